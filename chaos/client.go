package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/internal/actor"
	"github.com/nanoservice/core-fanout/internal/backoff"
	"github.com/nanoservice/core-fanout/internal/slogrus"
)

// Client behaviours (ClientConfig.Mode).
const (
	ModeAck    = "ack"    // acks every message after a random processing time
	ModeSilent = "silent" // never acks: every delivery to it times out
	ModeNack   = "nack"   // nacks a share of the messages after a delay, acks the rest
)

// ClientConfig configures one chaos client process.
type ClientConfig struct {
	Addrs       []string
	Name        string // the client's name in its log lines: <role>.<incarnation>
	Log         string // the event log, appended to
	Mode        string
	Seed        uint64
	MaxInFlight int
	Workers     int           // goroutines processing messages
	MaxProcess  time.Duration // processing time is uniform in [0, MaxProcess)
	NackShare   float64       // ModeNack: the share of messages nacked
	NackDelay   time.Duration // ModeNack: how long a nacked message is held first
	// NackRedeliver is ModeNack's NackWithDelay: the daemon redelivers what
	// this client nacks no earlier than this after the nack (0: at once).
	NackRedeliver time.Duration
}

// PoisonPrefix starts the value of a poison record: every client nacks it
// (the silent one lets it time out), so it ends in the dead-letter topic.
const PoisonPrefix = "poison-"

// RunClient receives messages until ctx ends, writing one event line per
// delivery, ack and nack to cfg.Log (see EventLog) before it acts, so that a
// kill -9 never hides an ack that was sent.
func RunClient(ctx context.Context, cfg ClientConfig, log *logrus.Entry) error {
	f, err := os.OpenFile(cfg.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("client log: %w", err)
	}
	defer f.Close()
	c, err := client.Dial(ctx, client.Config{
		Addrs: cfg.Addrs, ClientID: cfg.Name, MaxInFlight: cfg.MaxInFlight,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, Logger: slogrus.Logger(log),
	})
	if err != nil {
		return fmt.Errorf("dial %v: %w", cfg.Addrs, err)
	}
	defer c.Close()
	var seq atomic.Uint64 // numbers this incarnation's deliveries
	write := func(kind byte, idx uint64, m *client.Message) {
		// One write(2) per line: complete lines survive a kill -9.
		line := fmt.Appendf(nil, "%d %c %s %d %d %d %d %s %d %s\n", time.Now().UnixNano(), kind, cfg.Name, idx,
			m.Partition, m.Offset, m.Attempt, m.Member(), m.DeliveryID, m.Value)
		if _, err := f.Write(line); err != nil {
			log.WithError(err).Error("client log")
		}
	}
	var g actor.Group
	for w := range max(cfg.Workers, 1) {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(w)))
		g.Go(log, "worker-"+strconv.Itoa(w), func() {
			for {
				var m *client.Message
				select {
				case <-ctx.Done():
					return
				case m = <-c.Messages():
				}
				idx := seq.Add(1)
				write(EventDeliver, idx, m)
				switch {
				case cfg.Mode == ModeSilent:
					continue
				case cfg.Mode == ModeNack && (rng.Float64() < cfg.NackShare || strings.HasPrefix(string(m.Value), PoisonPrefix)):
					if !backoff.Sleep(ctx, cfg.NackDelay) {
						return
					}
					write(EventNack, idx, m)
					_ = m.NackWithDelay(cfg.NackRedeliver)
					continue
				case strings.HasPrefix(string(m.Value), PoisonPrefix):
					write(EventNack, idx, m)
					_ = m.Nack()
					continue
				}
				if cfg.MaxProcess > 0 && !backoff.Sleep(ctx, time.Duration(rng.Int64N(int64(cfg.MaxProcess)))) {
					return
				}
				write(EventAck, idx, m)
				_ = m.Ack()
			}
		}, nil)
	}
	g.Wait()
	return nil
}
