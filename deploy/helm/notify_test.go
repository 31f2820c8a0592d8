package helm

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// notifyExpect is what the guide consumer is to run with for the notify
// webhook.
type notifyExpect struct {
	url string // STILLTHERE_NOTIFY_URL; "" unset
	// secretFrom is the Secret STILLTHERE_NOTIFY_SECRET is read from, key
	// notify-secret; "" unset (no notify URL, or webhook-secret signs).
	secretFrom string
	optional   bool   // the key may be missing (an existing Secret, sender=webhook)
	value      string // notify-secret in the chart's own Secret; "" none
}

// notifyWant is what the values given to a ci file make the consumer run
// with: notify-secret only with a notify URL, where the consumer uses it.
func notifyWant(v values) notifyExpect {
	want := notifyExpect{url: v.Consumer.NotifyURL}
	if v.Secrets.ExistingSecret == "" {
		want.value = v.Secrets.NotifySecret
	}
	switch {
	case want.url == "":
	case v.Secrets.ExistingSecret != "":
		want.secretFrom, want.optional = v.Secrets.ExistingSecret, v.Consumer.Sender == "webhook"
	case v.Secrets.NotifySecret != "":
		want.secretFrom = fullname
	}
	return want
}

// checkNotify: the consumer, and only it, gets the notify URL and the key
// that signs for it, from the Secret the values name.
func checkNotify(t *testing.T, m *manifests, pods map[string]*corev1.PodTemplateSpec, want notifyExpect) {
	t.Helper()
	consumer := &pods["guide-consumer"].Spec.Containers[0]
	envs := env(t, m, consumer)
	if got, ok := envs["STILLTHERE_NOTIFY_URL"]; got != want.url || ok != (want.url != "") {
		t.Errorf("guide-consumer: STILLTHERE_NOTIFY_URL = %q (set: %v), want %q", got, ok, want.url)
	}
	wantSecret := ""
	if want.secretFrom != "" {
		wantSecret = "secret:" + want.secretFrom + "/notify-secret"
	}
	if got := envs["STILLTHERE_NOTIFY_SECRET"]; got != wantSecret {
		t.Errorf("guide-consumer: STILLTHERE_NOTIFY_SECRET = %q, want %q", got, wantSecret)
	}
	for _, e := range consumer.Env {
		if e.Name != "STILLTHERE_NOTIFY_SECRET" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			continue
		}
		optional := e.ValueFrom.SecretKeyRef.Optional != nil && *e.ValueFrom.SecretKeyRef.Optional
		if optional != want.optional {
			t.Errorf("guide-consumer: STILLTHERE_NOTIFY_SECRET's key optional = %v, want %v", optional, want.optional)
		}
	}
	for _, c := range components {
		if c == "guide-consumer" {
			continue
		}
		for name := range env(t, m, &pods[c].Spec.Containers[0]) {
			if name == "STILLTHERE_NOTIFY_URL" || name == "STILLTHERE_NOTIFY_SECRET" {
				t.Errorf("%s: %s, which only the guide consumer reads", c, name)
			}
		}
	}
	if s := m.secrets[fullname]; s != nil {
		got, ok := s.Data["notify-secret"]
		if string(got) != want.value || ok != (want.value != "") {
			t.Errorf("Secret %s: notify-secret = %q (set: %v), want %q", fullname, got, ok, want.value)
		}
	} else if want.value != "" {
		t.Errorf("no Secret %s to hold notify-secret", fullname)
	}
}

// TestChartNotify: the notify URL and secret reach the consumer as it
// reads them: the secret with a URL only, from the chart's Secret or an
// existing one, whose key only sender=webhook may lack (webhook-secret
// then signs).
func TestChartNotify(t *testing.T) {
	const (
		url          = "https://platform.example.com/notify"
		secret       = "notify-secret-for-tests-0123456789ab"
		existing     = "chat-secrets"
		setURL       = "--set=consumer.notifyURL=" + url
		setSecret    = "--set=secrets.notifySecret=" + secret
		setExisting  = "--set=secrets.existingSecret=" + existing
		setWebhook   = "--set=consumer.sender=webhook,consumer.webhookURL=https://im.example.com/hook"
		setWebhookKS = "--set=secrets.webhookSecret=webhook-secret-for-tests-0123456789"
	)
	for _, tc := range []struct {
		name string
		args []string
		want notifyExpect
	}{
		{"none", secretValues, notifyExpect{}},
		{"a URL and its secret", append(slices.Clone(secretValues), setURL, setSecret),
			notifyExpect{url: url, secretFrom: fullname, value: secret}},
		{"webhook, no notify URL: the guide webhook's", append(slices.Clone(secretValues), setWebhook, setWebhookKS),
			notifyExpect{}},
		{"webhook and a notify URL: webhook-secret signs", append(slices.Clone(secretValues), setWebhook, setWebhookKS, setURL),
			notifyExpect{url: url}},
		{"webhook, a notify URL and its secret", append(slices.Clone(secretValues), setWebhook, setWebhookKS, setURL, setSecret),
			notifyExpect{url: url, secretFrom: fullname, value: secret}},
		{"an existing secret, no URL", []string{setExisting}, notifyExpect{}},
		{"an existing secret and a URL", []string{setExisting, setURL},
			notifyExpect{url: url, secretFrom: existing}},
		{"an existing secret, webhook and a URL", []string{setExisting, setWebhook, setURL},
			notifyExpect{url: url, secretFrom: existing, optional: true}},
		{"an existing secret, webhook, no URL", []string{setExisting, setWebhook}, notifyExpect{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := render(t, tc.args...)
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
			checkNotify(t, m, pods, tc.want)
		})
	}
}
