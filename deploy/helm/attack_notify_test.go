package helm

import (
	"slices"
	"strings"
	"testing"
)

// TestAttackChartNotifySecretInConfigMap breaks the chart's rule that a
// secret never lands in a ConfigMap (its free-form maps refuse
// webhook-secret, push-secret and the others: "a secret does not belong
// in a ConfigMap"). The notify webhook's signing key,
// STILLTHERE_NOTIFY_SECRET, is the same kind of key as
// STILLTHERE_WEBHOOK_SECRET, yet consumer.config.notify-secret renders
// into the consumer's ConfigMap in the clear: the chart has no other way
// to give it (no secrets.* value, no existingSecret key), so an operator
// who sets up a notify webhook with guides through the gateway is led to
// put the key where every reader of ConfigMaps sees it.
func TestAttackChartNotifySecretInConfigMap(t *testing.T) {
	args := append(slices.Clone(secretValues),
		"--set", "consumer.config.notify-url=https://im.example.com/notify",
		"--set", "consumer.config.notify-secret=notify-secret-for-tests-0123456789abcdef")
	out, err := render(t, args...)
	if err != nil {
		if !strings.Contains(err.Error(), "notify-secret") {
			t.Fatalf("refused, but without naming notify-secret: %v", err)
		}
		return // refused, as for webhook-secret: the rule holds
	}
	m, err := decode(out)
	if err != nil {
		t.Fatalf("decoding the rendered chart strictly:\n%v", err)
	}
	for name, cm := range m.configMaps {
		if v, ok := cm.Data["STILLTHERE_NOTIFY_SECRET"]; ok && v != "" {
			t.Errorf("ConfigMap %s holds STILLTHERE_NOTIFY_SECRET in the clear (%d bytes); want it refused, or read from a Secret", name, len(v))
		}
	}
}

// TestAttackChartNotifyWebhookWithGatewaySender: docs/protocol.md,
// "Notify webhook": with guides through the gateway (the chart's default
// sender), a notify stage goes to STILLTHERE_NOTIFY_URL signed with
// STILLTHERE_NOTIFY_SECRET, which is then required. The chart has a typed
// value and a Secret key for the guide webhook's pair, and none for the
// notify webhook's: a notify-url given through consumer.config renders a
// consumer with no STILLTHERE_NOTIFY_SECRET from any Secret, and the
// consumer refuses to start ("notify-secret: 0 bytes, want at least
// 32"). Rendering must either refuse such values, naming what to set, as
// it refuses sender=webhook without webhookURL, or wire the secret from
// the chart's Secret or secrets.existingSecret.
func TestAttackChartNotifyWebhookWithGatewaySender(t *testing.T) {
	args := append(slices.Clone(secretValues),
		"--set", "consumer.config.notify-url=https://im.example.com/notify")
	out, err := render(t, args...)
	if err != nil {
		if !strings.Contains(err.Error(), "notify") {
			t.Fatalf("refused, but without naming the notify setting: %v", err)
		}
		return
	}
	m, err := decode(out)
	if err != nil {
		t.Fatalf("decoding the rendered chart strictly:\n%v", err)
	}
	d := m.deployments[fullname+"-guide-consumer"]
	if d == nil {
		t.Fatalf("no Deployment %s-guide-consumer", fullname)
	}
	got := env(t, m, &d.Spec.Template.Spec.Containers[0])
	if got["STILLTHERE_NOTIFY_URL"] == "" {
		t.Fatalf("consumer env has no STILLTHERE_NOTIFY_URL: the test did not set up the case")
	}
	if s := got["STILLTHERE_NOTIFY_SECRET"]; !strings.HasPrefix(s, "secret:") {
		t.Errorf("consumer has STILLTHERE_NOTIFY_URL but STILLTHERE_NOTIFY_SECRET %q, not from a Secret: "+
			"the rendered consumer fails its config check at start", s)
	}
}
