package kafkastore

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/IBM/sarama"
)

// joinBytes returns the metadata bytes a join of meta carries, as sarama
// puts them on the wire.
func joinBytes(t *testing.T, topic string, meta memberMeta, owned []int32, gen int32) []byte {
	t.Helper()
	md, err := encodeJoin(topic, meta, owned, gen)
	if err != nil {
		t.Fatalf("encodeJoin: %v", err)
	}
	var join sarama.JoinGroupRequest
	if err := join.AddGroupProtocolMetadata(spreadProtocol, md); err != nil {
		t.Fatalf("encode join metadata: %v", err)
	}
	return join.OrderedGroupProtocols[0].Metadata
}

// assignmentBytes returns the bytes of the assignment of node under plan,
// as the leader's SyncGroup carries them.
func assignmentBytes(t *testing.T, topic string, plan *Plan, node string) []byte {
	t.Helper()
	a, err := encodeAssignment(topic, plan, node)
	if err != nil {
		t.Fatalf("encodeAssignment: %v", err)
	}
	var sync sarama.SyncGroupRequest
	if err := sync.AddGroupAssignmentMember("m", a); err != nil {
		t.Fatalf("encode assignment: %v", err)
	}
	return sync.GroupAssignments[0].Assignment
}

// FuzzDecodeJoin: whatever a join's metadata holds (it comes from any
// client that joins the group), the leader's decoder neither panics nor
// hands the planner a member it cannot plan with: a member with a node id
// has a weight of at least 1 and ascending, distinct owned partitions; one
// without owns nothing. What encodeJoin writes of a valid node id and
// address decodes as it was.
func FuzzDecodeJoin(f *testing.F) {
	seed := func(meta memberMeta, owned []int32, gen int32) []byte {
		md, _ := encodeJoin("jobs", meta, owned, gen)
		var join sarama.JoinGroupRequest
		_ = join.AddGroupProtocolMetadata(spreadProtocol, md)
		return join.OrderedGroupProtocols[0].Metadata
	}
	f.Add(seed(memberMeta{Node: "node-a", Addr: "a:4987", Weight: 2, Partitions: 12, Initial: 12, Planned: true}, []int32{0, 3, 5}, 7),
		"node-a", "a:4987", 2, []byte{0, 3, 5}, int32(7))
	f.Add(seed(memberMeta{Node: "n"}, nil, -1), "n", "", 0, []byte{}, int32(-1))
	f.Add([]byte{0, 2, 0, 0, 0, 1, 0, 4, 'j', 'o', 'b', 's', 0, 0, 0, 2, '{', '}'}, "", "x:1", -5, []byte{9, 9, 1}, int32(3))
	f.Add([]byte("not a subscription"), "node-b", "b:1", 1000, []byte{255, 0}, int32(0))
	f.Fuzz(func(t *testing.T, raw []byte, node, addr string, weight int, owned []byte, gen int32) {
		pm := decodeJoin("jobs", "m", raw)
		checkPlanMember(t, pm)
		if !utf8.ValidString(node) || !utf8.ValidString(addr) {
			return // the daemon refuses such a --node-id or --advertise
		}

		var parts []int32
		for _, b := range owned {
			parts = append(parts, int32(b))
		}
		meta := memberMeta{Node: node, Addr: addr, Weight: weight, Partitions: 256}
		got := decodeJoin("jobs", "m", joinBytes(t, "jobs", meta, parts, gen))
		checkPlanMember(t, got)
		if node == "" {
			if got.Node != "" {
				t.Fatalf("a join without a node id decoded as member %q", got.Node)
			}
			return
		}
		want := slices.Compact(slices.Sorted(slices.Values(parts)))
		if got.Node != node || got.Addr != addr || got.Weight != max(weight, 1) || got.Generation != gen ||
			got.Partitions != 256 || !slices.Equal(got.Owned, want) {
			t.Fatalf("decoded %+v; want node %q addr %q weight %d generation %d owned %v", got, node, addr, max(weight, 1), gen, want)
		}
	})
}

func checkPlanMember(t *testing.T, pm PlanMember) {
	t.Helper()
	if pm.MemberID != "m" {
		t.Fatalf("member id %q, want m", pm.MemberID)
	}
	if pm.Node == "" {
		if len(pm.Owned) != 0 || pm.Generation != -1 {
			t.Fatalf("a member without a node id owns %v as of generation %d", pm.Owned, pm.Generation)
		}
		return
	}
	if pm.Weight < 1 {
		t.Fatalf("member %q of weight %d", pm.Node, pm.Weight)
	}
	for i := 1; i < len(pm.Owned); i++ {
		if pm.Owned[i] <= pm.Owned[i-1] {
			t.Fatalf("owned %v: not ascending and distinct", pm.Owned)
		}
	}
}

// FuzzDecodeAssignment: whatever a SyncGroup hands a member (the leader
// may be any client of the group), the member's decoder neither panics nor
// returns a plan whose owners and their partitions are out of order (the
// member searches them); what encodeAssignment writes decodes as it was.
func FuzzDecodeAssignment(f *testing.F) {
	seed := func(plan *Plan, node string) []byte {
		a, _ := encodeAssignment("jobs", plan, node)
		var sync sarama.SyncGroupRequest
		_ = sync.AddGroupAssignmentMember("m", a)
		return sync.GroupAssignments[0].Assignment
	}
	plan := &Plan{Generation: 3, Leader: "b", Partitions: 4, Initial: 4, Owners: []PlanOwner{
		{Node: "a", Addr: "a:1", Weight: 1, Target: []int32{0, 1}, Held: []int32{0, 1}},
		{Node: "b", Addr: "b:1", Weight: 1, Target: []int32{2, 3}, Held: []int32{2}},
	}}
	f.Add(seed(plan, "a"), "a", []byte{0, 1}, []byte{2, 3})
	f.Add(seed(plan, "c"), "c", []byte{}, []byte{7})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, '['}, "", []byte{5, 1, 5}, []byte{})
	f.Add([]byte{0, 3, 0, 0, 0, 1, 0, 4, 'j', 'o', 'b', 's', 0, 0, 0, 1, 0, 0, 0, 9}, "z", []byte{9}, []byte{1})
	f.Fuzz(func(t *testing.T, raw []byte, node string, target, held []byte) {
		a, err := (&sarama.SyncGroupResponse{MemberAssignment: raw}).GetMemberAssignment()
		if err == nil {
			ps, p, _ := decodeAssignment("jobs", a)
			checkDecodedAssignment(t, ps, p)
		}
		if node == "" || !utf8.ValidString(node) {
			return // no member's node id (the daemon refuses one not UTF-8)
		}

		in := &Plan{Generation: 1, Leader: node, Partitions: 256, Owners: []PlanOwner{{Node: node, Target: bytesParts(target), Held: bytesParts(held)}}}
		raw = assignmentBytes(t, "jobs", in, node)
		a, err = (&sarama.SyncGroupResponse{MemberAssignment: raw}).GetMemberAssignment()
		if err != nil {
			t.Fatalf("the encoded assignment does not decode: %v", err)
		}
		ps, p, err := decodeAssignment("jobs", a)
		if err != nil || p == nil {
			t.Fatalf("the encoded assignment: plan %v, %v", p, err)
		}
		checkDecodedAssignment(t, ps, p)
		o, ok := p.Owner(node)
		if !ok || !slices.Equal(o.Target, bytesParts(target)) || !slices.Equal(o.Held, bytesParts(held)) ||
			!slices.Equal(ps, bytesParts(held)) {
			t.Fatalf("decoded holding %v, owner %+v (%v); want target %v, held %v", ps, o, ok, bytesParts(target), bytesParts(held))
		}
	})
}

// bytesParts returns the distinct partitions of b, ascending.
func bytesParts(b []byte) []int32 {
	ps := []int32{}
	for _, x := range b {
		ps = append(ps, int32(x))
	}
	return slices.Compact(slices.Sorted(slices.Values(ps)))
}

func checkDecodedAssignment(t *testing.T, held []int32, p *Plan) {
	t.Helper()
	if !slices.IsSorted(held) {
		t.Fatalf("held %v: not ascending", held)
	}
	if p == nil {
		return
	}
	if !slices.IsSortedFunc(p.Owners, func(x, y PlanOwner) int { return strings.Compare(x.Node, y.Node) }) {
		t.Fatalf("owners %+v: not by node id", p.Owners)
	}
	for _, o := range p.Owners {
		if !slices.IsSorted(o.Target) || !slices.IsSorted(o.Held) {
			t.Fatalf("owner %+v: partitions not ascending", o)
		}
	}
	_ = p.String()
	for _, o := range p.Owners {
		for _, h := range o.Held {
			_ = p.HolderOf(h)
		}
	}
}
