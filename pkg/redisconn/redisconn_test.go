package redisconn

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stillthere/stillthere/pkg/redisserver"
	"github.com/stillthere/stillthere/pkg/tlsfiles"
	"github.com/stillthere/stillthere/pkg/tlsfiles/tlsfilestest"
)

func TestValidate(t *testing.T) {
	pki := tlsfilestest.Generate(t)
	for _, tc := range []struct {
		name    string
		edit    func(*Config)
		wantErr string // empty: valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"no address", func(c *Config) { c.Addrs = nil }, "redis-addrs: no address"},
		{"not host:port", func(c *Config) { c.Addrs = []string{"redis"} }, `redis-addrs: "redis"`},
		{"bad prefix", func(c *Config) { c.KeyPrefix = "" }, "key-prefix:"},
		{"tls with system roots", func(c *Config) { c.TLS = true }, ""},
		{"mutual tls", func(c *Config) {
			c.TLS, c.TLSFiles = true, tlsfiles.Files{CAFile: pki.CAFile, CertFile: pki.ClientCertFile, KeyFile: pki.ClientKeyFile, ServerName: "redis"}
		}, ""},
		{"CA without tls", func(c *Config) { c.TLSFiles.CAFile = pki.CAFile }, "redis-tls-ca-file: set, but redis-tls is false"},
		{"server name without tls", func(c *Config) { c.TLSFiles.ServerName = "redis" }, "redis-tls-server-name: set, but redis-tls is false"},
		{"CA that does not parse", func(c *Config) { c.TLS, c.TLSFiles.CAFile = true, pki.ClientKeyFile }, "redis-tls-ca-file: "},
		{"missing CA", func(c *Config) { c.TLS, c.TLSFiles.CAFile = true, "/nonexistent.pem" }, "redis-tls-ca-file: open"},
		{"key without cert", func(c *Config) { c.TLS, c.TLSFiles.KeyFile = true, pki.ClientKeyFile }, "redis-tls-cert-file: empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Addrs: []string{"127.0.0.1:6379"}, KeyPrefix: "st"}
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

// TestOpenTLS runs a real redis-server with a TLS port that demands a
// client certificate, and connects to it through Open.
func TestOpenTLS(t *testing.T) {
	pki := tlsfilestest.Generate(t, "redis.test")
	tlsPort := freePort(t)
	// The plaintext port stays on: the server helper waits for PING on it.
	srv, err := redisserver.Start(context.Background(), redisserver.Options{
		Dir: t.TempDir(),
		Args: []string{
			"--tls-port", strconv.Itoa(tlsPort),
			"--tls-cert-file", pki.ServerCertFile,
			"--tls-key-file", pki.ServerKeyFile,
			"--tls-ca-cert-file", pki.CAFile,
			"--tls-auth-clients", "yes",
		},
	})
	if err != nil {
		t.Fatalf("start redis-server with TLS (it must be built with TLS, as Debian's is): %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))

	good := Config{Addrs: []string{addr}, KeyPrefix: "st", TLS: true,
		TLSFiles: tlsfiles.Files{CAFile: pki.CAFile, CertFile: pki.ClientCertFile, KeyFile: pki.ClientKeyFile}}
	open := func(c Config) error {
		t.Helper()
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rdb, err := Open(ctx, c)
		if err != nil {
			return err
		}
		defer rdb.Close()
		return rdb.Set(ctx, "st:tls-probe", "1", time.Minute).Err()
	}

	if err := open(good); err != nil {
		t.Fatalf("mutual TLS by IP: %v", err)
	}
	byName := good
	byName.TLSFiles.ServerName = "redis.test"
	if err := open(byName); err != nil {
		t.Fatalf("mutual TLS with redis-tls-server-name: %v", err)
	}

	wrongName := good
	wrongName.TLSFiles.ServerName = "other.test"
	if err := open(wrongName); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a server name not in the certificate: Open = %v, want a certificate error", err)
	}
	otherCA := good
	otherCA.TLSFiles.CAFile = tlsfilestest.Generate(t).CAFile
	if err := open(otherCA); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a server certificate from an unknown CA: Open = %v, want a certificate error", err)
	}
	noClientCert := good
	noClientCert.TLSFiles.CertFile, noClientCert.TLSFiles.KeyFile = "", ""
	if err := open(noClientCert); err == nil {
		t.Error("the server demands a client certificate, but Open without one succeeded")
	}
	plain := Config{Addrs: []string{addr}, KeyPrefix: "st"}
	if err := open(plain); err == nil {
		t.Error("a plaintext client reached the TLS port")
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestOpenLeavesAddrsAlone: a cluster client appends the nodes it learns
// to its seed list. Opened from a Config whose Addrs has room to grow, it
// wrote them into the caller's array, shared by every client opened from
// that Config: two clients of one service raced on it.
func TestOpenLeavesAddrsAlone(t *testing.T) {
	c, err := redisserver.StartCluster(context.Background(), t.TempDir(), 3)
	if err != nil {
		t.Fatalf("start redis cluster: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	seeds := make([]string, 1, 8)
	seeds[0] = c.Addrs()[0]
	cfg := Config{Addrs: seeds, Cluster: true}
	for range 2 {
		rdb, err := Open(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		// Commands on every master make the client learn them all.
		for i := range 30 {
			rdb.Get(context.Background(), "k"+strconv.Itoa(i))
		}
	}
	if spare := seeds[1:cap(seeds)]; strings.Join(spare, "") != "" {
		t.Fatalf("the Config's Addrs array was written past its length: %q", spare)
	}
}
