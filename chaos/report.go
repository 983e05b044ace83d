package chaos

import (
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nanoservice/core-fanout/fanout/authority"
)

// Summary is the outcome of one run, written as summary.json and summary.md.
type Summary struct {
	Mode         string         `json:"mode"`
	Store        string         `json:"offset_store,omitempty"` // the daemons' --offset-store; "" for ZooKeeper
	Seed         uint64         `json:"seed"`
	Command      string         `json:"command"`
	Started      time.Time      `json:"started"`
	Seconds      float64        `json:"seconds"`
	Daemons      int            `json:"daemons"`
	Clients      int            `json:"clients"`
	Rate         int            `json:"rate"`
	FaultsByKind map[string]int `json:"faults_by_kind"`
	Faults       int            `json:"faults"`
	Skipped      int            `json:"faults_skipped"`
	Drained      bool           `json:"drained"`
	*Result
	// RecoveryMS are min, median and max of Result.Recovery in
	// milliseconds: failover (leader mode) or handoff (spread mode).
	RecoveryMS []int64 `json:"recovery_ms"`
	Passed     bool    `json:"passed"`
}

func summarize(cfg Config, in Input, res *Result, start, end time.Time, drained bool, skipped int) *Summary {
	s := &Summary{Mode: cfg.Mode, Store: cfg.Store, Seed: cfg.Seed, Command: strings.Join(os.Args, " "), Started: start.UTC(),
		Seconds: end.Sub(start).Seconds(), Daemons: cfg.Daemons, Clients: cfg.Clients + 2 + btoi(cfg.Python != ""), Rate: cfg.Rate,
		FaultsByKind: map[string]int{}, Faults: len(in.Faults), Skipped: skipped, Drained: drained, Result: res}
	for _, f := range in.Faults {
		s.FaultsByKind[f.Kind]++
	}
	if rs := slices.Sorted(slices.Values(res.Recovery)); len(rs) > 0 {
		s.RecoveryMS = []int64{rs[0].Milliseconds(), rs[len(rs)/2].Milliseconds(), rs[len(rs)-1].Milliseconds()}
	}
	s.Passed = drained && res.Passed()
	return s
}

// causes returns the keys of a count by cause, sorted, unexplained last.
func causes(m map[string]int) []string {
	return slices.SortedFunc(func(yield func(string) bool) {
		for c := range m {
			if !yield(c) {
				return
			}
		}
	}, func(a, b string) int {
		switch {
		case a == b:
			return 0
		case a == causeUnexplained:
			return 1
		case b == causeUnexplained:
			return -1
		}
		return strings.Compare(a, b)
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Markdown renders the summary.
func (s *Summary) Markdown() string {
	var b strings.Builder
	verdict := "PASS"
	if !s.Passed {
		verdict = "FAIL"
	}
	recoveryName := "failover (leader faults)"
	if s.Mode != "leader" {
		recoveryName = "handoff (member faults)"
	}
	store := s.Store
	if k, err := authority.Lookup(s.Store); err == nil {
		store = k.Title
	}
	fmt.Fprintf(&b, "# Chaos run: %s mode, offsets in %s, seed %d: %s\n\n", s.Mode, store, s.Seed, verdict)
	fmt.Fprintf(&b, "Command: `%s`  \nStarted %s, %.0f s; %d daemons, %d clients, %d msg/s.\n\n",
		s.Command, s.Started.Format(time.RFC3339), s.Seconds, s.Daemons, s.Clients, s.Rate)
	fmt.Fprintf(&b, "| figure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| acknowledged sends missing from Kafka at the end | %d |\n", s.Vanished)
	fmt.Fprintf(&b, "| messages in Kafka | %d |\n| deliveries | %d |\n| acked at least once | %d |\n| **lost** | **%d** |\n",
		s.Messages, s.Deliveries, s.Acked, s.Lost)
	if s.DeadLetters > 0 || s.Poison > 0 {
		fmt.Fprintf(&b, "| poison records (nacked by every client) | %d |\n| records dead-lettered (not lost) | %d |\n"+
			"| of them not poison (failed their attempts in faults) | %d |\n| dead-letter records | %d |\n| **dead letters wrong** | **%d** |\n",
			s.Poison, s.DeadLettered, s.DeadLetteredHealthy, s.DeadLetters, s.DeadLetterWrong)
	}
	for _, c := range causes(s.Duplicates) {
		fmt.Fprintf(&b, "| duplicates: %s | %d |\n", c, s.Duplicates[c])
	}
	if s.DeliveryLogs.Events > 0 {
		for _, c := range causes(s.Failures) {
			fmt.Fprintf(&b, "| failed attempts counted: %s | %d |\n", c, s.Failures[c])
		}
		for _, c := range causes(s.NotCounted) {
			fmt.Fprintf(&b, "| failed attempts not counted: %s | %d |\n", c, s.NotCounted[c])
		}
		fmt.Fprintf(&b, "| delivery logs: events / attempts / dropped (slow disk) / unreadable lines | %d / %d / %d / %d |\n",
			s.DeliveryLogs.Events, s.DeliveryLogs.Attempts, s.DeliveryLogs.Dropped, s.DeliveryLogs.Bad)
		fmt.Fprintf(&b, "| client-logged deliveries in no delivery log | %d |\n", s.DeliveryLogs.Unmatched)
	}
	fmt.Fprintf(&b, "| committed-offset samples | %d |\n| samples past an unacked record | %d |\n", s.OffsetSamples, s.OffsetViolations)
	if len(s.RecoveryMS) == 3 {
		fmt.Fprintf(&b, "| %s min / median / max | %d / %d / %d ms (%d faults; %d more during a server restart or with no traffic) |\n",
			recoveryName, s.RecoveryMS[0], s.RecoveryMS[1], s.RecoveryMS[2], len(s.Recovery), s.Unmeasured)
	}
	fmt.Fprintf(&b, "| faults after which a partition never delivered again | %d |\n", s.NotRecovered)
	fmt.Fprintf(&b, "| records nacked with a delay that came again sooner, no fault excusing it | %d |\n", s.EarlyNackRedeliveries)
	if s.Mode == "spread" {
		fmt.Fprintf(&b, "| ownership-record samples | %d |\n| deliveries by a member while another owned the partition | %d |\n",
			s.OwnerSamples, s.TwoOwners)
	}
	fmt.Fprintf(&b, "| drained (every record acked, offsets committed) | %v |\n\n", s.Drained)
	fmt.Fprintf(&b, "Faults injected: %d (%d skipped: their target was held by another fault)\n\n| kind | count |\n|---|---|\n", s.Faults, s.Skipped)
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range s.FaultsByKind {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, s.FaultsByKind[k])
	}
	for _, l := range []struct {
		name string
		xs   []string
	}{{"Lost records", s.LostRecords}, {"Unexplained duplicates", s.Unexplained}, {"Unexplained failures", s.UnexplainedFailures},
		{"Offset violations", s.Violations}, {"Two owners", s.TwoOwnersAt}, {"Wrong dead letters", s.DeadLetterWrongAt},
		{"Early redeliveries of delayed nacks", s.EarlyNackRedeliveriesAt}} {
		if len(l.xs) > 0 {
			fmt.Fprintf(&b, "\n%s (first %d):\n\n", l.name, len(l.xs))
			for _, x := range l.xs {
				fmt.Fprintf(&b, "- %s\n", x)
			}
		}
	}
	b.WriteString("\nDuplicates and counted failures by cause, each attempt found in its daemon's delivery log by its delivery id: " +
		"*nack*, given back by its client (a duplicate no sooner than the delay asked for, unless served anew); *timeout*, " +
		"its client did not ack it within --ack-timeout; *client left holding it*, its client said goodbye with it unanswered; " +
		"*fault: KIND*, a fault that hit its holder while it held it (its client, the daemon that delivered it, or a cut between " +
		"them; one counted failure per record and fault), or, for a record delivered again after it was acked, a fault that " +
		"ended what its daemon served it under (the daemon's own fault, its cut from Kafka or ZooKeeper, a server restart), " +
		"or made its daemon close the connection holding it; " +
		"*handoff* (spread mode), its partition was handed over (revoked by its owner, then assigned) after it was acked; " +
		"*partition restarted below it*, the daemon fetched it again.\n\n")
	b.WriteString("Timeline (timeline.png): green, records done per second (first acks, dead letters); red, lag (records produced " +
		"and not yet done); bands, faults: red daemon kill/term, orange daemon stop, blue client faults, purple server " +
		"restarts, grey cuts, black partition additions.\n")
	return b.String()
}

// Write writes summary.json, summary.md and timeline.png into dir.
func (s *Summary) Write(dir string, in Input, start, end time.Time) error {
	js, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.md"), []byte(s.Markdown()), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "timeline.png"))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := png.Encode(f, Timeline(in, start, end)); err != nil {
		return fmt.Errorf("timeline: %w", err)
	}
	return f.Close()
}

// faultColor is the colour of a fault's band on the timeline.
func faultColor(kind string) color.RGBA {
	switch kind {
	case FaultDaemonKill, FaultDaemonTerm:
		return color.RGBA{255, 200, 200, 255}
	case FaultDaemonStop:
		return color.RGBA{255, 225, 180, 255}
	case FaultClientKill, FaultClientTerm, FaultClientStop:
		return color.RGBA{200, 215, 255, 255}
	case FaultKafkaRestart, FaultZKRestart:
		return color.RGBA{225, 200, 255, 255}
	case FaultAddPartitions:
		return color.RGBA{0, 0, 0, 255}
	}
	return color.RGBA{220, 220, 220, 255}
}

// Timeline draws faults as bands, acks per second (green) and lag (red)
// over the run, each curve scaled to its own maximum.
func Timeline(in Input, start, end time.Time) image.Image {
	const w, h, pad = 1200, 400, 10
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	span := max(end.Sub(start), time.Second)
	x := func(t time.Time) int { return pad + int(float64(w-2*pad)*float64(t.Sub(start))/float64(span)) }
	for _, f := range in.Faults {
		x0, x1 := x(f.Start), max(x(f.End), x(f.Start)+2)
		// Each fault kind has its own row band, so overlapping faults stay visible.
		c := faultColor(f.Kind)
		for xx := max(x0, 0); xx < min(x1, w); xx++ {
			for y := pad; y < h-pad; y++ {
				if c.R == 0 || xx < x0+2 || y%4 != 0 {
					img.Set(xx, y, c)
				}
			}
		}
	}
	secs := int(span/time.Second) + 1
	acked := make([]float64, secs)
	lag := make([]float64, secs)
	first := map[key]time.Time{}
	for _, e := range in.Events {
		k := key{e.Partition, e.Offset}
		if t, ok := first[k]; e.Kind == EventAck && (!ok || e.At.Before(t)) {
			first[k] = e.At
		}
	}
	for _, dl := range in.DeadLetters { // a dead-lettered record is done too
		k := key{dl.Partition, dl.Offset}
		if t, ok := first[k]; !ok || dl.At.Before(t) {
			first[k] = dl.At
		}
	}
	// lag holds the changes per second first, then their running sum.
	for _, t := range first {
		if i := int(t.Sub(start) / time.Second); i >= 0 && i < secs {
			acked[i]++
			lag[i]--
		}
	}
	for _, r := range in.Records {
		if i := min(max(int(r.At.Sub(start)/time.Second), 0), secs-1); i >= 0 {
			lag[i]++
		}
	}
	for i := 1; i < secs; i++ {
		lag[i] += lag[i-1]
	}
	plot := func(vs []float64, c color.RGBA) {
		top := 1.0
		for _, v := range vs {
			top = max(top, v)
		}
		prevY := -1
		for i, v := range vs {
			xx := x(start.Add(time.Duration(i) * time.Second))
			y := h - pad - int(float64(h-2*pad)*max(v, 0)/top)
			if prevY >= 0 {
				for yy := min(y, prevY); yy <= max(y, prevY); yy++ {
					img.Set(xx, yy, c)
					img.Set(xx+1, yy, c)
				}
			}
			nx := x(start.Add(time.Duration(i+1) * time.Second))
			for xx2 := xx; xx2 <= nx && xx2 < w; xx2++ {
				img.Set(xx2, y, c)
				img.Set(xx2, y+1, c)
			}
			prevY = y
		}
	}
	plot(acked, color.RGBA{0, 150, 0, 255})
	plot(lag, color.RGBA{200, 0, 0, 255})
	return img
}
