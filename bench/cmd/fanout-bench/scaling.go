package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// How the daemon's costs grow with the work (bin/bench --scaling, and the
// full run): its CPU per message, its memory and its commit traffic to
// ZooKeeper as the topic's partitions grow, and its memory, CPU and CPU per
// message as its clients grow, idle and busy.

// PartitionsRun is the daemon draining a topic of Partitions partitions
// with the Go client processes of the plan, then idle for IdleSeconds.
type PartitionsRun struct {
	Partitions    int     `json:"partitions"`
	Size          int     `json:"size"`
	Messages      int64   `json:"messages"`
	Expected      int64   `json:"expected"`
	Committed     int64   `json:"committed"`
	Seconds       float64 `json:"seconds"`
	MsgPerS       float64 `json:"msg_per_s"`
	DaemonCPUPerM float64 `json:"daemon_cpu_s_per_million"` // over the whole drain, the partitions' start included
	// SteadyCPUPerM is the daemon's CPU per message between 20% and 80% of
	// the acks: every partition started, none finished.
	SteadyCPUPerM float64 `json:"daemon_cpu_s_per_million_steady,omitempty"`
	// FixedCPU is what the drain cost beyond SteadyCPUPerM for each
	// message: the partitions' start (offset lookups, first fetches and
	// commits) and the drain's tail, an estimate.
	FixedCPU       float64 `json:"daemon_fixed_cpu_s,omitempty"`
	PeakRSSMB      float64 `json:"daemon_peak_rss_mb"`
	Commits        float64 `json:"commits"`          // offset commits during the drain (fanout_commit_duration_seconds_count)
	ZKBytes        int64   `json:"zk_bytes"`         // to and from ZooKeeper during the drain
	IdleSeconds    float64 `json:"idle_seconds"`     // the idle window after the drain
	IdleCPUPercent float64 `json:"idle_cpu_percent"` // of one core, over the idle window
	IdleCommits    float64 `json:"idle_commits"`     // commits during the idle window
	IdleZKBytes    int64   `json:"idle_zk_bytes"`    // to and from ZooKeeper during the idle window
}

// BusyRun is the daemon with Clients raw connections, each of credit
// Credit, acking every delivery: measured over Messages acked once all
// are connected.
type BusyRun struct {
	Clients       int     `json:"clients"`
	Credit        int     `json:"credit"`
	Turn          int     `json:"deliveries_per_turn,omitempty"` // the daemon's --deliveries-per-turn
	Connected     int     `json:"connected"`                     // still connected at the end
	Messages      int64   `json:"messages"`
	Expected      int64   `json:"expected"`
	Seconds       float64 `json:"seconds"`
	MsgPerS       float64 `json:"msg_per_s"`
	DaemonCPUPerM float64 `json:"daemon_cpu_s_per_million"`
	// PerFrame is the deliveries each delivery frame carried, on average:
	// what one write and one ack amortize.
	PerFrame  float64 `json:"deliveries_per_frame,omitempty"`
	RSSMB     float64 `json:"daemon_rss_mb"`
	PeakRSSMB float64 `json:"daemon_peak_rss_mb"`
}

// Scaling holds the runs of the scaling measurements.
type Scaling struct {
	Partitions []PartitionsRun `json:"partitions"`
	Idle       []Idle          `json:"idle"`
	Busy       []BusyRun       `json:"busy"`
}

// scalingPlan is what the scaling measurements run.
type scalingPlan struct {
	Partitions   []int         `json:"partitions"`         // topics of these many partitions
	PartMessages int           `json:"partition_messages"` // preloaded in each
	PartSize     int           `json:"partition_size"`     // record size, bytes
	PartClients  int           `json:"partition_clients"`  // Go client processes draining them
	PartIdle     time.Duration `json:"partition_idle"`     // the idle window after each drain
	Idle         []int         `json:"idle_clients"`       // idle connections of each run
	Busy         []int         `json:"busy_clients"`       // busy connections of each run
	BusyCredit   int           `json:"busy_credit"`        // credit of each busy connection
	BusyMessages int           `json:"busy_messages"`      // acked in each busy run, once all are connected
	// BusyTurn, when > 1, runs the largest busy run once more with the
	// daemon's --deliveries-per-turn at it.
	BusyTurn int `json:"busy_turn,omitempty"`
}

// measureScaling runs the scaling measurements of p.
func (e *env) measureScaling(p plan, rep *report) error {
	sp := p.Scaling
	rep.Scaling = &Scaling{}
	for _, parts := range sp.Partitions {
		r, err := e.partitionsRun(parts, sp.PartMessages, sp.PartSize, sp.PartClients, p.InFlight, sp.PartIdle)
		if err != nil {
			return err
		}
		rep.Scaling.Partitions = append(rep.Scaling.Partitions, r)
	}
	for _, n := range sp.Idle {
		idle, err := e.idleRun(n, p.IdleFor)
		if err != nil {
			return err
		}
		rep.Scaling.Idle = append(rep.Scaling.Idle, *idle)
		rep.Idle = idle // the largest, last: the idle clients' target
	}
	if len(sp.Busy) == 0 {
		return nil
	}
	topic := fmt.Sprintf("busy-%s", e.runID)
	n := sp.BusyMessages + sp.Busy[len(sp.Busy)-1]*sp.BusyCredit // what the connections may hold before "go", and more
	say("== %s: %d messages of 100 B on 8 partitions, for the busy clients", topic, n)
	if err := e.createTopic(topic, 8); err != nil {
		return err
	}
	if err := e.preload(topic, n, 100); err != nil {
		return err
	}
	runs := make([][2]int, 0, len(sp.Busy)+1) // clients, turn
	for _, c := range sp.Busy {
		runs = append(runs, [2]int{c, 1})
	}
	if sp.BusyTurn > 1 {
		runs = append(runs, [2]int{sp.Busy[len(sp.Busy)-1], sp.BusyTurn})
	}
	for _, run := range runs {
		r, err := e.busyRun(topic, run[0], sp.BusyCredit, run[1], sp.BusyMessages)
		if err != nil {
			return err
		}
		rep.Scaling.Busy = append(rep.Scaling.Busy, r)
	}
	return nil
}

// partitionsRun preloads a topic of parts partitions with n records of size
// bytes, drains it with a daemon (whose ZooKeeper connection goes through a
// proxy that counts its bytes) and k Go client processes, and holds the
// daemon idle for idleFor after.
func (e *env) partitionsRun(parts, n, size, k, inFlight int, idleFor time.Duration) (PartitionsRun, error) {
	r := PartitionsRun{Partitions: parts, Size: size, Expected: int64(n)}
	topic := fmt.Sprintf("scale-%s-p%d", e.runID, parts)
	say("== %s: %d messages of %d B on %d partitions", topic, n, size, parts)
	if err := e.createTopic(topic, parts); err != nil {
		return r, err
	}
	// Batches of 16 KiB, so that every partition gets records.
	if err := e.preloadBatches(topic, n, size, 16384); err != nil {
		return r, err
	}
	if total, err := e.highWater(topic); err != nil || total != int64(n) {
		return r, fmt.Errorf("%s holds %d messages after preloading %d (%v)", topic, total, n, err)
	}
	zk, err := newCountingProxy(e.zk)
	if err != nil {
		return r, err
	}
	defer zk.close()
	id := topic
	d, err := e.startDaemonZK(id, topic, "bench", zk.addr())
	if err != nil {
		return r, err
	}
	defer d.stop()
	stopPerf := func() {}
	if e.perf { // the whole drain, from before the clients start
		if stopPerf, err = e.perfRecord(d.pid(), fmt.Sprintf("daemon-partitions-%d", parts)); err != nil {
			return r, err
		}
	}
	cpu0, err := cpuSeconds(d.pid())
	if err != nil {
		return r, err
	}
	commits0, _ := scrapeCounter(d.metrics, "fanout_commit_duration_seconds_count")
	zk0 := zk.bytes()
	var ws []*worker
	for i := range k {
		w, err := startWorker(fmt.Sprintf("client %d", i), e.self, "client", "--addr", d.addr, "--max-in-flight", strconv.Itoa(inFlight))
		if err != nil {
			return r, err
		}
		ws = append(ws, w)
	}
	stop := showProgress(fmt.Sprintf("%d partitions", parts), int64(n), ws)
	type mark struct {
		at   int64   // acks it waits for
		sum  int64   // acks when it was taken
		cpus float64 // the daemon's CPU seconds then
	}
	marks := []mark{{at: int64(n) / 5}, {at: int64(n) * 4 / 5}}
	next := 0
	err = waitSumEach(ws, int64(n), 5*time.Minute, func(sum int64) {
		for next < len(marks) && sum >= marks[next].at {
			marks[next].sum = sum
			marks[next].cpus, _ = cpuSeconds(d.pid())
			next++
		}
	})
	stop()
	stopPerf()
	cpu1, _ := cpuSeconds(d.pid())
	commits1, _ := scrapeCounter(d.metrics, "fanout_commit_duration_seconds_count")
	zk1 := zk.bytes()
	if err != nil {
		return r, fmt.Errorf("%w\n(daemon log: %s)", err, d.log)
	}
	say("   idle for %s", idleFor)
	time.Sleep(idleFor)
	cpu2, _ := cpuSeconds(d.pid())
	commits2, _ := scrapeCounter(d.metrics, "fanout_commit_duration_seconds_count")
	zk2 := zk.bytes()
	_, r.PeakRSSMB, _ = memMB(d.pid())
	var first, last int64
	for _, w := range ws {
		res, ferr := w.finish(30 * time.Second)
		if ferr != nil {
			err = errors.Join(err, ferr)
			continue
		}
		r.Messages += res.Messages
		if res.Messages > 0 {
			if first == 0 || res.FirstNS < first {
				first = res.FirstNS
			}
			last = max(last, res.LastNS)
		}
	}
	if err != nil {
		return r, err
	}
	r.Seconds = float64(last-first) / 1e9
	if r.Seconds > 0 {
		r.MsgPerS = float64(r.Messages) / r.Seconds
	}
	r.DaemonCPUPerM = (cpu1 - cpu0) / float64(max(r.Messages, 1)) * 1e6
	if a, b := marks[0], marks[1]; next == len(marks) && b.sum > a.sum && b.cpus > a.cpus {
		r.SteadyCPUPerM = (b.cpus - a.cpus) / float64(b.sum-a.sum) * 1e6
		r.FixedCPU = max(0, (cpu1-cpu0)-r.SteadyCPUPerM*float64(r.Messages)/1e6)
	}
	r.Commits, r.ZKBytes = commits1-commits0, zk1-zk0
	r.IdleSeconds = idleFor.Seconds()
	r.IdleCPUPercent = (cpu2 - cpu1) / idleFor.Seconds() * 100
	r.IdleCommits, r.IdleZKBytes = commits2-commits1, zk2-zk1
	d.stop()
	r.Committed, err = e.committedAll(id, topic, "zookeeper")
	say("   %d partitions: %.0f msg/s, daemon %.2f s CPU / 10^6 msg (steady %.2f s, fixed %.2f s), peak RSS %.0f MB, %.0f commits, %d ZooKeeper bytes; idle: %.1f%% CPU, %.0f commits, %d ZooKeeper bytes",
		parts, r.MsgPerS, r.DaemonCPUPerM, r.SteadyCPUPerM, r.FixedCPU, r.PeakRSSMB, r.Commits, r.ZKBytes, r.IdleCPUPercent, r.IdleCommits, r.IdleZKBytes)
	return r, err
}

// busyRun runs a daemon (--deliveries-per-turn turn) on topic with c raw
// connections of credit credit (one process), and once all are connected
// has them ack every delivery until m more are acked.
func (e *env) busyRun(topic string, c, credit, turn, m int) (BusyRun, error) {
	r := BusyRun{Clients: c, Credit: credit, Turn: turn, Expected: int64(m)}
	id := fmt.Sprintf("%s-c%d-t%d", topic, c, turn)
	say("== %d busy clients (one process, raw connections of credit %d acking every delivery), %d deliveries per turn", c, credit, turn)
	d, err := e.startDaemon(id, topic, "bench", "--deliveries-per-turn", strconv.Itoa(turn))
	if err != nil {
		return r, err
	}
	defer d.stop()
	w, err := startWorker("busy", e.self, "busy", "--addr", d.addr, "--conns", strconv.Itoa(c), "--max-in-flight", strconv.Itoa(credit))
	if err != nil {
		return r, err
	}
	select {
	case line := <-w.events:
		say("   %s", line)
	case <-w.exited:
		return r, fmt.Errorf("busy worker exited: %v\n%s", w.err, w.stderr.String())
	case <-time.After(5 * time.Minute):
		return r, fmt.Errorf("busy clients not connected after 5 min\n%s", w.stderr.String())
	}
	stopPerf := func() {}
	if e.perf { // from "go" to the last ack
		if stopPerf, err = e.perfRecord(d.pid(), fmt.Sprintf("daemon-busy-%d-t%d", c, turn)); err != nil {
			return r, err
		}
	}
	cpu0, _ := cpuSeconds(d.pid())
	t0 := time.Now()
	if _, err := io.WriteString(w.stdin, "go\n"); err != nil {
		stopPerf()
		return r, err
	}
	stop := showProgress(fmt.Sprintf("%d busy clients", c), int64(m), []*worker{w})
	err = waitSum([]*worker{w}, int64(m), 5*time.Minute)
	stop()
	stopPerf()
	cpu1, _ := cpuSeconds(d.pid())
	r.Seconds = time.Since(t0).Seconds()
	r.Messages = w.progress.Load()
	r.RSSMB, r.PeakRSSMB, _ = memMB(d.pid())
	res, ferr := w.finish(time.Minute)
	if err = errors.Join(err, ferr); err != nil {
		return r, fmt.Errorf("%w\n(daemon log: %s)", err, d.log)
	}
	r.Connected = res.Connected
	if res.Frames > 0 {
		r.PerFrame = float64(res.Framed) / float64(res.Frames)
	}
	r.MsgPerS = float64(r.Messages) / r.Seconds
	r.DaemonCPUPerM = (cpu1 - cpu0) / float64(max(r.Messages, 1)) * 1e6
	say("   %d busy clients, %d per turn: %.0f msg/s, daemon %.2f s CPU / 10^6 msg, %.1f deliveries per frame, RSS %.0f MB (peak %.0f), %d of %d stayed connected",
		c, turn, r.MsgPerS, r.DaemonCPUPerM, r.PerFrame, r.RSSMB, r.PeakRSSMB, r.Connected, c)
	return r, nil
}

// countingProxy forwards TCP connections to a server and counts the bytes
// both ways.
type countingProxy struct {
	ln     net.Listener
	target string
	n      atomic.Int64
	mu     sync.Mutex // guards conns
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newCountingProxy(target string) (*countingProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &countingProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *countingProxy) addr() string { return p.ln.Addr().String() }

// bytes returns the bytes forwarded so far, both ways.
func (p *countingProxy) bytes() int64 { return p.n.Load() }

func (p *countingProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 10*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
}

// pipe copies from src to dst, counting, until either fails.
func (p *countingProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.n.Add(int64(n))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			dst.Close()
			src.Close()
			return
		}
	}
}

func (p *countingProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
