//go:build integration

package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/internal/testutil"
)

// exBuild builds the example ./examples/<name> into the test's temporary
// directory and returns the binary's path.
func exBuild(t testing.TB, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", bin, "./examples/"+name)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/%s: %v\n%s", name, err, out)
	}
	return bin
}

// exDaemons starts the daemons an example runs against and returns them
// and the address to give it: in leader mode one daemon; in spread mode two
// members, once every partition is owned (the example follows the member
// list from the first's address). extra are more flags of each daemon.
func exDaemons(t *testing.T, topic string, partitions int, spread bool, extra ...string) (*clCluster, string) {
	t.Helper()
	if !spread {
		c := clNewCluster(t, topic, 1)
		c.nodes[0].args = extra
		c.startAll()
		clWaitLeader(t, c.nodes, 60*time.Second)
		return c, c.nodes[0].addr
	}
	c := spNewCluster(t, topic, 2)
	for _, nd := range c.nodes {
		nd.args = append(nd.args, extra...)
	}
	c.startAll()
	spWaitOwned(t, spZK(t), c, c.nodes, partitions, 60*time.Second)
	return c, c.nodes[0].addr
}

// exCommitted returns the sum of c's committed offsets.
func exCommitted(c *clCluster) int64 {
	var sum int64
	for _, o := range c.offsets() {
		sum += o
	}
	return sum
}

// exRequest is one request the example worker made to the test's service.
type exRequest struct {
	value, key string // the body, the Idempotency-Key
	status     int
	at         time.Time // when the answer was decided, before it was sent
}

// exService is the HTTP service the example worker posts to: a job
// "job-<n>" with n a multiple of 3 fails with a 503 the first time, a
// "poison-<n>" is refused (422), "slow" waits for release; the rest is taken.
type exService struct {
	mu       sync.Mutex
	requests []exRequest
	release  chan struct{}
}

func (s *exService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	v := string(body)
	status := http.StatusOK
	switch n, _ := strconv.Atoi(strings.TrimPrefix(v, "job-")); {
	case strings.HasPrefix(v, "poison-"):
		status = http.StatusUnprocessableEntity
	case v == "slow":
		s.record(exRequest{value: v, key: r.Header.Get("Idempotency-Key"), status: 0, at: time.Now()})
		<-s.release
	case strings.HasPrefix(v, "job-") && n%3 == 0 && len(s.of(v)) == 0:
		status = http.StatusServiceUnavailable
	}
	s.record(exRequest{value: v, key: r.Header.Get("Idempotency-Key"), status: status, at: time.Now()})
	w.WriteHeader(status)
}

func (s *exService) record(r exRequest) {
	s.mu.Lock()
	s.requests = append(s.requests, r)
	s.mu.Unlock()
}

// of returns the requests for value, answered or not, in order.
func (s *exService) of(value string) []exRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []exRequest
	for _, r := range s.requests {
		if r.value == value {
			out = append(out, r)
		}
	}
	return out
}

// taken reports whether value was answered 200.
func (s *exService) taken(value string) bool {
	for _, r := range s.of(value) {
		if r.status == http.StatusOK {
			return true
		}
	}
	return false
}

// The Go worker example against real daemons with --max-attempts 3 and a
// dead-letter topic, in leader mode and in spread mode: every job reaches
// the service; a job that failed transiently comes again after the worker's
// --retry-delay, not before; a poison message is tried 3 times and lands in
// the dead-letter topic with the service's answer as the reason; and
// SIGTERM lets the request in flight finish and be acked before the worker
// exits 0.
func TestExampleWorker(t *testing.T) {
	t.Parallel()
	t.Run("leader", func(t *testing.T) { testExampleWorker(t, false) })
	t.Run("spread", func(t *testing.T) { testExampleWorker(t, true) })
}

func testExampleWorker(t *testing.T, spread bool) {
	const jobs, retryDelay = 9, 1500 * time.Millisecond
	partitions := 1
	if spread {
		partitions = 2
	}
	topic, dlq := uniqueName(t, "topic"), uniqueName(t, "dlq")
	createTopic(t, topic, int32(partitions))
	createTopic(t, dlq, 1)
	svc := &exService{release: make(chan struct{})}
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-svc.release:
		default:
			close(svc.release)
		}
	})
	worker := exBuild(t, "worker")

	var msgs []*sarama.ProducerMessage
	for i := 1; i <= jobs; i++ {
		msgs = append(msgs, &sarama.ProducerMessage{Value: sarama.StringEncoder(fmt.Sprintf("job-%d", i))})
		if i == jobs/2 {
			msgs = append(msgs, &sarama.ProducerMessage{Value: sarama.StringEncoder("poison-1")})
		}
	}
	produce(t, topic, msgs...)
	// An ack timeout above the slow request's wait: a worker's requests
	// must finish within it, or the message comes again meanwhile.
	c, addr := exDaemons(t, topic, partitions, spread, "--max-attempts", "3", "--dead-letter-topic", dlq, "--ack-timeout", "60s")
	w := procRun(t, worker, nil, "--connect", addr, "--target", srv.URL, "--concurrency", "4",
		"--retry-delay", retryDelay.String(), "--shutdown-timeout", "30s")

	testutil.WaitFor(t, 60*time.Second, "every job taken by the service", func() bool {
		for i := 1; i <= jobs; i++ {
			if !svc.taken(fmt.Sprintf("job-%d", i)) {
				return false
			}
		}
		return true
	})
	for i := 3; i <= jobs; i += 3 {
		rs := svc.of(fmt.Sprintf("job-%d", i))
		if len(rs) < 2 || rs[0].status != http.StatusServiceUnavailable {
			t.Fatalf("job-%d: requests %+v, want a 503 and then a 200", i, rs)
		}
		if gap := rs[1].at.Sub(rs[0].at); gap < retryDelay {
			t.Errorf("job-%d came again %v after its 503, before the retry delay %v", i, gap, retryDelay)
		}
		if rs[0].key == "" || rs[0].key != rs[1].key {
			t.Errorf("job-%d: Idempotency-Keys %q and %q, want the same", i, rs[0].key, rs[1].key)
		}
	}

	r := polReadTopic(t, dlq, 1)[0]
	h := polHeaders(r)
	if string(r.Value) != "poison-1" || h[kafka.HeaderDeadLetterAttempts] != "3" ||
		!strings.Contains(h[kafka.HeaderDeadLetterNackReason], "422") {
		t.Errorf("dead letter %q, headers %v: want poison-1 after 3 attempts, the reason naming the 422", r.Value, h)
	}
	if n := len(svc.of("poison-1")); n < 1 || n > 3 {
		t.Errorf("the service saw poison-1 %d times, want 3 (fewer if an attempt timed out before its request)", n)
	}

	// SIGTERM while a request is in flight: it finishes and is acked.
	produce(t, topic, &sarama.ProducerMessage{Value: sarama.StringEncoder("slow")})
	testutil.WaitFor(t, 30*time.Second, "the slow request", func() bool { return len(svc.of("slow")) == 1 })
	w.signal(t, syscall.SIGTERM)
	testutil.WaitFor(t, 30*time.Second, "the worker to begin its shutdown", func() bool {
		return w.logLine("shutting down") != ""
	})
	if w.exited() {
		t.Fatal("the worker exited with a request in flight")
	}
	close(svc.release)
	if code := w.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("the worker exited %d after SIGTERM, want 0", code)
	}
	want := int64(jobs + 2) // every job, poison-1 and slow: all done
	testutil.WaitFor(t, 30*time.Second, "the offsets committed past slow", func() bool { return exCommitted(c) == want })
	if rs := svc.of("slow"); len(rs) != 2 || rs[1].status != http.StatusOK {
		t.Errorf("slow: requests %+v, want one, answered 200", rs)
	}
}

// exProcessed matches a line the canary example logs per message.
var exProcessed = regexp.MustCompile(`msg=processed version=(\S+) partition=\d+ offset=\d+ value=(\S+)`)

// exCounts returns, per version, the values a canary example process
// logged as processed.
func exCounts(p *procProcess) map[string][]string {
	out := map[string][]string{}
	for _, m := range exProcessed.FindAllStringSubmatch(p.output(), -1) {
		out[m[1]] = append(out[m[1]], m[2])
	}
	return out
}

// The canary example against real daemons, in leader mode and in spread
// mode: a stable client of the default weight and a canary of weight 5
// share traffic they keep up with,
// every message is processed, and the canary's share is about 5/105
// (between 1% and 15%, loose for a loaded machine: a stable client whose
// credit is full lets the canary take more).
func TestExampleCanary(t *testing.T) {
	t.Parallel()
	t.Run("leader", func(t *testing.T) { testExampleCanary(t, false) })
	t.Run("spread", func(t *testing.T) { testExampleCanary(t, true) })
}

func testExampleCanary(t *testing.T, spread bool) {
	const n = 2000
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 2)
	bin := exBuild(t, "canary")
	_, addr := exDaemons(t, topic, 2, spread)
	stable := procRun(t, bin, nil, "--connect", addr, "--version", "v1")
	canary := procRun(t, bin, nil, "--connect", addr, "--version", "v2", "--weight", "5")
	for _, p := range []*procProcess{stable, canary} {
		testutil.WaitFor(t, 60*time.Second, "both versions connected", func() bool { return p.logLine("msg=connected") != "" })
	}
	// Traffic the services keep up with: with a backlog every client is
	// full and the split follows their speeds, not their weights.
	produced := procProducePaced(t, topic, n, 2, 10, 20*time.Millisecond)

	var v1, v2 []string
	testutil.WaitFor(t, 60*time.Second, "every message processed", func() bool {
		v1, v2 = exCounts(stable)["v1"], exCounts(canary)["v2"]
		seen := map[string]bool{}
		for _, v := range append(slices.Clone(v1), v2...) {
			seen[v] = true
		}
		return len(seen) == n
	})
	if err := <-produced; err != nil {
		t.Fatalf("produce: %v", err)
	}
	share := float64(len(v2)) / float64(len(v1)+len(v2))
	t.Logf("stable processed %d, canary %d: %.1f%% (weights 100 and 5: %.1f%%)", len(v1), len(v2), 100*share, 100*5.0/105)
	if share < 0.01 || share > 0.15 {
		t.Errorf("the canary processed %.1f%% of the messages, want about %.1f%%", 100*share, 100*5.0/105)
	}
	for _, p := range []*procProcess{stable, canary} {
		p.signal(t, syscall.SIGTERM)
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Errorf("exit code %d after SIGTERM, want 0", code)
		}
	}
}
