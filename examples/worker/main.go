// Command worker is an example fanout nanoservice to copy: it hands each
// message of a topic to an HTTP service (a POST of the message's value to
// --target), with a pool of workers, and tells the daemon how it went.
//
//	go run ./examples/worker --connect 127.0.0.1:4987 --target http://mailer:8080/send
//
// What it shows:
//
//   - client.Consume runs the handler in --concurrency workers; the
//     handler's nil acks the message, its error nacks it.
//   - A transient failure (the service unreachable, a 5xx, a 429) is nacked
//     with a delay, client.RetryAfter: the daemon delivers the message again
//     no earlier than --retry-delay (or the service's Retry-After), to this
//     worker or another, and holds no worker meanwhile.
//   - A message the service refuses (another 4xx) is nacked with the
//     reason and no delay of its own: the daemon delivers it again after its
//     --retry-backoff (by default 1s, doubling with each failure, at most
//     1m). The worker does not keep track of poison messages: the
//     daemon, run with --max-attempts N --dead-letter-topic T, produces a
//     message that failed N times to T, with the reason, and moves on.
//     Transient failures count as attempts too: choose N, and --retry-delay,
//     so that N attempts outlast an outage you want to ride out.
//   - On SIGTERM or SIGINT, client.Shutdown: no new messages, the requests
//     in flight finish and are acked, then goodbye, within
//     --shutdown-timeout.
//   - Delivery is at least once, so every request carries an
//     Idempotency-Key (topic partition and offset) for the service to drop
//     a duplicate.
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nanoservice/core-fanout/client"
)

// envVars names the environment variables the worker reads, by flag: each
// is the flag's default.
var envVars = map[string]string{"connect": "FANOUT_CONNECT", "target": "WORKER_TARGET"}

// settings are the worker's flags.
type settings struct {
	connect, target                             string
	concurrency                                 int
	retryDelay, requestTimeout, shutdownTimeout time.Duration
}

// newFlags returns the worker's flag set, filling s when it parses; getenv
// reads the variables of envVars.
func newFlags(s *settings, getenv func(string) string) *flag.FlagSet {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	connect := getenv(envVars["connect"])
	if connect == "" {
		connect = "127.0.0.1:4987"
	}
	fs.StringVar(&s.connect, "connect", connect, "comma-separated fanout daemon addresses host:port ($FANOUT_CONNECT)")
	fs.StringVar(&s.target, "target", getenv(envVars["target"]), "URL each message is POSTed to ($WORKER_TARGET)")
	fs.IntVar(&s.concurrency, "concurrency", 8, "requests in flight at once")
	fs.DurationVar(&s.retryDelay, "retry-delay", 5*time.Second, "how long a message that failed transiently waits before it is delivered again")
	fs.DurationVar(&s.requestTimeout, "request-timeout", 10*time.Second, "bound of one request; past it the failure is transient")
	fs.DurationVar(&s.shutdownTimeout, "shutdown-timeout", 20*time.Second, "on SIGTERM, how long the requests in flight may take to finish")
	return fs
}

// check reports what is missing from s.
func (s *settings) check() error {
	if s.target == "" || s.concurrency < 1 {
		return errors.New("--target is required and --concurrency at least 1")
	}
	return nil
}

func main() {
	var s settings
	if err := newFlags(&s, os.Getenv).Parse(os.Args[1:]); errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	} else if err != nil {
		os.Exit(2) // the flag package has said why
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := s.check(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.Dial(ctx, client.Config{
		Addrs:       strings.Split(s.connect, ","),
		ClientID:    "example-worker",
		MaxInFlight: s.concurrency, // no more messages held than workers to take them
		Logger:      log,
	})
	if err != nil {
		if ctx.Err() != nil {
			return // interrupted while connecting
		}
		log.Error("cannot connect", "error", err)
		os.Exit(1)
	}
	stopOnSignal := context.AfterFunc(ctx, func() {
		log.Info("shutting down: finishing the requests in flight", "timeout", s.shutdownTimeout)
		sctx, cancel := context.WithTimeout(context.Background(), s.shutdownTimeout)
		defer cancel()
		if err := c.Shutdown(sctx); err != nil {
			log.Warn("shutdown", "error", err)
		}
	})
	defer stopOnSignal()

	w := &worker{target: s.target, retryDelay: s.retryDelay, http: &http.Client{Timeout: s.requestTimeout}, log: log}
	// Consume returns once Shutdown is done, or when the client gives up.
	if err := c.Consume(context.Background(), s.concurrency, w.handle); err != nil {
		log.Error("stopped", "error", err)
		os.Exit(1)
	}
	log.Info("stopped")
}

// worker posts messages to target.
type worker struct {
	target     string
	retryDelay time.Duration
	http       *http.Client
	log        *slog.Logger
}

// handle posts one message: nil when the service took it, a RetryAfter
// error when it may take it later, a plain error when it refused it.
func (w *worker) handle(ctx context.Context, m *client.Message) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.target, bytes.NewReader(m.Value))
	if err != nil {
		return fmt.Errorf("request: %w", err) // a bad --target: every message fails alike
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Idempotency-Key", fmt.Sprintf("%d-%d", m.Partition, m.Offset))
	resp, err := w.http.Do(req)
	if err != nil {
		w.log.Warn("will retry", "partition", m.Partition, "offset", m.Offset, "attempt", m.Attempt, "error", err)
		return client.RetryAfter(w.retryDelay, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	switch code := resp.StatusCode; {
	case code < 300:
		return nil
	case code == http.StatusTooManyRequests || code >= 500:
		delay := retryAfter(resp.Header.Get("Retry-After"), w.retryDelay)
		w.log.Warn("will retry", "partition", m.Partition, "offset", m.Offset, "attempt", m.Attempt, "status", resp.Status, "delay", delay)
		return client.RetryAfter(delay, fmt.Errorf("%s answered %s", w.target, resp.Status))
	default:
		w.log.Warn("refused", "partition", m.Partition, "offset", m.Offset, "attempt", m.Attempt, "status", resp.Status)
		return errors.New(w.target + " refused it: " + resp.Status)
	}
}

// retryAfter reads a Retry-After header given in seconds, or returns def.
func retryAfter(header string, def time.Duration) time.Duration {
	if s, err := strconv.Atoi(header); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return def
}
