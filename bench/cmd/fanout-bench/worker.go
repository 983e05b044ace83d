package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Result is what a worker process prints on standard output when it ends.
type Result struct {
	Messages    int64   `json:"messages"`    // acked (client) or received (sarama)
	Bytes       int64   `json:"bytes"`       // value bytes of those
	Redelivered int64   `json:"redelivered"` // deliveries with Attempt > 1 (client)
	FirstNS     int64   `json:"first_ns"`    // Unix ns of the first ack / receipt
	LastNS      int64   `json:"last_ns"`     // Unix ns of the last ack / receipt
	LatencyUS   []int64 `json:"latency_us,omitempty"`
	Connected   int     `json:"connected,omitempty"` // idle: sessions welcomed
	Errors      int64   `json:"errors,omitempty"`
	// Frames counts the delivery frames received (busy: once started),
	// Framed the deliveries they carried.
	Frames int64 `json:"frames,omitempty"`
	Framed int64 `json:"framed,omitempty"`
	// The process's CPU seconds (user and system) once it was ready to
	// receive (connected: start-up excluded), and at a sample taken with
	// the count at CPUMessages (every cpuSampleEvery messages and at the
	// last): CPU - ReadyCPU over CPUMessages is its CPU per message.
	ReadyCPU    float64 `json:"ready_cpu_s,omitempty"`
	CPU         float64 `json:"cpu_s,omitempty"`
	CPUMessages int64   `json:"cpu_messages,omitempty"`
}

// cpuSampleEvery is how often (in messages) a worker samples its CPU.
const cpuSampleEvery = 256

// processCPU returns the CPU seconds (user and system) of this process.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// counter counts messages for progress lines and the result.
type counter struct {
	n, bytes       atomic.Int64
	first, last    atomic.Int64
	measureLatency bool
	mu             sync.Mutex // guards latency and the fields below
	latency        []int64    // µs from produce to receipt
	readyCPU       float64    // the process's CPU when ready (ready)
	cpu            float64    // the process's CPU at the last sample ...
	cpuN           int64      // ... when n was this
}

// ready records the process's CPU before the first message.
func (c *counter) ready() {
	c.mu.Lock()
	c.readyCPU = processCPU()
	c.mu.Unlock()
}

// sample records the process's CPU with the count n when the count went
// past a multiple of cpuSampleEvery from before.
func (c *counter) sample(before, n int64) {
	if before/cpuSampleEvery == n/cpuSampleEvery {
		return
	}
	c.sampleNow(n)
}

func (c *counter) sampleNow(n int64) {
	cpu := processCPU()
	c.mu.Lock()
	if n > c.cpuN {
		c.cpu, c.cpuN = cpu, n
	}
	c.mu.Unlock()
}

// add records one message of value v handled at now.
func (c *counter) add(v []byte, now time.Time) {
	ns := now.UnixNano()
	c.first.CompareAndSwap(0, ns)
	for old := c.last.Load(); ns > old && !c.last.CompareAndSwap(old, ns); old = c.last.Load() {
	}
	n := c.n.Add(1)
	c.sample(n-1, n)
	c.bytes.Add(int64(len(v)))
	if c.measureLatency {
		if at, ok := producedAt(v); ok {
			c.mu.Lock()
			c.latency = append(c.latency, now.Sub(at).Microseconds())
			c.mu.Unlock()
		}
	}
}

// addBatch records the messages of values, handled at now, with one
// update of the counters for all of them.
func (c *counter) addBatch(values [][]byte, now time.Time) {
	if c.measureLatency {
		for _, v := range values {
			c.add(v, now)
		}
		return
	}
	var bytes int64
	for _, v := range values {
		bytes += int64(len(v))
	}
	ns := now.UnixNano()
	c.first.CompareAndSwap(0, ns)
	c.last.Store(ns)
	n := c.n.Add(int64(len(values)))
	c.sample(n-int64(len(values)), n)
	c.bytes.Add(bytes)
}

// result returns the counts and the CPU samples (one now when none was
// taken: fewer than cpuSampleEvery messages).
func (c *counter) result() Result {
	c.mu.Lock()
	none := c.cpuN == 0
	c.mu.Unlock()
	if none {
		c.sampleNow(c.n.Load())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return Result{Messages: c.n.Load(), Bytes: c.bytes.Load(), FirstNS: c.first.Load(), LastNS: c.last.Load(), LatencyUS: c.latency,
		ReadyCPU: c.readyCPU, CPU: c.cpu, CPUMessages: c.cpuN}
}

// reportProgress writes "progress N" to standard error every interval until
// stop is closed.
func reportProgress(n *atomic.Int64, every time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			fmt.Fprintf(os.Stderr, "progress %d\n", n.Load())
		}
	}
}

// stdinClosed is closed when standard input reaches EOF: the driver's signal
// to stop.
func stdinClosed() <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(ch)
	}()
	return ch
}

func printResult(r Result) error {
	return json.NewEncoder(os.Stdout).Encode(r)
}

// producedAt reads the produce time from a synthetic value "SEQ UNIXNANOS ..."
// (the format of `fanout produce --count`, cmd/fanout/produce.go, and of the
// driver's paced producer).
func producedAt(v []byte) (time.Time, bool) {
	_, rest, ok1 := bytes.Cut(v, []byte{' '})
	ns, _, ok2 := bytes.Cut(rest, []byte{' '})
	if !ok1 || !ok2 {
		return time.Time{}, false
	}
	t, err := strconv.ParseInt(string(ns), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, t), true
}

// syntheticValue is "SEQ UNIXNANOS " padded with '.' to size bytes.
func syntheticValue(seq int, at time.Time, size int) []byte {
	v := make([]byte, 0, size)
	v = strconv.AppendInt(v, int64(seq), 10)
	v = append(v, ' ')
	v = strconv.AppendInt(v, at.UnixNano(), 10)
	v = append(v, ' ')
	for len(v) < size {
		v = append(v, '.')
	}
	return v
}
