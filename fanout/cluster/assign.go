package cluster

import (
	"cmp"
	"slices"
	"strings"
)

// Assignment says, in spread mode, which member owns which partition of the
// topic. The elected leader computes it (assign), publishes it in its
// heartbeats, and every member accepts it only from the leader that
// ZooKeeper records for Epoch.
type Assignment struct {
	Epoch      uint64 // the epoch of the leader that computed it
	Generation uint64 // grows by one with every change, across leaders
	Partitions int32  // the topic's partition count it covers
	// InitialPartitions is the number of partitions that start at
	// --initial-offset when they have no committed offset: the partition
	// count when this line of assignments began, in a group that had
	// committed nothing then; else 0. It is carried from generation to
	// generation. A partition at or above it (added while the cluster ran,
	// or whose start nobody committed) starts at the oldest offset.
	InitialPartitions int32
	Owners            []Owner // by node id; every member in the assignment, even one that owns nothing
}

// Owner is one member of an Assignment and the partitions it owns.
type Owner struct {
	NodeID     string
	Addr       string  // its advertised client address
	Partitions []int32 // ascending
}

// Of returns the partitions node owns, ascending (nil when none).
func (a *Assignment) Of(node string) []int32 {
	if a == nil {
		return nil
	}
	for _, o := range a.Owners {
		if o.NodeID == node {
			return o.Partitions
		}
	}
	return nil
}

// OwnerOf returns the member that owns partition p, or "".
func (a *Assignment) OwnerOf(p int32) string {
	if a == nil {
		return ""
	}
	for _, o := range a.Owners {
		if _, ok := slices.BinarySearch(o.Partitions, p); ok {
			return o.NodeID
		}
	}
	return ""
}

// Addrs returns the advertised addresses of the members that own at least
// one partition, sorted.
func (a *Assignment) Addrs() []string {
	if a == nil {
		return nil
	}
	var out []string
	for _, o := range a.Owners {
		if len(o.Partitions) > 0 && o.Addr != "" {
			out = append(out, o.Addr)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// owned returns the partitions of each member.
func (a *Assignment) owned() map[string][]int32 {
	if a == nil {
		return nil
	}
	m := make(map[string][]int32, len(a.Owners))
	for _, o := range a.Owners {
		m[o.NodeID] = o.Partitions
	}
	return m
}

// sameOwners reports whether a and b give every member the same partitions
// at the same address (epoch and generation aside).
func (a *Assignment) sameOwners(b *Assignment) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Partitions == b.Partitions && slices.EqualFunc(a.Owners, b.Owners, func(x, y Owner) bool {
		return x.NodeID == y.NodeID && x.Addr == y.Addr && slices.Equal(x.Partitions, y.Partitions)
	})
}

// candidate is a live member that can own partitions.
type candidate struct {
	id     string
	addr   string
	weight int // at least 1
}

// assign returns which of members owns which of the partitions 0..n-1,
// given prev, the partitions each member owned before (members that are
// gone, and partitions that no longer exist, may appear in it). It is a
// pure function of its arguments, whatever their order:
//
//   - Balanced: with W the sum of the weights, a member of weight w owns
//     floor(n·w/W) or ceil(n·w/W) partitions (with equal weights, floor(n/M)
//     or ceil(n/M)); every partition has exactly one owner.
//   - Sticky: a member keeps as many of its previous partitions as its
//     share allows, and the members that get one more than their floor are
//     chosen among those that already hold that many, so that a join, a
//     leave or a change of n moves as few partitions as any balanced
//     assignment could.
//   - Deterministic: ties go by node id; a member keeps its lowest
//     partitions; free partitions go out in ascending order, to the members
//     below their share in node-id order.
//
// Members must have distinct ids and weights of at least 1. With no member
// the result is empty.
func assign(prev map[string][]int32, members []candidate, n int32) map[string][]int32 {
	if len(members) == 0 {
		return map[string][]int32{}
	}
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b candidate) int { return strings.Compare(a.id, b.id) })
	out := make(map[string][]int32, len(ms))
	if n <= 0 {
		for _, m := range ms {
			out[m.id] = []int32{}
		}
		return out
	}

	// What each live member holds of the partitions that exist, each
	// partition counted for one member only (the first by node id).
	taken := make([]bool, n)
	held := make([][]int32, len(ms))
	for i, m := range ms {
		ps := slices.Clone(prev[m.id])
		slices.Sort(ps)
		for _, p := range slices.Compact(ps) {
			if p >= 0 && p < n && !taken[p] {
				taken[p] = true
				held[i] = append(held[i], p)
			}
		}
	}

	// Shares: floor for everyone, one more for the rem members whose exact
	// share is not whole, preferring those that hold more than their floor
	// (each such choice saves a move), then the larger fraction, then the
	// node id.
	var total int64
	for _, m := range ms {
		total += int64(m.weight)
	}
	quota := make([]int, len(ms))
	frac := make([]int64, len(ms))
	rem := int(n)
	var eligible []int
	for i, m := range ms {
		q := int64(n) * int64(m.weight)
		quota[i], frac[i] = int(q/total), q%total
		rem -= quota[i]
		if frac[i] > 0 {
			eligible = append(eligible, i)
		}
	}
	slices.SortStableFunc(eligible, func(a, b int) int {
		ea, eb := len(held[a]) > quota[a], len(held[b]) > quota[b]
		switch {
		case ea != eb:
			if ea {
				return -1
			}
			return 1
		case frac[a] != frac[b]:
			return -cmp.Compare(frac[a], frac[b])
		}
		return cmp.Compare(a, b) // ms is sorted by id
	})
	for _, i := range eligible[:rem] {
		quota[i]++
	}

	// Keep what the share allows, lowest partitions first; free the rest.
	clear(taken)
	for i, m := range ms {
		keep := held[i][:min(len(held[i]), quota[i])]
		out[m.id] = slices.Clone(keep)
		for _, p := range keep {
			taken[p] = true
		}
	}
	// Hand out the free partitions, ascending, to the members below their
	// share, in node-id order.
	i := 0
	for p := range n {
		if taken[p] {
			continue
		}
		for len(out[ms[i].id]) >= quota[i] {
			i++
		}
		out[ms[i].id] = append(out[ms[i].id], p)
	}
	for _, m := range ms {
		slices.Sort(out[m.id])
	}
	return out
}
