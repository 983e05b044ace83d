package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
)

// runClient is one fanout client process: it acks every message it receives
// (by default a whole Batch at a time, with the batch API; --api messages:
// one Message at a time) and, when standard input closes, closes the client
// (flushing the last acks) and prints its Result. Only messages whose Ack
// succeeded are counted; the receipt time is taken for latency before the
// ack. Given the members of a spread cluster, the Go client keeps a session
// with each (its credit split over them).
func runClient(args []string) error {
	fs := flag.NewFlagSet("client", flag.ExitOnError)
	addrs := fs.String("addr", "127.0.0.1:4987", "daemon address, or comma-separated addresses of one cluster")
	inFlight := fs.Int("max-in-flight", 1000, "credit asked for in Hello (split over the members in spread mode)")
	latency := fs.Bool("latency", false, "record produce-to-receipt latency of synthetic values")
	api := fs.String("api", "batches", "batches: Config.Batches and one Batch.Ack per batch; messages: Messages and Message.Ack")
	_ = fs.Parse(args)
	if *api != "batches" && *api != "messages" {
		return fmt.Errorf("--api %q: want batches or messages", *api)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, client.Config{Addrs: strings.Split(*addrs, ","), MaxInFlight: *inFlight,
		ClientID: fmt.Sprintf("bench-%d", os.Getpid()), Batches: *api == "batches"})
	if err != nil {
		return err
	}
	cnt := &counter{measureLatency: *latency}
	cnt.ready()
	var redelivered, ackErrs atomic.Int64
	stop := stdinClosed()
	stopProgress := make(chan struct{})
	go reportProgress(&cnt.n, 250*time.Millisecond, stopProgress)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if *api == "batches" {
			var values [][]byte
			for b := range c.Batches() {
				now := time.Now()
				for _, m := range b.Messages {
					if m.Attempt > 1 {
						redelivered.Add(1)
					}
				}
				if err := b.Ack(); err != nil {
					ackErrs.Add(int64(len(b.Messages)))
					continue
				}
				values = values[:0]
				for _, m := range b.Messages {
					values = append(values, m.Value)
				}
				cnt.addBatch(values, now)
			}
			return
		}
		for m := range c.Messages() {
			now := time.Now()
			if m.Attempt > 1 {
				redelivered.Add(1)
			}
			if err := m.Ack(); err != nil {
				ackErrs.Add(1)
				continue
			}
			cnt.add(m.Value, now)
		}
	}()
	<-stop
	closeErr := c.Close() // Messages is closed when Close returns
	<-done
	close(stopProgress)
	r := cnt.result()
	r.Redelivered, r.Errors = redelivered.Load(), ackErrs.Load()
	if closeErr != nil {
		r.Errors++
		fmt.Fprintf(os.Stderr, "close: %v\n", closeErr)
	}
	return printResult(r)
}

// runIdle opens --conns raw protocol connections, each sending Hello and
// answering the daemon's pings, and holds them until standard input closes.
// It prints "connected N" on standard error once every session is welcomed
// (or failed), and its Result (Connected, Errors) at the end.
func runIdle(args []string) error {
	fs := flag.NewFlagSet("idle", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:4987", "daemon address")
	conns := fs.Int("conns", 10000, "connections")
	parallel := fs.Int("parallel", 64, "handshakes in progress at once")
	_ = fs.Parse(args)

	var (
		connected, failed atomic.Int64
		firstErr          atomic.Pointer[error]
		open              []net.Conn
		mu                sync.Mutex // guards open
		wg                sync.WaitGroup
	)
	sem := make(chan struct{}, *parallel)
	for i := range *conns {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, r, err := handshake(*addr, &protocol.Hello{ClientId: fmt.Sprintf("idle-%d", i), ProtocolVersion: 1, MaxInFlight: 1})
			<-sem
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, &err)
				return
			}
			connected.Add(1)
			mu.Lock()
			open = append(open, conn)
			mu.Unlock()
			idleServe(conn, r)
		}()
		if (i+1)%1000 == 0 {
			fmt.Fprintf(os.Stderr, "progress %d\n", connected.Load())
		}
	}
	for connected.Load()+failed.Load() < int64(*conns) {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "connected %d\n", connected.Load())
	if p := firstErr.Load(); p != nil {
		fmt.Fprintf(os.Stderr, "%d connections failed, the first: %v\n", failed.Load(), *p)
	}
	<-stdinClosed()
	// Sessions the daemon closed before now (a missed ping) count as lost.
	closing.Store(true)
	mu.Lock()
	for _, c := range open {
		_ = c.Close()
	}
	mu.Unlock()
	wg.Wait()
	return printResult(Result{Connected: int(connected.Load() - lost.Load()), Errors: failed.Load() + lost.Load()})
}

var (
	lost    atomic.Int64 // idle sessions that ended before the driver said stop
	closing atomic.Bool  // the driver said stop: connections end on our Close
)

// handshake connects, sends h and waits for Welcome; it returns the
// connection and its reader (of a small buffer, for many connections).
func handshake(addr string, h *protocol.Hello) (net.Conn, *protocol.Reader, error) {
	conn, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		return nil, nil, err
	}
	w := protocol.NewWriterSize(conn, 0, 512)
	r := protocol.NewReaderSize(conn, 0, 4<<10)
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	err = w.WriteFrame(protocol.HelloFrame(h))
	if err == nil {
		err = w.Flush()
	}
	var f protocol.Frame
	if err == nil {
		err = r.ReadFrame(&f)
	}
	if err == nil && f.GetWelcome() == nil {
		err = fmt.Errorf("want Welcome, got %v", &f)
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, r, nil
}

// idleServe answers pings until the connection ends. A connection ended by
// the daemon (not by our Close) counts as lost.
func idleServe(conn net.Conn, r *protocol.Reader) {
	w := protocol.NewWriterSize(conn, 0, 512)
	for {
		var f protocol.Frame
		if err := r.ReadFrame(&f); err != nil {
			if !closing.Load() {
				lost.Add(1)
			}
			return
		}
		if p := f.GetPing(); p != nil {
			if w.WriteFrame(protocol.PongFrame(p.GetNonce())) != nil || w.Flush() != nil {
				lost.Add(1)
				return
			}
		}
	}
}

// runBusy opens --conns raw protocol connections, each asking for
// --max-in-flight messages with CAPABILITY_BATCH, and answers pings. Until
// a line "go" comes on standard input the connections hold what they are
// delivered; from then on each acks every delivery frame at once (its ids
// as ranges). It writes "connected N" to standard error once every session
// is welcomed (or failed), "progress N" (the messages acked) every 250 ms,
// and its Result when standard input closes.
func runBusy(args []string) error {
	fs := flag.NewFlagSet("busy", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:4987", "daemon address")
	conns := fs.Int("conns", 1000, "connections")
	inFlight := fs.Int("max-in-flight", 10, "credit of each connection")
	parallel := fs.Int("parallel", 64, "handshakes in progress at once")
	_ = fs.Parse(args)

	var (
		connected, failed, acked atomic.Int64
		frames, framed           atomic.Int64 // delivery frames received once started, and their deliveries
		firstErr                 atomic.Pointer[error]
		open                     []*busyConn
		mu                       sync.Mutex // guards open
		wg                       sync.WaitGroup
	)
	stopProgress := make(chan struct{})
	go reportProgress(&acked, 250*time.Millisecond, stopProgress)
	sem := make(chan struct{}, *parallel)
	for i := range *conns {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := &protocol.Hello{ClientId: fmt.Sprintf("busy-%d", i), ProtocolVersion: 1, MaxInFlight: uint32(*inFlight),
				Capabilities: []protocol.Capability{protocol.Capability_CAPABILITY_BATCH}}
			conn, r, err := handshake(*addr, h)
			<-sem
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, &err)
				return
			}
			connected.Add(1)
			bc := &busyConn{conn: conn, w: protocol.NewWriterSize(conn, 0, 4<<10), acked: &acked, frames: &frames, framed: &framed}
			bc.ackFrame = &protocol.Frame{Body: &protocol.Frame_Ack{Ack: &bc.ack}}
			mu.Lock()
			open = append(open, bc)
			mu.Unlock()
			bc.serve(r)
		}()
	}
	for connected.Load()+failed.Load() < int64(*conns) {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "connected %d\n", connected.Load())
	if p := firstErr.Load(); p != nil {
		fmt.Fprintf(os.Stderr, "%d connections failed, the first: %v\n", failed.Load(), *p)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() != "go" {
			continue
		}
		mu.Lock()
		for _, bc := range open {
			bc.start()
		}
		mu.Unlock()
	}
	closing.Store(true)
	mu.Lock()
	for _, bc := range open {
		_ = bc.conn.Close()
	}
	mu.Unlock()
	wg.Wait()
	close(stopProgress)
	return printResult(Result{Messages: acked.Load(), Connected: int(connected.Load() - lost.Load()), Errors: failed.Load() + lost.Load(),
		Frames: frames.Load(), Framed: framed.Load()})
}

// busyConn is one connection of runBusy.
type busyConn struct {
	conn     net.Conn
	acked    *atomic.Int64
	frames   *atomic.Int64 // delivery frames received once started
	framed   *atomic.Int64 // the deliveries of those
	mu       sync.Mutex    // guards the fields below: the reader and start write
	w        *protocol.Writer
	started  bool         // "go": ack at once
	ack      protocol.Ack // the ranges received and not yet acked
	ackFrame *protocol.Frame
	n        int64 // the messages of ack
}

// serve reads r until the connection ends: it queues the ids of every
// delivery frame for an ack, sent at once once started, and answers pings.
// A connection ended by the daemon counts as lost.
func (bc *busyConn) serve(r *protocol.Reader) {
	var f protocol.Frame
	var b protocol.Batch
	for {
		deliveries, err := r.ReadBatch(&f, &b)
		if err == nil {
			bc.mu.Lock()
			switch {
			case deliveries:
				for _, d := range b.Deliveries {
					if n := len(bc.ack.Ranges); n > 0 && bc.ack.Ranges[n-2]+bc.ack.Ranges[n-1] == d.ID {
						bc.ack.Ranges[n-1]++
					} else {
						bc.ack.Ranges = append(bc.ack.Ranges, d.ID, 1)
					}
				}
				bc.n += int64(len(b.Deliveries))
				if bc.started {
					bc.frames.Add(1)
					bc.framed.Add(int64(len(b.Deliveries)))
					err = bc.flushAcks()
				}
			case f.GetPing() != nil:
				if err = bc.w.WriteFrame(protocol.PongFrame(f.GetPing().GetNonce())); err == nil {
					err = bc.w.Flush()
				}
			}
			bc.mu.Unlock()
		}
		if err != nil {
			if !closing.Load() {
				lost.Add(1)
			}
			return
		}
	}
}

// start acks what the connection holds and every delivery from now on.
func (bc *busyConn) start() {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	bc.started = true
	if bc.flushAcks() != nil {
		_ = bc.conn.Close() // serve counts it lost
	}
}

// flushAcks sends one Ack of the ranges queued. bc.mu must be held.
func (bc *busyConn) flushAcks() error {
	if len(bc.ack.Ranges) == 0 {
		return nil
	}
	if err := bc.w.WriteFrame(bc.ackFrame); err != nil {
		return err
	}
	if err := bc.w.Flush(); err != nil {
		return err
	}
	bc.acked.Add(bc.n)
	bc.ack.Ranges, bc.n = bc.ack.Ranges[:0], 0
	return nil
}
