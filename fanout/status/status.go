// Package status is the document that describes a fanout cluster: what
// `fanout status --json` prints, read from Kafka and ZooKeeper, and what a
// daemon's console serves at /api/status, the daemon's own view. One type and
// one encoder (Encode), so that a script reads both the same way.
package status

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/metrics"
)

// Status describes a fanout cluster. Node, Clients and Rates are a
// daemon's own view: fanout status, which reads Kafka and ZooKeeper, leaves
// them out.
type Status struct {
	ID             string `json:"id"`
	Topic          string `json:"topic"`
	HeartbeatTopic string `json:"heartbeat_topic"`
	Mode           string `json:"mode,omitempty"` // the leader's --assignment; "" when unknown
	// OffsetStore is the store the leader record and the committed offsets
	// were read from (fanout status), or the daemon's own (--offset-store);
	// StoreFrom says how fanout status chose it.
	OffsetStore string      `json:"offset_store,omitempty"`
	StoreFrom   string      `json:"offset_store_from,omitempty"`
	Leader      *Leader     `json:"leader"` // nil: no leader recorded (fanout status) or known (a daemon)
	Members     []Member    `json:"members"`
	Partitions  []Partition `json:"partitions"`
	TotalLag    int64       `json:"total_lag"` // over the partitions with a committed offset

	// Spread mode (AddSpread): the leader's assignment (nil when none is
	// known) and the partitions whose ownership record does not name, live,
	// the member the assignment gives them.
	Assignment *Assignment `json:"assignment,omitempty"`
	Handoffs   []Handoff   `json:"handoffs,omitempty"`
	// Unauthenticated counts the heartbeat records of the window ignored
	// for want of a valid MAC (fanout status with --cluster-secret-file).
	Unauthenticated int `json:"unauthenticated_heartbeats,omitempty"`
	// Pause is the cluster's delivery pause: the last pause or resume an
	// operator asked of any member, as the members' heartbeats (or the
	// daemon's election) say; nil when none was asked.
	Pause *Pause `json:"pause,omitempty"`

	Node    *Node    `json:"node,omitempty"`    // the daemon that answered
	Clients []Client `json:"clients,omitempty"` // its connected clients, by name
	Rates   *Rates   `json:"rates,omitempty"`   // its message rates of the last minutes
}

// Leader is the leader: the record in ZooKeeper (fanout status), or the one
// a daemon's election knows.
type Leader struct {
	Node  string `json:"node"`
	Addr  string `json:"addr"`
	Epoch uint64 `json:"epoch"`
}

// Member is a cluster member's last heartbeat.
type Member struct {
	NodeID   string    `json:"node_id"`
	Addr     string    `json:"addr"`
	Role     string    `json:"role"` // RoleName of its heartbeat's role
	Epoch    uint64    `json:"epoch"`
	LastSeen time.Time `json:"last_seen"`
	Mode     string    `json:"mode"` // its --assignment (ModeName)
	// OffsetStore is its --offset-store (cluster.StoreName); "" when its
	// heartbeats do not say (a member older than the field).
	OffsetStore string `json:"offset_store,omitempty"`
	// Ready and Reason are what its /readyz answered as of its heartbeat;
	// Ready is nil when its heartbeats do not say.
	Ready  *bool  `json:"ready,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Pause is the cluster's delivery pause as its heartbeat says; nil
	// when it says none (none was asked, or a member older than pauses).
	Pause *Pause `json:"pause,omitempty"`
	// LastAction is the last operator action asked of it; nil: none.
	LastAction *Action `json:"last_action,omitempty"`
}

// MemberOf is the Member a heartbeat describes, heard at lastSeen.
func MemberOf(hb *cluster.Heartbeat, lastSeen time.Time) Member {
	m := Member{NodeID: hb.GetNodeId(), Addr: hb.GetAddr(), Role: RoleName(hb.GetRole()), Epoch: hb.GetEpoch(),
		LastSeen: lastSeen, Mode: cluster.ModeName(hb.GetMode()), OffsetStore: cluster.StoreName(hb.GetOffsetStore())}
	m.SetReadiness(hb.GetReadiness())
	if p, ok := cluster.PauseOf(hb); ok {
		m.Pause = PauseOf(p)
	}
	if a, ok := cluster.LastActionOf(hb); ok {
		m.LastAction = ActionOf(a)
	}
	return m
}

// Pause is the cluster's delivery pause: the last pause or resume an
// operator asked of a member.
type Pause struct {
	Paused  bool      `json:"paused"`
	Version uint64    `json:"version"` // grows with every pause and resume
	Node    string    `json:"node"`    // the member asked
	By      string    `json:"by"`      // who asked: the name the request gave, and its address
	At      time.Time `json:"at"`
}

// PauseOf is the Pause of p; nil when none was asked (version 0).
func PauseOf(p cluster.Pause) *Pause {
	if p.Version == 0 {
		return nil
	}
	return &Pause{Paused: p.Paused, Version: p.Version, Node: p.Action.NodeID, By: p.Action.By, At: p.Action.At}
}

// LatestPause returns the pause of the highest version the members say
// (of two of one version, the one asked of the higher node id: the one the
// members take), or nil when none says one.
func LatestPause(members []Member) *Pause {
	var out *Pause
	for _, m := range members {
		if p := m.Pause; p != nil && (out == nil || p.Version > out.Version || p.Version == out.Version && p.Node > out.Node) {
			out = p
		}
	}
	return out
}

// Action is an operator's action asked of a daemon (the console, or fanout
// pause, resume and drain-client).
type Action struct {
	Kind   string    `json:"kind"`             // "pause", "resume" or "drain-client"
	Target string    `json:"target,omitempty"` // drain-client: the client's name or session
	By     string    `json:"by"`               // who asked: the name the request gave, and its address
	At     time.Time `json:"at"`
	Node   string    `json:"node,omitempty"`   // the member asked
	Result string    `json:"result,omitempty"` // what came of it (the daemon's own record)
}

// ActionOf is the Action of a.
func ActionOf(a cluster.Action) *Action {
	return &Action{Kind: a.Kind, Target: a.Target, By: a.By, At: a.At, Node: a.NodeID}
}

// Warning is something an operator should look at (metrics.Warnings): a
// readiness condition that fails, or an advisory.
type Warning struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Unready bool   `json:"unready,omitempty"` // the node is not ready for it
}

// SetReadiness sets Ready and Reason from r (nil: not said).
func (m *Member) SetReadiness(r *cluster.Readiness) {
	if r == nil {
		m.Ready, m.Reason = nil, ""
		return
	}
	ready := r.GetReady()
	m.Ready, m.Reason = &ready, r.GetReason()
}

// Partition is one partition's offsets; Committed and Lag are nil when no
// offset is committed for it.
type Partition struct {
	Partition     int32  `json:"partition"`
	Committed     *int64 `json:"committed"`
	HighWatermark int64  `json:"high_watermark"`
	Lag           *int64 `json:"lag"`
	Owner         string `json:"owner,omitempty"` // node id of the member that serves it, when known
	// Of the partitions the daemon serves: fetching it is paused behind an
	// unacked message (Held), its committed offset has not moved for the
	// stall time (Stalled), messages of it wait to be stored in the
	// dead-letter topic (DeadLettersPending).
	Held               bool `json:"held,omitempty"`
	Stalled            bool `json:"stalled,omitempty"`
	DeadLettersPending int  `json:"dead_letters_pending,omitempty"`
}

// Assignment is the assignment the spread leader last published.
type Assignment struct {
	Epoch      uint64           `json:"epoch"`
	Generation uint64           `json:"generation"`
	Members    []AssignedMember `json:"members"`
}

// AssignedMember is one member of the assignment: the partitions it is
// assigned, those its live ownership records give it, and the lag of the
// partitions assigned to it (those with a committed offset).
type AssignedMember struct {
	NodeID     string  `json:"node_id"`
	Addr       string  `json:"addr"`
	Partitions []int32 `json:"partitions"`
	Owned      []int32 `json:"owned"`
	Lag        int64   `json:"lag"`
}

// Handoff is a partition on its way to the member assigned it.
type Handoff struct {
	Partition int32  `json:"partition"`
	From      string `json:"from"` // the member its record names; "" when released or never reserved
	To        string `json:"to"`   // the member the assignment gives it
	State     string `json:"state"`
}

// Node is the daemon that answered and its dispatcher's gauges.
type Node struct {
	NodeID   string    `json:"node_id"`
	Mode     string    `json:"mode"`   // its own --assignment
	Role     string    `json:"role"`   // "leader", "follower" or "starting"
	Ready    bool      `json:"ready"`  // what /readyz answers
	Reason   string    `json:"reason"` // and why
	Serving  bool      `json:"serving"`
	InFlight int       `json:"in_flight"`
	Buffered int       `json:"buffered"`
	Paused   bool      `json:"paused"` // fetching from Kafka is paused
	Clients  int       `json:"clients"`
	Time     time.Time `json:"time"` // when the document was made
	// Partial says why the document shows only this node's partitions
	// (spread mode: the others' could not be read); "" when complete.
	Partial string `json:"partial,omitempty"`
	// DeliveryPaused: the cluster's deliveries are paused as this node
	// knows (while it serves, it hands nothing out).
	DeliveryPaused bool `json:"delivery_paused"`
	// ActionsEnabled: the node takes actions (it has a metrics token).
	ActionsEnabled bool `json:"actions_enabled"`
	// Actions are the last actions asked of this node, oldest first.
	Actions []Action `json:"actions,omitempty"`
	// Warnings are what its operator should look at: the readiness
	// conditions that fail, then the advisories.
	Warnings []Warning `json:"warnings,omitempty"`
}

// The roles of a client.
const (
	// ClientRoleWorker receives messages and acks them.
	ClientRoleWorker = "worker"
	// ClientRoleObserver receives a copy of every delivery and acks nothing
	// (Hello.observer).
	ClientRoleObserver = "observer"
)

// Client is one connected client.
type Client struct {
	ID            uint64    `json:"id"` // session id
	Name          string    `json:"name"`
	Identity      string    `json:"identity,omitempty"` // certificate subject and/or named token (see server.Session)
	Addr          string    `json:"addr"`
	Role          string    `json:"role"`
	Weight        *uint32   `json:"weight,omitempty"` // its share, while the daemon shares by weight (some worker's differs from the default)
	InFlight      int       `json:"in_flight"`
	MaxInFlight   int       `json:"max_in_flight"`
	Acked         uint64    `json:"acked"`           // since it joined
	AcksPerSecond float64   `json:"acks_per_second"` // over the last sample interval
	ConnectedAt   time.Time `json:"connected_at"`
	// Since it joined, its deliveries: nacked, not acked in time, queued
	// again for another delivery (after a nack, a timeout, or as it left
	// holding them), and failed for the last time (dead-lettered).
	Nacked       uint64 `json:"nacked"`
	TimedOut     uint64 `json:"timed_out"`
	DeadLettered uint64 `json:"dead_lettered"`
	Redelivered  uint64 `json:"redelivered"`
	Draining     bool   `json:"draining,omitempty"` // an operator drained it: it leaves once it holds nothing
}

// Rates are the daemon's message rates, one point per sample interval,
// oldest first.
type Rates struct {
	IntervalSeconds float64     `json:"interval_seconds"`
	Points          []RatePoint `json:"points"`
}

// RatePoint is the messages per second over the interval that ends at Time.
type RatePoint struct {
	Time        time.Time `json:"time"`
	Consumed    float64   `json:"consumed"`
	Delivered   float64   `json:"delivered"`
	Acked       float64   `json:"acked"`
	Redelivered float64   `json:"redelivered"`
}

// AddPartition appends partition p with its high watermark and, when
// committed is not nil, its committed offset and lag, which it adds to
// TotalLag.
func (s *Status) AddPartition(p int32, highWatermark int64, committed *int64, owner string) {
	ps := Partition{Partition: p, HighWatermark: highWatermark, Owner: owner}
	if committed != nil {
		off, lag := *committed, metrics.Lag(highWatermark, *committed)
		ps.Committed, ps.Lag = &off, &lag
		s.TotalLag += lag
	}
	s.Partitions = append(s.Partitions, ps)
}

// Holder is who holds a partition in spread mode, as the offset store
// says (authority.Owners): the member Node, live while it may serve the
// partition (its ZooKeeper session is the one its ownership record names,
// or the group's generation lets it hold it). Node is "" once the
// partition was released and nobody took it yet.
type Holder struct {
	Node string
	Live bool
}

// MarkServed marks, among the partitions added so far, those held and
// stalled, and the dead letters pending of each: a serving daemon's view.
func (s *Status) MarkServed(held, stalled []int32, deadLettersPending map[int32]int) {
	for i, p := range s.Partitions {
		s.Partitions[i].Held = slices.Contains(held, p.Partition)
		s.Partitions[i].Stalled = slices.Contains(stalled, p.Partition)
		s.Partitions[i].DeadLettersPending = deadLettersPending[p.Partition]
	}
}

// AddSpread adds what spread mode says of the partitions added so far: each
// one's owner, the live member that holds it (holders, from the offset
// store); and, when a is not nil, the mode, the assignment with each
// member's owned partitions and lag, and the handoffs in progress.
func (s *Status) AddSpread(a *cluster.Assignment, holders map[int32]Holder) {
	lag := map[int32]int64{}
	for i, p := range s.Partitions {
		if o := holders[p.Partition]; o.Live {
			s.Partitions[i].Owner = o.Node
		}
		if p.Lag != nil {
			lag[p.Partition] = *p.Lag
		}
	}
	if a == nil {
		return
	}
	s.Mode = cluster.ModeName(cluster.Mode_MODE_SPREAD)
	s.Assignment = &Assignment{Epoch: a.Epoch, Generation: a.Generation}
	s.Handoffs = nil
	for _, o := range a.Owners {
		m := AssignedMember{NodeID: o.NodeID, Addr: o.Addr, Partitions: slices.Clone(o.Partitions), Owned: []int32{}}
		if m.Partitions == nil {
			m.Partitions = []int32{}
		}
		for _, p := range o.Partitions {
			m.Lag += lag[p]
			h, ok := holders[p]
			switch {
			case ok && h.Live && h.Node == o.NodeID:
				m.Owned = append(m.Owned, p)
			case !ok:
				s.Handoffs = append(s.Handoffs, Handoff{Partition: p, To: o.NodeID, State: "never reserved: waiting for " + o.NodeID})
			case h.Node == "":
				s.Handoffs = append(s.Handoffs, Handoff{Partition: p, To: o.NodeID, State: "released: waiting for " + o.NodeID})
			case h.Live:
				s.Handoffs = append(s.Handoffs, Handoff{Partition: p, From: h.Node, To: o.NodeID,
					State: "held by " + h.Node + ": handing over"})
			default:
				s.Handoffs = append(s.Handoffs, Handoff{Partition: p, From: h.Node, To: o.NodeID,
					State: h.Node + "'s session is gone: waiting for " + o.NodeID})
			}
		}
		s.Assignment.Members = append(s.Assignment.Members, m)
	}
	slices.SortFunc(s.Handoffs, func(x, y Handoff) int { return cmp.Compare(x.Partition, y.Partition) })
}

// RoleName is a heartbeat's role in lower case without its prefix:
// "leader".
func RoleName(r cluster.Role) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "ROLE_"))
}

// Encode writes st to w as indented JSON, followed by a newline.
func Encode(w io.Writer, st *Status) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(st); err != nil {
		return fmt.Errorf("write status: %w", err)
	}
	return nil
}
