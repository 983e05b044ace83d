//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// pyRoot is the repository root, seen from this package.
const pyRoot = ".."

// pyPython returns the interpreter of the virtualenv bin/deps makes for the
// Python client's tests, failing (never skipping) when it is missing.
func pyPython(t testing.TB) string {
	t.Helper()
	py, err := filepath.Abs(filepath.Join(pyRoot, ".cache", "python", "bin", "python"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(py); err != nil {
		t.Fatalf("the Python client's virtualenv is missing (%v): run bin/deps", err)
	}
	return py
}

// pyRun runs the venv's python with args in dir (relative to the repository
// root), the Python client's sources on PYTHONPATH and env added, until it
// exits or timeout, and returns its standard output; the test fails on a
// non-zero exit, with both outputs.
func pyRun(t testing.TB, dir string, timeout time.Duration, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	src, err := filepath.Abs(filepath.Join(pyRoot, "clients", "python", "src"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, pyPython(t), args...)
	cmd.Dir = filepath.Join(pyRoot, dir)
	cmd.Env = append(append(os.Environ(), "PYTHONPATH="+src, "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python %s (in %s): %v\n%s\nstderr:\n%s", strings.Join(args, " "), dir, err, out, stderr.String())
	}
	return string(out)
}

// pyStart starts pytest on the Python client's tests selected by args, in
// the background, its output (-s: the tests' prints too) going to the
// process's log; killed at the end of the test if still running.
func pyStart(t testing.TB, env []string, args ...string) *procProcess {
	t.Helper()
	src, err := filepath.Abs(filepath.Join(pyRoot, "clients", "python", "src"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(pyPython(t), append([]string{"-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
		"-o", "log_level=INFO"}, args...)...)
	cmd.Dir = filepath.Join(pyRoot, "clients", "python")
	cmd.Env = append(append(os.Environ(), "PYTHONPATH="+src, "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"), env...)
	return procRunCmd(t, cmd)
}

// pyTest runs pytest on the Python client's tests selected by args.
func pyTest(t testing.TB, env []string, args ...string) {
	t.Helper()
	out := pyRun(t, "clients/python", 5*time.Minute, env,
		append([]string{"-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "log_level=INFO"}, args...)...)
	t.Logf("pytest %s:\n%s", strings.Join(args, " "), out)
}

// The Python client's unit tests, against its in-process fake daemon
// (framing errors, redirects, pings, members, batches).
func TestPythonClientUnit(t *testing.T) {
	t.Parallel()
	pyTest(t, nil, "tests", "-m", "not integration")
}

// The Python client against the real daemon: a wrong token is refused, then
// every message is received and acked (one nacked, one touched), the client
// closes cleanly, and the daemon commits every offset.
func TestPythonClientAgainstDaemon(t *testing.T) {
	t.Parallel()
	const partitions, n = 2, 20
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, partitions)
	addr := procFreeAddr(t)
	procStart(t, procDaemonArgs(t, id, topic, addr, "--auth-token", "py-secret")...)
	produceSeq(t, topic, "m", n, partitions)

	pyTest(t, []string{"FANOUT_TEST_DAEMONS=" + addr, "FANOUT_TEST_TOKEN=py-secret", fmt.Sprintf("FANOUT_TEST_COUNT=%d", n)},
		"tests/integration/test_daemon.py::test_consume_ack_nack_touch")
	testutil.WaitFor(t, 30*time.Second, "every offset committed", func() bool {
		offs := zkOffsets(t, id, topic)
		return offs[0] == n/partitions && offs[1] == n/partitions
	})
}

// The Python client given a follower is redirected to the leader and
// receives every message from it.
func TestPythonClientFollowsRedirect(t *testing.T) {
	t.Parallel()
	const n = 6
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, 1)
	addrs := []string{procFreeAddr(t), procFreeAddr(t)}
	for _, a := range addrs {
		procStart(t, procDaemonArgs(t, id, topic, a)...)
	}
	leader, follower := pyLeader(t, addrs)
	produceSeq(t, topic, "m", n, 1)
	pyTest(t, []string{"FANOUT_TEST_DAEMONS=" + follower, "FANOUT_TEST_LEADER=" + leader, fmt.Sprintf("FANOUT_TEST_COUNT=%d", n)},
		"tests/integration/test_daemon.py::test_redirected_to_the_leader")
	testutil.WaitFor(t, 30*time.Second, "every offset committed", func() bool { return zkOffsets(t, id, topic)[0] == n })
}

// pyLeader waits until one of the two daemons at addrs leads and the other
// redirects to it; it returns the leader's index and address, and the other's.
func pyLeader(t *testing.T, addrs []string) (leader, follower string) {
	t.Helper()
	testutil.WaitFor(t, 60*time.Second, "a leader and a follower that redirects to it", func() bool {
		a, b := clHello(addrs[0]), clHello(addrs[1])
		switch {
		case a.welcome != "" && b.redirectTo == addrs[0]:
			leader, follower = addrs[0], addrs[1]
		case b.welcome != "" && a.redirectTo == addrs[1]:
			leader, follower = addrs[1], addrs[0]
		default:
			return false
		}
		return true
	})
	return leader, follower
}

// clients/python/examples/tail.py prints the messages as JSON and acks
// them: their offsets get committed.
func TestPythonTailExample(t *testing.T) {
	t.Parallel()
	const n = 5
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, 1)
	addr := procFreeAddr(t)
	procStart(t, procDaemonArgs(t, id, topic, addr)...)
	produceSeq(t, topic, "m", n, 1)

	out := pyRun(t, "clients/python", 2*time.Minute, nil,
		"examples/tail.py", "--connect", addr, "--count", fmt.Sprint(n), "--json", "--timeout", "60")
	seen := map[int64]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			Partition *int32  `json:"partition"`
			Offset    *int64  `json:"offset"`
			Value     *string `json:"value"`
			Attempt   int     `json:"attempt"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Partition == nil || r.Offset == nil || r.Value == nil {
			t.Fatalf("line %q: not a JSON record with partition, offset and value (%v)\n%s", line, err, out)
		}
		if *r.Partition != 0 || seen[*r.Offset] || *r.Value != fmt.Sprintf("m-%d", *r.Offset) || r.Attempt < 1 {
			t.Fatalf("unexpected record %s (seen %v)", line, seen)
		}
		seen[*r.Offset] = true
	}
	if len(seen) != n {
		t.Fatalf("tail.py printed %d records, want %d:\n%s", len(seen), n, out)
	}
	testutil.WaitFor(t, 15*time.Second, "the tailed offsets committed", func() bool { return zkOffsets(t, id, topic)[0] == n })
}

// examples/python-worker stores the word count of every document, retries
// a transient failure after a nack with a delay, drops a bad document, and
// stops cleanly on SIGTERM; every offset is committed.
func TestPythonWorkerExample(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, 2)
	addr := procFreeAddr(t)
	procStart(t, procDaemonArgs(t, id, topic, addr)...)
	docs := map[string]string{"a": "one", "b": "one two", "c": "one two three", "d": "a b c d", "e": ""}
	var msgs []*sarama.ProducerMessage
	for docID, text := range docs {
		v, _ := json.Marshal(map[string]any{"id": docID, "text": text, "flaky": docID == "c"})
		msgs = append(msgs, &sarama.ProducerMessage{Key: sarama.StringEncoder(docID), Value: sarama.ByteEncoder(v)})
	}
	msgs = append(msgs, &sarama.ProducerMessage{Key: sarama.StringEncoder("bad"), Value: sarama.StringEncoder("{not json")})
	produce(t, topic, msgs...)

	outDir := t.TempDir()
	src, _ := filepath.Abs(filepath.Join(pyRoot, "clients", "python", "src"))
	var logs strings.Builder
	cmd := exec.Command(pyPython(t), "worker.py", "--connect", addr, "--out", outDir, "--retry-delay", "0.5")
	cmd.Dir = filepath.Join(pyRoot, "examples", "python-worker")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src, "PYTHONDONTWRITEBYTECODE=1")
	cmd.Stdout, cmd.Stderr = &lockedWriter{w: &logs}, &lockedWriter{w: &logs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("worker output:\n%s", logs.String())
		}
	})

	type result struct {
		ID      string `json:"id"`
		Words   int    `json:"words"`
		Attempt int    `json:"attempt"`
	}
	results := map[string]result{}
	testutil.WaitFor(t, 60*time.Second, "a result for every document", func() bool {
		for docID := range docs {
			b, err := os.ReadFile(filepath.Join(outDir, docID+".json"))
			if err != nil {
				return false
			}
			var r result
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("result of %s: %v: %s", docID, err, b)
			}
			results[docID] = r
		}
		return true
	})
	for docID, text := range docs {
		if r := results[docID]; r.ID != docID || r.Words != len(strings.Fields(text)) {
			t.Errorf("result of %s = %+v, want %d words", docID, r, len(strings.Fields(text)))
		}
	}
	if r := results["c"]; r.Attempt < 2 {
		t.Errorf("the flaky document was stored at attempt %d, want a retry (attempt 2 or more)", r.Attempt)
	}
	testutil.WaitFor(t, 30*time.Second, "every offset committed (the bad document's too)", func() bool {
		offs := zkOffsets(t, id, topic)
		return offs[0]+offs[1] == int64(len(msgs))
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("worker exited with %v after SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("worker still running 30s after SIGTERM")
	}
	for _, want := range []string{"retrying in 0.5s", "dropping a bad document", "stopping"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("worker output lacks %q:\n%s", want, logs.String())
		}
	}
}

// lockedWriter serializes writes to w (a process's stdout and stderr).
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// In spread mode the Python client given one member's address keeps a
// session with each member and receives every partition's messages.
func TestPythonClientSpread(t *testing.T) {
	t.Parallel()
	const partitions, n = 4, 40
	addrs, id, topic := pySpread(t, 2, partitions)
	produceSeq(t, topic, "m", n, partitions)
	pyTest(t, []string{"FANOUT_TEST_DAEMONS=" + addrs[0], "FANOUT_TEST_MEMBERS=" + strings.Join(addrs, ","),
		fmt.Sprintf("FANOUT_TEST_COUNT=%d", n)},
		"tests/integration/test_daemon.py::test_spread_one_session_per_member")
	testutil.WaitFor(t, 30*time.Second, "every offset committed", func() bool { return sumOffsets(zkOffsets(t, id, topic)) == n })
}

// The same on the Kafka store, no ZooKeeper: the members are the group's.
func TestPythonClientSpreadKafkaStore(t *testing.T) {
	t.Parallel()
	const partitions, n = 4, 40
	c := pySpreadOn(t, 2, partitions, true)
	produceSeq(t, c.topic, "m", n, partitions)
	var addrs []string
	for _, nd := range c.nodes {
		addrs = append(addrs, nd.addr)
	}
	pyTest(t, []string{"FANOUT_TEST_DAEMONS=" + addrs[0], "FANOUT_TEST_MEMBERS=" + strings.Join(addrs, ","),
		fmt.Sprintf("FANOUT_TEST_COUNT=%d", n)},
		"tests/integration/test_daemon.py::test_spread_one_session_per_member")
	testutil.WaitFor(t, 30*time.Second, "every offset committed", func() bool { return sumOffsets(c.offsets()) == n })
}

// pySpread starts members daemons of a new service in spread mode, on a new
// topic of partitions, and waits until each owns partitions; it returns
// their addresses, the service's id and the topic.
func pySpread(t *testing.T, members int, partitions int32) (addrs []string, id, topic string) {
	t.Helper()
	c := pySpreadOn(t, members, partitions, false)
	for _, nd := range c.nodes {
		addrs = append(addrs, nd.addr)
	}
	return addrs, c.id, c.topic
}

// pySpreadOn starts members daemons of a new service in spread mode, with
// the Kafka store or ZooKeeper, on a new topic of partitions, and waits
// until each owns partitions.
func pySpreadOn(t *testing.T, members int, partitions int32, kafkaStore bool) *clCluster {
	t.Helper()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, partitions)
	newCluster := spNewCluster
	if kafkaStore {
		newCluster = skNewCluster
	}
	c := newCluster(t, topic, members)
	c.startAll()
	conn := spConn(t, c)
	testutil.WaitFor(t, 120*time.Second, fmt.Sprintf("the %d members own partitions", members), func() bool {
		return len(spOwners(t, conn, c)) == members
	})
	return c
}

// sumOffsets is the sum of a topic's committed offsets.
func sumOffsets(offs map[int32]int64) int64 {
	var sum int64
	for _, o := range offs {
		sum += o
	}
	return sum
}

// An asyncio worker (consume, four workers) outlives a kill -9 of the leader
// under it: messages keep coming while the leader dies and is started again,
// the worker reconnects (to the other daemon once it leads, or to the
// restarted one), the messages it had in hand come again, and every offset
// gets committed; then SIGTERM stops it gracefully (close with a drain) and
// it checks that it handled every message.
func TestPythonAsyncioWorkerOutlivesKill9(t *testing.T) {
	t.Parallel()
	const partitions, n = 2, 400
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, partitions)
	addrs := []string{procFreeAddr(t), procFreeAddr(t)}
	procs := map[string]*procProcess{}
	for _, a := range addrs {
		procs[a] = procStart(t, procDaemonArgs(t, id, topic, a)...)
	}
	leader, _ := pyLeader(t, addrs)
	produced := procProducePaced(t, topic, n, partitions, 10, 100*time.Millisecond)
	worker := pyStart(t, []string{"FANOUT_TEST_DAEMONS=" + strings.Join(addrs, ","), "FANOUT_TEST_PREFIX=seq",
		fmt.Sprintf("FANOUT_TEST_COUNT=%d", n)},
		"tests/integration/test_aio.py::test_worker_outlives_a_kill_9_of_its_daemon")
	var before int64
	testutil.WaitFor(t, 90*time.Second, "the worker's first acks committed", func() bool {
		before = sumOffsets(zkOffsets(t, id, topic))
		return before >= 40
	})
	if before >= n {
		t.Fatalf("every message was committed before the kill: nothing was in flight to test")
	}
	procs[leader].signal(t, syscall.SIGKILL)
	procs[leader].wait(t, 30*time.Second)
	t.Logf("killed the leader %s with %d of %d offsets committed", leader, before, n)
	procs[leader] = procStart(t, procDaemonArgs(t, id, topic, leader)...)
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 180*time.Second, "every offset committed", func() bool {
		return sumOffsets(zkOffsets(t, id, topic)) == n
	})
	worker.signal(t, syscall.SIGTERM)
	if code := worker.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("the worker exited with %d:\n%s", code, worker.output())
	}
	t.Logf("worker:\n%s", worker.output())
}

// In spread mode the asyncio client given one address of three members
// keeps a session with each, a third of max_in_flight each, and receives
// every partition's messages.
func TestPythonAsyncioSpreadThreeMembers(t *testing.T) {
	t.Parallel()
	const partitions, n = 6, 60
	addrs, id, topic := pySpread(t, 3, partitions)
	produceSeq(t, topic, "m", n, partitions)
	pyTest(t, []string{"FANOUT_TEST_DAEMONS=" + addrs[0], "FANOUT_TEST_MEMBERS=" + strings.Join(addrs, ","),
		fmt.Sprintf("FANOUT_TEST_COUNT=%d", n)},
		"tests/integration/test_aio.py::test_spread_one_session_per_member")
	testutil.WaitFor(t, 30*time.Second, "every offset committed", func() bool { return sumOffsets(zkOffsets(t, id, topic)) == n })
}

// The asyncio client closed with a drain while its handlers run: they
// finish, and their acks reach the daemon before the Goodbye: the committed
// offset is exactly the number of messages handled (the ones queued and not
// handed out were given back, not acked).
func TestPythonAsyncioCloseDrains(t *testing.T) {
	t.Parallel()
	const n = 40
	topic := uniqueName(t, "topic")
	id := uniqueName(t, "svc")
	createTopic(t, topic, 1)
	addr := procFreeAddr(t)
	procStart(t, procDaemonArgs(t, id, topic, addr)...)
	produceSeq(t, topic, "m", n, 1)
	out := filepath.Join(t.TempDir(), "drain.json")
	pyTest(t, []string{"FANOUT_TEST_DAEMONS=" + addr, "FANOUT_TEST_OUT=" + out, fmt.Sprintf("FANOUT_TEST_COUNT=%d", n)},
		"tests/integration/test_aio.py::test_close_drains_the_handlers_in_hand")
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Handled int64 `json:"handled"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.Handled <= 0 {
		t.Fatalf("the test's result %s: %v", b, err)
	}
	testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("offset %d committed", r.Handled), func() bool {
		return zkOffsets(t, id, topic)[0] >= r.Handled
	})
	if got := zkOffsets(t, id, topic)[0]; got != r.Handled {
		t.Fatalf("committed offset %d, want %d: exactly the messages handled", got, r.Handled)
	}
}
