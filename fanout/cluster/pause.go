package cluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sirupsen/logrus"
)

// The cluster's delivery pause. An operator pauses or resumes the
// deliveries of the whole cluster through any member (SetPaused): the
// member makes a Pause one version above the one it knows and carries it in
// its heartbeats; every member takes the Pause of the highest version (then
// node id) it reads and carries it on. So the members agree within a
// heartbeat or two, whoever was asked; a member that becomes leader, or
// starts, is paused as the cluster is (it hears the others before it leads
// or is assigned partitions); the pause lasts as long as one member runs.
//
// A Pause is taken only from the records the vote folds (vote.observe):
// with --cluster-secret, from members only, and never from a copy of a
// record already read (decision 0003). It is bounded: one per heartbeat,
// with fields of at most maxActionField bytes.

// Kinds of Action.
const (
	ActionPause       = "pause"
	ActionResume      = "resume"
	ActionDrainClient = "drain-client"
)

// maxActionField bounds every text field of an Action: longer ones are cut
// by the member asked and refused when read.
const maxActionField = 256

// Action is an operator's action asked of a member.
type Action struct {
	Kind   string    // ActionPause, ActionResume or ActionDrainClient
	Target string    // ActionDrainClient: the client's name or session
	By     string    // who asked
	At     time.Time // when, on the clock of the member asked
	NodeID string    // the member asked
}

// Pause is the cluster's delivery pause as a member knows it: the last
// pause or resume asked of any member.
type Pause struct {
	Version uint64 // 0: never paused nor resumed
	Paused  bool
	Action  Action // the pause or resume
}

// after reports whether p supersedes q: a higher version, or the same one
// asked of a member with a higher node id (two members asked at once).
func (p Pause) after(q Pause) bool {
	return p.Version > q.Version || p.Version == q.Version && p.Action.NodeID > q.Action.NodeID
}

// Cut returns s cut to at most maxActionField bytes, on a rune boundary,
// without control characters: what a member keeps of an operator's text.
func Cut(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return -1
		}
		return r
	}, s)
	if len(s) <= maxActionField {
		return s
	}
	s = s[:maxActionField]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// actionOf returns the Action of its wire form, and false when a field is
// longer than a member writes.
func actionOf(a *OperatorAction) (Action, bool) {
	for _, f := range []string{a.GetKind(), a.GetTarget(), a.GetBy(), a.GetNodeId()} {
		if len(f) > maxActionField {
			return Action{}, false
		}
	}
	return Action{Kind: a.GetKind(), Target: a.GetTarget(), By: a.GetBy(), At: time.UnixMilli(a.GetAtMs()),
		NodeID: a.GetNodeId()}, true
}

// wire returns a's wire form.
func (a Action) wire() *OperatorAction {
	return &OperatorAction{Kind: a.Kind, Target: a.Target, By: a.By, AtMs: a.At.UnixMilli(), NodeId: a.NodeID}
}

// PauseOf returns the delivery pause a heartbeat carries, and false when it
// carries none (or one no member writes).
func PauseOf(hb *Heartbeat) (Pause, bool) {
	p := hb.GetPause()
	if p == nil || p.GetVersion() == 0 {
		return Pause{}, false
	}
	a, ok := actionOf(p.GetAction())
	if !ok {
		return Pause{}, false
	}
	return Pause{Version: p.GetVersion(), Paused: p.GetPaused(), Action: a}, true
}

// LastActionOf returns the last action a heartbeat's sender was asked,
// and false when it says none.
func LastActionOf(hb *Heartbeat) (Action, bool) {
	if hb.GetLastAction() == nil {
		return Action{}, false
	}
	return actionOf(hb.GetLastAction())
}

// wire returns p's wire form; nil for the zero Pause.
func (p Pause) wire() *DeliveryPause {
	if p.Version == 0 {
		return nil
	}
	return &DeliveryPause{Version: p.Version, Paused: p.Paused, Action: p.Action.wire()}
}

// pauseReq is a SetPaused for the loop.
type pauseReq struct {
	paused bool
	by     string
	reply  chan Pause
}

// ErrNotRunning is returned by SetPaused when the election does not run.
var ErrNotRunning = errors.New("cluster: the election does not run")

// SetPaused pauses (paused) or resumes the deliveries of the whole
// cluster, asked by by, and returns the Pause in force: this member's
// heartbeats carry it from the next one on, published at once, and
// Config.OnPause has been told before SetPaused returns.
func (e *Elector) SetPaused(ctx context.Context, paused bool, by string) (Pause, error) {
	if !e.running.Load() {
		return Pause{}, ErrNotRunning
	}
	r := pauseReq{paused: paused, by: Cut(by), reply: make(chan Pause, 1)}
	select {
	case e.pauses <- r:
	case <-e.done:
		return Pause{}, ErrNotRunning
	case <-ctx.Done():
		return Pause{}, fmt.Errorf("cluster: pause: %w", ctx.Err())
	}
	select {
	case p := <-r.reply:
		return p, nil
	case <-e.done:
		return Pause{}, ErrNotRunning
	case <-ctx.Done():
		return Pause{}, fmt.Errorf("cluster: pause: %w", ctx.Err())
	}
}

// Pause returns the cluster's delivery pause as this member knows it.
func (e *Elector) Pause() Pause { return e.snap.Load().pause }

// NoteAction records a, asked of this member, for its heartbeats (fanout
// status shows each member's last action); its text fields are cut as
// SetPaused's. It does not block.
func (e *Elector) NoteAction(a Action) {
	a.Kind, a.Target, a.By, a.NodeID = Cut(a.Kind), Cut(a.Target), Cut(a.By), e.cfg.NodeID
	a.At = time.UnixMilli(a.At.UnixMilli())
	e.lastAction.Store(&a)
}

// setPause makes p the pause in force when it supersedes the one in force,
// and tells Config.OnPause; it reports whether it did.
func (l *loop) setPause(p Pause) bool {
	if !p.after(l.pause) {
		return false
	}
	l.pause = p
	if l.e.cfg.OnPause != nil {
		l.e.cfg.OnPause(p)
	}
	return true
}

// pausedWord says paused or resumed, for logs.
func pausedWord(paused bool) string {
	if paused {
		return "paused"
	}
	return "resumed"
}

// askPause takes a SetPaused at now: the next version, asked of this member.
func (l *loop) askPause(r pauseReq, now time.Time) {
	kind := ActionResume
	if r.paused {
		kind = ActionPause
	}
	if l.pause.Version == math.MaxUint64 {
		l.e.log.Error("delivery pause: the version is exhausted (a forged heartbeat?): not changed")
		r.reply <- l.pause
		return
	}
	p := Pause{Version: l.pause.Version + 1, Paused: r.paused,
		Action: Action{Kind: kind, By: r.by, At: time.UnixMilli(now.UnixMilli()), NodeID: l.e.cfg.NodeID}} // as the heartbeats carry it
	l.setPause(p)
	l.e.NoteAction(p.Action)
	l.e.log.WithFields(logrus.Fields{"version": p.Version, "by": p.Action.By}).
		Info("the cluster's deliveries are " + pausedWord(p.Paused) + " (asked of this member)")
	l.update(now, false) // publishes it at once
	r.reply <- l.pause
}
