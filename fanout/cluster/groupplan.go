package cluster

import (
	"cmp"
	"slices"
	"strings"

	"github.com/nanoservice/core-fanout/fanout/kafkastore"
)

// PlanGroup is the planner of spread mode on the Kafka store
// (kafkastore.Planner): what the group's leader computes for a generation
// of the group fanout_<id>, with the assignment of spread mode (assign):
// every member's target, balanced by weight and sticky to the previous
// plan's targets (or, for a leader that received none, to what the members
// own), so that a join, a leave or new partitions move as few partitions as
// any balanced assignment could.
//
// A partition is held by at most one member in a generation: the member
// that owns it (reports it in its join: it serves it or hands it over; the
// newest generation wins a conflict, and a tie gives it to nobody, so that
// both drop it), else its target owner. A partition owned by a member and
// assigned to another stays with its owner, which hands it over and joins
// again without it; its target owner gets it in that next generation.
// Members that are not spread members (no node id) get nothing.
func PlanGroup(in kafkastore.PlanInput) kafkastore.Plan {
	var cands []candidate
	n := int32(0)
	for _, m := range in.Members {
		if m.Node == "" {
			continue
		}
		cands = append(cands, candidate{id: m.Node, addr: m.Addr, weight: max(m.Weight, 1)})
		n = max(n, m.Partitions)
	}
	if n == 0 && in.Previous != nil {
		n = in.Previous.Partitions // nobody knows the count: keep the last one
	}

	// Who owns each partition now.
	type claim struct {
		node string
		gen  int32
		tie  bool
	}
	owner := map[int32]claim{}
	for _, m := range in.Members {
		if m.Node == "" {
			continue
		}
		for _, p := range m.Owned {
			if p < 0 || p >= n {
				continue
			}
			c, ok := owner[p]
			switch {
			case !ok || m.Generation > c.gen:
				owner[p] = claim{node: m.Node, gen: m.Generation}
			case m.Generation == c.gen && m.Node != c.node:
				c.tie = true
				owner[p] = c
			}
		}
	}

	// Where each partition goes: sticky to the previous plan's targets,
	// else to what the members own.
	prev := map[string][]int32{}
	if in.Previous != nil {
		for _, o := range in.Previous.Owners {
			prev[o.Node] = o.Target
		}
	} else {
		for p, c := range owner {
			if !c.tie {
				prev[c.node] = append(prev[c.node], p)
			}
		}
	}
	targets := assign(prev, cands, n)

	held := map[string][]int32{}
	for p := range n {
		c, owned := owner[p]
		switch {
		case owned && c.tie:
			// Two members say they own it in one generation: neither may.
		case owned:
			held[c.node] = append(held[c.node], p)
		default:
			for node, ps := range targets {
				if _, ok := slices.BinarySearch(ps, p); ok {
					held[node] = append(held[node], p)
					break
				}
			}
		}
	}

	plan := kafkastore.Plan{Generation: in.Generation, Leader: in.Leader, Partitions: n}
	switch {
	case in.Previous != nil:
		plan.Initial = in.Previous.Initial
	case slices.ContainsFunc(in.Members, func(m kafkastore.PlanMember) bool { return m.Planned }):
		for _, m := range in.Members {
			if m.Planned {
				plan.Initial = max(plan.Initial, m.Initial)
			}
		}
	case !in.Committed:
		plan.Initial = n // a new line in a group that never committed
	}
	slices.SortFunc(cands, func(a, b candidate) int { return strings.Compare(a.id, b.id) })
	for _, c := range cands {
		o := kafkastore.PlanOwner{Node: c.id, Addr: c.addr, Weight: c.weight, Target: targets[c.id], Held: held[c.id]}
		if o.Target == nil {
			o.Target = []int32{}
		}
		if o.Held == nil {
			o.Held = []int32{}
		}
		slices.Sort(o.Held)
		plan.Owners = append(plan.Owners, o)
	}
	slices.SortFunc(plan.Owners, func(a, b kafkastore.PlanOwner) int { return cmp.Compare(a.Node, b.Node) })
	return plan
}

// AssignmentOfPlan returns spread mode's Assignment of a plan of the
// Kafka store: epoch 0 (no election), the group's generation, each member's
// target partitions.
func AssignmentOfPlan(p *kafkastore.Plan) *Assignment {
	if p == nil {
		return nil
	}
	a := &Assignment{Generation: uint64(max(p.Generation, 0)), Partitions: p.Partitions, InitialPartitions: p.Initial}
	for _, o := range p.Owners {
		a.Owners = append(a.Owners, Owner{NodeID: o.Node, Addr: o.Addr, Partitions: slices.Clone(o.Target)})
	}
	slices.SortFunc(a.Owners, func(x, y Owner) int { return strings.Compare(x.NodeID, y.NodeID) })
	return a
}
