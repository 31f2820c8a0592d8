package kafka

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/kafka/kafkatest"
	"github.com/stillthere/stillthere/pkg/tlsfiles"
	"github.com/stillthere/stillthere/pkg/tlsfiles/tlsfilestest"
	"github.com/twmb/franz-go/pkg/kfake"
)

func valid() Config {
	return Config{Brokers: []string{"127.0.0.1:9092"}, Topic: "t", Partitions: 1, ReplicationFactor: 1, SASLMechanism: SASLNone}
}

func TestValidate(t *testing.T) {
	pki := tlsfilestest.Generate(t)
	for _, tc := range []struct {
		name    string
		edit    func(*Config)
		wantErr string // empty: valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"no brokers", func(c *Config) { c.Brokers = nil }, "kafka-brokers:"},
		{"tls with a CA", func(c *Config) { c.TLS, c.TLSFiles.CAFile = true, pki.CAFile }, ""},
		{"tls with system roots", func(c *Config) { c.TLS = true }, ""},
		{"CA without tls", func(c *Config) { c.TLSFiles.CAFile = pki.CAFile }, "kafka-tls-ca-file: set, but kafka-tls is false"},
		{"CA that does not parse", func(c *Config) { c.TLS, c.TLSFiles.CAFile = true, pki.ClientKeyFile }, "kafka-tls-ca-file: "},
		{"cert without key", func(c *Config) { c.TLS, c.TLSFiles.CertFile = true, pki.ClientCertFile }, "kafka-tls-key-file: empty"},
		{"plain", func(c *Config) { c.SASLMechanism, c.SASLUsername, c.SASLPassword = SASLPlain, "u", "p" }, ""},
		{"scram-sha-256", func(c *Config) { c.SASLMechanism, c.SASLUsername, c.SASLPassword = SASLScramSHA256, "u", "p" }, ""},
		{"scram-sha-512", func(c *Config) { c.SASLMechanism, c.SASLUsername, c.SASLPassword = SASLScramSHA512, "u", "p" }, ""},
		{"unknown mechanism", func(c *Config) { c.SASLMechanism = "gssapi" }, `kafka-sasl-mechanism: "gssapi"`},
		{"upper-case mechanism", func(c *Config) { c.SASLMechanism = "PLAIN" }, `kafka-sasl-mechanism: "PLAIN"`},
		{"mechanism without user", func(c *Config) { c.SASLMechanism, c.SASLPassword = SASLPlain, "p" }, "kafka-sasl-username: empty"},
		{"mechanism without password", func(c *Config) { c.SASLMechanism, c.SASLUsername = SASLScramSHA512, "u" }, "kafka-sasl-password: empty"},
		{"user without mechanism", func(c *Config) { c.SASLUsername = "u" }, "kafka-sasl-username: a SASL user or password is set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.wantErr)):
				t.Fatalf("Validate = %v, want an error starting %q", err, tc.wantErr)
			}
		})
	}
}

// TestTLSAndSASL connects to an in-process Kafka that listens with TLS
// only and authenticates with SASL, once per mechanism, and creates and
// lists the topic through it.
func TestTLSAndSASL(t *testing.T) {
	pki := tlsfilestest.Generate(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, mech := range []struct{ setting, kfake string }{
		{SASLPlain, "PLAIN"},
		{SASLScramSHA256, "SCRAM-SHA-256"},
		{SASLScramSHA512, "SCRAM-SHA-512"},
	} {
		t.Run(mech.setting, func(t *testing.T) {
			cluster, err := kafkatest.NewFake(
				kfake.TLS(pki.ServerConfig(t, true)),
				kfake.EnableSASL(),
				kfake.Superuser(mech.kfake, "svc", "s3cret"))
			if err != nil {
				t.Fatal(err)
			}
			defer cluster.Close()
			c := valid()
			c.Brokers = cluster.ListenAddrs()
			c.TLS = true
			c.TLSFiles = tlsfiles.Files{CAFile: pki.CAFile, CertFile: pki.ClientCertFile, KeyFile: pki.ClientKeyFile}
			c.SASLMechanism, c.SASLUsername, c.SASLPassword = mech.setting, "svc", "s3cret"
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			cl, err := NewClient(c, logger)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := EnsureTopic(ctx, cl, c); err != nil {
				t.Fatalf("over TLS with %s: %v", mech.setting, err)
			}

			bad := c
			bad.SASLPassword = "wrong"
			if err := pingWith(t, bad, logger); err == nil {
				t.Error("a wrong SASL password was accepted")
			}
			bad = c
			bad.TLS, bad.TLSFiles = false, tlsfiles.Files{}
			if err := pingWith(t, bad, logger); err == nil {
				t.Error("a plaintext client reached the TLS listener")
			}
			bad = c
			bad.TLSFiles.CAFile = tlsfilestest.Generate(t).CAFile // another CA
			if err := pingWith(t, bad, logger); err == nil || !strings.Contains(err.Error(), "certificate") {
				t.Errorf("a broker certificate from an unknown CA: ping = %v, want a certificate error", err)
			}
		})
	}
}

func pingWith(t *testing.T, c Config, logger *slog.Logger) error {
	t.Helper()
	cl, err := NewClient(c, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}

func TestRetryBackoff(t *testing.T) {
	for _, tc := range []struct {
		fails int
		r     float64
		want  time.Duration
	}{
		{0, 0.5, 100 * time.Millisecond},
		{1, 0.5, 100 * time.Millisecond},
		{1, 0, 80 * time.Millisecond},
		{1, 0.999999, 119999960 * time.Nanosecond},
		{2, 0.5, 200 * time.Millisecond},
		{3, 0.5, 400 * time.Millisecond},
		{4, 0.5, 800 * time.Millisecond},
		{4, 0.999999, 959999680 * time.Nanosecond},
		{6, 0.999999, time.Second}, // never past the cap
		{5, 0, 800 * time.Millisecond},
		{5, 0.5, time.Second},
		{5, 0.999999, time.Second},
		{1000, 0.5, time.Second}, // no overflow
	} {
		if got := RetryBackoff(tc.fails, tc.r); got != tc.want {
			t.Errorf("RetryBackoff(%d, %v) = %v, want %v", tc.fails, tc.r, got, tc.want)
		}
	}
}
