package cluster

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// equal members of weight 1, node-1 .. node-m.
func equalMembers(m int) []candidate {
	out := make([]candidate, m)
	for i := range out {
		out[i] = candidate{id: fmt.Sprintf("node-%d", i+1), weight: 1}
	}
	return out
}

func parts(ps ...int32) []int32 { return ps }

func TestAssignExamples(t *testing.T) {
	t.Parallel()
	three := assign(nil, equalMembers(3), 12)
	want := map[string][]int32{
		"node-1": parts(0, 1, 2, 3), "node-2": parts(4, 5, 6, 7), "node-3": parts(8, 9, 10, 11),
	}
	if !maps.EqualFunc(three, want, slices.Equal) {
		t.Fatalf("3 members, 12 partitions: %v, want %v", three, want)
	}

	// A fourth member joins: each of the three gives up exactly one.
	four := assign(three, equalMembers(4), 12)
	for id, ps := range four {
		if len(ps) != 3 {
			t.Fatalf("after the join %s owns %v, want 3 partitions", id, ps)
		}
	}
	for _, id := range []string{"node-1", "node-2", "node-3"} {
		if kept := common(three[id], four[id]); len(kept) != 3 {
			t.Fatalf("after the join %s owns %v, kept %v of %v: want 3 kept", id, four[id], kept, three[id])
		}
	}
	if got := moved(three, four); got != 3 {
		t.Fatalf("the join moved %d partitions, want 3", got)
	}

	// node-2 leaves: only its partitions move, spread over the others.
	left := assign(four, []candidate{{id: "node-1", weight: 1}, {id: "node-3", weight: 1}, {id: "node-4", weight: 1}}, 12)
	for _, id := range []string{"node-1", "node-3", "node-4"} {
		if len(left[id]) != 4 || len(common(four[id], left[id])) != 3 {
			t.Fatalf("after node-2 left %s owns %v (had %v): want its 3 and one more", id, left[id], four[id])
		}
	}
	if _, ok := left["node-2"]; ok {
		t.Fatalf("node-2 left but owns %v", left["node-2"])
	}

	// The topic grows from 12 to 15 partitions: the new ones are spread,
	// nothing else moves.
	grown := assign(left, equalMembers(4)[:0], 15) // no member: empty
	if len(grown) != 0 {
		t.Fatalf("no member: %v, want nothing", grown)
	}
	grown = assign(left, []candidate{{id: "node-1", weight: 1}, {id: "node-3", weight: 1}, {id: "node-4", weight: 1}}, 15)
	if got := moved(left, grown); got != 0 {
		t.Fatalf("growing to 15 moved %d existing partitions: %v -> %v", got, left, grown)
	}
	for id, ps := range grown {
		if len(ps) != 5 {
			t.Fatalf("after growing to 15 %s owns %v, want 5", id, ps)
		}
	}

	// Weights: node-b weighs twice as much.
	w := assign(nil, []candidate{{id: "node-a", weight: 1}, {id: "node-b", weight: 2}}, 12)
	if len(w["node-a"]) != 4 || len(w["node-b"]) != 8 {
		t.Fatalf("weights 1 and 2 over 12: %v, want 4 and 8", w)
	}

	// No partitions: every member owns nothing.
	if got := assign(nil, equalMembers(2), 0); len(got) != 2 || len(got["node-1"]) != 0 || len(got["node-2"]) != 0 {
		t.Fatalf("0 partitions: %v", got)
	}
}

// common returns the partitions in both a and b.
func common(a, b []int32) []int32 {
	var out []int32
	for _, p := range a {
		if slices.Contains(b, p) {
			out = append(out, p)
		}
	}
	return out
}

// moved counts the partitions owned in both a and b whose owner differs.
func moved(a, b map[string][]int32) int {
	owner := map[int32]string{}
	for id, ps := range a {
		for _, p := range ps {
			owner[p] = id
		}
	}
	n := 0
	for id, ps := range b {
		for _, p := range ps {
			if o, ok := owner[p]; ok && o != id {
				n++
			}
		}
	}
	return n
}

// randomCase draws members (1-12, weights 1-4 or all 1), a partition count
// (0-100) and a previous assignment that may name members that are gone,
// partitions that no longer exist, partitions twice and nothing at all.
func randomCase(r *rand.Rand) (prev map[string][]int32, members []candidate, n int32) {
	weighted := r.IntN(2) == 0
	for i := range 1 + r.IntN(12) {
		w := 1
		if weighted {
			w = 1 + r.IntN(4)
		}
		members = append(members, candidate{id: fmt.Sprintf("node-%02d", i+r.IntN(3)*20), weight: w})
	}
	slices.SortFunc(members, func(a, b candidate) int { return cmpString(a.id, b.id) })
	members = slices.CompactFunc(members, func(a, b candidate) bool { return a.id == b.id })
	n = int32(r.IntN(101))
	prev = map[string][]int32{}
	oldN := int32(r.IntN(101))
	var ids []string
	for _, m := range members {
		ids = append(ids, m.id)
	}
	ids = append(ids, "gone-1", "gone-2")
	for p := range oldN {
		if r.IntN(10) == 0 {
			continue // owned by nobody
		}
		id := ids[r.IntN(len(ids))]
		prev[id] = append(prev[id], p)
		if r.IntN(30) == 0 { // listed twice
			id2 := ids[r.IntN(len(ids))]
			prev[id2] = append(prev[id2], p)
		}
	}
	return prev, members, n
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Properties for any member and partition counts: every partition has
// exactly one owner, a live member; each member's share is the floor or the
// ceiling of its weighted share; the partitions kept are the most any
// balanced assignment could keep; the result does not depend on the order
// of the members; and assigning again changes nothing.
func TestAssignProperties(t *testing.T) {
	t.Parallel()
	for seed := range uint64(3000) {
		r := rand.New(rand.NewPCG(seed, 7))
		prev, members, n := randomCase(r)
		got := assign(prev, members, n)
		name := fmt.Sprintf("seed %d: %d members, %d partitions", seed, len(members), n)

		// Exactly one live owner per partition.
		owner := map[int32]string{}
		for id, ps := range got {
			if !slices.ContainsFunc(members, func(m candidate) bool { return m.id == id }) {
				t.Fatalf("%s: %s owns %v but is not a member", name, id, ps)
			}
			if !slices.IsSorted(ps) {
				t.Fatalf("%s: %s owns %v, not ascending", name, id, ps)
			}
			for _, p := range ps {
				if p < 0 || p >= n {
					t.Fatalf("%s: %s owns partition %d", name, id, p)
				}
				if o, dup := owner[p]; dup {
					t.Fatalf("%s: partition %d owned by %s and %s", name, p, o, id)
				}
				owner[p] = id
			}
		}
		if len(owner) != int(n) || len(got) != len(members) {
			t.Fatalf("%s: %d partitions owned, %d members in the result", name, len(owner), len(got))
		}

		// Balanced: floor or ceiling of the weighted share.
		total := 0
		for _, m := range members {
			total += m.weight
		}
		for _, m := range members {
			lo := int(n) * m.weight / total
			hi := lo
			if int(n)*m.weight%total != 0 {
				hi++
			}
			if k := len(got[m.id]); k < lo || k > hi {
				t.Fatalf("%s: %s (weight %d of %d) owns %d partitions, want %d..%d", name, m.id, m.weight, total, k, lo, hi)
			}
		}

		// Sticky: kept = the most a balanced assignment can keep. A member
		// keeps at most min(held, floor), plus one more for as many members
		// as get a ceiling, if it holds more than its floor.
		held := map[string]map[int32]bool{}
		claimed := map[int32]bool{}
		for _, m := range members { // the first holder by id counts, as in assign
			ps := slices.Clone(prev[m.id])
			slices.Sort(ps)
			held[m.id] = map[int32]bool{}
			for _, p := range ps {
				if p >= 0 && p < n && !claimed[p] {
					claimed[p] = true
					held[m.id][p] = true
				}
			}
		}
		kept, best, extras, canUse := 0, 0, int(n), 0
		for _, m := range members {
			for _, p := range got[m.id] {
				if held[m.id][p] {
					kept++
				}
			}
			floor := int(n) * m.weight / total
			best += min(len(held[m.id]), floor)
			extras -= floor
			if int(n)*m.weight%total != 0 && len(held[m.id]) > floor {
				canUse++
			}
		}
		best += min(extras, canUse)
		if kept != best {
			t.Fatalf("%s: kept %d previous partitions, a balanced assignment keeps %d\nprev %v\ngot  %v", name, kept, best, prev, got)
		}

		// Deterministic, whatever the order of the members.
		shuffled := slices.Clone(members)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if again := assign(prev, shuffled, n); !maps.EqualFunc(again, got, slices.Equal) {
			t.Fatalf("%s: another member order gives %v, want %v", name, again, got)
		}
		// Stable: nothing moves when nothing changed.
		if again := assign(got, members, n); !maps.EqualFunc(again, got, slices.Equal) {
			t.Fatalf("%s: assigning again gives %v, want %v", name, again, got)
		}
	}
}

// A member joining a balanced assignment of equal weights takes its share
// and each partition it gets comes from a member above the new share: the
// join moves exactly floor(P/(M+1)) or ceil(...) partitions, no more. A
// member leaving moves only its own partitions.
func TestAssignJoinAndLeaveMoveTheMinimum(t *testing.T) {
	t.Parallel()
	for m := 1; m <= 10; m++ {
		for n := int32(0); n <= 64; n++ {
			before := assign(nil, equalMembers(m), n)
			after := assign(before, equalMembers(m+1), n)
			newcomer := fmt.Sprintf("node-%d", m+1)
			if got, want := moved(before, after), len(after[newcomer]); got != want {
				t.Fatalf("%d members, %d partitions: the join of %s moved %d partitions, it took %d", m, n, newcomer, got, want)
			}
			// The first member leaves: only its partitions move.
			survivors := equalMembers(m + 1)[1:]
			left := assign(after, survivors, n)
			if got, want := moved(after, left), len(after["node-1"]); got != want {
				t.Fatalf("%d members, %d partitions: node-1 left, %d partitions moved, it had %d", m+1, n, got, want)
			}
		}
	}
}

// Fuzz: the invariants that do not need the reference computation.
func FuzzAssign(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Add(uint64(42), uint64(0))
	f.Fuzz(func(t *testing.T, a, b uint64) {
		r := rand.New(rand.NewPCG(a, b))
		prev, members, n := randomCase(r)
		got := assign(prev, members, n)
		seen := 0
		for _, ps := range got {
			seen += len(ps)
		}
		if seen != int(n) {
			t.Fatalf("%d partitions owned of %d: %v", seen, n, got)
		}
	})
}

func TestAssignmentAccessors(t *testing.T) {
	t.Parallel()
	a := &Assignment{Owners: []Owner{
		{NodeID: "node-1", Addr: "h:2", Partitions: parts(0, 2)},
		{NodeID: "node-2", Addr: "h:1", Partitions: parts(1)},
		{NodeID: "node-3", Addr: "h:3"},
	}}
	if got := a.Addrs(); !slices.Equal(got, []string{"h:1", "h:2"}) {
		t.Fatalf("Addrs = %v, want the owners of partitions, sorted", got)
	}
	if got := a.OwnerOf(2); got != "node-1" {
		t.Fatalf("OwnerOf(2) = %q", got)
	}
	if got := a.OwnerOf(7); got != "" {
		t.Fatalf("OwnerOf(7) = %q", got)
	}
	if got := a.Of("node-2"); !slices.Equal(got, parts(1)) {
		t.Fatalf("Of(node-2) = %v", got)
	}
	var none *Assignment
	if none.Of("x") != nil || none.Addrs() != nil || none.OwnerOf(0) != "" {
		t.Fatal("a nil Assignment owns nothing")
	}
}
