package helm

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// secretValues supply the secrets the chart needs as values, for tests
// of other values: the chart generates none.
var secretValues = []string{
	"--set", "secrets.tokenSecret=token-secret-for-tests-0123456789abcdef",
	"--set", "secrets.pushSecret=push-secret-for-tests-0123456789abcdef",
}

// secretKeys are the keys of secrets.existingSecret values.yaml documents.
var secretKeys = []string{"token-secret", "push-secret", "webhook-secret", "notify-secret", "activity-secret", "ops-secret", "redis-password", "kafka-sasl-password"}

// checkSecrets: the pods read their secrets from secrets.existingSecret,
// by the documented keys, and the chart renders no Secret of its own; or,
// without it, from the chart's Secret.
func checkSecrets(t *testing.T, m *manifests, pods map[string]*corev1.PodTemplateSpec, v values) {
	want := fullname
	if v.Secrets.ExistingSecret != "" {
		want = v.Secrets.ExistingSecret
		if m.secrets[fullname] != nil {
			t.Errorf("Secret %s rendered alongside secrets.existingSecret %s", fullname, want)
		}
	} else if m.secrets[fullname] == nil {
		t.Fatalf("no Secret %s and no secrets.existingSecret", fullname)
	}
	for c, pod := range pods {
		for _, e := range pod.Spec.Containers[0].Env {
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
				continue
			}
			ref := e.ValueFrom.SecretKeyRef
			if ref.Name != want {
				t.Errorf("%s: %s from Secret %s, want %s", c, e.Name, ref.Name, want)
			}
			if !slices.Contains(secretKeys, ref.Key) {
				t.Errorf("%s: %s from key %s, which values.yaml does not document", c, e.Name, ref.Key)
			}
		}
	}
	gw := env(t, m, &pods["gateway"].Spec.Containers[0])
	for name, key := range map[string]string{"STILLTHERE_TOKEN_SECRET": "token-secret", "STILLTHERE_PUSH_SECRET": "push-secret"} {
		if got := gw[name]; got != "secret:"+want+"/"+key {
			t.Errorf("gateway: %s = %q, want it from Secret %s key %s", name, got, want, key)
		}
	}
	// The activity and ops secrets are optional: read from an existing
	// Secret, which may lack the key (the endpoint is off then), or from
	// the chart's when given.
	for _, o := range []struct {
		env, key, value string
	}{
		{"STILLTHERE_ACTIVITY_SECRET", "activity-secret", v.Secrets.ActivitySecret},
		{"STILLTHERE_OPS_SECRET", "ops-secret", v.Secrets.OpsSecret},
	} {
		got := gw[o.env]
		if v.Secrets.ExistingSecret == "" && o.value == "" {
			if got != "" {
				t.Errorf("gateway: %s = %q with no %s given", o.env, got, o.key)
			}
			continue
		}
		if got != "secret:"+want+"/"+o.key {
			t.Errorf("gateway: %s = %q, want it from Secret %s key %s", o.env, got, want, o.key)
		}
		for _, e := range pods["gateway"].Spec.Containers[0].Env {
			if e.Name == o.env && (e.ValueFrom.SecretKeyRef.Optional == nil || !*e.ValueFrom.SecretKeyRef.Optional) {
				t.Errorf("gateway: %s's key is not optional", o.env)
			}
		}
	}
	// Only the gateway serves the endpoints the two open.
	for c, pod := range pods {
		if c == "gateway" {
			continue
		}
		for name := range env(t, m, &pod.Spec.Containers[0]) {
			if name == "STILLTHERE_ACTIVITY_SECRET" || name == "STILLTHERE_OPS_SECRET" {
				t.Errorf("%s: %s, which only the gateway needs", c, name)
			}
		}
	}
}

// TestChartOptionalSecretsOff: with only the required secrets as values,
// the gateway gets neither the activity nor the ops secret (both
// endpoints off), and the chart's Secret holds neither key.
func TestChartOptionalSecretsOff(t *testing.T) {
	out, err := render(t, secretValues...)
	if err != nil {
		t.Fatal(err)
	}
	m, err := decode(out)
	if err != nil {
		t.Fatalf("decoding the rendered chart strictly:\n%v", err)
	}
	pods := map[string]*corev1.PodTemplateSpec{}
	for _, c := range components {
		d := m.deployments[fullname+"-"+c]
		if d == nil {
			t.Fatalf("no Deployment %s-%s", fullname, c)
		}
		pods[c] = &d.Spec.Template
	}
	checkSecrets(t, m, pods, loadValues(t))
	for _, key := range []string{"activity-secret", "ops-secret"} {
		if _, ok := m.secrets[fullname].Data[key]; ok {
			t.Errorf("Secret %s holds %s, which no value gave", fullname, key)
		}
	}
}

// TestChartRendersTheSameTwice: helm template, Argo CD and --dry-run see
// no cluster, so a value generated at render time differs on every sync
// and would rotate a secret each time.
func TestChartRendersTheSameTwice(t *testing.T) {
	for _, file := range valueSets(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			first, err := render(t, "-f", file)
			if err != nil {
				t.Fatal(err)
			}
			second, err := render(t, "-f", file)
			if err != nil {
				t.Fatal(err)
			}
			if first != second {
				t.Errorf("two renders differ:\n%s", firstDifference(first, second))
			}
		})
	}
}

func firstDifference(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return "line " + al[i] + "\nthen " + bl[i]
		}
	}
	return "one is longer"
}

// nondeterministic are the template functions whose result changes from
// one render to the next, or depends on the cluster (lookup, which helm
// template and GitOps tools answer with nothing).
var nondeterministic = []string{
	"lookup", "now", "uuidv4", "shuffle",
	"randAlphaNum", "randAlpha", "randNumeric", "randAscii", "randBytes", "randInt",
	"genPrivateKey", "genCA", "genCAWithKey", "genSelfSignedCert", "genSelfSignedCertWithKey", "genSignedCert", "genSignedCertWithKey",
	"htpasswd", "bcrypt", "encryptAES",
}

var (
	templateAction  = regexp.MustCompile(`(?s)\{\{.*?\}\}`)
	templateComment = regexp.MustCompile(`(?s)\{\{-?\s*/\*.*?\*/\s*-?\}\}`)
	templateString  = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|`[^`]*`")
	// A function name: a word not after a dot or a $ (a field or variable).
	templateWord = regexp.MustCompile(`(^|[^.$\w])([A-Za-z_]\w*)`)
)

// TestChartGeneratesNoSecrets: no template calls a function that makes
// the render differ between runs or depend on the cluster.
func TestChartGeneratesNoSecrets(t *testing.T) {
	files, err := filepath.Glob(chartDir + "/templates/*")
	if err != nil || len(files) == 0 {
		t.Fatalf("templates: %q, %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := templateComment.ReplaceAllString(string(b), "")
		for _, action := range templateAction.FindAllString(text, -1) {
			code := templateString.ReplaceAllString(action, `""`)
			for _, m := range templateWord.FindAllStringSubmatch(code, -1) {
				if slices.Contains(nondeterministic, m[2]) {
					t.Errorf("%s: %s in %s: the render would differ between runs or need the cluster", f, m[2], action)
				}
			}
		}
	}
}

// TestChartRequiresSecrets: without secrets.existingSecret or the secret
// values the chart fails, saying what to set; with existingSecret, a
// secret value it would ignore fails too.
func TestChartRequiresSecrets(t *testing.T) {
	const token, push = "--set=secrets.tokenSecret=token-secret-for-tests-0123456789abcdef", "--set=secrets.pushSecret=push-secret-for-tests-0123456789abcdef"
	const webhook, webhookSecret = "--set=consumer.sender=webhook,consumer.webhookURL=https://im.example.com/hook", "--set=secrets.webhookSecret=webhook-secret-for-tests-0123456789"
	const notifyURL, notifySecret = "--set=consumer.notifyURL=https://platform.example.com/notify", "--set=secrets.notifySecret=notify-secret-for-tests-0123456789ab"
	for _, tc := range []struct {
		name string
		args []string
		want []string // substrings of the error; nil means it renders
	}{
		{"nothing", nil,
			[]string{"secrets.tokenSecret and secrets.pushSecret: required", "generates no secrets", "Set secrets.existingSecret", "token-secret and push-secret", "Or set secrets.tokenSecret and secrets.pushSecret"}},
		{"no push secret", []string{token},
			[]string{"secrets.pushSecret: required", "secrets.existingSecret"}},
		{"no token secret", []string{push},
			[]string{"secrets.tokenSecret: required", "secrets.existingSecret"}},
		{"both as values", []string{token, push}, nil},
		{"an existing secret", []string{"--set=secrets.existingSecret=chat-secrets"}, nil},
		{"an existing secret for every feature", []string{"--set=secrets.existingSecret=chat-secrets", "--set=consumer.sender=webhook", "--set=consumer.webhookURL=https://im.example.com/hook",
			"--set=redis.auth.enabled=true", "--set=kafka.sasl.mechanism=plain", "--set=kafka.sasl.username=u"}, nil},
		{"an existing secret and a token secret", []string{"--set=secrets.existingSecret=chat-secrets", token},
			[]string{"secrets.tokenSecret: set together with secrets.existingSecret (chat-secrets)", "leave secrets.tokenSecret empty"}},
		{"an existing secret and a Redis password", []string{"--set=secrets.existingSecret=chat-secrets", "--set=redis.auth.enabled=true", "--set=redis.auth.password=p"},
			[]string{"redis.auth.password: set together with secrets.existingSecret (chat-secrets)"}},
		{"an existing secret and a SASL password", []string{"--set=secrets.existingSecret=chat-secrets", "--set=kafka.sasl.mechanism=plain", "--set=kafka.sasl.username=u", "--set=kafka.sasl.password=p"},
			[]string{"kafka.sasl.password: set together with secrets.existingSecret (chat-secrets)"}},
		{"an activity secret", []string{token, push, "--set=secrets.activitySecret=activity-secret-for-tests-0123456789"}, nil},
		{"the push secret as the activity secret", []string{token, push, "--set=secrets.activitySecret=push-secret-for-tests-0123456789abcdef"},
			[]string{"secrets.activitySecret: the same as secrets.pushSecret"}},
		{"an existing secret and an activity secret", []string{"--set=secrets.existingSecret=chat-secrets", "--set=secrets.activitySecret=activity-secret-for-tests-0123456789"},
			[]string{"secrets.activitySecret: set together with secrets.existingSecret (chat-secrets)"}},
		{"an ops secret", []string{token, push, "--set=secrets.opsSecret=ops-secret-for-tests-0123456789abcdef"}, nil},
		{"an ops secret beside an activity secret", []string{token, push, "--set=secrets.activitySecret=activity-secret-for-tests-0123456789", "--set=secrets.opsSecret=ops-secret-for-tests-0123456789abcdef"}, nil},
		{"a short ops secret", []string{token, push, "--set=secrets.opsSecret=ops-secret-too-short"},
			[]string{"/secrets/opsSecret", "minLength"}},
		{"the push secret as the ops secret", []string{token, push, "--set=secrets.opsSecret=push-secret-for-tests-0123456789abcdef"},
			[]string{"secrets.opsSecret: the same as secrets.pushSecret"}},
		{"the token secret as the ops secret", []string{token, push, "--set=secrets.opsSecret=token-secret-for-tests-0123456789abcdef"},
			[]string{"secrets.opsSecret: the same as secrets.tokenSecret"}},
		{"the activity secret as the ops secret", []string{token, push, "--set=secrets.activitySecret=activity-secret-for-tests-0123456789", "--set=secrets.opsSecret=activity-secret-for-tests-0123456789"},
			[]string{"secrets.opsSecret: the same as secrets.activitySecret"}},
		{"an existing secret and an ops secret", []string{"--set=secrets.existingSecret=chat-secrets", "--set=secrets.opsSecret=ops-secret-for-tests-0123456789abcdef"},
			[]string{"secrets.opsSecret: set together with secrets.existingSecret (chat-secrets)"}},
		{"the ops secret through the gateway's map", []string{token, push, "--set=gateway.config.ops-secret=ops-secret-for-tests-0123456789abcdef"},
			[]string{"gateway.config.ops-secret: a secret does not belong in a ConfigMap"}},
		{"the ops secret through the common map", []string{token, push, "--set=config.STILLTHERE_OPS_SECRET=ops-secret-for-tests-0123456789abcdef"},
			[]string{"config.STILLTHERE_OPS_SECRET: a secret does not belong in a ConfigMap"}},
		{"webhook without its secret", []string{token, push, "--set=consumer.sender=webhook", "--set=consumer.webhookURL=https://im.example.com/hook"},
			[]string{"secrets.webhookSecret: required with consumer.sender=webhook"}},
		{"a notify URL and its secret", []string{token, push, notifyURL, notifySecret}, nil},
		{"a notify URL without its secret", []string{token, push, notifyURL},
			[]string{"secrets.notifySecret: required with consumer.notifyURL and consumer.sender=gateway", "at least 32 bytes", "secrets.existingSecret, key notify-secret"}},
		{"a short notify secret", []string{token, push, notifyURL, "--set=secrets.notifySecret=notify-secret-too-short"},
			[]string{"/secrets/notifySecret", "minLength"}},
		{"a notify secret without a URL", []string{token, push, notifySecret},
			[]string{"secrets.notifySecret: set without consumer.notifyURL", "notify-secret: set without notify-url", "Set consumer.notifyURL"}},
		{"webhook and a notify URL without a notify secret", []string{token, push, webhook, webhookSecret, notifyURL}, nil},
		{"webhook and a notify URL and secret", []string{token, push, webhook, webhookSecret, notifyURL, notifySecret}, nil},
		{"webhook and a notify secret without a URL", []string{token, push, webhook, webhookSecret, notifySecret},
			[]string{"secrets.notifySecret: set without consumer.notifyURL, so it would be unused", "consumer.webhookURL, signed with secrets.webhookSecret"}},
		{"an existing secret and a notify URL", []string{"--set=secrets.existingSecret=chat-secrets", notifyURL}, nil},
		{"an existing secret and a notify secret", []string{"--set=secrets.existingSecret=chat-secrets", notifyURL, notifySecret},
			[]string{"secrets.notifySecret: set together with secrets.existingSecret (chat-secrets)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, tc.args...)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("helm template %q rendered, want an error naming %q", tc.args, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}
