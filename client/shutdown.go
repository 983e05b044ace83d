package client

import (
	"context"
	"fmt"
)

// Shutdown stops the client gracefully: it takes no new messages (each
// session passes no more deliveries on, and the daemon delivers them to
// other clients), nacks the messages waiting in Messages that nobody has
// received yet (flagged unprocessed: not a failed attempt), waits for the messages already received (by Consume's
// handlers, or a loop over Messages) to be acked or nacked, sends those acks
// and a Goodbye on every session, and closes. Messages is closed when it
// returns; Shutdown never reconnects.
//
// ctx bounds the wait: when it ends first, Shutdown closes the client at
// once, as Close does (the handlers' context ends, and acks not yet queued
// return ErrClosed; the daemon delivers those messages again), and returns
// an error wrapping ctx's. A session also stops waiting after the daemon's
// ack timeout, when the daemon has delivered its messages again anyway.
// Shutdown returns nil, or the error of sending the final acks; it is safe
// to call more than once and with Close.
func (c *Client) Shutdown(ctx context.Context) error {
	c.shuttingDown.Store(true)
	select {
	case c.events <- event{kind: evShutdown}:
	case <-c.done:
	}
	for {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				return c.Close() // run has stopped: this only waits for it and frees c.ctx
			}
			_ = m.giveBack() // nobody took it: another client may, and it is not a failed attempt
		case <-ctx.Done():
			if err := c.Close(); err != nil {
				return fmt.Errorf("fanout client: shutdown: %w (closing: %v)", ctx.Err(), err)
			}
			return fmt.Errorf("fanout client: shutdown: %w", ctx.Err())
		}
	}
}
