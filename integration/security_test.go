//go:build integration

package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
	"github.com/nanoservice/core-fanout/internal/testutil"
	"github.com/nanoservice/core-fanout/internal/tlsconf"
)

// secEnv is the secured listeners of the test servers: bin/services starts
// them, bin/integration exports where they are.
type secEnv struct {
	kafkaSASL []string // FANOUT_TEST_KAFKA_SASL: SASL_SSL, SCRAM and PLAIN for the user fanout
	zkTLS     []string // FANOUT_TEST_ZOOKEEPER_TLS: TLS, a client certificate required
	dir       string   // FANOUT_TEST_TLS_DIR: ca.pem, client.pem, client-key.pem, kafka-password
	password  string   // the Kafka password of the user fanout
}

// secureEnv returns the secured listeners, failing the test (never
// skipping it) when they are not there.
func secureEnv(t testing.TB) secEnv {
	t.Helper()
	e := secEnv{
		kafkaSASL: addrsFromEnv(t, "FANOUT_TEST_KAFKA_SASL", "Apache Kafka SASL_SSL listener"),
		zkTLS:     addrsFromEnv(t, "FANOUT_TEST_ZOOKEEPER_TLS", "Apache ZooKeeper TLS port"),
		dir:       os.Getenv("FANOUT_TEST_TLS_DIR"),
	}
	if e.dir == "" {
		t.Fatal("FANOUT_TEST_TLS_DIR is not set: the running services have no secured listeners or certificates. " +
			"Start them with this checkout's bin/services (bin/integration exports FANOUT_TEST_TLS_DIR from `bin/services tls-dir`)")
	}
	for _, f := range []string{"ca.pem", "client.pem", "client-key.pem", "kafka-password"} {
		if _, err := os.Stat(filepath.Join(e.dir, f)); err != nil {
			t.Fatalf("FANOUT_TEST_TLS_DIR %s: %v (made by bin/services start)", e.dir, err)
		}
	}
	for _, l := range []struct{ what, addr string }{{"Kafka SASL_SSL listener", e.kafkaSASL[0]}, {"ZooKeeper TLS port", e.zkTLS[0]}} {
		c, err := net.DialTimeout("tcp", l.addr, 5*time.Second)
		if err != nil {
			t.Fatalf("the %s at %s does not answer (%v): the services were started without it; restart them with "+
				"this checkout's bin/services", l.what, l.addr, err)
		}
		c.Close()
	}
	b, err := os.ReadFile(filepath.Join(e.dir, "kafka-password"))
	if err != nil {
		t.Fatal(err)
	}
	e.password = strings.TrimSpace(string(b))
	return e
}

func (e secEnv) file(name string) string { return filepath.Join(e.dir, name) }

// kafka is SASL_SSL with SCRAM-SHA-512 as fanout with password.
func (e secEnv) kafka(password string) kafka.Security {
	return kafka.Security{TLSFiles: tlsconf.Files{CA: e.file("ca.pem")},
		SASLMechanism: kafka.SASLSCRAMSHA512, SASLUser: "fanout", SASLPassword: password}
}

// zookeeper is TLS with the harness client certificate, auth and read.
func (e secEnv) zookeeper(auth, read string) zkstore.Security {
	return zkstore.Security{Auth: auth, ReadACL: read,
		TLSFiles: tlsconf.Files{CA: e.file("ca.pem"), Cert: e.file("client.pem"), Key: e.file("client-key.pem")}}
}

// randomSecret returns prefix and 16 random hex digits: a secret no log line
// contains by chance.
func randomSecret(t testing.TB, prefix string) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

// noSecrets fails the test if text (what is named what) contains any secret.
func noSecrets(t testing.TB, what, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			for _, line := range strings.Split(text, "\n") {
				if strings.Contains(line, s) {
					t.Errorf("%s shows a secret in: %s", what, line)
				}
			}
		}
	}
}

// secLog captures every log line of an in-process daemon at debug level.
type secLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *secLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *secLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// logger is a debug-level logrus entry writing to l.
func (l *secLog) logger() *logrus.Entry {
	lg := logrus.New()
	lg.SetOutput(l)
	lg.SetLevel(logrus.DebugLevel)
	return logrus.NewEntry(lg)
}

// saramaSink receives sarama's own log lines (its debug lines included:
// sarama.DebugLogger forwards to sarama.Logger) and passes them to the
// capture of the test under way, or drops them. sarama.Logger is set once,
// before any test runs: sarama reads it from goroutines that outlive their
// clients, so swapping it during the run would race.
type saramaSink struct {
	mu sync.Mutex
	to *secLog // nil: discard
}

func (s *saramaSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.to != nil {
		_, _ = s.to.Write(p)
	}
	return len(p), nil
}

var saramaLogs saramaSink

func init() { sarama.Logger = log.New(&saramaLogs, "[sarama] ", 0) }

// captureSarama routes sarama's own logs (silent in the daemon) to l until
// the test ends.
func captureSarama(t testing.TB, l *secLog) {
	saramaLogs.mu.Lock()
	saramaLogs.to = l
	saramaLogs.mu.Unlock()
	t.Cleanup(func() {
		saramaLogs.mu.Lock()
		saramaLogs.to = nil
		saramaLogs.mu.Unlock()
	})
}

// secProcess runs the fanout binary with args and extra environment
// variables; it is killed at the end of the test if still running.
func secProcess(t testing.TB, env []string, stdin string, args ...string) *procProcess {
	t.Helper()
	logFile, err := os.CreateTemp(t.TempDir(), "fanout-*.log")
	if err != nil {
		t.Fatal(err)
	}
	p := &procProcess{cmd: exec.Command(procBinary(t), args...), logPath: logFile.Name(), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdin = strings.NewReader(stdin)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start fanout: %v", err)
	}
	p.started = time.Now()
	go func() {
		_ = p.cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("fanout %v output:\n%s", args, p.output())
		}
	})
	return p
}

// secKafkaArgs are the flags of SASL_SSL with SCRAM-SHA-512 (the password
// comes from the environment).
func (e secEnv) kafkaArgs() []string {
	return []string{"--kafka", strings.Join(e.kafkaSASL, ","), "--kafka-tls-ca", e.file("ca.pem"),
		"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-user", "fanout"}
}

// zkArgs are the flags of ZooKeeper over TLS with a client certificate,
// the digest identity in authFile and reading for read.
func (e secEnv) zkArgs(authFile, read string) []string {
	return []string{"--zookeeper", strings.Join(e.zkTLS, ","), "--zookeeper-tls-ca", e.file("ca.pem"),
		"--zookeeper-tls-cert", e.file("client.pem"), "--zookeeper-tls-key", e.file("client-key.pem"),
		"--zookeeper-auth-file", authFile, "--zookeeper-acl-read", read}
}

// secOffsets reads the committed offsets with an authenticated TLS session.
func secOffsets(t testing.TB, sec zkstore.Security, id, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := sec.Connect(ctx, secureEnv(t).zkTLS, 10*time.Second, nil)
	if err != nil {
		t.Fatalf("zookeeper over TLS: %v", err)
	}
	defer conn.Close()
	offs, err := zkstore.New(conn, "", id, topic).Load(ctx)
	if err != nil {
		t.Fatalf("load offsets: %v", err)
	}
	return offs
}

func sum(offs map[int32]int64) int64 {
	var n int64
	for _, o := range offs {
		n += o
	}
	return n
}

// secReadyz returns the /readyz body of a metrics address ("" if it does
// not answer).
func secReadyz(addr string) string {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return b.String()
}

// The daemon consumes, elects, commits and hands over over SASL_SSL with
// SCRAM-SHA-512 and ZooKeeper over TLS with digest auth; produce and
// status work the same way; /metrics needs its token; no secret appears in
// any output at -v.
func TestSecurityEndToEnd(t *testing.T) {
	t.Parallel()
	env := secureEnv(t)
	const partitions = 2
	topic := uniqueName(t, "sec")
	createTopic(t, topic, partitions)
	id := uniqueName(t, "svc")
	zkAuth := "fanout-test:" + randomSecret(t, "zk-")
	token := randomSecret(t, "metrics-")
	authFile := filepath.Join(t.TempDir(), "zk-auth")
	if err := os.WriteFile(authFile, []byte(zkAuth+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets := []string{env.password, zkAuth, strings.SplitN(zkAuth, ":", 2)[1], token}
	environ := []string{"FANOUT_KAFKA_SASL_PASSWORD=" + env.password, "FANOUT_METRICS_TOKEN=" + token}

	type node struct {
		p             *procProcess
		addr, metrics string
	}
	var nodes []node
	for i := range 2 {
		n := node{addr: procFreeAddr(t), metrics: procFreeAddr(t)}
		args := []string{"--id", id, "--topic", topic, "--node-id", fmt.Sprintf("sec-node-%d", i),
			"--listen", n.addr, "--advertise", n.addr, "--metrics-listen", n.metrics,
			"--commit-interval", "200ms", "--ack-timeout", "5s", "--initial-offset", "oldest",
			"--cluster-heartbeat", "200ms", "--leader-timeout", "1s", "-v"}
		args = append(append(args, env.kafkaArgs()...), env.zkArgs(authFile, "auth")...)
		n.p = secProcess(t, environ, "", args...)
		nodes = append(nodes, n)
	}
	var leader, follower node
	testutil.WaitFor(t, 60*time.Second, "one daemon to lead over SASL_SSL", func() bool {
		for i, n := range nodes {
			if strings.HasPrefix(secReadyz(n.metrics), "leader: serving") {
				leader, follower = n, nodes[1-i]
				return true
			}
		}
		return false
	})

	produceLines := func(prefix string, n int) {
		t.Helper()
		var in strings.Builder
		for i := range n {
			fmt.Fprintf(&in, "%s-%d\n", prefix, i)
		}
		p := secProcess(t, environ, in.String(), append([]string{"produce", "--topic", topic, "--progress", "0"}, env.kafkaArgs()...)...)
		if code := p.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("fanout produce over SASL_SSL exited %d:\n%s", code, p.output())
		}
		noSecrets(t, "fanout produce", p.output(), secrets...)
	}
	c := dial(t, client.Config{ClientID: "sec-consumer", MaxBackoff: 500 * time.Millisecond}, leader.addr, follower.addr)
	zkSec := env.zookeeper(zkAuth, zkstore.ReadAuth)
	// consume acks every message it receives until n distinct messages with
	// prefix arrived and the committed offsets sum to committed: on a loaded
	// machine a term may end (its own heartbeats late) after a message was
	// acked to it, and the next term delivers that message again.
	consume := func(prefix string, n int, committed int64) {
		t.Helper()
		got := map[string]bool{}
		deadline := time.Now().Add(90 * time.Second)
		for len(got) < n || sum(secOffsets(t, zkSec, id, topic)) != committed {
			if time.Now().After(deadline) {
				t.Fatalf("after 90 s: %d of %d %q messages received, committed offsets %v, want them to sum to %d",
					len(got), n, prefix, secOffsets(t, zkSec, id, topic), committed)
			}
			select {
			case m, ok := <-c.Messages():
				if !ok {
					t.Fatalf("client closed: %v", c.Err())
				}
				if strings.HasPrefix(string(m.Value), prefix+"-") {
					got[string(m.Value)] = true
				}
				if err := m.Ack(); err != nil && !errors.Is(err, client.ErrStale) {
					t.Fatalf("ack: %v", err)
				}
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	produceLines("first", 20)
	consume("first", 20, 20)

	// fanout status reads the leader record and offsets with the digest
	// identity over TLS, and the heartbeats over SASL_SSL.
	st := secProcess(t, environ, "", append(append([]string{"status", "--id", id, "--topic", topic, "--json"},
		env.kafkaArgs()...), env.zkArgs(authFile, "auth")...)...)
	if code := st.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("fanout status exited %d:\n%s", code, st.output())
	}
	var status statusJSON
	if err := json.Unmarshal([]byte(st.output()), &status); err != nil {
		t.Fatalf("status --json: %v\n%s", err, st.output())
	}
	if status.Leader == nil || len(status.Members) != 2 || status.TotalLag != 0 || len(status.Partitions) != partitions {
		t.Fatalf("status: leader %+v, %d members, total lag %d, %d partitions; want a leader, 2 members, lag 0, %d partitions:\n%s",
			status.Leader, len(status.Members), status.TotalLag, len(status.Partitions), partitions, st.output())
	}
	noSecrets(t, "fanout status", st.output(), secrets...)

	// /metrics needs the token; the probes do not.
	base := "http://" + leader.metrics
	if code, _, _ := testutil.HTTPGet(t, base+"/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("/metrics without the token = %d, want 401", code)
	}
	if code, _, _ := testutil.HTTPGet(t, base+"/metrics", "Bearer "+token); code != http.StatusOK {
		t.Errorf("/metrics with the token = %d, want 200", code)
	}
	for _, probe := range []string{"/healthz", "/readyz"} {
		if code, body, _ := testutil.HTTPGet(t, base+probe, ""); code != http.StatusOK {
			t.Errorf("%s without a token = %d %q, want 200", probe, code, body)
		}
	}

	// Handover: the follower takes over, the fence and the offsets znodes,
	// which only the digest identity may write, included.
	leader.p.signal(t, syscall.SIGTERM)
	if code := leader.p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("leader exited %d after SIGTERM", code)
	}
	testutil.WaitFor(t, 60*time.Second, "the follower to lead", func() bool {
		return strings.HasPrefix(secReadyz(follower.metrics), "leader: serving")
	})
	produceLines("second", 10)
	consume("second", 10, 30)
	if line := follower.p.logLine("elected leader"); line == "" {
		t.Errorf("the follower never logged that it was elected")
	}

	follower.p.signal(t, syscall.SIGTERM)
	if code := follower.p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("daemon exited %d after SIGTERM", code)
	}
	for i, n := range nodes {
		out := n.p.output()
		if !strings.Contains(out, "level=debug") {
			t.Errorf("daemon %d logged nothing at debug level: the secret check needs -v", i)
		}
		if !strings.Contains(out, "kafka_security=\"TLS, SASL SCRAM-SHA-512 as fanout\"") {
			t.Errorf("daemon %d does not log its Kafka security", i)
		}
		noSecrets(t, fmt.Sprintf("daemon %d", i), out, secrets...)
	}
}

// A wrong Kafka password is reported clearly, retried with backoff, and
// never crashes the daemon; produce and status fail with the same clear
// error. The password, wrong or right, is in no output.
func TestSecurityWrongKafkaPassword(t *testing.T) {
	t.Parallel()
	env := secureEnv(t)
	topic := uniqueName(t, "sec")
	createTopic(t, topic, 1)
	wrong := randomSecret(t, "wrong-")
	environ := []string{"FANOUT_KAFKA_SASL_PASSWORD=" + wrong}
	args := append([]string{"--id", uniqueName(t, "svc"), "--topic", topic, "--listen", procFreeAddr(t),
		"--metrics-listen", "", "--zookeeper", strings.Join(zkAddrs(t), ","), "-v"}, env.kafkaArgs()...)
	d := secProcess(t, environ, "", args...)

	refused := func() int {
		return strings.Count(d.output(), "refused the credentials (SASL SCRAM-SHA-512, user \\\"fanout\\\")")
	}
	testutil.WaitFor(t, 60*time.Second, "two logged attempts refused for the credentials", func() bool { return refused() >= 2 || d.exited() })
	if d.exited() {
		t.Fatalf("the daemon exited on a wrong password:\n%s", d.output())
	}
	if line := d.logLine("connect to Kafka failed; retrying", "refused the credentials"); !strings.Contains(line, "level=warning") || !strings.Contains(line, "retry_in=") {
		t.Errorf("the refusal is not logged as a retried attempt: %q", line)
	}
	d.signal(t, syscall.SIGTERM)
	if code := d.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("daemon exited %d after SIGTERM", code)
	}
	noSecrets(t, "daemon", d.output(), wrong, env.password)

	p := secProcess(t, environ, "hello\n", append([]string{"produce", "--topic", topic}, env.kafkaArgs()...)...)
	if code := p.wait(t, 60*time.Second); code != 1 || !strings.Contains(p.output(), "refused the credentials") {
		t.Errorf("produce with a wrong password: exit %d, want 1 saying the credentials were refused:\n%s", code, p.output())
	}
	noSecrets(t, "produce", p.output(), wrong, env.password)

	s := secProcess(t, environ, "", append([]string{"status", "--id", "nobody", "--topic", topic,
		"--zookeeper", strings.Join(zkAddrs(t), ",")}, env.kafkaArgs()...)...)
	if code := s.wait(t, 60*time.Second); code != 1 || !strings.Contains(s.output(), "refused the credentials") {
		t.Errorf("status with a wrong password: exit %d, want 1 saying the credentials were refused:\n%s", code, s.output())
	}
	noSecrets(t, "status", s.output(), wrong, env.password)
}

// secZnodes returns the znodes a daemon of id and topic created below
// chroot: the offsets znode, its partitions, their parents below
// /consumers, and the fence znode with its parents below /fanout.
func secZnodes(t testing.TB, conn *zk.Conn, chroot, id, topic string) []string {
	t.Helper()
	dir := zkstore.OffsetsPath(chroot, id, topic)
	fence := chroot + cluster.FencePath(id, topic)
	out := []string{chroot + "/consumers/fanout_" + id, chroot + "/consumers/fanout_" + id + "/offsets", dir,
		chroot + "/fanout/" + id, chroot + "/fanout/" + id + "/" + topic, fence}
	children, _, err := conn.Children(dir)
	if err != nil {
		t.Fatalf("children of %s: %v", dir, err)
	}
	for _, c := range children {
		out = append(out, dir+"/"+c)
	}
	return out
}

// Znodes the daemon creates cannot be written, deleted, re-permissioned or
// added to by a session without the credentials (none, or wrong ones), so
// the offsets stay what the daemon committed; reading follows
// --zookeeper-acl-read. The shared parents it creates (the chroot,
// /consumers, /fanout) let others create their own znodes, nothing more.
func TestSecurityZooKeeperACL(t *testing.T) {
	t.Parallel()
	for _, read := range []string{zkstore.ReadWorld, zkstore.ReadAuth} {
		t.Run("read "+read, func(t *testing.T) {
			const partitions, n = 2, 6
			topic := uniqueName(t, "sec")
			createTopic(t, topic, partitions)
			auth := "fanout-test:" + randomSecret(t, "zk-")
			opts := daemonOptions(t, topic)
			chroot := "/" + uniqueName(t, "chroot")
			opts.ZooKeeper = []string{strings.Join(zkAddrs(t), ",") + chroot}
			opts.ZooKeeperSecurity = zkstore.Security{Auth: auth, ReadACL: read}
			d := startDaemon(t, opts)
			c := dial(t, client.Config{}, d.addr)
			produceSeq(t, topic, "acl", n, partitions)
			for range n {
				if err := recv(t, c, 30*time.Second).Ack(); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			owner, err := opts.ZooKeeperSecurity.Connect(ctx, zkAddrs(t), 10*time.Second, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			defer owner.Close()
			store := zkstore.New(owner, chroot, opts.ID, topic)
			testutil.WaitFor(t, 30*time.Second, "every ack committed", func() bool {
				offs, err := store.Load(ctx)
				return err == nil && sum(offs) == n
			})
			committed, err := store.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			znodes := secZnodes(t, owner, chroot, opts.ID, topic)
			d.stop(t)

			anonymous, err := zkstore.Connect(ctx, zkAddrs(t), 10*time.Second, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			defer anonymous.Close()
			wrongCreds, err := zkstore.Security{Auth: "fanout-test:wrong"}.Connect(ctx, zkAddrs(t), 10*time.Second, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			defer wrongCreds.Close()
			for name, conn := range map[string]*zk.Conn{"no credentials": anonymous, "wrong credentials": wrongCreds} {
				for _, p := range znodes {
					noAuth := func(op string, err error) {
						t.Helper()
						if !errors.Is(err, zk.ErrNoAuth) {
							t.Errorf("%s: %s %s = %v, want %v", name, op, p, err, zk.ErrNoAuth)
						}
					}
					_, err := conn.Set(p, []byte("0"), -1)
					noAuth("set", err)
					_, err = conn.Create(p+"/intruder", nil, 0, zk.WorldACL(zk.PermAll))
					noAuth("create a child of", err)
					_, err = conn.SetACL(p, zk.WorldACL(zk.PermAll), -1)
					noAuth("set the ACL of", err)
					_, _, err = conn.Get(p)
					if read == zkstore.ReadAuth {
						noAuth("get", err)
					} else if err != nil {
						t.Errorf("%s: get %s = %v, want it readable (--zookeeper-acl-read world)", name, p, err)
					}
				}
				dir := zkstore.OffsetsPath(chroot, opts.ID, topic)
				for p := range committed {
					err := conn.Delete(fmt.Sprintf("%s/%d", dir, p), -1)
					if !errors.Is(err, zk.ErrNoAuth) {
						t.Errorf("%s: delete partition %d's znode = %v, want %v", name, p, err, zk.ErrNoAuth)
					}
				}
				if _, err := zkstore.New(conn, chroot, opts.ID, topic).Load(ctx); read == zkstore.ReadAuth && !errors.Is(err, zk.ErrNoAuth) {
					t.Errorf("%s: Load = %v, want %v", name, err, zk.ErrNoAuth)
				}
				// Under the leader's current fence, so that only the missing
				// credentials can refuse the write.
				fencePath := chroot + cluster.FencePath(opts.ID, topic)
				_, fstat, ferr := conn.Get(fencePath)
				if ferr != nil && !errors.Is(ferr, zk.ErrNoAuth) {
					t.Fatalf("%s: get %s: %v", name, fencePath, ferr)
				}
				var fenceVersion int32
				if fstat != nil {
					fenceVersion = fstat.Version
				}
				fence := offsets.TopicFence(zkstore.Version{Path: fencePath, Version: fenceVersion})
				err := zkstore.New(conn, chroot, opts.ID, topic).Commit(ctx, fence, map[int32]int64{0: 0, 1: 0})
				if !errors.Is(err, zk.ErrNoAuth) || !strings.Contains(err.Error(), "check --zookeeper-auth") {
					t.Errorf("%s: Commit = %v, want %v with a hint", name, err, zk.ErrNoAuth)
				}
			}
			if after, err := store.Load(ctx); err != nil || !equalOffsets(after, committed) {
				t.Fatalf("offsets after the attempts: %v (%v), want %v unchanged", after, err, committed)
			}

			// Another fanout instance, with other credentials or none, can
			// still make its znodes beside this one's, and change nothing
			// shared.
			for _, shared := range []string{chroot, chroot + "/consumers", chroot + "/fanout"} {
				if _, err := anonymous.Create(shared+"/fanout_other", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
					t.Errorf("another instance cannot create its znode in %s: %v", shared, err)
				}
				if _, err := anonymous.Set(shared, []byte("x"), -1); !errors.Is(err, zk.ErrNoAuth) {
					t.Errorf("set the shared %s without credentials = %v, want %v", shared, err, zk.ErrNoAuth)
				}
				if _, err := anonymous.SetACL(shared, zk.WorldACL(zk.PermAll), -1); !errors.Is(err, zk.ErrNoAuth) {
					t.Errorf("set the ACL of the shared %s without credentials = %v, want %v", shared, err, zk.ErrNoAuth)
				}
			}
		})
	}
}

// A daemon with credentials warns once about existing znodes of its own
// that others may change, and still works.
func TestSecurityZooKeeperOpenZnodesWarned(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "sec")
	createTopic(t, topic, 1)
	opts := daemonOptions(t, topic)
	var logs secLog
	opts.Logger = logs.logger()
	opts.ZooKeeperSecurity = zkstore.Security{Auth: "fanout-test:" + randomSecret(t, "zk-")}

	// An older daemon without --zookeeper-auth left its offsets znode open.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := zkstore.Connect(ctx, zkAddrs(t), 10*time.Second, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	seedRoot := "/" + uniqueName(t, "seed-fence")
	defer deleteTree(t, conn, seedRoot) // before conn.Close
	seed := zkFence(t, conn, seedRoot)
	if err := zkstore.New(conn, "", opts.ID, topic).Commit(ctx, seed, map[int32]int64{0: 0}); err != nil {
		t.Fatal(err)
	}

	d := startDaemon(t, opts)
	c := dial(t, client.Config{}, d.addr)
	produceSeq(t, topic, "open", 1, 1)
	if err := recv(t, c, 30*time.Second).Ack(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the ack committed into the open znode", func() bool { return zkOffsets(t, opts.ID, topic)[0] == 1 })
	d.stop(t)

	var warnings []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=warning") && strings.Contains(line, "znodes that someone other than") {
			warnings = append(warnings, line)
		}
	}
	dir := zkstore.OffsetsPath("", opts.ID, topic)
	if len(warnings) != 1 {
		t.Fatalf("%d warnings about open znodes, want 1:\n%s", len(warnings), strings.Join(warnings, "\n"))
	}
	for _, p := range []string{"/consumers/fanout_" + opts.ID, dir, dir + "/0"} {
		if !strings.Contains(warnings[0], p+" ") && !strings.Contains(warnings[0], p+"]") {
			t.Errorf("the warning does not name %s: %s", p, warnings[0])
		}
	}
	if strings.Contains(warnings[0], cluster.FencePath(opts.ID, topic)) {
		t.Errorf("the warning names the fence znode, which the daemon created itself: %s", warnings[0])
	}
	noSecrets(t, "daemon", logs.String(), opts.ZooKeeperSecurity.Auth)
}

// An in-process daemon over SASL_SSL and ZooKeeper TLS with digest auth,
// every log at debug level, sarama's and go-zookeeper's own included:
// no secret in any line, and a client receives what was produced.
func TestSecurityNoSecretInLibraryLogs(t *testing.T) {
	// Not parallel: it captures sarama's process-wide logger.
	env := secureEnv(t)
	topic := uniqueName(t, "sec")
	createTopic(t, topic, 1)
	var logs secLog
	captureSarama(t, &logs)
	auth := "fanout-test:" + randomSecret(t, "zk-")
	opts := daemonOptions(t, topic)
	opts.Kafka = env.kafkaSASL
	opts.KafkaSecurity = env.kafka(env.password)
	opts.ZooKeeper = env.zkTLS
	opts.ZooKeeperSecurity = env.zookeeper(auth, zkstore.ReadWorld)
	opts.MetricsToken = randomSecret(t, "metrics-")
	opts.MetricsListen = "127.0.0.1:0"
	opts.Logger = logs.logger()
	d := startDaemon(t, opts)
	c := dial(t, client.Config{}, d.addr)
	produceSeq(t, topic, "lib", 3, 1)
	for range 3 {
		if err := recv(t, c, 30*time.Second).Ack(); err != nil {
			t.Fatal(err)
		}
	}
	d.stop(t)
	out := logs.String()
	for _, want := range []string{"[sarama] SASL authentication succeeded", "zookeeper session established", "level=debug"} {
		if !strings.Contains(out, want) {
			t.Errorf("the captured logs lack %q: the check did not see what it must", want)
		}
	}
	noSecrets(t, "logs", out, env.password, auth, strings.SplitN(auth, ":", 2)[1], opts.MetricsToken)
	if t.Failed() {
		t.Logf("logs:\n%s", out)
	}
}

// Each SASL mechanism the flag offers works against the real broker.
func TestSecurityKafkaMechanisms(t *testing.T) {
	t.Parallel()
	env := secureEnv(t)
	for _, m := range []string{kafka.SASLPlain, kafka.SASLSCRAMSHA256, kafka.SASLSCRAMSHA512} {
		t.Run(m, func(t *testing.T) {
			sec := env.kafka(env.password)
			sec.SASLMechanism = m
			cfg, err := sec.Config("fanout-integration-security")
			if err != nil {
				t.Fatal(err)
			}
			client, err := sarama.NewClient(env.kafkaSASL, cfg)
			if err != nil {
				t.Fatalf("%s over SASL_SSL: %v", m, kafka.DescribeError(env.kafkaSASL, sec, err))
			}
			defer client.Close()
			if len(client.Brokers()) == 0 {
				t.Fatal("no brokers in the metadata")
			}
		})
	}
	// Without TLS the SASL_SSL listener cannot be spoken to.
	plain := env.kafka(env.password)
	plain.TLSFiles = tlsconf.Files{}
	cfg, err := plain.Config("fanout-integration-security")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Net.DialTimeout, cfg.Net.ReadTimeout, cfg.Metadata.Retry.Max = 2*time.Second, 2*time.Second, 0
	if c, err := sarama.NewClient(env.kafkaSASL, cfg); err == nil {
		c.Close()
		t.Fatal("a client without TLS connected to the SASL_SSL listener")
	}
}

// ZooKeeper's TLS port refuses a client without a certificate, and one that
// does not trust its CA.
func TestSecurityZooKeeperTLS(t *testing.T) {
	t.Parallel()
	env := secureEnv(t)
	other := testutil.NewTLSFiles(t)
	for _, tt := range []struct {
		name  string
		files tlsconf.Files
		want  string // in the error
	}{
		{"no client certificate", tlsconf.Files{CA: env.file("ca.pem")}, "remote error: tls:"},
		{"another CA", tlsconf.Files{CA: other.CA, Cert: env.file("client.pem"), Key: env.file("client-key.pem")},
			"certificate signed by unknown authority"},
		{"plain text to the TLS port", tlsconf.Files{}, "last attempt"},
	} {
		sec := zkstore.Security{TLSFiles: tt.files}
		if tt.files == (tlsconf.Files{}) {
			sec = zkstore.Security{}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := sec.Connect(ctx, env.zkTLS, 4*time.Second, testLogger(t))
		cancel()
		if err == nil {
			conn.Close()
			t.Errorf("%s: a ZooKeeper session on the TLS port was established", tt.name)
		} else if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", tt.name, err, tt.want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := env.zookeeper("", "").Connect(ctx, env.zkTLS, 10*time.Second, testLogger(t))
	if err != nil {
		t.Fatalf("with the harness client certificate: %v", err)
	}
	conn.Close()
}
