// Package tlsconf builds the client side of fanout's TLS connections to
// Kafka and ZooKeeper from PEM files: one rule for both (TLS 1.2 minimum,
// the server verified against a CA bundle or the system's roots, an optional
// client certificate for servers that ask for one).
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Files names the PEM files of a TLS client. The zero value verifies the
// server against the system's roots and presents no certificate.
type Files struct {
	CA   string // CA bundle that signs the server's certificate; "" for the system's roots
	Cert string // client certificate (mutual TLS); with Key, or neither
	Key  string // the client certificate's private key (unencrypted PEM)

	// InsecureSkipVerify accepts any server certificate: for tests only.
	InsecureSkipVerify bool
}

// Set reports whether any field is set: a TLS option given implies TLS.
func (f Files) Set() bool { return f != Files{} }

// Config reads the files and returns the client configuration. The server
// name is left empty: the Kafka and ZooKeeper clients set it per address.
// Errors name the file and what is wrong with it.
func (f Files) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.InsecureSkipVerify}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate in it", f.CA)
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.Cert == "" && f.Key == "":
	case f.Cert == "" || f.Key == "":
		return nil, errors.New("a client certificate needs both its certificate file and its key file")
	default:
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s with key %s: %w", f.Cert, f.Key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
