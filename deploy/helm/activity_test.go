package helm

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// activityFeed is gateway.activityFeed.
type activityFeed struct {
	Enabled     bool   `json:"enabled"`
	Topic       string `json:"topic"`
	Partitions  int    `json:"partitions"`
	Replication int    `json:"replication"`
	Group       string `json:"group"`
	DLQTopic    string `json:"dlqTopic"`
	Stamp       string `json:"stamp"`
	Gap         string `json:"gap"`
	// GroupSessionTimeout bounds the hold of every deadline a gateway
	// killed in the group causes.
	GroupSessionTimeout string `json:"groupSessionTimeout"`
}

// activitySettings are the gateway's activity feed settings besides
// STILLTHERE_ACTIVITY_FEED, as the values give them ("" for not set).
func (f activityFeed) settings() map[string]string {
	return map[string]string{
		"STILLTHERE_ACTIVITY_TOPIC":                 f.Topic,
		"STILLTHERE_ACTIVITY_TOPIC_PARTITIONS":      strconv.Itoa(f.Partitions),
		"STILLTHERE_ACTIVITY_TOPIC_REPLICATION":     strconv.Itoa(f.Replication),
		"STILLTHERE_ACTIVITY_GROUP":                 f.Group,
		"STILLTHERE_ACTIVITY_DLQ_TOPIC":             f.DLQTopic,
		"STILLTHERE_ACTIVITY_STAMP":                 f.Stamp,
		"STILLTHERE_ACTIVITY_GAP":                   f.Gap,
		"STILLTHERE_ACTIVITY_GROUP_SESSION_TIMEOUT": f.GroupSessionTimeout,
	}
}

// checkActivityFeed: the gateway runs the feed as the values say, with the
// settings given and no other component seeing them; with it on, the
// gateway is the Kafka client the guide consumer is (the same brokers,
// TLS, SASL user and password, and the certificate files mounted where the
// settings point); with it off, it gets no Kafka credentials or files.
func checkActivityFeed(t *testing.T, m *manifests, pods map[string]*corev1.PodTemplateSpec, f activityFeed) {
	gwCtr := &pods["gateway"].Spec.Containers[0]
	gw := env(t, m, gwCtr)
	if got, want := gw["STILLTHERE_ACTIVITY_FEED"], strconv.FormatBool(f.Enabled); got != want {
		t.Errorf("STILLTHERE_ACTIVITY_FEED = %q, want %q from gateway.activityFeed.enabled", got, want)
	}
	for name, want := range f.settings() {
		got, ok := gw[name]
		switch {
		case !f.Enabled && ok:
			t.Errorf("the feed is off, but the gateway gets %s=%q", name, got)
		case f.Enabled && got != want:
			t.Errorf("%s = %q, want %q from the values", name, got, want)
		}
	}
	for _, c := range []string{"expiry-listener", "guide-consumer"} {
		for name := range env(t, m, &pods[c].Spec.Containers[0]) {
			if strings.HasPrefix(name, "STILLTHERE_ACTIVITY_") {
				t.Errorf("%s reaches %s", name, c)
			}
		}
	}

	consumerCtr := &pods["guide-consumer"].Spec.Containers[0]
	consumer := env(t, m, consumerCtr)
	if !f.Enabled {
		if _, ok := gw["STILLTHERE_KAFKA_SASL_PASSWORD"]; ok {
			t.Error("the feed is off, but the gateway gets the Kafka SASL password")
		}
		for _, vm := range gwCtr.VolumeMounts {
			if vm.Name == "kafka-tls" {
				t.Error("the feed is off, but the gateway mounts Kafka's TLS files")
			}
		}
		return
	}
	for name, want := range consumer {
		if !strings.HasPrefix(name, "STILLTHERE_KAFKA_") {
			continue
		}
		if got := gw[name]; got != want {
			t.Errorf("gateway %s = %q, the guide consumer's is %q: the feed needs Kafka's settings", name, got, want)
		}
		if strings.HasSuffix(name, "_FILE") && !underMount(gwCtr, want) {
			t.Errorf("gateway %s = %q, which no volume of the gateway is mounted over", name, want)
		}
	}
}

// underMount reports whether a volume is mounted over path.
func underMount(ctr *corev1.Container, path string) bool {
	return slices.ContainsFunc(ctr.VolumeMounts, func(vm corev1.VolumeMount) bool {
		return strings.HasPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/")
	})
}

// TestChartActivityFeed: the feed off by default sets only
// STILLTHERE_ACTIVITY_FEED=false; on, with the defaults of values.yaml,
// every setting but the dead-letter topic (the gateway's own default);
// with Kafka secured, the gateway gets Kafka's credentials and files.
func TestChartActivityFeed(t *testing.T) {
	base := []string{"--set", "secrets.existingSecret=stillthere"}
	secured := []string{
		"--set", "kafka.tls.enabled=true", "--set", "kafka.tls.secretName=kafka-client-tls",
		"--set", "kafka.sasl.mechanism=scram-sha-512", "--set", "kafka.sasl.username=stillthere",
	}
	for _, tc := range []struct {
		name string
		args []string
		want activityFeed
	}{
		{"off by default", nil, activityFeed{}},
		{"on with the defaults", []string{"--set", "gateway.activityFeed.enabled=true"},
			activityFeed{Enabled: true, Topic: "session-activity", Partitions: 12, Replication: 3, Group: "stillthere-activity", Stamp: "250ms", Gap: "5s", GroupSessionTimeout: "10s"}},
		{"on with Kafka secured", append([]string{"--set", "gateway.activityFeed.enabled=true"}, secured...),
			activityFeed{Enabled: true, Topic: "session-activity", Partitions: 12, Replication: 3, Group: "stillthere-activity", Stamp: "250ms", Gap: "5s", GroupSessionTimeout: "10s"}},
		{"off with Kafka secured", secured, activityFeed{}},
		{"on with a dead-letter topic", []string{"--set", "gateway.activityFeed.enabled=true", "--set", "gateway.activityFeed.dlqTopic=refused-activity"},
			activityFeed{Enabled: true, Topic: "session-activity", Partitions: 12, Replication: 3, Group: "stillthere-activity", DLQTopic: "refused-activity", Stamp: "250ms", Gap: "5s", GroupSessionTimeout: "10s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := render(t, append(slices.Clone(base), tc.args...)...)
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
			checkActivityFeed(t, m, pods, tc.want)
			gw := env(t, m, &pods["gateway"].Spec.Containers[0])
			if _, ok := gw["STILLTHERE_ACTIVITY_DLQ_TOPIC"]; ok && tc.want.DLQTopic == "" {
				t.Error("STILLTHERE_ACTIVITY_DLQ_TOPIC is set though dlqTopic is empty: the gateway's default (the topic with -dlq) is the documented one")
			}
			_, sasl := gw["STILLTHERE_KAFKA_SASL_PASSWORD"]
			if want := tc.want.Enabled && slices.Contains(tc.args, "kafka.sasl.mechanism=scram-sha-512"); sasl != want {
				t.Errorf("gateway gets the Kafka SASL password: %v, want %v", sasl, want)
			}
		})
	}
}

// TestChartActivityFrom: networkPolicy.activityFrom opens the gateway's
// internal port to exactly its peers, in a rule of its own; empty, the
// port stays open to the guide consumers and metricsFrom only.
func TestChartActivityFrom(t *testing.T) {
	platform := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "chat-platform"}}}
	bots := networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.20.0.0/16"}}
	scrapers := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}
	for _, tc := range []struct {
		name     string
		args     []string
		activity []networkingv1.NetworkPolicyPeer
	}{
		{"none", nil, nil},
		{"two peers", []string{
			"--set", "networkPolicy.activityFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=chat-platform",
			"--set", "networkPolicy.activityFrom[1].ipBlock.cidr=10.20.0.0/16",
		}, []networkingv1.NetworkPolicyPeer{platform, bots}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--set", "secrets.existingSecret=stillthere",
				"--set", "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring"}, tc.args...)
			out, err := render(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			m, err := decode(out)
			if err != nil {
				t.Fatalf("decoding the rendered chart strictly:\n%v", err)
			}
			np := m.netpols[fullname+"-gateway"]
			if np == nil {
				t.Fatalf("no NetworkPolicy %s-gateway", fullname)
			}
			// The rules on the internal port, by their peers.
			var internal [][]networkingv1.NetworkPolicyPeer
			for _, r := range np.Spec.Ingress {
				if len(r.Ports) == 1 && r.Ports[0].Port != nil && *r.Ports[0].Port == intstr.FromString("internal") {
					internal = append(internal, r.From)
				}
			}
			want := 2 // the guide consumers, metricsFrom
			if len(tc.activity) > 0 {
				want++
			}
			if len(internal) != want {
				t.Fatalf("%d rules on the internal port, want %d: %+v", len(internal), want, internal)
			}
			if !reflect.DeepEqual(internal[1], []networkingv1.NetworkPolicyPeer{scrapers}) {
				t.Errorf("metricsFrom rule = %+v", internal[1])
			}
			if len(tc.activity) > 0 && !reflect.DeepEqual(internal[2], tc.activity) {
				t.Errorf("activityFrom rule = %+v, want %+v", internal[2], tc.activity)
			}
			// Only the gateway: the listener and consumer serve no endpoint.
			for _, c := range []string{"expiry-listener", "guide-consumer"} {
				for _, r := range m.netpols[fullname+"-"+c].Spec.Ingress {
					for _, p := range r.From {
						if slices.ContainsFunc(tc.activity, func(a networkingv1.NetworkPolicyPeer) bool { return reflect.DeepEqual(a, p) }) {
							t.Errorf("activityFrom peer %+v reaches %s", p, c)
						}
					}
				}
			}
		})
	}
}

// TestChartRefusesBadActivityValues: a feed setting the gateway would
// refuse at start, a topic or group of the timeout pipeline's, or a feed
// setting given where the chart does not derive the gateway's Kafka
// credentials from it, fails the render naming it.
func TestChartRefusesBadActivityValues(t *testing.T) {
	on := []string{"--set", "gateway.activityFeed.enabled=true"}
	for _, tc := range []struct {
		name string
		args []string
		want []string // substrings of the error
	}{
		{"group session timeout out of range", []string{"--set", "gateway.activityFeed.groupSessionTimeout=5s"},
			[]string{"gateway.activityFeed.groupSessionTimeout: 5s, want between 6s and 30m"}},
		{"group session timeout not a duration", []string{"--set-string", "gateway.activityFeed.groupSessionTimeout=10"},
			[]string{"/gateway/activityFeed/groupSessionTimeout"}},
		{"stamp out of range", []string{"--set", "gateway.activityFeed.stamp=20s"},
			[]string{"gateway.activityFeed.stamp: 20s, want between 10ms and 10s"}},
		{"stamp not a duration", []string{"--set-string", "gateway.activityFeed.stamp=250"},
			[]string{"/gateway/activityFeed/stamp"}},
		{"gap under four stamps", []string{"--set", "gateway.activityFeed.stamp=500ms", "--set", "gateway.activityFeed.gap=1s"},
			[]string{"gateway.activityFeed.gap: 1s, want at least four stamps (gateway.activityFeed.stamp 500ms)"}},
		{"dead-letter topic is the topic", []string{"--set", "gateway.activityFeed.dlqTopic=session-activity"},
			[]string{"gateway.activityFeed.dlqTopic: \"session-activity\" is the activity topic itself"}},
		{"topic is the timeout topic", []string{"--set", "gateway.activityFeed.topic=session-timeouts"},
			[]string{"gateway.activityFeed.topic: \"session-timeouts\" is a topic of the timeout pipeline"}},
		{"dead-letter topic is the guides'", []string{"--set", "gateway.activityFeed.dlqTopic=session-timeouts-dlq"},
			[]string{"gateway.activityFeed.dlqTopic: \"session-timeouts-dlq\" is a topic of the timeout pipeline"}},
		{"default dead-letter topic is the guides' set one", []string{"--set", "gateway.activityFeed.topic=guides", "--set", "consumer.dlqTopic=guides-dlq"},
			[]string{"gateway.activityFeed.dlqTopic: \"guides-dlq\" is a topic of the timeout pipeline"}},
		{"group is the guide consumers'", []string{"--set", "gateway.activityFeed.group=stillthere-guide"},
			[]string{"gateway.activityFeed.group: \"stillthere-guide\" is consumer.group"}},
		{"no partitions", []string{"--set", "gateway.activityFeed.partitions=0"},
			[]string{"/gateway/activityFeed/partitions"}},
		{"replication of 0", []string{"--set", "gateway.activityFeed.replication=0"},
			[]string{"/gateway/activityFeed/replication"}},
		{"topic not a topic name", []string{"--set", "gateway.activityFeed.topic=chat/activity"},
			[]string{"/gateway/activityFeed/topic"}},
		{"empty group", []string{"--set", "gateway.activityFeed.group="},
			[]string{"/gateway/activityFeed/group"}},
		{"enabled not a boolean", []string{"--set-string", "gateway.activityFeed.enabled=yes"},
			[]string{"/gateway/activityFeed/enabled"}},
		{"misspelt key", []string{"--set", "gateway.activityFeed.partition=6"},
			[]string{"/gateway/activityFeed", "partition"}},
		{"feed through the gateway's map", []string{"--set", "gateway.config.activity-feed=true"},
			[]string{"gateway.config.activity-feed", "STILLTHERE_ACTIVITY_FEED"}},
		{"topic through the common map", []string{"--set", "config.STILLTHERE_ACTIVITY_TOPIC=other"},
			[]string{"config.STILLTHERE_ACTIVITY_TOPIC", "STILLTHERE_ACTIVITY_TOPIC"}},
		{"feed through extraEnv", []string{"--set", "gateway.extraEnv[0].name=STILLTHERE_ACTIVITY_FEED", "--set-string", "gateway.extraEnv[0].value=true"},
			[]string{"gateway.extraEnv", "STILLTHERE_ACTIVITY_FEED"}},
		{"activityFrom not a list", []string{"--set", "networkPolicy.activityFrom=platform"},
			[]string{"/networkPolicy/activityFrom"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, slices.Concat(secretValues, on, tc.args)...)
			if err == nil {
				t.Fatalf("helm template %q succeeded, want an error naming %q", tc.args, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q:\n%v", w, err)
				}
			}
		})
	}
	// The same values pass with the feed off, but for the schema's: the
	// checks are the gateway's at start, and it does not check a feed it
	// does not run.
	if _, err := render(t, slices.Concat(secretValues, []string{"--set", "gateway.activityFeed.stamp=20s", "--set", "gateway.activityFeed.group=stillthere-guide"})...); err != nil {
		t.Errorf("bad feed settings with the feed off: %v", err)
	}
}
