//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

var (
	procBuildOnce sync.Once
	procBinPath   string
	procBuildErr  error
)

// procBinary builds cmd/fanout once per package run and returns its path.
// The module root is the parent of this package's directory.
// TestMain removes the binary procBinary built, once every test is done.
func TestMain(m *testing.M) {
	code := m.Run()
	if procBinPath != "" {
		_ = os.RemoveAll(filepath.Dir(procBinPath))
	}
	os.Exit(code)
}

func procBinary(t testing.TB) string {
	t.Helper()
	procBuildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fanout-integration-bin-")
		if err != nil {
			procBuildErr = err
			return
		}
		procBinPath = filepath.Join(dir, "fanout")
		cmd := exec.Command("go", "build", "-o", procBinPath, "./cmd/fanout")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			procBuildErr = fmt.Errorf("go build ./cmd/fanout: %v\n%s", err, out)
		}
	})
	if procBuildErr != nil {
		t.Fatal(procBuildErr)
	}
	return procBinPath
}

// procFreeAddr returns a loopback address with a port nobody listens on.
func procFreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// procProcess is a process the test runs (fanout, or an example); its
// stdout and stderr go to a file that is printed if the test fails.
type procProcess struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the process has exited
	started time.Time
}

// procStart runs the fanout binary with args until the test ends (then it
// is killed if still running).
func procStart(t testing.TB, args ...string) *procProcess {
	t.Helper()
	return procStartEnv(t, nil, args...)
}

// procStartEnv is procStart with the environment env (nil: the test's).
func procStartEnv(t testing.TB, env []string, args ...string) *procProcess {
	t.Helper()
	return procRun(t, procBinary(t), env, args...)
}

// procRun runs the program bin (fanout, or another one the test built) with
// the environment env (nil: the test's) and args until the test ends.
func procRun(t testing.TB, bin string, env []string, args ...string) *procProcess {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	return procRunCmd(t, cmd)
}

// procRunCmd starts cmd, its output going to a file, until the test ends;
// then it is killed, with its process group when it has one of its own
// (SysProcAttr.Setpgid).
func procRunCmd(t testing.TB, cmd *exec.Cmd) *procProcess {
	t.Helper()
	name := filepath.Base(cmd.Path)
	logFile, err := os.CreateTemp(t.TempDir(), name+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	p := &procProcess{cmd: cmd, logPath: logFile.Name(), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p.started = time.Now()
	go func() {
		_ = p.cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	group := cmd.SysProcAttr != nil && cmd.SysProcAttr.Setpgid
	t.Cleanup(func() {
		if group {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // what the process started too
		}
		if !p.exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s %v output:\n%s", name, cmd.Args[1:], p.output())
		}
	})
	return p
}

func (p *procProcess) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// output returns what the process wrote so far.
func (p *procProcess) output() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// signal sends sig to the process.
func (p *procProcess) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("send %v: %v", sig, err)
	}
}

// wait returns the exit code once the process has exited, failing the test
// after timeout.
func (p *procProcess) wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("%s still running %v later:\n%s", filepath.Base(p.cmd.Path), timeout, p.output())
		return -1
	}
}

// logLine returns the first line of the output containing every one of
// substrs, or "".
func (p *procProcess) logLine(substrs ...string) string {
next:
	for _, line := range strings.Split(p.output(), "\n") {
		for _, s := range substrs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		return line
	}
	return ""
}

// procDaemonArgs returns the flags of a daemon of topic with service id,
// listening on addr, with short timeouts and a fast election, plus extra.
func procDaemonArgs(t testing.TB, id, topic, addr string, extra ...string) []string {
	args := []string{
		"--id", id, "--topic", topic,
		"--kafka", strings.Join(kafkaAddrs(t), ","), "--zookeeper", strings.Join(zkAddrs(t), ","),
		"--listen", addr, "--commit-interval", "200ms", "--ack-timeout", "2s", "--initial-offset", "oldest",
		"--cluster-heartbeat", "200ms", "--leader-timeout", "1s", "--metrics-listen", "", "-v",
	}
	return append(args, extra...)
}

// procDial connects a Go client to addr, retrying until a daemon welcomes
// it (a process may still be starting); closed at cleanup.
func procDial(t testing.TB, cfg client.Config, addr string) *client.Client {
	t.Helper()
	cfg.Addrs = []string{addr}
	cfg.ClientID = t.Name()
	cfg.MaxBackoff = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("client.Dial(%s): %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// procProducePaced produces n messages "seq-<i>", message i to partition
// i % partitions, in batches of batch every interval, in the background.
// The returned channel yields the first error, or is closed when all are
// produced.
func procProducePaced(t testing.TB, topic string, n, partitions, batch int, interval time.Duration) <-chan error {
	t.Helper()
	producer := manualProducer(t)
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		defer producer.Close()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; i < n; {
			var msgs []*sarama.ProducerMessage
			for ; i < n && len(msgs) < batch; i++ {
				msgs = append(msgs, &sarama.ProducerMessage{
					Topic: topic, Partition: int32(i % partitions), Value: sarama.StringEncoder(fmt.Sprintf("seq-%d", i)),
				})
			}
			if err := producer.SendMessages(msgs); err != nil {
				errc <- err
				return
			}
			<-tick.C
		}
	}()
	return errc
}

// procStore is how a process test runs daemons of one offset store: their
// flags, how it reads their committed offsets, how it starts them.
type procStore struct {
	args    func(t testing.TB, id, topic, addr string, extra ...string) []string
	offsets func(t testing.TB, id, topic string) map[int32]int64
	start   func(t testing.TB, args ...string) *procProcess
}

// procStoreZooKeeper runs daemons of the ZooKeeper offset store.
var procStoreZooKeeper = procStore{args: procDaemonArgs, offsets: zkOffsets, start: procStart}

// kill -9 loses nothing: every message is acked at least once across the
// crash, and the only duplicates are at or after the offsets committed when
// the process died.
func TestKillNineLosesNothing(t *testing.T) {
	t.Parallel()
	testKillNineLosesNothing(t, procStoreZooKeeper)
}

// testKillNineLosesNothing is the test, with daemons of store.
func testKillNineLosesNothing(t *testing.T, store procStore) {
	const partitions, n = 3, 600
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, partitions)

	addr1 := procFreeAddr(t)
	p1 := store.start(t, store.args(t, id, topic, addr1)...)
	c1 := procDial(t, client.Config{MaxInFlight: 50}, addr1)
	produced := procProducePaced(t, topic, n, partitions, 20, 100*time.Millisecond)

	acked := map[string]bool{}   // values acked at least once
	ackedAt := map[procPO]bool{} // records acked at least once
	seq := map[procPO]string{}   // record -> value, as delivered
	duplicates := 0              // deliveries of records already acked
	consume := func(m *client.Message) {
		po := procPO{m.Partition, m.Offset}
		if v, ok := seq[po]; ok && v != string(m.Value) {
			t.Fatalf("%v delivered with value %q, earlier %q", po, m.Value, v)
		}
		seq[po] = string(m.Value)
		if ackedAt[po] {
			duplicates++
		}
		if err := m.Ack(); err != nil {
			return // the connection ended: not acked, will come again
		}
		acked[string(m.Value)], ackedAt[po] = true, true
	}
	for len(acked) < n/2 {
		consume(recv(t, c1, 30*time.Second))
	}
	p1.signal(t, syscall.SIGKILL)
	p1.wait(t, 10*time.Second)
	committedAtKill := store.offsets(t, id, topic)
	t.Logf("killed after %d acks; committed offsets at the kill: %v", len(acked), committedAtKill)
	// The committed offsets never pass what the client acked.
	for p, o := range committedAtKill {
		for off := int64(0); off < o; off++ {
			if !ackedAt[procPO{p, off}] {
				t.Fatalf("committed offset %d of partition %d, but p%d@%d was never acked", o, p, p, off)
			}
		}
	}
	_ = c1.Close()

	addr2 := procFreeAddr(t)
	store.start(t, store.args(t, id, topic, addr2)...)
	c2 := procDial(t, client.Config{MaxInFlight: 50}, addr2)
	for len(acked) < n {
		m := recv(t, c2, 30*time.Second)
		if m.Offset < committedAtKill[m.Partition] {
			t.Fatalf("p%d@%d (%s) delivered after the restart, below the offset %d committed at the kill",
				m.Partition, m.Offset, m.Value, committedAtKill[m.Partition])
		}
		consume(m)
	}
	if err := <-produced; err != nil {
		t.Fatalf("produce: %v", err)
	}
	for i := range n {
		if v := fmt.Sprintf("seq-%d", i); !acked[v] {
			t.Fatalf("%s never acked", v)
		}
	}
	testutil.WaitFor(t, 15*time.Second, "every partition committed to its end", func() bool {
		offs := store.offsets(t, id, topic)
		for p := range int32(partitions) {
			if offs[p] != n/partitions {
				return false
			}
		}
		return true
	})
	t.Logf("%d duplicate deliveries across the kill -9 (%d messages)", duplicates, n)
}

// procRaw is a raw protocol client: its reader answers pings and passes
// every other frame on.
type procRaw struct {
	conn   net.Conn
	mu     sync.Mutex // guards w
	w      *protocol.Writer
	frames chan *protocol.Frame // closed when the connection ends
}

func procRawDial(t testing.TB, addr string, maxInFlight uint32) *procRaw {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := &procRaw{conn: conn, w: protocol.NewWriter(conn, 0), frames: make(chan *protocol.Frame, 100)}
	go func() {
		defer close(c.frames)
		r := protocol.NewReader(conn, 0)
		for {
			f := new(protocol.Frame)
			if err := r.ReadFrame(f); err != nil {
				return
			}
			if ping := f.GetPing(); ping != nil {
				_ = c.send(protocol.PongFrame(ping.GetNonce()))
				continue
			}
			c.frames <- f
		}
	}()
	if err := c.send(protocol.HelloFrame(&protocol.Hello{
		ClientId: t.Name(), ProtocolVersion: protocol.Version, MaxInFlight: maxInFlight,
	})); err != nil {
		t.Fatalf("hello: %v", err)
	}
	return c
}

func (c *procRaw) send(f *protocol.Frame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.w.WriteFrame(f); err != nil {
		return err
	}
	return c.w.Flush()
}

// next returns the next frame other than a ping, failing after timeout or
// when the connection ends.
func (c *procRaw) next(t testing.TB, timeout time.Duration) *protocol.Frame {
	t.Helper()
	select {
	case f, ok := <-c.frames:
		if !ok {
			t.Fatal("connection closed")
		}
		return f
	case <-time.After(timeout):
		t.Fatalf("no frame within %v", timeout)
		return nil
	}
}

// SIGTERM drains: the client holding unacked messages is told Goodbye, its
// acks sent afterwards still count, the process exits 0 without waiting for
// the drain timeout, and the acked offsets are committed.
func TestSigtermDrainsAndCommits(t *testing.T) {
	t.Parallel()
	const n = 5
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, 1)
	addr := procFreeAddr(t)
	p := procStart(t, procDaemonArgs(t, id, topic, addr, "--drain-timeout", "60s")...)
	procDial(t, client.Config{}, addr).Close() // waits until it serves

	produceSeq(t, topic, "m", n, 1)
	c := procRawDial(t, addr, 10)
	if f := c.next(t, 30*time.Second); f.GetWelcome() == nil {
		t.Fatalf("first frame %v, want Welcome", f)
	}
	var ids []uint64
	for len(ids) < n {
		f := c.next(t, 30*time.Second)
		d := f.GetDeliver()
		if d == nil {
			t.Fatalf("frame %v, want Deliver", f)
		}
		ids = append(ids, d.GetDeliveryId())
	}

	p.signal(t, syscall.SIGTERM)
	var goodbye *protocol.Goodbye
	for goodbye == nil {
		f := c.next(t, 30*time.Second)
		if goodbye = f.GetGoodbye(); goodbye == nil && f.GetDeliver() != nil {
			t.Fatalf("delivery after SIGTERM: %v", f)
		}
	}
	t.Logf("goodbye: %q", goodbye.GetReason())
	if p.exited() {
		t.Fatal("the process exited with messages outstanding, before the drain timeout")
	}
	acked := time.Now()
	if err := c.send(protocol.AckFrame(ids)); err != nil {
		t.Fatalf("ack after goodbye: %v", err)
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	t.Logf("exited %v after the acks", time.Since(acked).Round(time.Millisecond))
	if p.logLine("draining") == "" {
		t.Error("no log line about draining")
	}
	if got := zkOffsets(t, id, topic); got[0] != n {
		t.Fatalf("committed offsets %v after the drain, want partition 0 at %d", got, n)
	}
}

// With Kafka or ZooKeeper out of reach the daemon stays up, says which and
// where and that it retries, and still exits 0 promptly on SIGTERM.
func TestUnreachableServicesAreRetried(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, service, flag string
	}{
		{"kafka", "Kafka", "--kafka"},
		{"zookeeper", "ZooKeeper", "--zookeeper"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			closed := procFreeAddr(t)
			args := procDaemonArgs(t, uniqueName(t, "svc"), uniqueName(t, "topic"), procFreeAddr(t))
			args[slices.Index(args, tc.flag)+1] = closed
			p := procStart(t, args...)
			var line string
			testutil.WaitFor(t, 60*time.Second, "a warning naming "+tc.service+" at "+closed, func() bool {
				line = p.logLine("level=warning", tc.service, closed, "retrying")
				return line != "" || p.exited()
			})
			if p.exited() {
				t.Fatalf("fanout exited (code %d) with %s unreachable", p.cmd.ProcessState.ExitCode(), tc.service)
			}
			t.Logf("after %v: %s", time.Since(p.started).Round(time.Millisecond), line)
			if since := time.Since(p.started); since < 5*time.Second {
				select {
				case <-p.done:
					t.Fatalf("fanout exited (code %d) with %s unreachable", p.cmd.ProcessState.ExitCode(), tc.service)
				case <-time.After(5*time.Second - since):
				}
			}
			// The first retry waits at most 500 ms: a second from now the
			// daemon is inside its next attempt to connect, where SIGTERM
			// must be as prompt as between attempts.
			time.Sleep(time.Second)
			term := time.Now()
			p.signal(t, syscall.SIGTERM)
			if code := p.wait(t, 10*time.Second); code != 0 {
				t.Fatalf("exit code %d after SIGTERM, want 0", code)
			}
			t.Logf("exited %v after SIGTERM", time.Since(term).Round(time.Millisecond))
		})
	}
}

// Bad flags: exit code 2 and a message on stderr naming the flag.
func TestBadFlagsExitTwo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--id", "bad id!", "--topic", "t", "--listen", "127.0.0.1:0"}, "--id"},
		{[]string{"--id", "x", "--topic", "t", "--ack-timeout", "soon"}, "ack-timeout"},
	} {
		cmd := exec.Command(procBinary(t), tc.args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatalf("start: %v", err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("fanout %q still running after 30s", tc.args)
		}
		if code := cmd.ProcessState.ExitCode(); code != 2 {
			t.Errorf("fanout %q: exit code %d, want 2; stderr:\n%s", tc.args, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("fanout %q: stderr does not mention %q:\n%s", tc.args, tc.want, stderr.String())
		}
	}
}

// fanout tail against a running daemon prints the messages as JSON and
// acks them: their offsets get committed.
func TestTailPrintsAndAcks(t *testing.T) {
	t.Parallel()
	const n = 5
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, 1)
	addr := procFreeAddr(t)
	procStart(t, procDaemonArgs(t, id, topic, addr)...)
	produceSeq(t, topic, "m", n, 1)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, procBinary(t), "tail", "--connect", addr, "--count", strconv.Itoa(n),
		"--json", "--timeout", "60s")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("fanout tail: %v\nstderr:\n%s", err, stderr.String())
	}
	seen := map[int64]bool{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var r struct {
			Partition *int32  `json:"partition"`
			Offset    *int64  `json:"offset"`
			Value     *string `json:"value"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Partition == nil || r.Offset == nil || r.Value == nil {
			t.Fatalf("line %q: not a JSON record with partition, offset and value (%v)", sc.Text(), err)
		}
		if *r.Partition != 0 || seen[*r.Offset] || *r.Value != fmt.Sprintf("m-%d", *r.Offset) {
			t.Fatalf("unexpected record %s (seen %v)", sc.Text(), seen)
		}
		seen[*r.Offset] = true
	}
	if len(seen) != n {
		t.Fatalf("tail printed %d records, want %d:\n%s", len(seen), n, stdout.String())
	}
	testutil.WaitFor(t, 15*time.Second, "the tailed offsets committed", func() bool { return zkOffsets(t, id, topic)[0] == n })
}
