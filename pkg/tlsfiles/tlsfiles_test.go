package tlsfiles_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stillthere/stillthere/pkg/tlsfiles"
	"github.com/stillthere/stillthere/pkg/tlsfiles/tlsfilestest"
)

func TestCheck(t *testing.T) {
	pki := tlsfilestest.Generate(t)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		on      bool
		files   tlsfiles.Files
		wantErr string // empty: valid
	}{
		{"off and empty", false, tlsfiles.Files{}, ""},
		{"on with system roots", true, tlsfiles.Files{}, ""},
		{"on with a CA", true, tlsfiles.Files{CAFile: pki.CAFile, ServerName: "redis.internal"}, ""},
		{"mutual TLS", true, tlsfiles.Files{CAFile: pki.CAFile, CertFile: pki.ClientCertFile, KeyFile: pki.ClientKeyFile}, ""},
		{"CA while off", false, tlsfiles.Files{CAFile: pki.CAFile}, "x-tls-ca-file: set, but x-tls is false"},
		{"server name while off", false, tlsfiles.Files{ServerName: "a"}, "x-tls-server-name: set, but x-tls is false"},
		{"missing CA file", true, tlsfiles.Files{CAFile: "/nonexistent/ca.pem"}, "x-tls-ca-file: open /nonexistent/ca.pem"},
		{"CA that does not parse", true, tlsfiles.Files{CAFile: garbage}, "x-tls-ca-file: \"" + garbage + "\" holds no PEM certificate"},
		{"cert without key", true, tlsfiles.Files{CertFile: pki.ClientCertFile}, "x-tls-key-file: empty, but x-tls-cert-file is set"},
		{"key without cert", true, tlsfiles.Files{KeyFile: pki.ClientKeyFile}, "x-tls-cert-file: empty, but x-tls-key-file is set"},
		{"mismatched pair", true, tlsfiles.Files{CertFile: pki.ClientCertFile, KeyFile: pki.ServerKeyFile}, "x-tls-cert-file and x-tls-key-file: "},
		{"key that does not parse", true, tlsfiles.Files{CertFile: pki.ClientCertFile, KeyFile: garbage}, "x-tls-cert-file and x-tls-key-file: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.files.Check("x-tls", tc.on)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Check = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.wantErr)):
				t.Fatalf("Check = %v, want an error starting %q", err, tc.wantErr)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	pki := tlsfilestest.Generate(t)
	cfg, err := tlsfiles.Files{CAFile: pki.CAFile, CertFile: pki.ClientCertFile, KeyFile: pki.ClientKeyFile, ServerName: "kafka.internal"}.Config("x")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.ServerName != "kafka.internal" || cfg.InsecureSkipVerify {
		t.Fatalf("config = roots %v, %d certificates, server name %q, insecure %v", cfg.RootCAs != nil, len(cfg.Certificates), cfg.ServerName, cfg.InsecureSkipVerify)
	}
	cfg, err = tlsfiles.Files{}.Config("x")
	if err != nil || cfg.RootCAs != nil || len(cfg.Certificates) != 0 {
		t.Fatalf("empty files: %v, %+v: want system roots and no client certificate", err, cfg)
	}
}
