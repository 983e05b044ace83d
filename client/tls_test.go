package client

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// startFakeTLS serves TLS with f's server certificate and records the
// server name each client asked for.
func startFakeTLS(tb testing.TB, f testCA, names chan<- string) *fakeDaemon {
	tb.Helper()
	cfg := &tls.Config{Certificates: []tls.Certificate{f.server}, MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			names <- h.ServerName
			return nil, nil
		}}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return startFakeOn(tb, ln)
}

// clientTLS is a client's TLS configuration that trusts f's CA.
func clientTLS(tb testing.TB, f testCA) *tls.Config {
	tb.Helper()
	return &tls.Config{RootCAs: f.pool, MinVersion: tls.VersionTLS12}
}

func TestTLSServerNameTakenFromEachAddress(t *testing.T) {
	t.Parallel()
	f := newTestCA(t)
	names := make(chan string, 4)
	follower, leader := startFakeTLS(t, f, names), startFakeTLS(t, f, names)
	_, port, _ := net.SplitHostPort(leader.addr())
	go func() {
		fc := follower.accept(t)
		fc.expectHello(t)
		fc.send(t, protocol.RedirectFrame(net.JoinHostPort("localhost", port), "leader", 1))
	}()
	go func() {
		fc := leader.accept(t)
		fc.handshake(t)
		fc.deliver(t, 1, "over TLS")
	}()
	c := dial(t, Config{Addrs: []string{follower.addr()}, TLS: clientTLS(t, f)})
	if m := <-c.Messages(); string(m.Value) != "over TLS" {
		t.Fatalf("got %q", m.Value)
	}
	// No SNI for an IP address; the redirect's host name for the leader.
	if first, second := <-names, <-names; first != "" || second != "localhost" {
		t.Fatalf("server names %q, %q; want none for 127.0.0.1, then localhost from the redirect", first, second)
	}
}

func TestTLSRefusalsStopDialAtOnce(t *testing.T) {
	t.Parallel()
	f := newTestCA(t)
	other := newTestCA(t)
	names := make(chan string, 4)
	tlsDaemon := startFakeTLS(t, f, names)
	plain := startFake(t)
	go func() {
		fc := tlsDaemon.accept(t)
		_, _ = fc.read(testTimeout) // runs the server's side of the handshake
	}()
	go func() {
		// A plain-text daemon reads the ClientHello as a huge frame and
		// answers in plain text, as fanout's does.
		fc := plain.accept(t)
		_, _ = fc.read(testTimeout)
		fc.send(t, protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE, true, "frame too large"))
	}()
	for _, tc := range []struct {
		name, addr string
		cfg        *tls.Config
		want       string
	}{
		{"plain-text daemon", plain.addr(), clientTLS(t, f), "plain text"},
		{"untrusted daemon", tlsDaemon.addr(), clientTLS(t, other), "not trusted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			_, err := Dial(ctx, testConfig(Config{Addrs: []string{tc.addr}, TLS: tc.cfg}))
			if !errors.Is(err, ErrTLS) || !strings.Contains(err.Error(), tc.want) || ctx.Err() != nil {
				t.Fatalf("Dial: %v; want at once an ErrTLS saying %q", err, tc.want)
			}
		})
	}
}

// In spread mode the client connects to each member at the address listed,
// over TLS, with the server name taken from that address.
func TestTLSSpreadServerNameTakenFromEachMember(t *testing.T) {
	t.Parallel()
	f := newTestCA(t)
	names := make(chan string, 8)
	first, second := startFakeTLS(t, f, names), startFakeTLS(t, f, names)
	_, port, _ := net.SplitHostPort(second.addr())
	byName := net.JoinHostPort("localhost", port)
	members := []string{first.addr(), byName}
	ch := dialAsync(t, Config{Addrs: []string{first.addr()}, MaxInFlight: 10, TLS: clientTLS(t, f)})
	boot := first.join(t, 10, members...)
	c := connected(t, ch)
	boot.expectGoodbye(t)
	first.join(t, 5, members...)
	fc := second.join(t, 5, members...)
	fc.deliver(t, 1, "from the second member")
	if m := <-c.Messages(); string(m.Value) != "from the second member" || m.Member() != byName {
		t.Fatalf("got %q from %s", m.Value, m.Member())
	}
	got := map[string]int{}
	for range 3 {
		got[<-names]++
	}
	// No SNI for 127.0.0.1 (the bootstrap and the first member), localhost
	// for the member listed by name.
	if got[""] != 2 || got["localhost"] != 1 {
		t.Fatalf("server names %v, want two without and one localhost", got)
	}
}
