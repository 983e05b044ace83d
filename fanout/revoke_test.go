package fanout

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/server"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// writeFile writes content to path with modification time mod.
func writeFile(t *testing.T, path, content string, mod time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mod, mod); err != nil {
		t.Fatal(err)
	}
}

// dialAs connects a client with cfg to d (its address filled in), closed
// when the test ends.
func dialAs(t *testing.T, d *Daemon, cfg client.Config) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	cfg.Addrs = []string{d.Addr().String()}
	cfg.MaxInFlight = 10
	c, err := client.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", cfg.ClientID, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitUnauthorized waits until c has stopped on an Error UNAUTHORIZED.
func waitUnauthorized(t *testing.T, c *client.Client, what string) {
	t.Helper()
	testutil.WaitFor(t, testWait, what, func() bool {
		var re *protocol.RemoteError
		return errors.As(c.Err(), &re) && re.Code == protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED
	})
}

// holdsOne has c receive the one message produced and hold it unacked.
func holdsOne(t *testing.T, c *client.Client) *client.Message {
	t.Helper()
	m := next(t, c)
	if string(m.Value) != "job" || m.Attempt != 1 {
		t.Fatalf("got %q attempt %d, want job attempt 1", m.Value, m.Attempt)
	}
	return m
}

// getsItAgain has c receive the message a revoked session held, at once
// (the ack timeout is an hour), and ack it.
func getsItAgain(t *testing.T, c *client.Client) {
	t.Helper()
	m := next(t, c)
	if string(m.Value) != "job" || m.Attempt != 2 {
		t.Fatalf("got %q attempt %d, want job attempt 2", m.Value, m.Attempt)
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
}

// Removing a client's line from --auth-tokens-file ends its open session
// (an Error UNAUTHORIZED, then the close), and the message it held goes to
// another client at once; the other clients stay. Before, tokens were
// checked only at Hello and the session went on receiving and acking.
func TestRevokedTokenEndsItsSession(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tokens")
	mod := time.Now().Add(-time.Hour)
	writeFile(t, path, "alpha:tok-alpha\nbeta:tok-beta\n", mod)
	d, brokers, _ := soloDaemon(t, offsets.NewMemoryStore(), func(o *Options) {
		o.AuthTokensFile, o.AckTimeout = path, time.Hour
	})
	alpha := dialAs(t, d, client.Config{ClientID: "alpha", AuthToken: "tok-alpha"})
	produceTo(t, brokers, "job")
	holdsOne(t, alpha)
	beta := dialAs(t, d, client.Config{ClientID: "beta", AuthToken: "tok-beta"})

	writeFile(t, path, "beta:tok-beta\n", mod.Add(time.Minute))
	waitUnauthorized(t, alpha, "alpha's session ended as unauthorized")
	getsItAgain(t, beta)
	if err := beta.Err(); err != nil {
		t.Fatalf("beta, still in the file, stopped: %v", err)
	}
	revoked := uint64(0)
	for i, reason := range server.CloseReasons {
		if reason == "revoked" {
			revoked = d.srv.Stats().Closed[i]
		}
	}
	if revoked != 1 {
		t.Fatalf("sessions closed as revoked: %d, want 1", revoked)
	}
}

// Reload (SIGHUP) re-reads the tokens at once, even a change the files'
// modification time and size do not show, and ends the sessions whose
// token it no longer holds.
func TestReloadEndsSessionsOfRevokedTokens(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tokens")
	mod := time.Now().Add(-time.Hour)
	writeFile(t, path, "alpha:tok-alpha\nbeta:tok-beta\n", mod)
	d, brokers, _ := soloDaemon(t, offsets.NewMemoryStore(), func(o *Options) {
		o.AuthTokensFile, o.AckTimeout = path, time.Hour
	})
	alpha := dialAs(t, d, client.Config{ClientID: "alpha", AuthToken: "tok-alpha"})
	produceTo(t, brokers, "job")
	holdsOne(t, alpha)
	beta := dialAs(t, d, client.Config{ClientID: "beta", AuthToken: "tok-beta"})

	writeFile(t, path, "alpha:tok-alphX\nbeta:tok-beta\n", mod) // same size, same time
	d.Reload()
	waitUnauthorized(t, alpha, "alpha's session ended as unauthorized")
	getsItAgain(t, beta)
}

// A client CA file replaced by one that no longer signs a connected
// client's certificate ends that client's session, and the message it
// held goes to a client the new CA signs; a change that still signs it
// (a bundle with the new CA) leaves it be.
func TestClientCAChangeEndsSessionsItNoLongerSigns(t *testing.T) {
	t.Parallel()
	old, newer := testutil.NewTLSFiles(t), testutil.NewTLSFiles(t)
	pem := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	caPath := filepath.Join(t.TempDir(), "client-ca.pem")
	mod := time.Now().Add(-time.Hour)
	writeFile(t, caPath, pem(old.CA), mod)
	logger, logs := logtest.NewNullLogger()
	d, brokers, _ := soloDaemon(t, offsets.NewMemoryStore(), func(o *Options) {
		o.ClientTLS.Cert, o.ClientTLS.Key, o.ClientTLS.ClientCA = old.ServerCert, old.ServerKey, caPath
		o.AckTimeout, o.Logger = time.Hour, logrus.NewEntry(logger)
	})
	serverCA := x509.NewCertPool()
	serverCA.AppendCertsFromPEM([]byte(pem(old.CA)))
	tlsAs := func(f testutil.TLSFiles) *tls.Config {
		pair, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		return &tls.Config{RootCAs: serverCA, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	}
	first := dialAs(t, d, client.Config{ClientID: "first", TLS: tlsAs(old)})
	produceTo(t, brokers, "job")
	holdsOne(t, first)

	reloads := func() int {
		n := 0
		for _, e := range logs.AllEntries() {
			if strings.Contains(e.Message, "client TLS files reloaded") {
				n++
			}
		}
		return n
	}
	writeFile(t, caPath, pem(old.CA)+pem(newer.CA), mod.Add(time.Minute))
	testutil.WaitFor(t, testWait, "the bundle of both CAs in force", func() bool { return reloads() == 1 })
	second := dialAs(t, d, client.Config{ClientID: "second", TLS: tlsAs(newer)})
	if err := first.Err(); err != nil {
		t.Fatalf("a client the new bundle still signs stopped: %v", err)
	}

	writeFile(t, caPath, pem(newer.CA), mod.Add(2*time.Minute))
	waitUnauthorized(t, first, "the session of the client the new CA does not sign ended as unauthorized")
	getsItAgain(t, second)
}
