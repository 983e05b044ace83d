package kafkastore

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/IBM/sarama"
)

// spreadProtocol is the group protocol (the "assignor") of spread mode's
// members; leader mode's is protocolName. The coordinator refuses a join
// whose protocols share none with those of the group's members
// (INCONSISTENT_GROUP_PROTOCOL), so members of the two modes never share
// the group: the second mode is refused until the first has left.
const spreadProtocol = "fanout-spread"

// Plan is spread mode's assignment of one generation of the group, as the
// group's leader computed it (a Planner): where each partition goes (an
// owner's Target), and who may hold it in this generation (an owner's
// Held). A partition is held by its target owner, unless another member
// still holds it from an earlier generation and hands it over: then it
// stays that member's, and its target owner gets it in a later generation,
// once the holder released it and joined again without it (cooperative
// rebalancing: only the partitions that move pause). Every member receives
// the whole plan in its assignment's user data; the assignment's partitions
// are the ones it holds, which Kafka's tools show.
type Plan struct {
	Generation int32       `json:"generation"` // the group's generation it was computed for
	Leader     string      `json:"leader"`     // the node id of the member that computed it
	Partitions int32       `json:"partitions"` // the topic's partition count it covers
	Initial    int32       `json:"initial"`    // cluster.Assignment.InitialPartitions
	Owners     []PlanOwner `json:"owners"`     // by node id: every member, even one that gets nothing
}

// PlanOwner is one member of a Plan.
type PlanOwner struct {
	Node   string  `json:"node"`
	Addr   string  `json:"addr,omitempty"` // its advertised client address
	Weight int     `json:"weight,omitempty"`
	Target []int32 `json:"target"` // ascending: the partitions assigned to it
	Held   []int32 `json:"held"`   // ascending: the partitions it may hold in this generation
}

// Owner returns the owner of node in p (false when none).
func (p *Plan) Owner(node string) (PlanOwner, bool) {
	if p == nil {
		return PlanOwner{}, false
	}
	for _, o := range p.Owners {
		if o.Node == node {
			return o, true
		}
	}
	return PlanOwner{}, false
}

// HolderOf returns the node that may hold partition p in this generation,
// or "".
func (p *Plan) HolderOf(part int32) string {
	if p == nil {
		return ""
	}
	for _, o := range p.Owners {
		if _, ok := slices.BinarySearch(o.Held, part); ok {
			return o.Node
		}
	}
	return ""
}

// String describes the plan for logs: "node-1:0-3 node-2:4-5(+6)": each
// owner's target, and in parentheses what it holds beyond it (hands over).
func (p *Plan) String() string {
	if p == nil {
		return "none"
	}
	var b strings.Builder
	for i, o := range p.Owners {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%s", o.Node, Ranges(o.Target))
		var extra []int32
		for _, h := range o.Held {
			if _, ok := slices.BinarySearch(o.Target, h); !ok {
				extra = append(extra, h)
			}
		}
		if len(extra) > 0 {
			fmt.Fprintf(&b, "(+%s)", Ranges(extra))
		}
	}
	return b.String()
}

// Ranges writes ascending partitions compactly: "0-3,6"; "-" for none.
func Ranges(ps []int32) string {
	if len(ps) == 0 {
		return "-"
	}
	var b strings.Builder
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", ps[i], ps[j])
		} else {
			fmt.Fprintf(&b, "%d", ps[i])
		}
		i = j + 1
	}
	return b.String()
}

// PlanMember is one member of a rebalance as the group's leader sees it,
// from the metadata of its join.
type PlanMember struct {
	MemberID string
	Node     string // "" for a member whose metadata is not a spread member's: it gets nothing
	Addr     string
	Weight   int
	// Owned are the partitions it holds, or may hold, as of Generation
	// (the generation it last synced, -1 for none).
	Owned      []int32
	Generation int32
	// Partitions is the topic's partition count it sees (0: unknown).
	Partitions int32
	// Initial is the InitialPartitions of the last plan it received, when
	// Planned.
	Initial int32
	Planned bool
}

// PlanInput is what the group's leader plans a generation from.
type PlanInput struct {
	Generation int32
	Leader     string // the leader's node id
	Members    []PlanMember
	// Previous is the last plan the leader received (nil when none): the
	// plan sticks to its targets.
	Previous *Plan
	// Committed reports whether the group ever committed offsets of the
	// topic (as far as the leader knows): a line of plans that begins
	// without one gives --initial-offset to no partition.
	Committed bool
}

// Planner computes the plan of a generation (cluster.PlanGroup). It must
// give every partition below the partition count at most one holder, and a
// partition that a member owns (Owned, with the newest Generation among
// those that own it) to that member to hold.
type Planner func(PlanInput) Plan

// memberMeta is the user data of a spread member's join: who it is, and
// what it knows of the topic and the last plan. Encoded as JSON.
type memberMeta struct {
	Node       string `json:"node"`
	Addr       string `json:"addr,omitempty"`
	Weight     int    `json:"weight"`
	Partitions int32  `json:"partitions,omitempty"`
	Initial    int32  `json:"initial,omitempty"`
	Planned    bool   `json:"planned,omitempty"`
}

// encodeJoin returns the protocol metadata of a spread member's join: a
// consumer subscription (version 2) of topic, with the partitions it owns
// as of generation and meta as its user data.
func encodeJoin(topic string, meta memberMeta, owned []int32, generation int32) (*sarama.ConsumerGroupMemberMetadata, error) {
	ud, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("kafkastore: encode member metadata: %w", err)
	}
	md := &sarama.ConsumerGroupMemberMetadata{Version: 2, Topics: []string{topic}, UserData: ud, GenerationID: generation}
	if len(owned) > 0 {
		md.OwnedPartitions = []*sarama.OwnedPartition{{Topic: topic, Partitions: slices.Sorted(slices.Values(owned))}}
	}
	return md, nil
}

// decodeJoin reads the member of a join's metadata for the leader's plan:
// a member whose metadata is not a spread member's gets no node id.
func decodeJoin(topic, memberID string, metadata []byte) PlanMember {
	pm := PlanMember{MemberID: memberID, Generation: -1}
	// sarama exports its decoder of consumer subscriptions only on a
	// described member.
	md, err := (&sarama.GroupMemberDescription{MemberMetadata: metadata}).GetMemberMetadata()
	if err != nil || md == nil {
		return pm
	}
	var meta memberMeta
	if err := json.Unmarshal(md.UserData, &meta); err != nil || meta.Node == "" {
		return pm
	}
	pm.Node, pm.Addr, pm.Weight = meta.Node, meta.Addr, max(meta.Weight, 1)
	pm.Partitions, pm.Initial, pm.Planned = meta.Partitions, meta.Initial, meta.Planned
	pm.Generation = md.GenerationID
	if md.Version < 2 {
		pm.Generation = -1
	}
	for _, op := range md.OwnedPartitions {
		if op.Topic == topic {
			pm.Owned = append(pm.Owned, op.Partitions...)
		}
	}
	slices.Sort(pm.Owned)
	pm.Owned = slices.Compact(pm.Owned)
	return pm
}

// encodeAssignment returns the assignment of the member of node under
// plan: the partitions it holds, with the whole plan as user data.
func encodeAssignment(topic string, plan *Plan, node string) (*sarama.ConsumerGroupMemberAssignment, error) {
	ud, err := json.Marshal(plan)
	if err != nil {
		return nil, fmt.Errorf("kafkastore: encode plan: %w", err)
	}
	a := &sarama.ConsumerGroupMemberAssignment{Topics: map[string][]int32{}, UserData: ud}
	if o, ok := plan.Owner(node); ok && len(o.Held) > 0 {
		a.Topics[topic] = slices.Clone(o.Held)
	}
	return a, nil
}

// decodeAssignment reads a spread member's assignment: the partitions of
// topic it holds and the plan (nil when the user data holds none).
func decodeAssignment(topic string, a *sarama.ConsumerGroupMemberAssignment) ([]int32, *Plan, error) {
	if a == nil {
		return nil, nil, nil
	}
	held := slices.Sorted(slices.Values(a.Topics[topic]))
	if len(a.UserData) == 0 {
		return held, nil, nil
	}
	var p Plan
	if err := json.Unmarshal(a.UserData, &p); err != nil {
		return held, nil, fmt.Errorf("kafkastore: the assignment's user data %q is not a spread plan: %w", truncate(a.UserData), err)
	}
	for i := range p.Owners {
		slices.Sort(p.Owners[i].Target)
		slices.Sort(p.Owners[i].Held)
	}
	slices.SortFunc(p.Owners, func(x, y PlanOwner) int { return strings.Compare(x.Node, y.Node) })
	return held, &p, nil
}

// truncate cuts b for an error message.
func truncate(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}
