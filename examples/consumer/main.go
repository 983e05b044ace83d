// Command consumer is an example fanout consumer: it prints every message it
// receives and acks it. Run several to see messages spread among them.
//
//	go run ./examples/consumer --connect 127.0.0.1:4987
//	go run ./examples/consumer --connect fanout1:4987,fanout2:4987,fanout3:4987
//
// The client library (package client) follows redirects to the leader,
// answers heartbeats and reconnects by itself; a consumer only reads
// Messages and acks each one after processing it. Delivery is at least
// once: process messages idempotently.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nanoservice/core-fanout/client"
)

func main() {
	connect := flag.String("connect", envOr("FANOUT_CONNECT", "127.0.0.1:4987"), "comma-separated daemon addresses host:port ($FANOUT_CONNECT)")
	maxInFlight := flag.Int("max-in-flight", 100, "messages held unacked at once")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := consume(ctx, strings.Split(*connect, ","), *maxInFlight); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// consume prints and acks messages until ctx ends or the client gives up.
func consume(ctx context.Context, addrs []string, maxInFlight int) error {
	c, err := client.Dial(ctx, client.Config{Addrs: addrs, ClientID: "example-consumer", MaxInFlight: maxInFlight})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("connect to %v: %w", addrs, err)
	}
	stopOnCancel := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stopOnCancel()
	for m := range c.Messages() {
		// Process the message here; ack only after it is done.
		fmt.Printf("partition=%d offset=%d attempt=%d key=%q value=%q\n", m.Partition, m.Offset, m.Attempt, m.Key, m.Value)
		if err := m.Ack(); err != nil && !errors.Is(err, client.ErrStale) && !errors.Is(err, client.ErrClosed) {
			return fmt.Errorf("ack: %w", err)
		}
	}
	if err := c.Close(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("close: %w", err)
	}
	return c.Err()
}

// envOr returns the environment variable name, or def when it is empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
