package fanout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/console"
	"github.com/nanoservice/core-fanout/fanout/status"
)

// An operator's actions (decision 0023), asked through the metrics
// listener behind the metrics token (console.Actions): pausing and
// resuming the cluster's deliveries, and draining one client of this
// daemon. Each is logged with who asked, kept among the daemon's last
// actions (the console shows them) and carried in its heartbeats (fanout
// status shows each member's last one).

// maxActions is how many of its last actions a daemon keeps for the
// console.
const maxActions = 20

// actionLog is the last actions asked of the daemon, oldest first.
type actionLog struct {
	mu   sync.Mutex
	list []status.Action
}

// add records a.
func (l *actionLog) add(a status.Action) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.list) == maxActions {
		l.list = slices.Delete(l.list, 0, 1)
	}
	l.list = append(l.list, a)
}

// all returns the actions kept, oldest first.
func (l *actionLog) all() []status.Action {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.list)
}

// localPause is the pause of a daemon leading alone, without an election
// (Options.Store): its own, not carried to anybody.
type localPause struct {
	mu sync.Mutex
	p  cluster.Pause
}

// actions is the console's actions handler of the daemon.
func (d *Daemon) actions() console.ActionsConfig {
	return console.ActionsConfig{Pause: d.setPaused, DrainClient: d.drainClient}
}

// setPaused pauses or resumes the cluster's deliveries: through the
// election, which carries the pause to every member (cluster.SetPaused),
// or, leading alone, this daemon's only.
func (d *Daemon) setPaused(ctx context.Context, paused bool, by string) (*status.Pause, error) {
	var p cluster.Pause
	if el := d.elector.Load(); el != nil {
		var err error
		if p, err = el.SetPaused(ctx, paused, by); err != nil {
			if errors.Is(err, cluster.ErrNotRunning) {
				err = fmt.Errorf("%w: the election does not run (not yet, or no more)", console.ErrUnavailable)
			}
			return nil, err
		}
	} else if d.opts.Store != nil {
		d.local.mu.Lock()
		kind := cluster.ActionResume
		if paused {
			kind = cluster.ActionPause
		}
		d.local.p = cluster.Pause{Version: d.local.p.Version + 1, Paused: paused,
			Action: cluster.Action{Kind: kind, By: cluster.Cut(by), At: time.Now(), NodeID: d.opts.NodeID}}
		p = d.local.p
		d.local.mu.Unlock()
		d.pause.Set(paused)
	} else {
		return nil, fmt.Errorf("%w: this daemon does not take part in its cluster yet (it waits for its topic or its offset store): try again",
			console.ErrUnavailable)
	}
	d.noteAction(status.Action{Kind: p.Action.Kind, By: p.Action.By, At: p.Action.At, Node: d.opts.NodeID,
		Result: fmt.Sprintf("version %d", p.Version)})
	return status.PauseOf(p), nil
}

// onPause takes the cluster's pause the election settled on: the
// dispatchers follow the switch.
func (d *Daemon) onPause(p cluster.Pause) { d.pause.Set(p.Paused) }

// pauseInForce returns the cluster's pause as this daemon knows it, or nil.
func (d *Daemon) pauseInForce() *status.Pause {
	if el := d.elector.Load(); el != nil {
		return status.PauseOf(el.Pause())
	}
	d.local.mu.Lock()
	defer d.local.mu.Unlock()
	return status.PauseOf(d.local.p)
}

// drainClient drains the clients of this daemon's serving dispatcher whose
// session is id, or named name (dispatch.Dispatcher.DrainClient).
func (d *Daemon) drainClient(ctx context.Context, id uint64, name, by string) ([]status.Client, error) {
	disp := d.backend.dispatcher()
	if disp == nil {
		why := "this daemon serves no clients"
		if l := d.leadership(); l.LeaderAddr != "" {
			why += "; the leader at " + l.LeaderAddr + " serves them"
		}
		return nil, fmt.Errorf("%w: %s", console.ErrUnavailable, why)
	}
	drained, ok := disp.DrainClient(ctx, id, name, "drained by "+by)
	if !ok {
		return nil, fmt.Errorf("%w: this daemon stopped serving meanwhile", console.ErrUnavailable)
	}
	target := name
	if id != 0 {
		target = fmt.Sprintf("session %d", id)
	}
	out := d.statusClients(drained)
	result := fmt.Sprintf("%d sessions", len(out))
	if len(out) == 0 {
		result = "no such client"
	}
	d.noteAction(status.Action{Kind: cluster.ActionDrainClient, Target: target, By: by, At: time.Now(), Node: d.opts.NodeID,
		Result: result})
	return out, nil
}

// noteAction logs a, keeps it for the console and, in a cluster, for the
// heartbeats.
func (d *Daemon) noteAction(a status.Action) {
	d.log.WithFields(logrus.Fields{"action": a.Kind, "target": a.Target, "by": a.By, "result": a.Result}).
		Info("operator action")
	d.actionLog.add(a)
	if el := d.elector.Load(); el != nil && a.Kind == cluster.ActionDrainClient {
		// A pause or resume is noted by the election itself.
		el.NoteAction(cluster.Action{Kind: a.Kind, Target: a.Target, By: a.By, At: a.At})
	}
}
