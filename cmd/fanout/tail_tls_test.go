package main

import (
	"crypto/tls"
	"slices"
	"strings"
	"testing"

	"github.com/nanoservice/core-fanout/internal/testutil"
	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

// startMutualTLSTailDaemon is a tail daemon whose listener requires a
// client certificate signed by f's CA.
func startMutualTLSTailDaemon(t *testing.T, f testutil.TLSFiles, values ...string) *tailDaemon {
	t.Helper()
	s, err := tlsconf.NewServer(tlsconf.ServerFiles{Cert: f.ServerCert, Key: f.ServerKey, ClientCA: f.CA}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", s.Config())
	if err != nil {
		t.Fatal(err)
	}
	return startTailDaemonOn(t, ln, deliveries(values...)...)
}

func TestTailOverMutualTLS(t *testing.T) {
	t.Parallel()
	f := testutil.NewTLSFiles(t)
	d := startMutualTLSTailDaemon(t, f, "a", "b")
	out, err := runTailCommand(t, "--connect", d.addr, "--count", "2",
		"--tls-ca", f.CA, "--tls-cert", f.ClientCert, "--tls-key", f.ClientKey, "--tls-server-name", "localhost")
	if err != nil {
		t.Fatalf("tail: %v", err)
	}
	if out != "a\nb\n" {
		t.Errorf("output %q", out)
	}
	if got := d.ackedIDs(t); !slices.Equal(got, []uint64{1, 2}) {
		t.Errorf("acked %v", got)
	}
}

func TestTailWithoutClientCertificateIsRefused(t *testing.T) {
	t.Parallel()
	f := testutil.NewTLSFiles(t)
	d := startMutualTLSTailDaemon(t, f, "a")
	_, err := runTailCommand(t, "--connect", d.addr, "--count", "1", "--tls-ca", f.CA)
	if err == nil || !strings.Contains(err.Error(), "TLS refused") || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("tail: %v; want the TLS refusal", err)
	}
}
