package cluster

import (
	"slices"
	"testing"

	"github.com/nanoservice/core-fanout/fanout/kafkastore"
)

// planOf returns each node's targets and held partitions of p, as ranges.
func planOf(p kafkastore.Plan) map[string][2]string {
	out := map[string][2]string{}
	for _, o := range p.Owners {
		out[o.Node] = [2]string{PartitionRanges(o.Target), PartitionRanges(o.Held)}
	}
	return out
}

func planMember(node string, weight int, partitions int32, gen int32, owned ...int32) kafkastore.PlanMember {
	return kafkastore.PlanMember{MemberID: node + "-id", Node: node, Addr: node + ":4987", Weight: weight,
		Partitions: partitions, Generation: gen, Owned: owned}
}

// A first generation: nobody owns anything; every partition goes to its
// target at once, balanced; the plan starts a line of plans in a group that
// never committed, so every partition starts at --initial-offset.
func TestPlanGroupFirstGeneration(t *testing.T) {
	p := PlanGroup(kafkastore.PlanInput{Generation: 1, Leader: "b", Members: []kafkastore.PlanMember{
		planMember("b", 1, 12, -1), planMember("a", 1, 12, -1), planMember("c", 1, 0, -1),
	}})
	want := map[string][2]string{"a": {"0-3", "0-3"}, "b": {"4-7", "4-7"}, "c": {"8-11", "8-11"}}
	if got := planOf(p); !equalPlans(got, want) {
		t.Fatalf("plan %v, want %v", got, want)
	}
	if p.Partitions != 12 || p.Initial != 12 || p.Generation != 1 || p.Leader != "b" {
		t.Errorf("plan %+v: want 12 partitions, initial 12, generation 1, leader b", p)
	}
	if p.Owners[0].Addr != "a:4987" || p.Owners[0].Weight != 1 {
		t.Errorf("owner %+v: want its address and weight", p.Owners[0])
	}
	committed := PlanGroup(kafkastore.PlanInput{Generation: 1, Members: []kafkastore.PlanMember{planMember("a", 1, 4, -1)}, Committed: true})
	if committed.Initial != 0 {
		t.Errorf("a new line in a group that committed: initial %d, want 0", committed.Initial)
	}
}

// A member joins: the partitions that move stay with their owner (held,
// handed over), the joiner gets them only once their owner no longer owns
// them; nothing else moves. Weighted: a member of weight 2 gets twice the
// share.
func TestPlanGroupJoinIsCooperative(t *testing.T) {
	prev := PlanGroup(kafkastore.PlanInput{Generation: 1, Members: []kafkastore.PlanMember{
		planMember("a", 1, 12, -1), planMember("b", 1, 12, -1),
	}})
	in := kafkastore.PlanInput{Generation: 2, Previous: &prev, Members: []kafkastore.PlanMember{
		planMember("a", 1, 12, 1, 0, 1, 2, 3, 4, 5), planMember("b", 1, 12, 1, 6, 7, 8, 9, 10, 11), planMember("c", 2, 12, -1),
	}}
	p := PlanGroup(in)
	want := map[string][2]string{"a": {"0-2", "0-5"}, "b": {"6-8", "6-11"}, "c": {"3-5,9-11", "-"}}
	if got := planOf(p); !equalPlans(got, want) {
		t.Fatalf("plan %v, want %v", got, want)
	}
	if p.Initial != prev.Initial {
		t.Errorf("initial %d, want the previous plan's %d", p.Initial, prev.Initial)
	}

	// a handed its partitions over and joined again without them; b still
	// hands over: c gets a's at once, b's later.
	in.Generation, in.Previous = 3, &p
	in.Members = []kafkastore.PlanMember{
		planMember("a", 1, 12, 2, 0, 1, 2), planMember("b", 1, 12, 2, 6, 7, 8, 9, 10, 11), planMember("c", 2, 12, 2),
	}
	p3 := PlanGroup(in)
	want = map[string][2]string{"a": {"0-2", "0-2"}, "b": {"6-8", "6-11"}, "c": {"3-5,9-11", "3-5"}}
	if got := planOf(p3); !equalPlans(got, want) {
		t.Fatalf("after a's release: %v, want %v", got, want)
	}
}

// A member gone (crashed, left): its partitions have no owner and go to
// their targets at once; the others keep theirs. New partitions are spread.
func TestPlanGroupLeaveAndNewPartitions(t *testing.T) {
	prev := PlanGroup(kafkastore.PlanInput{Generation: 4, Members: []kafkastore.PlanMember{
		planMember("a", 1, 6, -1), planMember("b", 1, 6, -1), planMember("c", 1, 6, -1),
	}})
	p := PlanGroup(kafkastore.PlanInput{Generation: 5, Previous: &prev, Members: []kafkastore.PlanMember{
		planMember("a", 1, 9, 4, 0, 1), planMember("c", 1, 9, 4, 4, 5),
	}})
	got := planOf(p)
	if got["a"][0] != got["a"][1] || got["c"][0] != got["c"][1] {
		t.Errorf("nothing is owned elsewhere, so every target is held: %v", got)
	}
	for node, keep := range map[string][]int32{"a": {0, 1}, "c": {4, 5}} {
		o, _ := p.Owner(node)
		for _, k := range keep {
			if !slices.Contains(o.Target, k) {
				t.Errorf("%s lost partition %d it owned: %v", node, k, got)
			}
		}
		if len(o.Target) < 4 || len(o.Target) > 5 {
			t.Errorf("%s: %d of 9 partitions, want 4 or 5", node, len(o.Target))
		}
	}
	if p.Partitions != 9 {
		t.Errorf("partitions %d, want the members' 9", p.Partitions)
	}
}

// Two members that say they own one partition: the newer generation's
// claim wins; in one generation neither may hold it. A member whose
// metadata is not a spread member's gets nothing.
func TestPlanGroupConflictsAndForeignMembers(t *testing.T) {
	p := PlanGroup(kafkastore.PlanInput{Generation: 9, Members: []kafkastore.PlanMember{
		planMember("a", 1, 4, 7, 0, 1), planMember("b", 1, 4, 8, 1, 2), planMember("c", 1, 4, 8, 2, 3),
		{MemberID: "foreign"},
	}})
	holders := map[int32]string{}
	for _, o := range p.Owners {
		for _, h := range o.Held {
			if prev, ok := holders[h]; ok {
				t.Fatalf("partition %d held by %s and %s", h, prev, o.Node)
			}
			holders[h] = o.Node
		}
	}
	if holders[1] != "b" {
		t.Errorf("partition 1: held by %q, want b (generation 8 beats 7)", holders[1])
	}
	if h, ok := holders[2]; ok {
		t.Errorf("partition 2: held by %q, want nobody (b and c both claim it in generation 8)", h)
	}
	if holders[0] != "a" || holders[3] != "c" {
		t.Errorf("holders %v: want 0 a, 3 c", holders)
	}
	if len(p.Owners) != 3 {
		t.Errorf("owners %v: the foreign member is no owner", p.Owners)
	}
	// A leader without a previous plan takes the initial partitions from
	// the members that received one.
	q := PlanGroup(kafkastore.PlanInput{Generation: 2, Members: []kafkastore.PlanMember{
		{MemberID: "x", Node: "x", Partitions: 8, Planned: true, Initial: 6}, planMember("y", 1, 8, -1),
	}})
	if q.Initial != 6 {
		t.Errorf("initial %d, want 6 from the member that received a plan", q.Initial)
	}
}

func TestAssignmentOfPlan(t *testing.T) {
	if AssignmentOfPlan(nil) != nil {
		t.Fatal("a nil plan has an assignment")
	}
	p := PlanGroup(kafkastore.PlanInput{Generation: 7, Members: []kafkastore.PlanMember{planMember("b", 1, 4, -1), planMember("a", 1, 4, -1)}})
	a := AssignmentOfPlan(&p)
	if a.Epoch != 0 || a.Generation != 7 || a.Partitions != 4 || a.InitialPartitions != 4 {
		t.Fatalf("assignment %+v", a)
	}
	if got := a.String(); got != "a:0-1 b:2-3" {
		t.Errorf("assignment %s, want a:0-1 b:2-3", got)
	}
	if got := a.Addrs(); !slices.Equal(got, []string{"a:4987", "b:4987"}) {
		t.Errorf("addrs %v", got)
	}
}

func equalPlans(a, b map[string][2]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
