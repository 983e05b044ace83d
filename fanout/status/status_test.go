package status

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/cluster"
)

// The fields fanout status has always printed keep their names; what is
// unknown is null; a daemon's own view is left out when not set.
func TestEncodeClusterView(t *testing.T) {
	tests := []struct {
		name string
		st   Status
		want string
	}{
		{"none is null", Status{ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t",
			Partitions: []Partition{{Partition: 0, HighWatermark: 5}}},
			`{"id":"svc","topic":"t","heartbeat_topic":"fanout_svc_t","leader":null,"members":null,` +
				`"partitions":[{"partition":0,"committed":null,"high_watermark":5,"lag":null}],"total_lag":0}`},
		{"leader", Status{ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t",
			Leader: &Leader{Node: "a", Addr: "h:1", Epoch: 2}},
			`{"id":"svc","topic":"t","heartbeat_topic":"fanout_svc_t","leader":{"node":"a","addr":"h:1","epoch":2},` +
				`"members":null,"partitions":null,"total_lag":0}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := compact(t, &tt.st); got != tt.want {
				t.Errorf("JSON:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

// A daemon's document: node (with its pause, actions and warnings), clients
// (weight only when announced) and rates, the partitions it serves marked.
func TestEncodeDaemonView(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	w := uint32(5)
	st := Status{ID: "svc", Topic: "t", HeartbeatTopic: "fanout_svc_t",
		Node: &Node{NodeID: "a", Mode: "leader", Role: "leader", Ready: true, Reason: "leader: serving", Serving: true,
			InFlight: 3, Buffered: 1, Clients: 2, Time: at, DeliveryPaused: true, ActionsEnabled: true,
			Actions:  []Action{{Kind: "pause", By: "ops from 127.0.0.1:9", At: at, Node: "a", Result: "version 1"}},
			Warnings: []Warning{{Kind: "partitions-held", Message: "partitions 0 held"}}},
		Clients: []Client{
			{ID: 1, Name: "w1", Addr: "127.0.0.1:5000", Role: ClientRoleWorker, InFlight: 2, MaxInFlight: 10,
				Acked: 7, AcksPerSecond: 3.5, ConnectedAt: at, Nacked: 1, TimedOut: 2, DeadLettered: 3, Redelivered: 4, Draining: true},
			{ID: 2, Name: "canary", Addr: "127.0.0.1:5001", Role: ClientRoleWorker, Weight: &w, ConnectedAt: at},
		},
		Rates: &Rates{IntervalSeconds: 2, Points: []RatePoint{{Time: at, Consumed: 1, Delivered: 2, Acked: 3, Redelivered: 0.5}}},
		Pause: &Pause{Paused: true, Version: 1, Node: "a", By: "ops from 127.0.0.1:9", At: at},
	}
	st.AddPartition(0, 10, ptr(4), "a")
	st.MarkServed([]int32{0}, nil, map[int32]int{0: 2})
	want := `{"id":"svc","topic":"t","heartbeat_topic":"fanout_svc_t","leader":null,"members":null,` +
		`"partitions":[{"partition":0,"committed":4,"high_watermark":10,"lag":6,"owner":"a","held":true,"dead_letters_pending":2}],"total_lag":6,` +
		`"pause":{"paused":true,"version":1,"node":"a","by":"ops from 127.0.0.1:9","at":"2026-03-04T05:06:07Z"},` +
		`"node":{"node_id":"a","mode":"leader","role":"leader","ready":true,"reason":"leader: serving","serving":true,` +
		`"in_flight":3,"buffered":1,"paused":false,"clients":2,"time":"2026-03-04T05:06:07Z",` +
		`"delivery_paused":true,"actions_enabled":true,` +
		`"actions":[{"kind":"pause","by":"ops from 127.0.0.1:9","at":"2026-03-04T05:06:07Z","node":"a","result":"version 1"}],` +
		`"warnings":[{"kind":"partitions-held","message":"partitions 0 held"}]},` +
		`"clients":[{"id":1,"name":"w1","addr":"127.0.0.1:5000","role":"worker","in_flight":2,"max_in_flight":10,` +
		`"acked":7,"acks_per_second":3.5,"connected_at":"2026-03-04T05:06:07Z",` +
		`"nacked":1,"timed_out":2,"dead_lettered":3,"redelivered":4,"draining":true},` +
		`{"id":2,"name":"canary","addr":"127.0.0.1:5001","role":"worker","weight":5,"in_flight":0,"max_in_flight":0,` +
		`"acked":0,"acks_per_second":0,"connected_at":"2026-03-04T05:06:07Z",` +
		`"nacked":0,"timed_out":0,"dead_lettered":0,"redelivered":0}],` +
		`"rates":{"interval_seconds":2,"points":[{"time":"2026-03-04T05:06:07Z","consumed":1,"delivered":2,` +
		`"acked":3,"redelivered":0.5}]}}`
	if got := compact(t, &st); got != want {
		t.Errorf("JSON:\n%s\nwant:\n%s", got, want)
	}
	var back Status
	var buf bytes.Buffer
	if err := Encode(&buf, &st); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if got := compact(t, &back); got != want {
		t.Errorf("decoded and encoded again:\n%s\nwant:\n%s", got, want)
	}
}

// AddPartition: lag only with a committed offset, never negative, summed.
func TestAddPartition(t *testing.T) {
	var st Status
	st.AddPartition(0, 10, ptr(4), "")
	st.AddPartition(1, 7, nil, "")
	st.AddPartition(2, 3, ptr(5), "") // a commit the watermark has not caught up with
	st.AddPartition(3, 9, ptr(8), "")
	if st.TotalLag != 7 {
		t.Errorf("TotalLag %d, want 7", st.TotalLag)
	}
	if p := st.Partitions[1]; p.Committed != nil || p.Lag != nil {
		t.Errorf("partition without offset: committed %v, lag %v", p.Committed, p.Lag)
	}
	if p := st.Partitions[2]; *p.Lag != 0 {
		t.Errorf("lag %d, want 0", *p.Lag)
	}
}

// AddSpread: each partition's owner is its live record's; each member of
// the assignment owns the partitions whose live record names it, and the
// others are handoffs, with why they wait; the lag is summed per member.
func TestAddSpread(t *testing.T) {
	a := &cluster.Assignment{Epoch: 4, Generation: 9, Partitions: 5, Owners: []cluster.Owner{
		{NodeID: "m-a", Addr: "h:1", Partitions: []int32{0, 1, 2}},
		{NodeID: "m-b", Addr: "h:2", Partitions: []int32{3, 4}},
		{NodeID: "m-c", Addr: "h:3"}, // owns nothing: listed, with empty lists
	}}
	live := func(owner string) Holder { return Holder{Node: owner, Live: true} }
	owners := map[int32]Holder{
		0: live("m-a"),
		1: live("m-b"),   // handing over to m-a
		2: {Node: "m-x"}, // its session is gone
		3: {Node: ""},    // released
		// 4: never reserved
	}
	var st Status
	st.AddPartition(0, 10, ptr(8), "")
	st.AddPartition(1, 10, ptr(5), "")
	st.AddPartition(2, 10, nil, "")
	st.AddPartition(3, 10, ptr(9), "")
	st.AddPartition(4, 10, ptr(10), "")
	st.AddSpread(a, owners)
	got := compact(t, &st)
	for _, want := range []string{
		`"mode":"spread"`,
		`{"partition":0,"committed":8,"high_watermark":10,"lag":2,"owner":"m-a"}`,
		`{"partition":1,"committed":5,"high_watermark":10,"lag":5,"owner":"m-b"}`,
		`{"partition":2,"committed":null,"high_watermark":10,"lag":null}`,
		`"assignment":{"epoch":4,"generation":9,"members":[` +
			`{"node_id":"m-a","addr":"h:1","partitions":[0,1,2],"owned":[0],"lag":7},` +
			`{"node_id":"m-b","addr":"h:2","partitions":[3,4],"owned":[],"lag":1},` +
			`{"node_id":"m-c","addr":"h:3","partitions":[],"owned":[],"lag":0}]}`,
		`"handoffs":[{"partition":1,"from":"m-b","to":"m-a","state":"held by m-b: handing over"},` +
			`{"partition":2,"from":"m-x","to":"m-a","state":"m-x's session is gone: waiting for m-a"},` +
			`{"partition":3,"from":"","to":"m-b","state":"released: waiting for m-b"},` +
			`{"partition":4,"from":"","to":"m-b","state":"never reserved: waiting for m-b"}]`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("JSON lacks %s:\n%s", want, got)
		}
	}

	// Without an assignment (none heard yet, or leader mode): owners only.
	var bare Status
	bare.AddPartition(0, 10, ptr(8), "")
	bare.AddSpread(nil, owners)
	if bare.Mode != "" || bare.Assignment != nil || bare.Handoffs != nil || bare.Partitions[0].Owner != "m-a" {
		t.Errorf("without an assignment: %s", compact(t, &bare))
	}
}

func TestRoleName(t *testing.T) {
	if got := RoleName(cluster.Role_ROLE_LEADER); got != "leader" {
		t.Errorf("RoleName(ROLE_LEADER) = %q", got)
	}
}

// compact encodes st with Encode and returns it on one line.
func compact(t *testing.T, st *Status) string {
	t.Helper()
	var buf, out bytes.Buffer
	if err := Encode(&buf, st); err != nil {
		t.Fatal(err)
	}
	if err := json.Compact(&out, buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func ptr(v int64) *int64 { return &v }

// A member's heartbeat says the cluster's pause as it knows it and its last
// action; the pause of the cluster is the latest any member says, as the
// members take it (the highest version, then node id).
func TestMembersPausesAndActions(t *testing.T) {
	at := time.UnixMilli(1_770_000_000_000).UTC()
	hb := &cluster.Heartbeat{NodeId: "b", Pause: &cluster.DeliveryPause{Version: 4, Paused: true,
		Action: &cluster.OperatorAction{Kind: "pause", By: "ops", AtMs: at.UnixMilli(), NodeId: "a"}},
		LastAction: &cluster.OperatorAction{Kind: "drain-client", Target: "w1", By: "ops", AtMs: at.UnixMilli(), NodeId: "b"}}
	m := MemberOf(hb, at)
	if p := m.Pause; p == nil || !p.Paused || p.Version != 4 || p.Node != "a" || p.By != "ops" || !p.At.Equal(at) {
		t.Errorf("member's pause %+v", m.Pause)
	}
	if a := m.LastAction; a == nil || a.Kind != "drain-client" || a.Target != "w1" || a.Node != "b" || !a.At.Equal(at) {
		t.Errorf("member's last action %+v", m.LastAction)
	}
	if m := MemberOf(&cluster.Heartbeat{NodeId: "c"}, at); m.Pause != nil || m.LastAction != nil {
		t.Errorf("a heartbeat that says nothing: pause %+v, action %+v", m.Pause, m.LastAction)
	}
	members := []Member{
		{NodeID: "a", Pause: &Pause{Version: 3, Node: "z"}},
		{NodeID: "b", Pause: &Pause{Version: 4, Node: "a", Paused: true}},
		{NodeID: "c", Pause: &Pause{Version: 4, Node: "c"}},
		{NodeID: "d"},
	}
	if p := LatestPause(members); p == nil || p.Version != 4 || p.Node != "c" {
		t.Errorf("LatestPause = %+v, want version 4 asked of c", p)
	}
	if p := LatestPause(members[3:]); p != nil {
		t.Errorf("LatestPause of members that say none = %+v", p)
	}
}
