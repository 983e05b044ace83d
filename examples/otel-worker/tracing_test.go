package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/nanoservice/core-fanout/client"
)

// These tests call the handler that client.Consume calls, with the
// client.Message values it passes: the span rules need no daemon. That the
// headers get from a producer through Kafka and the daemon to this handler
// unchanged, and that the built worker exports these spans, is tested
// against real servers in integration/otel_worker_test.go of the daemon's
// module (which takes no OpenTelemetry dependency: it reads the exported
// JSON).

var prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// service is the HTTP service the worker posts to: it answers the n-th
// request with codes[n] (200 past the end) and records each request's
// traceparent header.
type service struct {
	mu     sync.Mutex
	codes  []int
	parent []string
}

func (s *service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	code := http.StatusOK
	if n := len(s.parent); n < len(s.codes) {
		code = s.codes[n]
	}
	s.parent = append(s.parent, r.Header.Get("traceparent"))
	w.WriteHeader(code)
}

// produced returns a producer's span and the record headers its
// propagator writes, as a traced producer would send them.
func produced(t *testing.T, tp trace.TracerProvider) (trace.SpanContext, []client.Header) {
	t.Helper()
	ctx, span := tp.Tracer("producer").Start(context.Background(), "send orders", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	hs := headers{{Key: "app", Value: []byte("billing")}}
	prop.Inject(ctx, &hs)
	if hs.Get("traceparent") == "" {
		t.Fatalf("the propagator wrote no traceparent: %v", hs.Keys())
	}
	return span.SpanContext(), hs
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

// One span per delivery attempt, each a child of the producer's span (same
// trace, the producer's span as parent, remote), with the attempt number,
// the partition and the offset; a failed attempt has the error as its
// status; and the request to the service carries the attempt's own span as
// its parent, so the service's spans join the trace.
func TestSpanPerAttemptContinuesTheProducersTrace(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	producer, hs := produced(t, tp)

	svc := &service{codes: []int{http.StatusServiceUnavailable}}
	srv := httptest.NewServer(svc)
	defer srv.Close()
	p := &poster{target: srv.URL, retryDelay: time.Second, prop: prop, http: srv.Client()}
	handle := traced(tp.Tracer("worker"), prop, "orders", p.post)

	msg := func(attempt int) *client.Message {
		return &client.Message{Partition: 3, Offset: 42, Value: []byte("order-1"), Headers: hs, Attempt: attempt}
	}
	if err := handle(context.Background(), msg(1)); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("first attempt: %v, want the 503 as an error", err)
	}
	if err := handle(context.Background(), msg(2)); err != nil {
		t.Fatalf("second attempt: %v", err)
	}

	var spans []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.InstrumentationScope().Name == "worker" {
			spans = append(spans, s)
		}
	}
	if len(spans) != 2 {
		t.Fatalf("%d worker spans, want one per attempt (2)", len(spans))
	}
	for i, s := range spans {
		attempt := i + 1
		if got := s.Parent(); got.TraceID() != producer.TraceID() || got.SpanID() != producer.SpanID() || !got.IsRemote() {
			t.Errorf("attempt %d: parent %s/%s remote %v, want the producer's span %s/%s, remote",
				attempt, got.TraceID(), got.SpanID(), got.IsRemote(), producer.TraceID(), producer.SpanID())
		}
		if s.SpanContext().TraceID() != producer.TraceID() {
			t.Errorf("attempt %d: trace %s, want the producer's %s", attempt, s.SpanContext().TraceID(), producer.TraceID())
		}
		if s.SpanKind() != trace.SpanKindConsumer || s.Name() != "process orders" {
			t.Errorf("attempt %d: span %q of kind %v", attempt, s.Name(), s.SpanKind())
		}
		a := attrs(s)
		if a[attrAttempt].AsInt64() != int64(attempt) || a[attrPartition].AsString() != "3" || a[attrOffset].AsInt64() != 42 ||
			a[attrTopic].AsString() != "orders" || a[attrSystem].AsString() != "kafka" {
			t.Errorf("attempt %d: attributes %v", attempt, s.Attributes())
		}
		// The service saw this attempt's span as the parent of its request.
		if want := "00-" + producer.TraceID().String() + "-" + s.SpanContext().SpanID().String() + "-01"; svc.parent[i] != want {
			t.Errorf("attempt %d: the service's traceparent %q, want %q", attempt, svc.parent[i], want)
		}
	}
	if st := spans[0].Status(); st.Code != codes.Error || !strings.Contains(st.Description, "503") || len(spans[0].Events()) == 0 {
		t.Errorf("the failed attempt's status %+v, events %v: want the error", st, spans[0].Events())
	}
	if st := spans[1].Status(); st.Code == codes.Error {
		t.Errorf("the acked attempt's status %+v", st)
	}
	if spans[0].SpanContext().SpanID() == spans[1].SpanContext().SpanID() {
		t.Error("both attempts share a span")
	}
}

// A record without a trace context, or with one that is not valid, starts
// a new trace: the attempt's span is a root.
func TestSpanWithoutProducerContextIsARoot(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ok := func(context.Context, *client.Message) error { return nil }
	handle := traced(tp.Tracer("worker"), prop, "orders", ok)
	for _, hs := range [][]client.Header{
		nil,
		{{Key: "traceparent", Value: []byte("00-not-a-trace-01")}},
		{{Key: "Traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}}, // another key
	} {
		if err := handle(context.Background(), &client.Message{Headers: hs, Attempt: 1}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range rec.Ended() {
		if s.Parent().IsValid() {
			t.Errorf("span %s has parent %s: want a root", s.SpanContext().SpanID(), s.Parent().SpanID())
		}
	}
	if n := len(rec.Ended()); n != 3 {
		t.Fatalf("%d spans, want 3", n)
	}
}

// The carrier reads the first header of a key, replaces a key's value,
// and lists the keys.
func TestHeadersCarrier(t *testing.T) {
	t.Parallel()
	hs := headers{{Key: "a", Value: []byte("1")}, {Key: "a", Value: []byte("2")}}
	if hs.Get("a") != "1" || hs.Get("b") != "" {
		t.Fatalf("Get: %q %q", hs.Get("a"), hs.Get("b"))
	}
	hs.Set("a", "3")
	hs.Set("b", "4")
	if got := strings.Join(hs.Keys(), ","); got != "a,a,b" || hs.Get("a") != "3" || hs.Get("b") != "4" {
		t.Fatalf("after Set: %q %q %q", got, hs.Get("a"), hs.Get("b"))
	}
}
