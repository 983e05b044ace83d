//go:build integration

package integration

// The client listener over TLS and mutual TLS, and the authenticated
// heartbeat log, with daemon processes against the real Kafka and
// ZooKeeper. Helpers here are prefixed ct.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/internal/testutil"
	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

// ctClientTLS is the client side of TLS: f's CA, and cert and key when set.
func ctClientTLS(t testing.TB, ca, cert, key string) *tls.Config {
	t.Helper()
	cfg, err := tlsconf.Files{CA: ca, Cert: cert, Key: key}.Config()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// ctInstall copies src over dst through a rename, as a certificate renewal
// would.
func ctInstall(t testing.TB, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// ctServerName returns the common name of the certificate the listener at
// addr presents now.
func ctServerName(addr, ca string) (string, error) {
	cfg, err := tlsconf.Files{CA: ca}.Config()
	if err != nil {
		return "", err
	}
	cfg.ServerName = "127.0.0.1"
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

// A daemon with --tls-cert, --tls-key and --tls-client-ca: a client with a
// good certificate receives and acks; one without a certificate, with one
// from another CA, or with an expired one is refused with a clear error at
// once; a plain-text client is told the listener speaks TLS; the server
// certificate renewed on disk is served without a restart (and SIGHUP
// re-reads it); the auth token and the keys appear in no log line at -v.
func TestClientMutualTLS(t *testing.T) {
	t.Parallel()
	const n = 12
	topic, id := uniqueName(t, "topic"), uniqueName(t, "svc")
	createTopic(t, topic, 2)
	files, other := testutil.NewTLSFiles(t), testutil.NewTLSFiles(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	ctInstall(t, files.ServerCert, cert)
	ctInstall(t, files.ServerKey, key)
	token := randomSecret(t, "client-token-")
	addr := procFreeAddr(t)
	d := procStartEnv(t, append(os.Environ(), "FANOUT_AUTH_TOKEN="+token),
		procDaemonArgs(t, id, topic, addr, "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", files.CA)...)

	good := procDial(t, client.Config{TLS: ctClientTLS(t, files.CA, files.ClientCert, files.ClientKey), AuthToken: token}, addr)
	produceSeq(t, topic, "m", n, 2)
	for range n {
		m := recv(t, good, 30*time.Second)
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	testutil.WaitFor(t, 30*time.Second, "the acks committed", func() bool {
		offs := zkOffsets(t, id, topic)
		return offs[0]+offs[1] == n
	})
	if line := d.logLine("client welcomed", "identity=", "CN=fanout-test-client"); line == "" {
		t.Error("no log line names the client by its certificate's subject")
	}

	for _, tc := range []struct{ name, cert, key, want string }{
		{"without a certificate", "", "", "certificate required"},
		{"with another CA's certificate", other.ClientCert, other.ClientKey, "unknown certificate authority"},
		{"with an expired certificate", files.ExpiredCert, files.ExpiredKey, "expired certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c, err := client.Dial(ctx, client.Config{Addrs: []string{addr}, TLS: ctClientTLS(t, files.CA, tc.cert, tc.key), AuthToken: token})
			if err == nil {
				_ = c.Close()
				t.Fatal("the client was let in")
			}
			if !errors.Is(err, client.ErrTLS) || !strings.Contains(err.Error(), tc.want) || ctx.Err() != nil {
				t.Fatalf("Dial: %v; want at once a TLS refusal saying %q", err, tc.want)
			}
		})
	}
	if a := clHello(addr); a.code != protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED || !strings.Contains(a.err.Error(), "speaks TLS only") {
		t.Errorf("a plain-text client got %v, want an Error UNAUTHORIZED saying the listener speaks TLS", a)
	}
	if !strings.Contains(d.logLine("fanout starting"), `client_security="mutual TLS, auth token"`) {
		t.Errorf("start line: %s", d.logLine("fanout starting"))
	}

	// Rotation: the renewed certificate is served to new connections, the
	// daemon still running and the established client still receiving.
	ctInstall(t, files.Server2Key, key)
	ctInstall(t, files.Server2Cert, cert)
	testutil.WaitFor(t, 30*time.Second, "the renewed certificate served", func() bool {
		name, err := ctServerName(addr, files.CA)
		return err == nil && name == "fanout-test-server-2"
	})
	if d.exited() {
		t.Fatal("the daemon exited")
	}
	produceSeq(t, topic, "after-rotation", 2, 2)
	for range 2 {
		if err := recv(t, good, 30*time.Second).Ack(); err != nil {
			t.Fatalf("ack after rotation: %v", err)
		}
	}
	d.signal(t, syscall.SIGHUP)
	testutil.WaitFor(t, 15*time.Second, "SIGHUP to re-read the files", func() bool {
		return strings.Count(d.output(), "client TLS files reloaded") >= 2
	})
	if d.exited() {
		t.Fatal("the daemon exited on SIGHUP")
	}

	out := d.output()
	keys := []string{token}
	for _, k := range []string{files.ServerKey, files.Server2Key, files.ClientKey} {
		b, err := os.ReadFile(k)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if len(line) > 40 { // a line of the key's base64 body
				keys = append(keys, line)
			}
		}
	}
	noSecrets(t, "the daemon's output at -v", out, keys...)
}

// A daemon over TLS without client certificates: a Go client trusting the
// CA receives; a TLS client on a plain-text daemon gets a clear error at
// once instead of a hang.
func TestClientTLSWithoutClientCertificates(t *testing.T) {
	t.Parallel()
	topic, id := uniqueName(t, "topic"), uniqueName(t, "svc")
	createTopic(t, topic, 1)
	files := testutil.NewTLSFiles(t)
	tlsAddr, plainAddr := procFreeAddr(t), procFreeAddr(t)
	procStart(t, procDaemonArgs(t, id, topic, tlsAddr, "--tls-cert", files.ServerCert, "--tls-key", files.ServerKey)...)
	c := procDial(t, client.Config{TLS: ctClientTLS(t, files.CA, "", "")}, tlsAddr)
	produceSeq(t, topic, "m", 1, 1)
	if err := recv(t, c, 30*time.Second).Ack(); err != nil {
		t.Fatal(err)
	}

	procStart(t, procDaemonArgs(t, uniqueName(t, "svc"), topic, plainAddr)...)
	testutil.WaitFor(t, 60*time.Second, "the plain-text daemon to answer", func() bool { return clHello(plainAddr).err == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := client.Dial(ctx, client.Config{Addrs: []string{plainAddr}, TLS: ctClientTLS(t, files.CA, "", "")})
	if !errors.Is(err, client.ErrTLS) || !strings.Contains(err.Error(), "plain text") || ctx.Err() != nil {
		t.Fatalf("Dial: %v; want at once an error saying the daemon answered in plain text", err)
	}
}

// With --cluster-secret, heartbeats forged without the MAC change nothing:
// neither the leader's forged goodbye (which, believed, lets the others
// depose it) nor a forged leader with a huge epoch and a foreign address.
// No deposition, no redirect elsewhere; each member says once that someone
// writes unauthenticated records. The secret is in no log line.
func TestClusterSecretForgedHeartbeatsChangeNothing(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, clPartitions)
	secret := randomSecret(t, "cluster-secret-")
	file := filepath.Join(t.TempDir(), "cluster-secret")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := clNewCluster(t, topic, 3)
	for _, nd := range c.nodes {
		nd.args = append(nd.args, "--cluster-secret-file", file)
	}
	c.startAll()
	leader := clWaitLeader(t, c.nodes, 60*time.Second)
	epoch, node, _ := electorFence(t, zkConnect(t), clFencePath(t, c))
	if node != leader.id {
		t.Fatalf("fence record names %s, the daemons %s", node, leader.id)
	}
	for _, nd := range c.nodes {
		nd.mark(t, "forged")
	}
	const foreign = "127.0.0.1:1"
	clForge(t, c,
		&cluster.Heartbeat{NodeId: leader.id, Addr: leader.addr, Epoch: epoch, Role: cluster.Role_ROLE_FOLLOWER, Leaving: true},
		&cluster.Heartbeat{NodeId: "zz-forged", Addr: foreign, Epoch: math.MaxUint64, Role: cluster.Role_ROLE_LEADER,
			ClaimEpoch: math.MaxUint64},
		&cluster.Heartbeat{NodeId: "zz-forged", Addr: foreign, Epoch: epoch, Role: cluster.Role_ROLE_CANDIDATE, ClaimEpoch: epoch + 1},
	)
	testutil.WaitFor(t, 15*time.Second, "every daemon to say that someone writes unauthenticated records", func() bool {
		for _, nd := range c.nodes {
			if len(clGrep(nd.logAfter("forged"), "someone writes records without a valid MAC")) == 0 {
				return false
			}
		}
		return true
	})
	// An absence of change: probe for three leader timeouts.
	for end := time.Now().Add(3 * clLeaderTimeout); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, nd := range c.nodes {
			a := clHello(nd.addr)
			switch {
			case nd == leader && a.welcome != leader.id:
				t.Fatalf("the leader %s stopped welcoming clients after the forged heartbeats: %v", leader.id, a)
			case nd != leader && (a.redirectTo != leader.addr || a.redirectNode != leader.id):
				t.Fatalf("%s answers %v after the forged heartbeats, want a redirect to %s", nd.id, a, leader.id)
			}
		}
	}
	for _, nd := range c.nodes {
		lines := nd.logAfter("forged")
		if got := clGrep(lines, "lost leadership"); len(got) > 0 {
			t.Errorf("%s lost leadership: %q", nd.id, got)
		}
		if got := clGrep(lines, "someone writes records without a valid MAC"); len(got) != 1 {
			t.Errorf("%s said %d times that someone writes unauthenticated records, want once", nd.id, len(got))
		}
		if got := clGrep(nd.logAfter(""), "heartbeats are not authenticated"); len(got) > 0 {
			t.Errorf("%s warns that heartbeats are not authenticated, with a secret: %q", nd.id, got)
		}
		noSecrets(t, nd.id+"'s log at -v", strings.Join(nd.logAfter(""), "\n"), secret)
	}
	if e, n, _ := electorFence(t, zkConnect(t), clFencePath(t, c)); e != epoch || n != leader.id {
		t.Errorf("fence record now %s at epoch %d, want %s at %d", n, e, leader.id, epoch)
	}
}

// Named tokens (--auth-tokens-file): a client with one is welcomed and
// named by it in the logs; the file rewritten revokes the token at once,
// without a restart; no token appears in any log line at -v.
func TestClientNamedTokens(t *testing.T) {
	t.Parallel()
	topic, id := uniqueName(t, "topic"), uniqueName(t, "svc")
	createTopic(t, topic, 1)
	billing, reports := randomSecret(t, "tok-billing-"), randomSecret(t, "tok-reports-")
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte("# clients\nbilling:"+billing+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := procFreeAddr(t)
	d := procStart(t, procDaemonArgs(t, id, topic, addr, "--auth-tokens-file", file)...)
	c := procDial(t, client.Config{AuthToken: billing}, addr)
	produceSeq(t, topic, "m", 1, 1)
	if err := recv(t, c, 30*time.Second).Ack(); err != nil {
		t.Fatal(err)
	}
	if d.logLine("client welcomed", "identity=", "token billing") == "" {
		t.Error("no log line names the client by its token's name")
	}
	// billing holds a second message, unacked (the ack timeout is 2 s):
	// revoking its token ends its session and the message goes to reports.
	produceSeq(t, topic, "m", 1, 1)
	held := recv(t, c, 30*time.Second)

	ctInstall(t, writeTemp(t, "reports:"+reports+"\n"), file)
	testutil.WaitFor(t, 30*time.Second, "billing's open session ended as unauthorized", func() bool {
		var re *protocol.RemoteError
		return errors.As(c.Err(), &re) && re.Code == protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED
	})
	if d.logLine("client connection closed", "reason=revoked", "token billing") == "" {
		t.Errorf("no log line says billing's session was ended as revoked:\n%s", d.output())
	}
	r := procDial(t, client.Config{AuthToken: reports}, addr)
	if m := recv(t, r, 30*time.Second); m.Offset != held.Offset || m.Attempt < 2 {
		t.Errorf("reports got offset %d attempt %d, want the message billing held (offset %d) again", m.Offset, m.Attempt, held.Offset)
	} else if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	dialWith := func(token string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := client.Dial(ctx, client.Config{Addrs: []string{addr}, AuthToken: token})
		if err == nil {
			_ = c.Close()
		}
		return err
	}
	if err := dialWith(billing); err == nil || !strings.Contains(err.Error(), "UNAUTHORIZED") {
		t.Errorf("the revoked token: %v, want refused", err)
	}
	if err := dialWith(reports); err != nil {
		t.Errorf("the new token: %v", err)
	}
	if d.logLine("client tokens file reloaded", "tokens=1") == "" {
		t.Error("the reload is not logged")
	}
	noSecrets(t, "the daemon's output at -v", d.output(), billing, reports)
}

// writeTemp writes content to a new file of the test and returns its path.
func writeTemp(t testing.TB, content string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "content-*")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// Spread mode secured: two members with mutual TLS and the cluster secret.
// A Go client given one address connects to each member over TLS (the
// server name from each member's address), receives every partition's
// messages and acks them; heartbeats forged without the MAC (the leader's
// name and epoch, an assignment giving every partition to a foreign
// address) move no partition.
func TestSpreadOverMutualTLSWithClusterSecret(t *testing.T) {
	t.Parallel()
	const n, partitions = 40, 4
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	files := testutil.NewTLSFiles(t)
	secret := filepath.Join(t.TempDir(), "cluster-secret")
	if err := os.WriteFile(secret, []byte(randomSecret(t, "cluster-secret-")), 0o600); err != nil {
		t.Fatal(err)
	}
	c := spNewCluster(t, topic, 2)
	for _, nd := range c.nodes {
		nd.args = append(nd.args, "--tls-cert", files.ServerCert, "--tls-key", files.ServerKey,
			"--tls-client-ca", files.CA, "--cluster-secret-file", secret)
	}
	c.startAll()
	conn := spZK(t)
	owned := spWaitOwned(t, conn, c, c.nodes, partitions, 60*time.Second)

	cl := procDial(t, client.Config{TLS: ctClientTLS(t, files.CA, files.ClientCert, files.ClientKey), MaxInFlight: 20}, c.nodes[0].addr)
	produceSeq(t, topic, "m", n, partitions)
	from := map[string]int{}
	for range n {
		m := recv(t, cl, 30*time.Second)
		from[m.Member()]++
		if err := m.Ack(); err != nil {
			t.Fatalf("ack: %v", err)
		}
	}
	for _, nd := range c.nodes {
		if from[nd.addr] == 0 {
			t.Errorf("nothing received from %s (%s): %v", nd.id, nd.addr, from)
		}
	}
	testutil.WaitFor(t, 30*time.Second, "every ack committed", func() bool {
		offs, total := zkOffsets(t, c.id, topic), int64(0)
		for _, o := range offs {
			total += o
		}
		return total == n
	})

	epoch, leaderID, _ := electorFence(t, conn, clFencePath(t, c))
	var leaderAddr string
	for _, nd := range c.nodes {
		nd.mark(t, "forged")
		if nd.id == leaderID {
			leaderAddr = nd.addr
		}
	}
	clForge(t, c, &cluster.Heartbeat{NodeId: leaderID, Addr: leaderAddr, Epoch: epoch, Role: cluster.Role_ROLE_LEADER,
		Mode: cluster.Mode_MODE_SPREAD, Instance: "forger",
		Assignment: &cluster.PartitionAssignment{Epoch: epoch, Generation: 1 << 40, Partitions: partitions,
			Owners: []*cluster.PartitionOwner{{NodeId: "zz-forged", Addr: "127.0.0.1:1", Partitions: []int32{0, 1, 2, 3}}}}})
	testutil.WaitFor(t, 15*time.Second, "both members to say that someone writes unauthenticated records", func() bool {
		for _, nd := range c.nodes {
			if len(clGrep(nd.logAfter("forged"), "someone writes records without a valid MAC")) == 0 {
				return false
			}
		}
		return true
	})
	for end := time.Now().Add(3 * clLeaderTimeout); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if now := spOwners(t, conn, c); !maps.EqualFunc(now, owned, slices.Equal) {
			t.Fatalf("ownership moved after the forged assignment: %v, was %v", now, owned)
		}
	}
	for _, nd := range c.nodes {
		if got := clGrep(nd.logAfter("forged"), "assignment accepted"); len(got) > 0 {
			t.Errorf("%s accepted an assignment after the forgery: %q", nd.id, got)
		}
	}
}

// The Python client's tail.py over TLS (--tls-ca) against a daemon with
// --tls-cert: it receives and acks, the offsets are committed.
func TestPythonTailOverTLS(t *testing.T) {
	t.Parallel()
	const n = 3
	topic, id := uniqueName(t, "topic"), uniqueName(t, "svc")
	createTopic(t, topic, 1)
	files := testutil.NewTLSFiles(t)
	addr := procFreeAddr(t)
	procStart(t, procDaemonArgs(t, id, topic, addr, "--tls-cert", files.ServerCert, "--tls-key", files.ServerKey)...)
	produceSeq(t, topic, "m", n, 1)
	out := pyRun(t, "clients/python", 2*time.Minute, nil,
		"examples/tail.py", "--connect", addr, "--count", fmt.Sprint(n), "--tls-ca", files.CA, "--timeout", "60")
	if got := strings.Fields(out); len(got) != n {
		t.Fatalf("tail.py printed %q, want %d values", out, n)
	}
	testutil.WaitFor(t, 15*time.Second, "the tailed offsets committed", func() bool { return zkOffsets(t, id, topic)[0] == n })
}
