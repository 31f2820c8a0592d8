package guide

import (
	"strings"
	"testing"
)

// TestAttackNotifySecretSetButIgnored breaks the config contract of the
// notify webhook (README, STILLTHERE_NOTIFY_SECRET; Config.NotifySecret:
// "default WebhookSecret with the webhook sender"): a default is what
// applies when the setting is not given. With guides through the webhook
// and notify-secret given but notify-url not, Validate accepts the config
// and the consumer signs notify stages with webhook-secret, dropping the
// secret the operator gave without a word. The platform's notify
// endpoint, which verifies with the notify secret it was told of, then
// answers 401 to every notify: the notify breaker opens and every guide
// waits behind it. With guides through the gateway the same setting is
// refused ("notify-secret: set without notify-url"); here it must be
// refused too, or used.
func TestAttackNotifySecretSetButIgnored(t *testing.T) {
	c := validConfig()
	c.Sender = SenderWebhook
	c.WebhookURL = "https://im.example.com/guides"
	c.WebhookSecret = strings.Repeat("w", 32)
	c.NotifySecret = strings.Repeat("n", 32) // notify-url left to its default
	if err := c.Validate(); err != nil {
		return // refused, naming the setting: the contract holds
	}
	url, secret := c.notifyTarget()
	switch secret {
	case c.NotifySecret:
	case c.WebhookSecret:
		t.Errorf("notify-secret given and accepted, but notify stages to %s are signed with webhook-secret", url)
	default:
		t.Errorf("notify-secret given and accepted, but notify stages to %s are signed with neither it nor webhook-secret", url)
	}
}

// TestAttackNotifySecretMayBePushSecret breaks the secret rule the
// project applies to every key a platform holds (activity.CheckSecret:
// "not the push secret, so that a platform holding one cannot push
// guides"; the ops secret likewise). The notify secret is handed to the
// platform's notify endpoint, to verify what the consumer signs; with
// guides through the gateway the consumer also holds the push secret.
// Validate accepts the two being the same, and the platform's notify
// receiver, or whoever reads its config, can then push any guide to any
// user, a close stage included.
func TestAttackNotifySecretMayBePushSecret(t *testing.T) {
	c := validConfig() // guides through the gateway
	c.NotifyURL = "https://im.example.com/notify"
	c.NotifySecret = c.PushSecret
	if err := c.Validate(); err == nil {
		t.Error("notify-secret the same as push-secret accepted: the platform holding it can push guides")
	}
}
