package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Row is one throughput measurement.
type Row struct {
	Size            int     `json:"size"`
	Consumer        string  `json:"consumer"`               // "A ConsumerPerformance", "B sarama", "C fanout", "D ShareConsumerPerformance", "E fanout spread", "P python threads", "P python asyncio"
	K               int     `json:"k"`                      // fanout clients or share-consumer threads
	Members         int     `json:"members,omitempty"`      // E: spread members
	Store           string  `json:"offset_store,omitempty"` // E: the members' --offset-store; "" for ZooKeeper
	Expected        int64   `json:"expected"`
	Messages        int64   `json:"messages"`
	Redelivered     int64   `json:"redelivered,omitempty"`
	Committed       int64   `json:"committed,omitempty"` // C: sum of offsets committed in ZooKeeper
	Seconds         float64 `json:"seconds"`
	MsgPerS         float64 `json:"msg_per_s"`
	MBPerS          float64 `json:"mb_per_s"`                 // 10^6 bytes of record value per second
	ToolMsgPerS     float64 `json:"tool_msg_per_s,omitempty"` // D: the tool's own rate, start-up included
	DaemonCPUPerM   float64 `json:"daemon_cpu_s_per_million,omitempty"`
	DaemonPeakRSSMB float64 `json:"daemon_peak_rss_mb,omitempty"`
	DaemonCores     float64 `json:"daemon_cores,omitempty"`              // C: daemon CPU seconds per second during the run
	ClientCPUPerM   float64 `json:"clients_cpu_s_per_million,omitempty"` // C, P: all client processes together; B: the consumer process (each from connected to its last message)
	MachineBusyPct  float64 `json:"machine_busy_pct,omitempty"`          // C: all CPUs of the machine, everybody's load
	CoverB          float64 `json:"c_over_b,omitempty"`
	CoverD          float64 `json:"c_over_d,omitempty"`
	// E: per member, its CPU seconds per 10^6 messages it acked, and those
	// messages.
	MemberCPUPerM  []float64 `json:"member_cpu_s_per_million,omitempty"`
	MemberMessages []int64   `json:"member_messages,omitempty"`
}

func (r *Row) finish() {
	if r.Seconds > 0 {
		r.MsgPerS = float64(r.Messages) / r.Seconds
		r.MBPerS = r.MsgPerS * float64(r.Size) / 1e6
	}
}

func (r Row) label() string {
	if strings.HasPrefix(r.Consumer, "C") || strings.HasPrefix(r.Consumer, "P") {
		return fmt.Sprintf("%s, %d client(s)", r.Consumer, r.K)
	}
	if strings.HasPrefix(r.Consumer, "D") {
		return fmt.Sprintf("%s, %d thread(s)", r.Consumer, r.K)
	}
	if strings.HasPrefix(r.Consumer, "E") {
		return fmt.Sprintf("%s, %d member(s), %s", r.Consumer, r.Members, storeLabel(r.Store))
	}
	return r.Consumer
}

// Latency is produce-to-receipt latency of one consumer at one rate.
type Latency struct {
	Rate     int     `json:"rate"`
	Consumer string  `json:"consumer"`
	Expected int64   `json:"expected"`
	Messages int64   `json:"messages"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	P999     float64 `json:"p999_ms"`
	Max      float64 `json:"max_ms"`
}

// Idle is the daemon's footprint with many idle clients.
type Idle struct {
	Clients       int     `json:"clients"`
	Connected     int     `json:"connected"` // still connected at the end
	RSSBeforeMB   float64 `json:"rss_before_mb"`
	RSSMB         float64 `json:"rss_mb"`
	PeakRSSMB     float64 `json:"peak_rss_mb"`
	CPUPercent    float64 `json:"cpu_percent"` // of one core, over the window
	WindowSeconds float64 `json:"window_seconds"`
}

type report struct {
	Plan        plan      `json:"plan"`
	Started     time.Time `json:"started"`
	Host        string    `json:"host"`
	LoadBefore  string    `json:"load_before"` // /proc/loadavg 1, 5, 15 min
	LoadAfter   string    `json:"load_after"`
	WallSeconds float64   `json:"wall_seconds"`
	Throughput  []Row     `json:"throughput"`
	Latency     []Latency `json:"latency"`
	Idle        *Idle     `json:"idle"`
	Scaling     *Scaling  `json:"scaling,omitempty"`
	Targets     []Target  `json:"targets"`
}

// storeLabel names an offset store for the report: "ZooKeeper", "Kafka".
func storeLabel(store string) string {
	if store == "" || store == "zookeeper" {
		return "ZooKeeper"
	}
	return strings.ToUpper(store[:1]) + store[1:]
}

// spreadRows returns the rows of the spread runs (E).
func (r *report) spreadRows() []Row {
	var out []Row
	for _, t := range r.Throughput {
		if strings.HasPrefix(t.Consumer, "E") {
			out = append(out, t)
		}
	}
	return out
}

// ratios fills C/B and C/D of every fanout row (D at the same K).
func (r *report) ratios() {
	find := func(size int, consumer string, k int) *Row {
		for i := range r.Throughput {
			t := &r.Throughput[i]
			if t.Size == size && strings.HasPrefix(t.Consumer, consumer) && (k == 0 || t.K == k) {
				return t
			}
		}
		return nil
	}
	for i := range r.Throughput {
		c := &r.Throughput[i]
		if !strings.HasPrefix(c.Consumer, "C") {
			continue
		}
		if b := find(c.Size, "B", 0); b != nil && b.MsgPerS > 0 {
			c.CoverB = c.MsgPerS / b.MsgPerS
		}
		if d := find(c.Size, "D", c.K); d != nil && d.MsgPerS > 0 {
			c.CoverD = c.MsgPerS / d.MsgPerS
		}
	}
}

// failures lists every measurement that missed a message.
func (r *report) failures() []string {
	var out []string
	for _, t := range r.Throughput {
		if t.Messages < t.Expected {
			out = append(out, fmt.Sprintf("%d B, %s: %d of %d messages", t.Size, t.label(), t.Messages, t.Expected))
		}
		if (strings.HasPrefix(t.Consumer, "C") || strings.HasPrefix(t.Consumer, "E")) && t.Committed != t.Expected {
			out = append(out, fmt.Sprintf("%d B, %s: committed offsets sum to %d, want %d", t.Size, t.label(), t.Committed, t.Expected))
		}
	}
	for _, l := range r.Latency {
		if l.Messages < l.Expected {
			out = append(out, fmt.Sprintf("latency at %d/s, %s: %d of %d messages", l.Rate, l.Consumer, l.Messages, l.Expected))
		}
	}
	if r.Idle != nil && r.Idle.Connected < r.Idle.Clients {
		out = append(out, fmt.Sprintf("idle: %d of %d clients stayed connected", r.Idle.Connected, r.Idle.Clients))
	}
	if sc := r.Scaling; sc != nil {
		for _, p := range sc.Partitions {
			if p.Messages < p.Expected || p.Committed != p.Expected {
				out = append(out, fmt.Sprintf("%d partitions: %d of %d messages acked, committed offsets sum to %d", p.Partitions, p.Messages, p.Expected, p.Committed))
			}
		}
		for _, i := range sc.Idle {
			if i.Connected < i.Clients {
				out = append(out, fmt.Sprintf("idle: %d of %d clients stayed connected", i.Connected, i.Clients))
			}
		}
		for _, b := range sc.Busy {
			if b.Messages < b.Expected || b.Connected < b.Clients {
				out = append(out, fmt.Sprintf("%d busy clients: %d of %d messages acked, %d stayed connected", b.Clients, b.Messages, b.Expected, b.Connected))
			}
		}
	}
	return out
}

func sizeLabel(size int) string {
	if size%1024 == 0 {
		return fmt.Sprintf("%d KiB", size/1024)
	}
	return fmt.Sprintf("%d B", size)
}

func (r *report) write(dir string) error {
	r.Targets = r.targets()
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(r.markdown()), 0o644); err != nil {
		return err
	}
	return drawChart(filepath.Join(dir, "throughput.png"), r)
}

func (r *report) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	mode := "full"
	if r.Plan.Quick {
		mode = "quick (small data: do not read anything into the timings)"
	}
	p("# fanout benchmark (%s)", mode)
	p("")
	p("%s UTC, %s; load average (1, 5, 15 min) %s before, %s after; %.0f s wall.",
		r.Started.Format("2006-01-02 15:04"), r.Host, r.LoadBefore, r.LoadAfter, r.WallSeconds)
	p("Kafka 4.4.0 (KRaft, one broker on loopback) and ZooKeeper 3.9 of `bin/services`; every topic has 8 partitions.")
	p("")
	p("## Throughput")
	p("")
	p("A: `ConsumerPerformance` (fetch rate, group join excluded). B: a plain sarama consumer of every partition")
	p("(`kafka.NewConfig`). C: the fanout daemon and K client processes acking every message, from the first ack to")
	p("the last; every committed offset checked in ZooKeeper afterwards. D: `ShareConsumerPerformance` with K threads,")
	p("timed after the share group's start-up (from the first 0.5 s interval carrying >= 1%% of the records to the end;")
	p("the tool's own rate, start-up of several seconds included, is in the last column). MB/s counts record values")
	p("(10^6 bytes). Credit of each fanout client: %d. For C, also the daemon's CPU seconds per second of the run", r.Plan.InFlight)
	p("(daemon cores), the client processes' CPU (for B: the consumer process's; each process's from its connection")
	p("to its last message, start-up excluded), and how busy the whole machine was (everything on it, including")
	p("the broker and other people's work). P: the Python client (`bench/pyclient.py`), threaded and asyncio, K")
	p("processes each acking every message on its own, over the first %d messages of the topic.", r.Plan.PyMessages)
	p("")
	p("| size | consumer | K | messages | msg/s | MB/s | C/B | C/D | daemon CPU s / 10^6 msg | daemon peak RSS MB | daemon cores | clients (B: consumer) CPU s / 10^6 msg | machine busy %% | D: tool's msg/s |")
	p("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, t := range r.Throughput {
		p("| %s | %s | %d | %d | %.0f | %.1f | %s | %s | %s | %s | %s | %s | %s | %s |", sizeLabel(t.Size), t.Consumer, t.K, t.Messages,
			t.MsgPerS, t.MBPerS, opt(t.CoverB, "%.2f"), opt(t.CoverD, "%.2f"), opt(t.DaemonCPUPerM, "%.1f"),
			opt(t.DaemonPeakRSSMB, "%.0f"), opt(t.DaemonCores, "%.2f"), opt(t.ClientCPUPerM, "%.1f"),
			opt(t.MachineBusyPct, "%.0f"), opt(t.ToolMsgPerS, "%.0f"))
	}
	p("")
	p("![throughput](throughput.png)")
	p("")
	if spread := r.spreadRows(); len(spread) > 0 {
		p("## Spread mode")
		p("")
		p("E: the same topic drained by M daemons with `--assignment spread` (each serving the partitions its")
		p("assignment gives it: 8 partitions over M members), with %d client processes each connected to every member (the Go", r.Plan.SpreadClients)
		p("client keeps a session per member; credit %d, split over them), with each offset store: ZooKeeper (the", r.Plan.InFlight)
		p("elected leader assigns, ownership records fence each partition) and Kafka (the members of the group")
		p("fanout_<id>: its leader plans, its generations fence the commits; no ZooKeeper). Per member: its CPU seconds")
		p("per 10^6 messages it acked, and those messages. On this machine the cores are shared by every member, the")
		p("broker and the clients, so the total rate cannot grow with M; what scales is the work of each member: its")
		p("share of the messages falls as 1/M while its CPU per message stays flat.")
		p("")
		p("| size | store | members | messages | msg/s | daemons' cores | CPU s / 10^6 msg, all members | per member: CPU s / 10^6 msg | per member: messages | machine busy %% |")
		p("|---|---|--:|--:|--:|--:|--:|---|---|--:|")
		for _, t := range spread {
			var cpu, msgs []string
			for i := range t.MemberCPUPerM {
				if t.MemberMessages[i] == 0 {
					cpu = append(cpu, "-") // its partitions held no message
				} else {
					cpu = append(cpu, fmt.Sprintf("%.1f", t.MemberCPUPerM[i]))
				}
				msgs = append(msgs, fmt.Sprint(t.MemberMessages[i]))
			}
			p("| %s | %s | %d | %d | %.0f | %.2f | %.1f | %s | %s | %.0f |", sizeLabel(t.Size), storeLabel(t.Store), t.Members, t.Messages,
				t.MsgPerS, t.DaemonCores, t.DaemonCPUPerM, strings.Join(cpu, ", "), strings.Join(msgs, ", "), t.MachineBusyPct)
		}
		p("")
	}
	p("## Latency")
	p("")
	p("Produce to receipt (the produce time travels in the value), %d B messages produced at a fixed rate for %s,", r.Plan.LatencySize, r.Plan.RateFor)
	p("read at the same time by a plain sarama consumer and by one fanout client (acking) through the daemon.")
	p("")
	p("| rate msg/s | consumer | messages | p50 ms | p99 ms | p99.9 ms | max ms |")
	p("|--:|---|--:|--:|--:|--:|--:|")
	for _, l := range r.Latency {
		p("| %d | %s | %d | %.2f | %.2f | %.2f | %.2f |", l.Rate, l.Consumer, l.Messages, l.P50, l.P99, l.P999, l.Max)
	}
	if r.Idle != nil {
		i := r.Idle
		p("")
		p("## Idle clients")
		p("")
		p("%d connections from one process, each welcomed and answering the daemon's pings (every 5 s); CPU over %.0f s.", i.Clients, i.WindowSeconds)
		p("")
		p("| clients | still connected | daemon RSS before MB | daemon RSS MB | daemon peak RSS MB | daemon CPU %% of a core |")
		p("|--:|--:|--:|--:|--:|--:|")
		p("| %d | %d | %.1f | %.1f | %.1f | %.1f |", i.Clients, i.Connected, i.RSSBeforeMB, i.RSSMB, i.PeakRSSMB, i.CPUPercent)
	}
	if sc := r.Scaling; sc != nil {
		r.scalingMarkdown(p, sc)
	}
	p("")
	p("## Targets (reported, not enforced)")
	p("")
	p("| target | measured | ratio | result |")
	p("|---|---|--:|---|")
	for _, t := range r.Targets {
		p("| %s | %s | %s | %s |", t.Name, t.Measured, t.ratio(), t.result())
	}
	for _, g := range r.unmeasured(r.Targets) {
		p("| %s | not measured in this run | | |", g)
	}
	return b.String()
}

// scalingMarkdown writes the scaling section of the report.
func (r *report) scalingMarkdown(p func(string, ...any), sc *Scaling) {
	sp := r.Plan.Scaling
	p("")
	p("## Scaling")
	p("")
	if len(sc.Partitions) > 0 && sp != nil {
		p("Partitions: a topic of P partitions preloaded with %d records of %d B (batches of 16 KiB, so that every", sp.PartMessages, sp.PartSize)
		p("partition gets records), drained by the daemon and %d Go client processes (credit %d), then the daemon idle", sp.PartClients, r.Plan.InFlight)
		p("for %s. The daemon's ZooKeeper connection goes through a proxy that counts its bytes (commits, the", sp.PartIdle)
		p("election's and the session's); commits are the daemon's `fanout_commit_duration_seconds_count`.")
		p("")
		p("The daemon's CPU per message is given over the whole drain, and steady: between 20%% and 80%% of the acks,")
		p("every partition started and none finished; fixed is what the drain cost beyond the steady rate (the")
		p("partitions' start: offset lookups, first fetches and commits; and the drain's tail), an estimate.")
		p("")
		p("| partitions | messages | msg/s | daemon CPU s / 10^6 msg | steady | fixed CPU s | daemon peak RSS MB | commits | ZooKeeper KB | KB / commit | idle: daemon CPU %% | idle: commits | idle: ZooKeeper KB |")
		p("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
		for _, x := range sc.Partitions {
			perCommit := ""
			if x.Commits > 0 {
				perCommit = fmt.Sprintf("%.1f", float64(x.ZKBytes)/1e3/x.Commits)
			}
			p("| %d | %d | %.0f | %.2f | %s | %s | %.0f | %.0f | %.1f | %s | %.1f | %.0f | %.1f |", x.Partitions, x.Messages, x.MsgPerS,
				x.DaemonCPUPerM, opt(x.SteadyCPUPerM, "%.2f"), opt(x.FixedCPU, "%.2f"), x.PeakRSSMB, x.Commits, float64(x.ZKBytes)/1e3,
				perCommit, x.IdleCPUPercent, x.IdleCommits, float64(x.IdleZKBytes)/1e3)
		}
	}
	if len(sc.Idle) > 0 {
		p("")
		p("Idle clients: connections from one process, each welcomed and answering the daemon's pings (every 5 s);")
		p("CPU over %s.", r.Plan.IdleFor)
		p("")
		p("| clients | still connected | daemon RSS before MB | daemon RSS MB | daemon peak RSS MB | daemon CPU %% of a core |")
		p("|--:|--:|--:|--:|--:|--:|")
		for _, i := range sc.Idle {
			p("| %d | %d | %.1f | %.1f | %.1f | %.1f |", i.Clients, i.Connected, i.RSSBeforeMB, i.RSSMB, i.PeakRSSMB, i.CPUPercent)
		}
	}
	if len(sc.Busy) > 0 && sp != nil {
		p("")
		p("Busy clients: raw connections from one process, each of credit %d, holding what they are delivered until", sp.BusyCredit)
		p("all are connected, then acking every delivery frame at once; measured over the next %d acks, on a topic", sp.BusyMessages)
		p("of 8 partitions of 100 B records.")
		p("")
		p("| clients | deliveries per turn | still connected | messages | msg/s | daemon CPU s / 10^6 msg | deliveries per frame | daemon RSS MB | daemon peak RSS MB |")
		p("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
		for _, b := range sc.Busy {
			p("| %d | %d | %d | %d | %.0f | %.2f | %.1f | %.0f | %.0f |", b.Clients, max(b.Turn, 1), b.Connected, b.Messages, b.MsgPerS, b.DaemonCPUPerM, b.PerFrame, b.RSSMB, b.PeakRSSMB)
		}
	}
}

// Target is one performance goal against one measurement: Ratio is the
// measured value over the reference it is compared with (B, D, or the limit
// itself), to be at most (AtMost) or at least Limit.
type Target struct {
	Name     string  `json:"name"`
	Measured string  `json:"measured"`
	Ratio    float64 `json:"ratio"`
	Limit    float64 `json:"limit"`
	AtMost   bool    `json:"at_most"`
	// Goal is the entry of goals this target measures (one of its cases).
	Goal string `json:"goal"`
}

// goals are the performance goals, each measured by one or more targets
// (one per size and K, say) when the run has their measurements.
var goals = []string{
	"daemon CPU per message <= 1.25 x plain sarama's (B), 100 B and 1 KiB, K = 1 and 4",
	"Go client CPU per message <= 0.5 x plain sarama's (B), K = 1 and 4",
	"msg/s >= 0.6 x plain sarama's (C/B), 1 KiB, K = 4",
	"msg/s >= 2 x a share group's (C/D), 100 B and 1 KiB, K = 1 and 4",
	"daemon CPU per message on the largest topic (1,024 partitions) <= 1.2 x 8 partitions', steady (the partitions' start apart)",
	"added p99 latency < 1 ms at 10,000 msg/s",
	"10,000 idle clients: daemon RSS < 300 MB",
}

// unmeasured returns the goals that no target of ts measures, in order.
func (r *report) unmeasured(ts []Target) []string {
	var out []string
	for _, g := range goals {
		if !slices.ContainsFunc(ts, func(t Target) bool { return t.Goal == g }) {
			out = append(out, g)
		}
	}
	return out
}

// Met says whether the measurement reaches the target.
func (t Target) Met() bool {
	if t.AtMost {
		return t.Ratio <= t.Limit
	}
	return t.Ratio >= t.Limit
}

func (t Target) ratio() string { return fmt.Sprintf("%.2f", t.Ratio) }

// result is "met", or "not met" with the distance to the limit, relative to
// the limit.
func (t Target) result() string {
	if t.Met() {
		return "met"
	}
	if t.AtMost {
		return fmt.Sprintf("not met: %.2f over the limit %.2f (%.0f%% above)", t.Ratio-t.Limit, t.Limit, 100*(t.Ratio/t.Limit-1))
	}
	return fmt.Sprintf("not met: %.2f under the limit %.2f (%.0f%% short)", t.Limit-t.Ratio, t.Limit, 100*(1-t.Ratio/t.Limit))
}

// line is the target as one line of the run's output.
func (t Target) line() string {
	return fmt.Sprintf("%-64s %-34s ratio %5s  %s", t.Name, t.Measured, t.ratio(), t.result())
}

// targets compares the results with the performance targets: the daemon's
// and the clients' CPU per message against B's, C/B, C/D, the latency added
// over B and the RSS of 10,000 idle clients. A target whose measurements are
// missing (a quick run has no K = 16, no 10k msg/s, few idle clients) is left
// out; its goal is then one that unmeasured returns.
func (r *report) targets() []Target {
	r.ratios()
	var b map[int]*Row // B per size
	for i := range r.Throughput {
		if t := &r.Throughput[i]; strings.HasPrefix(t.Consumer, "B") {
			if b == nil {
				b = map[int]*Row{}
			}
			b[t.Size] = t
		}
	}
	var out []Target
	k14 := func(t Row) bool { return t.K == 1 || t.K == 4 }
	for _, limit := range []struct {
		what   string
		factor float64
		of     func(Row) float64
		goal   string
	}{
		{"daemon CPU / 10^6 msg", 1.25, func(t Row) float64 { return t.DaemonCPUPerM }, goals[0]},
		{"Go client CPU / 10^6 msg", 0.5, func(t Row) float64 { return t.ClientCPUPerM }, goals[1]},
	} {
		for _, t := range r.Throughput {
			ref := b[t.Size]
			if !strings.HasPrefix(t.Consumer, "C") || !k14(t) || ref == nil || ref.ClientCPUPerM == 0 || limit.of(t) == 0 {
				continue
			}
			out = append(out, Target{
				Name:     fmt.Sprintf("%s <= %g x plain sarama's (B), %s, K=%d", limit.what, limit.factor, sizeLabel(t.Size), t.K),
				Measured: fmt.Sprintf("%.2f s (B %.2f s)", limit.of(t), ref.ClientCPUPerM),
				Ratio:    limit.of(t) / ref.ClientCPUPerM, Limit: limit.factor, AtMost: true, Goal: limit.goal,
			})
		}
	}
	for _, t := range r.Throughput {
		if strings.HasPrefix(t.Consumer, "C") && t.Size == 1024 && t.K == 4 && t.CoverB > 0 {
			out = append(out, Target{Name: fmt.Sprintf("msg/s >= 0.6 x plain sarama's (C/B), %s, K=%d", sizeLabel(t.Size), t.K),
				Measured: fmt.Sprintf("%.0f msg/s (B %.0f)", t.MsgPerS, b[t.Size].MsgPerS), Ratio: t.CoverB, Limit: 0.6, Goal: goals[2]})
		}
	}
	for _, t := range r.Throughput {
		if strings.HasPrefix(t.Consumer, "C") && k14(t) && t.CoverD > 0 {
			out = append(out, Target{Name: fmt.Sprintf("msg/s >= 2 x a share group's (C/D), %s, K=%d", sizeLabel(t.Size), t.K),
				Measured: fmt.Sprintf("%.0f msg/s (D %.0f)", t.MsgPerS, t.MsgPerS/t.CoverD), Ratio: t.CoverD, Limit: 2, Goal: goals[3]})
		}
	}
	var bp99, cp99 float64
	for _, l := range r.Latency {
		if l.Rate == 10000 && strings.HasPrefix(l.Consumer, "B") {
			bp99 = l.P99
		}
		if l.Rate == 10000 && strings.HasPrefix(l.Consumer, "C") {
			cp99 = l.P99
		}
	}
	if cp99 > 0 && bp99 > 0 {
		out = append(out, Target{Name: "added p99 latency < 1 ms at 10,000 msg/s",
			Measured: fmt.Sprintf("%.2f ms (C %.2f, B %.2f)", cp99-bp99, cp99, bp99), Ratio: cp99 - bp99, Limit: 1, AtMost: true, Goal: goals[5]})
	}
	if sc := r.Scaling; sc != nil {
		// The largest topic drained (1,024 partitions in a full run) against 8.
		var p8, big *PartitionsRun
		for i := range sc.Partitions {
			switch pr := &sc.Partitions[i]; {
			case pr.Partitions == 8:
				p8 = pr
			case pr.Partitions > 8 && (big == nil || pr.Partitions > big.Partitions):
				big = pr
			}
		}
		if p8 != nil && big != nil && p8.SteadyCPUPerM > 0 && big.SteadyCPUPerM > 0 {
			out = append(out, Target{Name: fmt.Sprintf("daemon CPU / 10^6 msg, steady, %d partitions <= 1.2 x 8 partitions'", big.Partitions),
				Measured: fmt.Sprintf("%.2f s (8: %.2f s)", big.SteadyCPUPerM, p8.SteadyCPUPerM),
				Ratio:    big.SteadyCPUPerM / p8.SteadyCPUPerM, Limit: 1.2, AtMost: true, Goal: goals[4]})
		}
	}
	if r.Idle != nil && r.Idle.Clients >= 10000 {
		out = append(out, Target{Name: fmt.Sprintf("%d idle clients: daemon RSS < 300 MB", r.Idle.Clients),
			Measured: fmt.Sprintf("%.0f MB peak", r.Idle.PeakRSSMB), Ratio: r.Idle.PeakRSSMB / 300, Limit: 1, AtMost: true, Goal: goals[6]})
	}
	return out
}

// runTargets prints the performance targets measured in each results.json
// given, one line per target and one column per file (for a before and
// after), computed from the measurements whatever the file's own Targets say.
func runTargets(args []string) error { return printTargets(os.Stdout, args) }

func printTargets(w io.Writer, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: fanout-bench targets RESULTS.json...")
	}
	var names []string
	got := map[string][]string{}
	for i, path := range args {
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var r report
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for _, t := range r.targets() {
			if _, ok := got[t.Name]; !ok {
				names = append(names, t.Name)
				got[t.Name] = make([]string, len(args))
			}
			status := "met"
			if !t.Met() {
				status = "not met"
			}
			got[t.Name][i] = fmt.Sprintf("%s (%s)", t.ratio(), status)
		}
	}
	fmt.Fprintf(w, "%-64s %s\n", "target", strings.Join(args, " -> "))
	for _, n := range names {
		col := got[n]
		for i := range col {
			if col[i] == "" {
				col[i] = "-"
			}
		}
		fmt.Fprintf(w, "%-64s %s\n", n, strings.Join(col, " -> "))
	}
	return nil
}

// opt formats v with f, or is empty when v is 0 (not measured).
func opt(v float64, f string) string {
	if v == 0 {
		return ""
	}
	return fmt.Sprintf(f, v)
}
