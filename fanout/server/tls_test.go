package server

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/internal/testutil"
	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

// withTLS serves TLS with f's server certificate; mutual requires client
// certificates signed by f's CA.
func withTLS(t testing.TB, f testutil.TLSFiles, mutual bool) func(*Config) {
	t.Helper()
	files := tlsconf.ServerFiles{Cert: f.ServerCert, Key: f.ServerKey}
	if mutual {
		files.ClientCA = f.CA
	}
	s, err := tlsconf.NewServer(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	return func(c *Config) { c.TLS = s.Config() }
}

// dialTLS connects a raw-protocol client over TLS, trusting f's CA and
// presenting cert and key when not empty. The handshake is not run yet.
func dialTLS(t testing.TB, s *testServer, f testutil.TLSFiles, cert, key string) *client {
	t.Helper()
	cfg, err := tlsconf.Files{CA: f.CA, Cert: cert, Key: key}.Config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.ServerName = "127.0.0.1"
	raw, err := net.DialTimeout("tcp", s.Addr().String(), testTimeout)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	nc := tls.Client(raw, cfg)
	t.Cleanup(func() { _ = nc.Close() })
	return &client{t: t, nc: nc, r: protocol.NewReader(nc, 64<<20), w: protocol.NewWriter(nc, 0)}
}

func TestTLSClientIsWelcomedAndNamedByItsCertificate(t *testing.T) {
	t.Parallel()
	f := testutil.NewTLSFiles(t)
	s := startServer(t, withTLS(t, f, true))
	c := dialTLS(t, s, f, f.ClientCert, f.ClientKey)
	w := c.hello(nil)
	if st := c.nc.(*tls.Conn).ConnectionState(); st.Version < tls.VersionTLS12 {
		t.Fatalf("TLS version %x, want at least 1.2", st.Version)
	}
	sink := s.b.sink(t, w.GetSessionId())
	d := dispatch.Delivery{ID: 1, Attempt: 1, Msg: testMessage(0, 7, 10)}
	sink.Send([]dispatch.Delivery{d})
	c.expectDeliver(d)
	c.send(protocol.AckFrame([]uint64{1}))
	s.b.waitCall(t, "ack", w.GetSessionId())
	c.send(protocol.GoodbyeFrame("done"))
	testutil.WaitFor(t, testTimeout, "close log", func() bool { return len(s.closeLogs(w.GetSessionId())) > 0 })
	if id := s.closeLogs(w.GetSessionId())[0].Data["identity"]; id != "CN=fanout-test-client,O=fanout tests" {
		t.Fatalf("identity logged %v, want the certificate's subject", id)
	}
}

func TestMutualTLSRefusesBadClientCertificatesInTheHandshake(t *testing.T) {
	t.Parallel()
	f := testutil.NewTLSFiles(t)
	other := testutil.NewTLSFiles(t)
	s := startServer(t, withTLS(t, f, true))
	for _, tc := range []struct{ name, cert, key, want string }{
		{"without a certificate", "", "", "certificate required"},
		{"from another CA", other.ClientCert, other.ClientKey, "unknown certificate authority"},
		{"expired", f.ExpiredCert, f.ExpiredKey, "expired certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialTLS(t, s, f, tc.cert, tc.key)
			// TLS 1.3: the client learns the verdict when it reads.
			_ = c.nc.SetDeadline(time.Now().Add(testTimeout))
			err := c.nc.(*tls.Conn).Handshake()
			if err == nil {
				c.send(protocol.HelloFrame(&protocol.Hello{ClientId: "x", ProtocolVersion: protocol.Version}))
				_, err = c.read()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a TLS alert %q", err, tc.want)
			}
		})
	}
	if n := len(s.b.find("join", 0)); n != 0 || s.Clients() != 0 {
		t.Fatalf("%d clients joined", s.Clients())
	}
	testutil.WaitFor(t, testTimeout, "3 rejected connections", func() bool {
		return s.Stats().Closed[closeRejected] == 3
	})
}

func TestPlainTextClientOnTLSListenerIsToldInPlainText(t *testing.T) {
	t.Parallel()
	f := testutil.NewTLSFiles(t)
	s := startServer(t, withTLS(t, f, false))
	c := dial(t, s)
	c.send(protocol.HelloFrame(&protocol.Hello{ClientId: "plain", ProtocolVersion: protocol.Version}))
	e := c.expectError(protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED)
	if !strings.Contains(e.GetMessage(), "TLS") {
		t.Fatalf("error %q does not say the listener speaks TLS", e.GetMessage())
	}
	c.expectClosed()
}

func TestSilentClientOnTLSListenerIsClosedAtTheHelloTimeout(t *testing.T) {
	t.Parallel()
	f := testutil.NewTLSFiles(t)
	s := startServer(t, withTLS(t, f, false), func(c *Config) { c.HelloTimeout = 100 * time.Millisecond })
	c := dial(t, s)
	c.expectClosed()
	testutil.WaitFor(t, testTimeout, "protocol close", func() bool { return s.Stats().Closed[closeProtocol] == 1 })
}

func TestTLSClientOnPlainListenerGetsAnErrorNotAHang(t *testing.T) {
	t.Parallel()
	f := testutil.NewTLSFiles(t)
	s := startServer(t)
	c := dialTLS(t, s, f, "", "")
	_ = c.nc.SetDeadline(time.Now().Add(testTimeout))
	err := c.nc.(*tls.Conn).Handshake()
	var rhe tls.RecordHeaderError
	if !errors.As(err, &rhe) && !errors.Is(err, io.EOF) {
		t.Fatalf("handshake: %v, want a record header error (the daemon answered in plain text)", err)
	}
	testutil.WaitFor(t, testTimeout, "the close logged", func() bool {
		for _, e := range s.logs.AllEntries() {
			if e.Message == "client connection closed" && strings.Contains(fmt.Sprint(e.Data["error"]), "a TLS client on this plain-text listener") {
				return true
			}
		}
		return false
	})
}

// Named tokens beside the shared one: each passes, a named one names the
// client in the logs (never the token), an unknown one is refused.
func TestNamedTokensNameTheClient(t *testing.T) {
	t.Parallel()
	s := startServer(t, func(c *Config) {
		c.AuthToken = "shared-token"
		c.Authenticate = namedTokens(&sync.Map{}, map[string]string{"tok-billing": "billing"})
	})
	for _, tc := range []struct{ token, identity string }{{"tok-billing", "token billing"}, {"shared-token", ""}} {
		c := dial(t, s)
		w := c.hello(&protocol.Hello{ClientId: "c", ProtocolVersion: protocol.Version, AuthToken: tc.token})
		c.send(protocol.GoodbyeFrame("done"))
		testutil.WaitFor(t, testTimeout, "close log", func() bool { return len(s.closeLogs(w.GetSessionId())) > 0 })
		if got, _ := s.closeLogs(w.GetSessionId())[0].Data["identity"].(string); got != tc.identity {
			t.Errorf("token %s: identity %q, want %q", tc.token, got, tc.identity)
		}
	}
	c := dial(t, s)
	c.send(protocol.HelloFrame(&protocol.Hello{ClientId: "c", ProtocolVersion: protocol.Version, AuthToken: "tok-unknown"}))
	c.expectError(protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED)
	for _, e := range s.logs.AllEntries() {
		if line, _ := e.String(); strings.Contains(line, "tok-") || strings.Contains(line, "shared-token") {
			t.Errorf("a token is logged: %s", line)
		}
	}
}

// Mutual TLS and a named token: the identity names both.
func TestCertificateAndNamedTokenBothNameTheClient(t *testing.T) {
	t.Parallel()
	f := testutil.NewTLSFiles(t)
	s := startServer(t, withTLS(t, f, true), func(c *Config) {
		c.Authenticate = namedTokens(&sync.Map{}, map[string]string{"tok-billing": "billing"})
	})
	c := dialTLS(t, s, f, f.ClientCert, f.ClientKey)
	w := c.hello(&protocol.Hello{ClientId: "c", ProtocolVersion: protocol.Version, AuthToken: "tok-billing"})
	const identity = "CN=fanout-test-client,O=fanout tests, token billing"
	if got := s.Stats().Identities; len(got) != 1 || got[identity] != 1 {
		t.Errorf("Stats().Identities = %v, want one client %q", got, identity)
	}
	if got := s.Sessions(); len(got) != 1 || got[0].Identity != identity {
		t.Errorf("Sessions() = %+v, want the client named %q (the console shows it)", got, identity)
	}
	c.send(protocol.GoodbyeFrame("done"))
	testutil.WaitFor(t, testTimeout, "close log", func() bool { return len(s.closeLogs(w.GetSessionId())) > 0 })
	if got := s.closeLogs(w.GetSessionId())[0].Data["identity"]; got != identity {
		t.Errorf("identity %v", got)
	}
	if got := s.Stats().Identities; len(got) != 0 {
		t.Errorf("Stats().Identities = %v after the client left, want none", got)
	}
}

// namedTokens returns a Config.Authenticate of the tokens in m (token to
// name), kept in tokens by their SHA-256 so that a test can revoke one.
func namedTokens(tokens *sync.Map, m map[string]string) func([sha256.Size]byte) (string, bool) {
	for token, name := range m {
		tokens.Store(sha256.Sum256([]byte(token)), name)
	}
	return func(sum [sha256.Size]byte) (string, bool) {
		name, ok := tokens.Load(sum)
		if !ok {
			return "", false
		}
		return name.(string), true
	}
}

// Reauthorize ends, with a fatal Error UNAUTHORIZED, the sessions whose
// named token is no longer known, and they leave the backend; a session of
// a token still known, or of the shared token, stays.
func TestReauthorizeEndsSessionsOfRevokedTokens(t *testing.T) {
	t.Parallel()
	tokens := &sync.Map{}
	s := startServer(t, func(c *Config) {
		c.AuthToken = "shared-token"
		c.Authenticate = namedTokens(tokens, map[string]string{"tok-a": "a", "tok-b": "b"})
	})
	hello := func(token string) (*client, uint64) {
		c := dial(t, s)
		w := c.hello(&protocol.Hello{ClientId: token, ProtocolVersion: protocol.Version, AuthToken: token})
		s.b.waitCall(t, "join", w.GetSessionId())
		return c, w.GetSessionId()
	}
	a, aID := hello("tok-a")
	_, bID := hello("tok-b")
	_, sharedID := hello("shared-token")
	if n := s.Reauthorize(); n != 0 {
		t.Fatalf("Reauthorize ended %d sessions with every token in force, want 0", n)
	}
	tokens.Delete(sha256.Sum256([]byte("tok-a")))
	if n := s.Reauthorize(); n != 1 {
		t.Fatalf("Reauthorize ended %d sessions, want 1", n)
	}
	a.expectError(protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED)
	s.b.waitCall(t, "leave", aID)
	for _, id := range []uint64{bID, sharedID} {
		if leaves := s.b.find("leave", id); len(leaves) != 0 {
			t.Errorf("session %d left: %v", id, leaves)
		}
	}
	if n := s.Stats().Closed[closeRevoked]; n != 1 {
		t.Errorf("closed as revoked: %d, want 1", n)
	}
	if logs := s.closeLogs(aID); len(logs) != 1 || logs[0].Data["reason"] != "revoked" || logs[0].Level != logrus.WarnLevel {
		t.Errorf("close log %v, want one warning with reason revoked", logs)
	}
}

// Reauthorize ends the sessions whose certificate Config.VerifyClient now
// refuses.
func TestReauthorizeEndsSessionsOfRefusedCertificates(t *testing.T) {
	t.Parallel()
	f := testutil.NewTLSFiles(t)
	var refuse atomic.Bool
	s := startServer(t, withTLS(t, f, true), func(c *Config) {
		c.VerifyClient = func(chain []*x509.Certificate) error {
			if refuse.Load() && chain[0].Subject.CommonName == "fanout-test-client" {
				return errors.New("x509: certificate signed by unknown authority")
			}
			return nil
		}
	})
	c := dialTLS(t, s, f, f.ClientCert, f.ClientKey)
	w := c.hello(&protocol.Hello{ClientId: "c", ProtocolVersion: protocol.Version})
	s.b.waitCall(t, "join", w.GetSessionId())
	if n := s.Reauthorize(); n != 0 {
		t.Fatalf("Reauthorize ended %d sessions of accepted certificates", n)
	}
	refuse.Store(true)
	if n := s.Reauthorize(); n != 1 {
		t.Fatalf("Reauthorize ended %d sessions, want 1", n)
	}
	if e := c.expectError(protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED); !strings.Contains(e.GetMessage(), "certificate") {
		t.Errorf("error %q does not say the certificate is no longer accepted", e.GetMessage())
	}
	s.b.waitCall(t, "leave", w.GetSessionId())
}
