package fanout

import (
	"context"
	"fmt"
	"strings"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/server"
	"github.com/nanoservice/core-fanout/fanout/status"
)

// mode is how the members of a cluster share the topic (--assignment),
// chosen once from the options (assignmentOf) when the daemon is made.
// The daemon opens the offset store, takes part in the election and serves
// clients; its mode says what serving is: the elected leader serves every
// partition, in terms (leaderMode), or every member serves the partitions
// the leader's assignment gives it, in stretches (spreadMode).
type mode interface {
	// prepare adds the mode's part to the election's configuration, once
	// the offset store is open and before the election runs; false when
	// ctx ended first.
	prepare(ctx context.Context, cfg *cluster.Config, auth authority.Authority) bool
	// run serves until ctx ends, while the election runs (see serveEnv).
	run(ctx context.Context, s serveEnv) error
	// leadership is what the server tells a client that says Hello now.
	leadership() server.Leadership
	// members lists the advertised addresses of the members that serve
	// partitions, with the list's version (the server's Config.Members);
	// nil and nil when clients are not told of members. It must not block.
	members() ([]string, *protocol.MembersVersion)
	// snapshot adds the mode's state to the metrics snapshot s.
	snapshot(s *metrics.Snapshot)
	// partitions adds the partitions a daemon's status shows to st.
	partitions(ctx context.Context, st *status.Status, snap metrics.Snapshot)
	// ownership is this member's partitions (spread mode); the zero value
	// when the mode has no partitions of its own.
	ownership() OwnershipStatus
}

// serveEnv is what a mode's run is given.
type serveEnv struct {
	client sarama.Client       // the source's
	auth   authority.Authority // the offset store, open
	el     *cluster.Elector    // running
	elDone chan error          // receives the election's error if it stops (put it back for the caller)
	resign func()              // leaves the election: another member takes over at once
}

// assignment is one value of --assignment: how the members share the
// topic, what it needs of the offset store, and its mode.
type assignment struct {
	name    string
	cluster cluster.Mode // as the heartbeats carry it
	// owners: each member serves partitions of its own, fenced alone by
	// the store's ownership records (authority.Kind.Owners).
	owners  bool
	newMode func(d *Daemon) mode
}

// assignmentModes are the values of --assignment, the default first.
var assignmentModes = []assignment{
	{name: AssignmentLeader, cluster: cluster.Mode_MODE_LEADER, newMode: newLeaderMode},
	{name: AssignmentSpread, cluster: cluster.Mode_MODE_SPREAD, owners: true, newMode: newSpreadMode},
}

// assignmentOf returns the assignment named name ("" is the default). It
// is the one place the assignment modes are told by their names.
func assignmentOf(name string) (assignment, error) {
	if name == "" {
		return assignmentModes[0], nil
	}
	var names []string
	for _, a := range assignmentModes {
		if a.name == name {
			return a, nil
		}
		names = append(names, a.name)
	}
	return assignment{}, fmt.Errorf("--assignment %q: want %s", name, strings.Join(names, " or "))
}

// PartitionsFencedAlone reports whether members of the assignment mode
// named name (as the heartbeats and fanout status name it) fence each of
// their partitions alone, by ownership records, rather than under the
// leader record: taking the leader record over does not stop their
// commits.
func PartitionsFencedAlone(name string) bool {
	a, err := assignmentOf(name)
	return err == nil && a.owners
}
