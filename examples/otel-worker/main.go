// Command otel-worker is an example fanout worker that continues the
// producer's trace with OpenTelemetry: for each delivery attempt a span,
// child of the span that produced the record (its trace context travels in
// the record's headers, which fanout delivers unchanged), with the attempt
// number, the partition and the offset as attributes. The work is a POST of
// the message's value to --target, with the trace context in the request's
// headers so that the service's spans join the trace.
//
//	go run . --connect 127.0.0.1:4987 --target http://mailer:8080/send --topic user_need
//
// The spans are written as JSON lines to --trace-file (default: standard
// output), with OpenTelemetry's stdout exporter; a real deployment would
// use an OTLP exporter instead (go.opentelemetry.io/otel/exporters/otlp).
// Neither the Go client nor the daemon depends on OpenTelemetry: this
// example is a module of its own.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/nanoservice/core-fanout/client"
)

func main() {
	fs := flag.NewFlagSet("otel-worker", flag.ContinueOnError)
	connect := fs.String("connect", "127.0.0.1:4987", "comma-separated fanout daemon addresses host:port")
	target := fs.String("target", "", "URL each message is POSTed to (required)")
	topic := fs.String("topic", "fanout", "the topic the daemon serves, for the spans' names (the daemon does not send it)")
	concurrency := fs.Int("concurrency", 8, "requests in flight at once")
	retryDelay := fs.Duration("retry-delay", 5*time.Second, "how long a message that failed transiently waits before it is delivered again")
	shutdownTimeout := fs.Duration("shutdown-timeout", 20*time.Second, "on SIGTERM, how long the requests in flight may take to finish")
	traceFile := fs.String("trace-file", "", "file the spans are written to as JSON lines (default: standard output)")
	if err := fs.Parse(os.Args[1:]); errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	} else if err != nil {
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *target == "" || *concurrency < 1 {
		fmt.Fprintln(os.Stderr, "otel-worker: --target is required and --concurrency at least 1")
		os.Exit(2)
	}
	if err := run(log, *connect, *target, *topic, *traceFile, *concurrency, *retryDelay, *shutdownTimeout); err != nil {
		log.Error("stopped", "error", err)
		os.Exit(1)
	}
	log.Info("stopped")
}

func run(log *slog.Logger, connect, target, topic, traceFile string, concurrency int, retryDelay, shutdownTimeout time.Duration) error {
	out := io.Writer(os.Stdout)
	if traceFile != "" {
		f, err := os.Create(traceFile)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	exporter, err := stdouttrace.New(stdouttrace.WithWriter(out))
	if err != nil {
		return fmt.Errorf("trace exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter))
	defer func() {
		// Export the spans still batched before exiting.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("trace provider shutdown", "error", err)
		}
	}()
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.Dial(ctx, client.Config{
		Addrs:       strings.Split(connect, ","),
		ClientID:    "example-otel-worker",
		MaxInFlight: concurrency,
		Logger:      log,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while connecting
		}
		return fmt.Errorf("connect: %w", err)
	}
	stopOnSignal := context.AfterFunc(ctx, func() {
		log.Info("shutting down: finishing the requests in flight", "timeout", shutdownTimeout)
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := c.Shutdown(sctx); err != nil {
			log.Warn("shutdown", "error", err)
		}
	})
	defer stopOnSignal()

	p := &poster{target: target, retryDelay: retryDelay, prop: prop, http: &http.Client{Timeout: 10 * time.Second}}
	handle := traced(tp.Tracer("github.com/nanoservice/core-fanout/examples/otel-worker"), prop, topic, p.post)
	// Consume returns once Shutdown is done, or when the client gives up.
	return c.Consume(context.Background(), concurrency, handle)
}

// poster posts messages to target.
type poster struct {
	target     string
	retryDelay time.Duration
	prop       propagation.TextMapPropagator
	http       *http.Client
}

// post posts one message with ctx's trace context in the request's headers:
// nil when the service took it (the message is acked), a RetryAfter error
// when it may take it later (unreachable, 429, 5xx), a plain error (a nack)
// when it refused it.
func (p *poster) post(ctx context.Context, m *client.Message) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.target, bytes.NewReader(m.Value))
	if err != nil {
		return fmt.Errorf("request: %w", err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Idempotency-Key", fmt.Sprintf("%d-%d", m.Partition, m.Offset))
	p.prop.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := p.http.Do(req)
	if err != nil {
		return client.RetryAfter(p.retryDelay, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	switch code := resp.StatusCode; {
	case code < 300:
		return nil
	case code == http.StatusTooManyRequests || code >= 500:
		return client.RetryAfter(p.retryDelay, fmt.Errorf("%s answered %s", p.target, resp.Status))
	default:
		return errors.New(p.target + " refused it: " + resp.Status)
	}
}
