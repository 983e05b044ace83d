package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// serve accepts one TLS connection on 127.0.0.1 with the server
// certificate of f, requiring a client certificate signed by f's CA when
// mutual is true, and returns the address and a channel that receives the
// handshake's outcome (the client certificate's common name, or an error).
func serve(t *testing.T, f testutil.TLSFiles, mutual bool) (string, <-chan string) {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(f.ServerCert, f.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}}
	if mutual {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	out := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			out <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			out <- "handshake: " + err.Error()
			return
		}
		st := tc.ConnectionState()
		if len(st.PeerCertificates) == 0 {
			out <- "no client certificate"
			return
		}
		out <- st.PeerCertificates[0].Subject.CommonName
	}()
	return ln.Addr().String(), out
}

func dial(addr string, cfg *tls.Config) error {
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Handshake()
}

func TestConfigVerifiesServerAndPresentsClientCertificate(t *testing.T) {
	f := testutil.NewTLSFiles(t)
	addr, got := serve(t, f, true)
	cfg, err := Files{CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey}.Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MinVersion != tls.VersionTLS12 {
		t.Errorf("MinVersion %#x, want TLS 1.2", cfg.MinVersion)
	}
	if err := dial(addr, cfg); err != nil {
		t.Fatalf("dial: %v", err)
	}
	if cn := <-got; cn != "fanout-test-client" {
		t.Fatalf("server saw %q, want the client certificate fanout-test-client", cn)
	}
}

func TestConfigRefusesServerOfAnotherCA(t *testing.T) {
	ours, theirs := testutil.NewTLSFiles(t), testutil.NewTLSFiles(t)
	addr, _ := serve(t, theirs, false)
	cfg, err := Files{CA: ours.CA}.Config()
	if err != nil {
		t.Fatal(err)
	}
	if err := dial(addr, cfg); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("dial a server of another CA: %v, want a certificate signed by unknown authority", err)
	}

	// Only InsecureSkipVerify accepts it.
	addr, _ = serve(t, theirs, false)
	cfg, err = Files{CA: ours.CA, InsecureSkipVerify: true}.Config()
	if err != nil {
		t.Fatal(err)
	}
	if err := dial(addr, cfg); err != nil {
		t.Fatalf("dial with InsecureSkipVerify: %v", err)
	}
}

func TestConfigErrorsNameTheFile(t *testing.T) {
	f := testutil.NewTLSFiles(t)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	tests := []struct {
		name  string
		files Files
		want  []string
	}{
		{"missing CA", Files{CA: missing}, []string{"CA file", missing, "no such file"}},
		{"CA without certificates", Files{CA: garbage}, []string{"CA file", garbage, "no PEM certificate"}},
		{"certificate without key", Files{Cert: f.ClientCert}, []string{"both"}},
		{"key without certificate", Files{Key: f.ClientKey}, []string{"both"}},
		{"unreadable certificate", Files{Cert: missing, Key: f.ClientKey}, []string{missing}},
		{"key of another certificate", Files{Cert: f.ClientCert, Key: f.ServerKey}, []string{f.ClientCert, "private key does not match"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.files.Config()
			if err == nil {
				t.Fatal("Config() = nil error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestSet(t *testing.T) {
	if (Files{}).Set() {
		t.Error("zero Files is set")
	}
	for _, f := range []Files{{CA: "x"}, {Cert: "x"}, {Key: "x"}, {InsecureSkipVerify: true}} {
		if !f.Set() {
			t.Errorf("%+v is not set", f)
		}
	}
}
