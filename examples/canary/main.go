// Command canary is an example of a canary release behind fanout: the same
// service runs twice, the version in production with the default weight and
// the new version, the canary, with a small one. The daemon hands each
// client a share of the messages proportional to its weight (Config.Weight,
// 100 by default), so the canary sees a small part of the real traffic:
//
//	canary --version v1                # stable: weight 100
//	canary --version v2 --weight 5     # canary: about 5/105 of the messages
//
// Watch the canary (its logs, its errors); promote it by restarting it with
// the default weight and retiring v1, or stop it: its messages in flight go
// back to the others (SIGTERM lets them finish first). Several stable
// replicas each count: beside two of weight 100, a canary of weight 5 gets
// about 5/205. The weights split the traffic the clients keep up with: the
// daemon skips a client whose credit (MaxInFlight) is full, so under a
// backlog each version gets what it can take.
//
// Each message processed is logged with the version that processed it, so
// the split shows in the logs.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nanoservice/core-fanout/client"
)

func main() {
	connect := flag.String("connect", envOr("FANOUT_CONNECT", "127.0.0.1:4987"), "comma-separated fanout daemon addresses host:port ($FANOUT_CONNECT)")
	version := flag.String("version", "v1", "the version of this service, in its client id and its logs")
	weight := flag.Int("weight", 0, "the share of the messages relative to the other clients (0: the daemon's default, 100)")
	concurrency := flag.Int("concurrency", 4, "messages processed at once")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stdout, nil)).With("version", *version)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.Dial(ctx, client.Config{
		Addrs:    strings.Split(*connect, ","),
		ClientID: "canary-example-" + *version,
		Weight:   *weight,
		Logger:   log,
	})
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		fmt.Fprintln(os.Stderr, "canary: cannot connect:", err)
		os.Exit(1)
	}
	stopOnSignal := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Shutdown(sctx); err != nil {
			log.Warn("shutdown", "error", err)
		}
	})
	defer stopOnSignal()
	err = c.Consume(context.Background(), *concurrency, func(ctx context.Context, m *client.Message) error {
		// The service's work goes here; v2 would do it differently.
		log.Info("processed", "partition", m.Partition, "offset", m.Offset, "value", string(m.Value))
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "canary:", err)
		os.Exit(1)
	}
}

// envOr returns the environment variable name, or def when it is empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
