//go:build integration

package integration

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
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

// otelSpan is the part of a span, as OpenTelemetry's stdout exporter writes
// it, that the test reads (this module takes no OpenTelemetry dependency).
type otelSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct {
		TraceID, SpanID string
		Remote          bool
	}
	Attributes []struct {
		Key   string
		Value struct {
			Type  string
			Value any
		}
	}
	Status struct{ Code string }
}

func (s otelSpan) attr(key string) any {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value.Value
		}
	}
	return nil
}

// randomHex returns n random bytes in hex.
func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// The OpenTelemetry example worker (examples/otel-worker, a module of its
// own), built and run against a real daemon and Kafka, continues the
// producer's trace: a record produced with a W3C traceparent is delivered
// twice (the service answers 503 first), and the worker exports one span
// per attempt, each a child of the producer's span, with the attempt
// number, the partition and the offset; the service's requests carry each
// attempt's span as their parent. The spans are flushed when the worker
// stops on SIGTERM.
func TestOtelWorkerContinuesTheProducersTrace(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "otel-worker")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join("..", "examples", "otel-worker")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build examples/otel-worker: %v\n%s", err, out)
	}

	topic := uniqueName(t, "otel")
	createTopic(t, topic, 1)
	d := startDaemon(t, daemonOptions(t, topic))

	var mu sync.Mutex
	var parents []string // the traceparent of each request, in order
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		parents = append(parents, r.Header.Get("traceparent"))
		if len(parents) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()

	traceID, producerSpan := randomHex(t, 16), randomHex(t, 8)
	produce(t, topic, &sarama.ProducerMessage{Value: sarama.StringEncoder("order-1"), Headers: []sarama.RecordHeader{
		{Key: []byte("traceparent"), Value: []byte("00-" + traceID + "-" + producerSpan + "-01")},
	}})

	spansFile := filepath.Join(t.TempDir(), "spans.json")
	w := procRun(t, bin, nil, "--connect", d.addr, "--target", srv.URL, "--topic", topic,
		"--retry-delay", "200ms", "--trace-file", spansFile)
	testutil.WaitFor(t, 60*time.Second, "the service to take the message on its second request", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(parents) >= 2
	})
	semWaitOffsets(t, d, map[int32]int64{0: 1}) // acked
	w.signal(t, syscall.SIGTERM)
	if code := w.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("otel-worker exit code %d after SIGTERM:\n%s", code, w.output())
	}

	f, err := os.Open(spansFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var spans []otelSpan
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s otelSpan
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("span line %q: %v", sc.Text(), err)
		}
		spans = append(spans, s)
	}
	if len(spans) != 2 || len(parents) != 2 {
		t.Fatalf("%d spans exported and %d requests made, want 2 of each (one per attempt):\n%+v\n%s", len(spans), len(parents), spans, w.output())
	}
	for i, s := range spans {
		attempt := float64(i + 1)
		if s.Parent.TraceID != traceID || s.Parent.SpanID != producerSpan || !s.Parent.Remote || s.SpanContext.TraceID != traceID {
			t.Errorf("span %d: trace %s, parent %+v; want a child of the producer's span %s/%s", i, s.SpanContext.TraceID, s.Parent, traceID, producerSpan)
		}
		if s.attr("fanout.delivery.attempt") != attempt || s.attr("messaging.destination.partition.id") != "0" ||
			s.attr("messaging.kafka.offset") != 0.0 || s.attr("messaging.destination.name") != topic {
			t.Errorf("span %d (%s): attributes %+v, want attempt %v, partition 0, offset 0, topic %s", i, s.Name, s.Attributes, attempt, topic)
		}
		if want := "00-" + traceID + "-" + s.SpanContext.SpanID + "-01"; parents[i] != want {
			t.Errorf("request %d: traceparent %q, want the attempt's span as parent: %q", i, parents[i], want)
		}
	}
	if spans[0].Status.Code != "Error" || strings.EqualFold(spans[1].Status.Code, "Error") {
		t.Errorf("statuses %q and %q: want the failed attempt's Error, then not", spans[0].Status.Code, spans[1].Status.Code)
	}
}
