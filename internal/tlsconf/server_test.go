package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// handshakeWith runs one handshake between a client of cfg and a server of
// s over a pipe and returns the server certificate's common name the client
// saw, or the client's error.
func handshakeWith(t *testing.T, s *Server, client *tls.Config) (string, error) {
	t.Helper()
	a, b := pipe(t)
	srv := tls.Server(a, s.Config())
	done := make(chan error, 1)
	go func() { done <- srv.Handshake(); _ = srv.Close() }()
	c := tls.Client(b, client)
	err := c.Handshake()
	if err == nil {
		// TLS 1.3: the server checks the client's certificate after the
		// client's handshake ended; its verdict arrives with the first read.
		_, err = c.Read(make([]byte, 1))
		if strings.Contains(errString(err), "EOF") {
			err = nil
		}
	}
	_ = c.Close()
	<-done
	if err != nil {
		return "", err
	}
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func clientOf(t *testing.T, f testutil.TLSFiles, withCert bool) *tls.Config {
	t.Helper()
	files := Files{CA: f.CA}
	if withCert {
		files.Cert, files.Key = f.ClientCert, f.ClientKey
	}
	cfg, err := files.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.ServerName = "localhost"
	return cfg
}

// copyFile writes src's content to dst and moves dst's modification time
// forward, so that a rewrite within the file system's time granularity is
// seen as a change.
func copyFile(t *testing.T, src, dst string, mod time.Time) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(dst, mod, mod); err != nil {
		t.Fatal(err)
	}
}

func TestServerPicksUpRotatedFilesWithoutReload(t *testing.T) {
	f := testutil.NewTLSFiles(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	copyFile(t, f.ServerCert, cert, time.Now())
	copyFile(t, f.ServerKey, key, time.Now())
	var reloads []error
	s, err := NewServer(ServerFiles{Cert: cert, Key: key}, func(err error) { reloads = append(reloads, err) })
	if err != nil {
		t.Fatal(err)
	}
	if cn, err := handshakeWith(t, s, clientOf(t, f, false)); err != nil || cn != "fanout-test-server" {
		t.Fatalf("before rotation: %q, %v", cn, err)
	}
	later := time.Now().Add(time.Minute)
	copyFile(t, f.Server2Cert, cert, later)
	copyFile(t, f.Server2Key, key, later)
	if cn, err := handshakeWith(t, s, clientOf(t, f, false)); err != nil || cn != "fanout-test-server-2" {
		t.Fatalf("after rotation: %q, %v; want the new certificate", cn, err)
	}
	if len(reloads) != 1 || reloads[0] != nil {
		t.Fatalf("reloads reported: %v, want one success", reloads)
	}
}

func TestServerKeepsThePreviousFilesWhenTheNewOnesDoNotLoad(t *testing.T) {
	f := testutil.NewTLSFiles(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	copyFile(t, f.ServerCert, cert, time.Now())
	copyFile(t, f.ServerKey, key, time.Now())
	var reloads []error
	s, err := NewServer(ServerFiles{Cert: cert, Key: key}, func(err error) { reloads = append(reloads, err) })
	if err != nil {
		t.Fatal(err)
	}
	// The certificate renewed, its key not yet: they do not match.
	copyFile(t, f.Server2Cert, cert, time.Now().Add(time.Minute))
	if cn, err := handshakeWith(t, s, clientOf(t, f, false)); err != nil || cn != "fanout-test-server" {
		t.Fatalf("half-renewed files: %q, %v; want the previous certificate still served", cn, err)
	}
	if len(reloads) != 1 || reloads[0] == nil || !strings.Contains(reloads[0].Error(), cert) {
		t.Fatalf("reloads reported: %v, want one error naming %s", reloads, cert)
	}
	// Reload (SIGHUP) after the key arrived.
	copyFile(t, f.Server2Key, key, time.Now().Add(time.Minute))
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if cn, err := handshakeWith(t, s, clientOf(t, f, false)); err != nil || cn != "fanout-test-server-2" {
		t.Fatalf("after reload: %q, %v", cn, err)
	}
}

func TestServerMutualTLSRefusesClientsWithoutAGoodCertificate(t *testing.T) {
	f := testutil.NewTLSFiles(t)
	other := testutil.NewTLSFiles(t)
	s, err := NewServer(ServerFiles{Cert: f.ServerCert, Key: f.ServerKey, ClientCA: f.CA}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !s.MutualTLS() {
		t.Fatal("MutualTLS false with a client CA")
	}
	if _, err := handshakeWith(t, s, clientOf(t, f, true)); err != nil {
		t.Fatalf("good client refused: %v", err)
	}
	if _, err := handshakeWith(t, s, clientOf(t, f, false)); err == nil {
		t.Fatal("a client without a certificate was let in")
	}
	foreign := clientOf(t, f, false)
	pair, err := tls.LoadX509KeyPair(other.ClientCert, other.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	foreign.Certificates = []tls.Certificate{pair}
	if _, err := handshakeWith(t, s, foreign); err == nil {
		t.Fatal("a client with another CA's certificate was let in")
	}
	expired := clientOf(t, f, false)
	if pair, err = tls.LoadX509KeyPair(f.ExpiredCert, f.ExpiredKey); err != nil {
		t.Fatal(err)
	}
	expired.Certificates = []tls.Certificate{pair}
	if _, err := handshakeWith(t, s, expired); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired client certificate: %v, want refused as expired", err)
	}
}

func TestServerRefusesTLSBelow12AndBadFiles(t *testing.T) {
	f := testutil.NewTLSFiles(t)
	s, err := NewServer(ServerFiles{Cert: f.ServerCert, Key: f.ServerKey}, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := clientOf(t, f, false)
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if _, err := handshakeWith(t, s, old); err == nil {
		t.Fatal("a TLS 1.1 client was let in")
	}
	for _, bad := range []ServerFiles{
		{Cert: f.ServerCert},
		{ClientCA: f.CA},
		{Cert: f.ServerCert, Key: f.ClientKey},
		{Cert: f.ServerCert, Key: f.ServerKey, ClientCA: f.ServerKey},
	} {
		if _, err := NewServer(bad, nil); err == nil {
			t.Errorf("NewServer(%+v) succeeded", bad)
		}
	}
}

// pipe returns the two ends of an in-memory connection, closed at the end
// of the test.
func pipe(t *testing.T) (net.Conn, net.Conn) {
	a, b := net.Pipe()
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return a, b
}

// BenchmarkServerCurrent measures what the rotation check adds to each
// handshake: three stat calls and a comparison, when nothing changed.
func BenchmarkServerCurrent(b *testing.B) {
	f := testutil.NewTLSFiles(b)
	s, err := NewServer(ServerFiles{Cert: f.ServerCert, Key: f.ServerKey, ClientCA: f.CA}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = s.current()
	}
}

// BenchmarkServerHandshake measures a whole mutual TLS handshake (TLS 1.3,
// ECDSA P-256) through the Server's configuration, for comparison.
func BenchmarkServerHandshake(b *testing.B) {
	f := testutil.NewTLSFiles(b)
	s, err := NewServer(ServerFiles{Cert: f.ServerCert, Key: f.ServerKey, ClientCA: f.CA}, nil)
	if err != nil {
		b.Fatal(err)
	}
	client, err := Files{CA: f.CA, Cert: f.ClientCert, Key: f.ClientKey}.Config()
	if err != nil {
		b.Fatal(err)
	}
	client.ServerName = "localhost"
	b.ReportAllocs()
	for b.Loop() {
		a, c := net.Pipe()
		srv := tls.Server(a, s.Config())
		done := make(chan error, 1)
		go func() { done <- srv.Handshake() }()
		if err := tls.Client(c, client).Handshake(); err != nil {
			b.Fatal(err)
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		_ = a.Close()
		_ = c.Close()
	}
}

// VerifyClient checks a chain against the client CA in force now: a
// client certificate the CA signs passes, an expired one or one of another
// CA does not; after the CA file is replaced (Refresh sees it) the old
// client's chain is refused. Without a client CA every chain passes.
func TestServerVerifyClientFollowsTheClientCA(t *testing.T) {
	f, other := testutil.NewTLSFiles(t), testutil.NewTLSFiles(t)
	ca := filepath.Join(t.TempDir(), "client-ca.pem")
	copyFile(t, f.CA, ca, time.Now().Add(-time.Hour))
	var reloads []error
	s, err := NewServer(ServerFiles{Cert: f.ServerCert, Key: f.ServerKey, ClientCA: ca}, func(err error) { reloads = append(reloads, err) })
	if err != nil {
		t.Fatal(err)
	}
	chain := func(cert string) []*x509.Certificate {
		pair, err := tls.LoadX509KeyPair(cert, strings.TrimSuffix(cert, ".pem")+"-key.pem")
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return []*x509.Certificate{c}
	}
	if err := s.VerifyClient(chain(f.ClientCert)); err != nil {
		t.Fatalf("a client the CA signs: %v", err)
	}
	for name, c := range map[string][]*x509.Certificate{"expired": chain(f.ExpiredCert), "another CA's": chain(other.ClientCert), "none": nil} {
		if err := s.VerifyClient(c); err == nil {
			t.Errorf("%s certificate passed", name)
		}
	}
	copyFile(t, other.CA, ca, time.Now())
	s.Refresh()
	if len(reloads) != 1 || reloads[0] != nil {
		t.Fatalf("reloads after Refresh: %v, want one that worked", reloads)
	}
	if err := s.VerifyClient(chain(f.ClientCert)); err == nil {
		t.Fatal("the old CA's client passed after the CA was replaced")
	}
	if err := s.VerifyClient(chain(other.ClientCert)); err != nil {
		t.Fatalf("the new CA's client: %v", err)
	}

	plain, err := NewServer(ServerFiles{Cert: f.ServerCert, Key: f.ServerKey}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.VerifyClient(nil); err != nil {
		t.Fatalf("without a client CA: %v", err)
	}
}
