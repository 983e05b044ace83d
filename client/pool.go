package client

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// Handler processes one message for Consume. It returns nil once the
// message is processed, and Consume acks it; an error makes Consume nack it,
// so the daemon delivers it again: at once (or after its --retry-backoff),
// or no earlier than d from now for an error made by RetryAfter(d, err).
// The error's text goes with the nack as its reason, into the daemon's logs
// and, when the message fails --max-attempts times, the fanout.dlq.*
// headers of its dead-letter record. A handler may ack, nack or touch the
// message itself; Consume then does nothing more with it.
//
// ctx ends when Consume's ctx does, or when the client closes (Close, or
// Shutdown's deadline): a handler that sees it end may return an error, and
// the message comes again. Shutdown before its deadline leaves it alone, so
// that running handlers finish.
type Handler func(ctx context.Context, m *Message) error

// Consume runs h on the client's messages in concurrency goroutines (the
// workers; at least 1), and acks or nacks each message by h's outcome (see
// Handler). A handler that panics nacks its message: the panic and its stack
// are logged (Config.Logger) and the worker goes on with the next message.
//
// Consume returns once every worker has stopped: when ctx ends (nil), or
// when Messages is closed, after Shutdown or Close or when the client
// stopped on its own (Err). A worker stops taking messages at either, and
// lets its running handler return first. For a graceful stop call Shutdown
// (from a signal handler, say) while Consume runs: it stops the deliveries,
// waits for the running handlers, and Consume returns once it is done.
//
// The workers are the only goroutines: none is started per message, so
// concurrency bounds the handlers running at once. More workers than
// Config.MaxInFlight have nothing to do: the client holds no more messages.
func (c *Client) Consume(ctx context.Context, concurrency int, h Handler) error {
	if concurrency < 1 {
		return fmt.Errorf("fanout client: Consume with concurrency %d: at least 1", concurrency)
	}
	if h == nil {
		return errors.New("fanout client: Consume with a nil handler")
	}
	// The handlers' context: ctx, ended too by the client's closing.
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(c.ctx, cancel)
	defer stop()

	var wg sync.WaitGroup
	wg.Add(concurrency)
	for range concurrency {
		go func() {
			defer wg.Done()
			for {
				select {
				case m, ok := <-c.msgs:
					if !ok {
						return
					}
					c.handle(hctx, h, m)
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	wg.Wait()
	return nil
}

// RetryAfter returns err marked for Consume to nack the message with a
// delay: the daemon delivers it again no earlier than d from now (at most
// protocol.MaxNackDelay), to this client or another. Use it for a failure
// that may pass, a dependency that is down, say; for a message that can
// never succeed, return the error as it is, and let the daemon's
// --max-attempts send it to the dead-letter topic.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("retry")
	}
	return &retryError{delay: d, err: err}
}

// retryError is RetryAfter's error.
type retryError struct {
	delay time.Duration
	err   error
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// handle runs h on m and acks or nacks m by the outcome.
func (c *Client) handle(ctx context.Context, h Handler, m *Message) {
	err := c.call(ctx, h, m)
	if err == nil {
		err = m.Ack()
	} else {
		var delay time.Duration
		var re *retryError
		if errors.As(err, &re) {
			delay = re.delay
		}
		c.log.Debug("handler failed: nacking the message", "partition", m.Partition, "offset", m.Offset,
			"attempt", m.Attempt, "delay", delay, "error", err)
		err = m.NackWith(delay, protocol.NackReason(&protocol.Nack{Reason: err.Error()}))
	}
	if err != nil && !errors.Is(err, ErrAlreadyAcked) {
		// ErrStale, ErrClosed: the daemon delivers the message again.
		c.log.Debug("ack or nack not sent: the message comes again", "partition", m.Partition, "offset", m.Offset, "error", err)
	}
}

// call runs h on m, turning a panic into an error after logging it.
func (c *Client) call(ctx context.Context, h Handler, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("handler panicked: nacking the message", "partition", m.Partition, "offset", m.Offset,
				"attempt", m.Attempt, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return h(ctx, m)
}
