// Package tlsfiles builds the client TLS configuration of a connection to
// Redis or Kafka from PEM files named in settings, as a Kubernetes Secret
// mounted into the pod provides them. Every error names the setting whose
// file is at fault, so a bad mount stops the start with a clear message.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Files are the PEM files and server name of one TLS client. Each field
// is optional: without CAFile the system roots verify the server; without
// CertFile and KeyFile no client certificate is sent; without ServerName
// the host of the dialed address is verified.
type Files struct {
	CAFile     string
	CertFile   string
	KeyFile    string
	ServerName string
}

// Any reports whether a field is set.
func (f Files) Any() bool {
	return f.CAFile != "" || f.CertFile != "" || f.KeyFile != "" || f.ServerName != ""
}

// Config reads the files into a client tls.Config. Setting names in errors
// are prefix plus "-ca-file", "-cert-file" or "-key-file", such as
// "redis-tls-ca-file".
func (f Files) Config(prefix string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s-ca-file: %w", prefix, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s-ca-file: %q holds no PEM certificate", prefix, f.CAFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.CertFile != "" && f.KeyFile == "":
		return nil, fmt.Errorf("%s-key-file: empty, but %s-cert-file is set: a client certificate needs both", prefix, prefix)
	case f.CertFile == "" && f.KeyFile != "":
		return nil, fmt.Errorf("%s-cert-file: empty, but %s-key-file is set: a client certificate needs both", prefix, prefix)
	case f.CertFile != "":
		pair, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s-cert-file and %s-key-file: %w", prefix, prefix, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// Check validates f for a connection whose TLS switch (the setting named
// prefix, such as "kafka-tls") is on: the files must load. With TLS off,
// any field set is an error, since whoever set it surely meant TLS.
func (f Files) Check(prefix string, on bool) error {
	if !on {
		for _, s := range []struct{ suffix, v string }{
			{"-ca-file", f.CAFile}, {"-cert-file", f.CertFile}, {"-key-file", f.KeyFile}, {"-server-name", f.ServerName},
		} {
			if s.v != "" {
				return fmt.Errorf("%s%s: set, but %s is false", prefix, s.suffix, prefix)
			}
		}
		return nil
	}
	_, err := f.Config(prefix)
	return err
}
