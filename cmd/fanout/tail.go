package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/urfave/cli/v2"
)

// tailCommand returns the "tail" command: print the messages a daemon
// delivers, acking each once it is written out. In spread mode the client
// holds a session with every member, so tail prints the whole topic.
func tailCommand() *cli.Command {
	return &cli.Command{
		Name:  "tail",
		Usage: "print delivered messages, acking each once printed",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "connect", Value: "localhost:4987", EnvVars: []string{"FANOUT_CONNECT"},
				Usage: "comma-separated host:port of daemons of the cluster (one is enough: in spread mode tail connects to every member)"},
			&cli.IntFlag{Name: "count", Usage: "exit after `N` messages (0: run until interrupted)"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object per message"},
			&cli.BoolFlag{Name: "meta", Usage: "prefix each value with partition/offset and attempt"},
			&cli.BoolFlag{Name: "no-ack", Usage: "do not ack (the daemon redelivers after its ack timeout, or --nack-delay)"},
			&cli.DurationFlag{Name: "nack-delay", Usage: "with --no-ack: give each printed message back at once, to be redelivered no earlier than this (0: at once)"},
			&cli.BoolFlag{Name: "observe", Usage: "observe: print a copy of every message the daemon delivers to its clients, ack nothing, take nothing from them"},
			&cli.IntFlag{Name: "weight", Usage: "this client's share of the messages relative to the others' (default 100 each: a canary of 5 beside two of 100 gets about 5/205)"},
			&cli.IntFlag{Name: "max-in-flight", Value: client.DefaultMaxInFlight, Usage: "unacked messages held at once (in spread mode split evenly over the members)"},
			&cli.IntFlag{Name: "max-frame-size", Value: protocol.DefaultMaxFrameSize, Usage: "largest frame (message) accepted, in bytes; told to the daemon, which holds larger messages for other clients"},
			&cli.StringFlag{Name: "client-id", Usage: "client name in the daemon's logs (default hostname-pid)"},
			&cli.StringFlag{Name: "auth-token", EnvVars: []string{"FANOUT_AUTH_TOKEN"}, Usage: "shared secret of the daemon"},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "give up when no daemon welcomes within this"},
		}, clientTLSFlags()...),
		Action:       runTail,
		OnUsageError: commandUsageError,
	}
}

func runTail(c *cli.Context) error {
	if c.Args().Present() {
		return usageError(fmt.Errorf("tail: unexpected argument %q (flags start with --)", c.Args().First()))
	}
	if c.Int("count") < 0 {
		return usageError(fmt.Errorf("tail: --count must not be negative"))
	}
	if n := c.Int("max-in-flight"); n < 1 {
		return usageError(fmt.Errorf("tail: --max-in-flight %d: at least 1", n))
	}
	if n := c.Int("max-frame-size"); n < protocol.MaxHelloSize || n > math.MaxUint32 {
		return usageError(fmt.Errorf("tail: --max-frame-size %d: between %d and %d", n, protocol.MaxHelloSize, uint32(math.MaxUint32)))
	}
	if c.IsSet("nack-delay") && !c.Bool("no-ack") {
		return usageError(fmt.Errorf("tail: --nack-delay gives messages back instead of acking them: it needs --no-ack"))
	}
	if d := c.Duration("nack-delay"); d < 0 || d > protocol.MaxNackDelay {
		return usageError(fmt.Errorf("tail: --nack-delay %v: between 0 and %v", d, protocol.MaxNackDelay))
	}
	if w := c.Int("weight"); w < 0 || w > math.MaxUint32 {
		return usageError(fmt.Errorf("tail: --weight %d: between 1 and %d (0: the default, 100)", w, uint32(math.MaxUint32)))
	}
	if c.Bool("observe") && (c.IsSet("weight") || c.IsSet("nack-delay")) {
		return usageError(fmt.Errorf("tail: an observer takes no share of the messages and gives none back: --observe excludes --weight and --nack-delay"))
	}
	addrs := splitAll([]string{c.String("connect")})
	if len(addrs) == 0 {
		return usageError(fmt.Errorf("tail: --connect names no address"))
	}
	tlsCfg, err := clientTLS(contextValues(c))
	if err != nil {
		return usageError(fmt.Errorf("tail: %w", err))
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()

	dialCtx, cancel := context.WithTimeout(ctx, c.Duration("timeout"))
	defer cancel()
	cl, err := client.Dial(dialCtx, client.Config{
		Addrs:        addrs,
		ClientID:     c.String("client-id"),
		MaxInFlight:  c.Int("max-in-flight"),
		AuthToken:    c.String("auth-token"),
		MaxFrameSize: c.Int("max-frame-size"),
		Weight:       c.Int("weight"),
		Observe:      c.Bool("observe"),
		TLS:          tlsCfg,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while connecting
		}
		return fmt.Errorf("tail: cannot connect to %s within %v: %w", strings.Join(addrs, ","), c.Duration("timeout"), err)
	}
	t := &tailer{
		out:       bufio.NewWriter(c.App.Writer),
		json:      c.Bool("json"),
		meta:      c.Bool("meta"),
		ack:       !c.Bool("no-ack"),
		nack:      c.IsSet("nack-delay"),
		nackDelay: c.Duration("nack-delay"),
		count:     c.Int("count"),
	}
	err = t.run(ctx, cl)
	if cerr := cl.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("tail: close: %w", cerr)
	}
	return err
}

// tailer prints messages. Printed messages are acked only once the output
// buffer holding them has been flushed, which happens whenever no further
// message is waiting.
type tailer struct {
	out       *bufio.Writer
	json      bool
	meta      bool
	ack       bool
	nack      bool          // give printed messages back (--no-ack --nack-delay)
	nackDelay time.Duration // ... to be redelivered no earlier than this
	count     int           // stop after this many; 0 = never

	printed   int
	unflushed []*client.Message
}

func (t *tailer) run(ctx context.Context, cl *client.Client) error {
	msgs := cl.Messages()
	for {
		if len(msgs) == 0 {
			if err := t.flush(); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return t.flush()
		case m, ok := <-msgs:
			if !ok {
				if err := t.flush(); err != nil {
					return err
				}
				var tooLarge *protocol.FrameTooLargeError
				if err := cl.Err(); errors.As(err, &tooLarge) {
					return fmt.Errorf("tail: the daemon sent a frame of %d bytes, more than --max-frame-size %d; "+
						"run tail with a larger --max-frame-size: %w", tooLarge.Size, tooLarge.Max, err)
				} else if err != nil {
					return fmt.Errorf("tail: %w", err)
				}
				return nil
			}
			if err := t.print(m); err != nil {
				return err
			}
			t.unflushed = append(t.unflushed, m)
			t.printed++
			if t.count > 0 && t.printed >= t.count {
				return t.flush()
			}
		}
	}
}

// flush writes out the printed messages, then acks them (or, with
// --nack-delay, gives them back).
func (t *tailer) flush() error {
	if err := t.out.Flush(); err != nil {
		return fmt.Errorf("tail: write: %w", err)
	}
	for _, m := range t.unflushed {
		// ErrStale: the connection broke and the daemon will redeliver it.
		switch {
		case t.ack:
			_ = m.Ack()
		case t.nack:
			_ = m.NackWithDelay(t.nackDelay)
		}
	}
	clear(t.unflushed)
	t.unflushed = t.unflushed[:0]
	return nil
}

// tailRecord is the --json form of a message. Key and value are text when
// they are valid UTF-8 and base64 (key_b64, value_b64) otherwise.
type tailRecord struct {
	Partition int32   `json:"partition"`
	Offset    int64   `json:"offset"`
	Key       *string `json:"key,omitempty"`
	KeyB64    []byte  `json:"key_b64,omitempty"`
	Value     *string `json:"value,omitempty"`
	ValueB64  []byte  `json:"value_b64,omitempty"`
	Attempt   int     `json:"attempt"`
	Timestamp string  `json:"timestamp"`
}

func (t *tailer) print(m *client.Message) error {
	var err error
	switch {
	case t.json:
		r := tailRecord{Partition: m.Partition, Offset: m.Offset, Attempt: m.Attempt,
			Timestamp: m.Timestamp.UTC().Format(time.RFC3339Nano)}
		r.Key, r.KeyB64 = textOrBytes(m.Key)
		r.Value, r.ValueB64 = textOrBytes(m.Value)
		enc := json.NewEncoder(t.out)
		enc.SetEscapeHTML(false)
		err = enc.Encode(&r)
	case t.meta:
		_, err = fmt.Fprintf(t.out, "%d/%d %d %s\n", m.Partition, m.Offset, m.Attempt, m.Value)
	default:
		if _, err = t.out.Write(m.Value); err == nil {
			err = t.out.WriteByte('\n')
		}
	}
	if err != nil {
		return fmt.Errorf("tail: write: %w", err)
	}
	return nil
}

// textOrBytes returns b as a string when it is valid UTF-8 (encoding/json
// marshals []byte as base64), else as bytes.
func textOrBytes(b []byte) (*string, []byte) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, nil
	}
	return nil, b
}
