package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Planned is one fault of a schedule: when it starts (from the start of the
// fault phase), what it is, how long it lasts, and whom it aims at (Pick
// chooses among the candidates when it is injected; -1 means the leader).
type Planned struct {
	At       time.Duration
	Kind     string
	Duration time.Duration
	Pick     int
}

func (p Planned) String() string {
	target := fmt.Sprintf("#%d", p.Pick)
	if p.Pick < 0 {
		target = "leader"
	}
	return fmt.Sprintf("+%s %s %s for %s", p.At.Round(time.Millisecond), p.Kind, target, p.Duration.Round(time.Millisecond))
}

// weights of the fault kinds after each has come once.
var weights = []struct {
	kind string
	w    int
	max  int // at most this many per run; 0: no bound
}{
	{FaultDaemonKill, 4, 0},
	{FaultDaemonTerm, 2, 0},
	{FaultDaemonStop, 2, 0},
	{FaultClientKill, 2, 0},
	{FaultClientTerm, 1, 0},
	{FaultClientStop, 1, 0},
	{FaultKafkaRestart, 1, 6},
	{FaultZKRestart, 1, 6},
	{FaultCutKafka, 1, 0},
	{FaultCutZooKeeper, 1, 0},
	{FaultCutClients, 1, 0},
	{FaultAddPartitions, 1, 2},
}

// Schedule draws the faults of a run from seed: every kind once, in a
// random order, then kinds by weight, one start every interval (±30 %),
// until span is used up. Each fault lasts 1 to 4 s (a process's downtime
// before its restart, a pause, a cut). The same seed gives the same
// schedule. Kinds in without are never drawn (the ZooKeeper faults of a
// run whose daemons use no ZooKeeper).
func Schedule(seed uint64, span, interval time.Duration, without ...string) []Planned {
	rng := rand.New(rand.NewPCG(seed, 0x6368616f73))
	var kinds []string
	for _, i := range rng.Perm(len(weights)) {
		if !slices.Contains(without, weights[i].kind) {
			kinds = append(kinds, weights[i].kind)
		}
	}
	count := map[string]int{}
	for _, k := range kinds {
		count[k]++
	}
	total := 0
	for _, w := range weights {
		total += w.w
	}
	drawn := func(kind string) bool { return !slices.Contains(without, kind) }
	var out []Planned
	at := interval / 2
	for i := 0; at < span; i++ {
		var kind string
		if i < len(kinds) {
			kind = kinds[i]
		} else {
			for kind == "" {
				n := rng.IntN(total)
				for _, w := range weights {
					if n < w.w {
						if drawn(w.kind) && (w.max == 0 || count[w.kind] < w.max) {
							kind = w.kind
						}
						break
					}
					n -= w.w
				}
			}
			count[kind]++
		}
		pick := rng.IntN(8)
		if daemonFault(kind) && rng.IntN(2) == 0 {
			pick = -1 // the leader
		}
		d := time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
		out = append(out, Planned{At: at, Kind: kind, Duration: d, Pick: pick})
		at += interval*7/10 + time.Duration(rng.Int64N(int64(interval*6/10)))
	}
	return out
}
