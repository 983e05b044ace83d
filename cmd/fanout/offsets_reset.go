package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
)

func offsetsResetCommand() *cli.Command {
	return &cli.Command{
		Name:  "reset",
		Usage: "move a cluster's committed offsets back (replay) or ahead (skip)",
		UsageText: "fanout offsets reset --id SERVICE_ID --topic TOPIC --to oldest|newest|<RFC3339 time>|<partition>=<offset>,...\n" +
			"   [--partitions 0,1] [--yes] [--fence-leader] [--kafka host:port] [--zookeeper host:port | --offset-store kafka]",
		Description: "Sets the committed offset of each partition (of --partitions, or all) to --to: oldest (the log\n" +
			"start), newest (the last stable offset), the first offset at or after an RFC 3339 time (Kafka's\n" +
			"offsets-for-times), or the offsets given (each within its partition's log unless\n" +
			"--allow-out-of-range). It prints the change and asks for confirmation on the terminal (--yes\n" +
			"skips it; without a terminal and without --yes it stops there, having written nothing).\n" +
			"\n" +
			"It refuses while a daemon of the cluster runs (a heartbeat within --window, or a member in the\n" +
			"group) unless --fence-leader. Either way it takes the leader record over as a leader elected at\n" +
			"the next epoch would (ZooKeeper: a compare-and-set of the record in the same multi that writes the\n" +
			"offsets; Kafka: a join of the group that replaces the leader's membership, then one commit under\n" +
			"it): a live leader's commits are refused from then on and it stops delivering, and the next\n" +
			"leader starts from the new offsets. The offsets are written all at once or not at all, then read\n" +
			"back and compared.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "to", Usage: "oldest, newest, an RFC 3339 time (2026-03-04T05:06:07Z), or <partition>=<offset>,..."},
			&cli.StringSliceFlag{Name: "partitions", Usage: "reset only these partitions (comma-separated; not with <partition>=<offset>)"},
			&cli.BoolFlag{Name: "yes", Usage: "do not ask for confirmation"},
			&cli.BoolFlag{Name: "fence-leader", Usage: "reset while the cluster runs: end the leader's term (its commits are refused) and write under the tool's own fence"},
			&cli.BoolFlag{Name: "allow-out-of-range", Usage: "write <partition>=<offset> values outside the partition's log"},
			offsetStoreFlag(),
			windowFlag(),
		}, offsetsClusterFlags()...),
		Action:       offsetsResetAction,
		OnUsageError: commandUsageError,
	}
}

func offsetsResetAction(c *cli.Context) error {
	target, err := parseResetTarget(c.String("to"))
	if err != nil {
		return usageError(err)
	}
	limit, err := parsePartitions(c.StringSlice("partitions"))
	if err != nil {
		return usageError(err)
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	t, from, err := storeTarget(ctx, c, c.Duration("window"))
	if err != nil {
		return err
	}
	defer t.close()
	opts := t.opts

	leader, plan, err := planTarget(ctx, t, target, limit, c.Bool("allow-out-of-range"))
	if errors.Is(err, errBadReset) {
		return usageError(err)
	}
	if err != nil {
		return err
	}
	w := c.App.Writer
	fmt.Fprintf(w, "reset %s (id %s, topic %s) to %s\n", t.auth.Where(), opts.ID, opts.Topic, target)
	fmt.Fprintf(w, "store chosen by %s\n", from)
	if leader != nil {
		fmt.Fprintf(w, "leader record: %s (epoch %d, %s)\n", leader.Node, leader.Epoch, orNone(leader.Addr))
	} else {
		fmt.Fprintln(w, "leader record: none")
	}
	if err := writePlan(w, plan); err != nil {
		return err
	}
	if !slices.ContainsFunc(plan, func(ch change) bool { return !ch.unchanged() }) {
		fmt.Fprintln(w, "nothing to change: every partition is at its target already")
		return nil
	}

	if err := t.checkStopped(ctx, c.Duration("window")); err != nil {
		if running := (*clusterRunning)(nil); errors.As(err, &running) && running.spread() {
			return fmt.Errorf("%w; nothing written. The cluster runs in spread mode, where each member's commits are fenced "+
				"by its own partitions (their ownership records, or the group's generations), not by the leader record: "+
				"--fence-leader cannot stop them, so stop every member and reset then", err)
		}
		if !c.Bool("fence-leader") {
			return fmt.Errorf("%w; nothing written. --fence-leader resets a running cluster: it takes the leader record over, "+
				"which ends the leader's term (its commits are refused from then on, it stops delivering), writes the offsets "+
				"under the tool's own fence, and leaves the record to the next election, whose leader resumes from them", err)
		}
		fmt.Fprintf(w, "%v\n--fence-leader: taking the leader record over ends the leader's term\n", err)
	}
	if !c.Bool("yes") {
		if !isTerminal(c.App.Reader) {
			return usageError(errors.New("not on a terminal, so nobody can confirm: give --yes to reset without asking; nothing written"))
		}
		ok, err := confirm(c.App.Reader, c.App.ErrWriter, fmt.Sprintf("reset %s of %s? [y/N] ", partitionCount(len(plan)), t.auth.Where()))
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("not confirmed: nothing written")
		}
	}

	// A fresh deadline: the answer may have taken a while.
	wctx, wcancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer wcancel()
	var seen uint64
	if leader != nil {
		seen = leader.Epoch
	}
	offs := make(map[int32]int64, len(plan))
	for _, ch := range plan {
		offs[ch.Partition] = ch.To
	}
	epoch, note, err := resetOffsets(wctx, t, seen, offs)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "reset %s of %s, verified%s\n", partitionCount(len(offs)), t.auth.Where(), note)
	fmt.Fprintf(w, "the leader record names %s at epoch %d until the next election: a running cluster elects its leader now, "+
		"a stopped one when it starts; that leader resumes from these offsets\n", cluster.ToolNode, epoch)
	return nil
}

// planTarget reads the cluster's leader record, committed offsets and logs,
// and plans the reset of limit (empty: every partition) to target.
func planTarget(ctx context.Context, t *offsetsTarget, target resetTarget, limit []int32, allowOutOfRange bool) (*status.Leader, []change, error) {
	leader, committed, err := t.read(ctx)
	if err != nil {
		return nil, nil, err
	}
	parts, err := t.partitions()
	if err != nil {
		return nil, nil, err
	}
	states, err := readLogs(t.client, t.opts.Topic, parts, committed)
	if err != nil {
		return nil, nil, err
	}
	for p, st := range states {
		if target.kind == toNewest || target.kind == toTime {
			if st.Stable, err = kafka.LastStableOffset(t.client, t.opts.Topic, p); err != nil {
				return nil, nil, fmt.Errorf("newest offset of %s/%d: %w", t.opts.Topic, p, err)
			}
		}
		if target.kind == toTime {
			if st.AtTime, err = t.client.GetOffset(t.opts.Topic, p, timestampMillis(target.at)); err != nil {
				return nil, nil, fmt.Errorf("offset of %s/%d at %s: %w", t.opts.Topic, p, target, err)
			}
		}
		states[p] = st
	}
	plan, err := planReset(target, limit, states, allowOutOfRange)
	return leader, plan, err
}

// timestampMillis is the ListOffsets timestamp of at: milliseconds since
// the Unix epoch, and 0 before it (negative values are Kafka's oldest and
// newest).
func timestampMillis(at time.Time) int64 { return max(0, at.UnixMilli()) }

// resetOffsets takes the cluster's leader record over (seen: the epoch read
// before, 0 for none) and writes offs under it, all at once or not at all,
// then reads them back and compares. It returns the epoch the tool
// recorded and a note for the user.
func resetOffsets(ctx context.Context, t *offsetsTarget, seen uint64, offs map[int32]int64) (uint64, string, error) {
	taken, err := t.auth.Take(ctx, seen)
	if err != nil {
		return 0, "", takeError(t, err)
	}
	defer taken.Release()
	if err := taken.Commit(ctx, offs); err != nil {
		return 0, "", writeError(t, err)
	}
	note, err := verifyReset(ctx, t.read, t.auth.Where(), taken.Epoch(), offs)
	return taken.Epoch(), note, err
}

// takeError describes a failed take of the leader record.
func takeError(t *offsetsTarget, err error) error {
	if errors.Is(err, cluster.ErrRecordChanged) {
		return fmt.Errorf("%w: a leader was elected or left since the offsets were read; nothing written: run the reset again", err)
	}
	return fmt.Errorf("take the leader record of %s: %w; nothing written", t.auth.Where(), err)
}

// writeError describes a failed write of the reset.
func writeError(t *offsetsTarget, err error) error {
	if errors.Is(err, offsets.ErrFenced) {
		return fmt.Errorf("write to %s: %w: a daemon took the leader record meanwhile; nothing written: run the reset again", t.auth.Where(), err)
	}
	return fmt.Errorf("write to %s: %w; nothing written", t.auth.Where(), err)
}

// verifyReset reads the offsets back from the store named name (read: its
// leader record and offsets) and compares them with offs, written at epoch.
// A difference is no error when a leader elected after the reset (an epoch
// above the tool's) has committed already; the note says so.
func verifyReset(ctx context.Context, read func(context.Context) (*status.Leader, map[int32]int64, error), name string,
	epoch uint64, offs map[int32]int64) (string, error) {
	leader, after, err := read(ctx)
	if err != nil {
		return "", fmt.Errorf("verify: the reset was written, but reading it back failed: %w", err)
	}
	var wrong []string
	for _, p := range slices.Sorted(maps.Keys(offs)) {
		if got, ok := after[p]; !ok || got != offs[p] {
			wrong = append(wrong, fmt.Sprintf("partition %d holds %s, want %d", p, optInt(optional(after, p)), offs[p]))
		}
	}
	switch {
	case len(wrong) == 0:
		return "", nil
	case leader != nil && leader.Epoch > epoch:
		return fmt.Sprintf(" (the next leader, %s at epoch %d, has committed since: %s)", leader.Node, leader.Epoch, strings.Join(wrong, "; ")), nil
	}
	return "", fmt.Errorf("verify %s after the reset: %s", name, strings.Join(wrong, "; "))
}

// partitionCount is "1 partition", "2 partitions".
func partitionCount(n int) string {
	if n == 1 {
		return "1 partition"
	}
	return fmt.Sprintf("%d partitions", n)
}

// isTerminal reports whether r is a terminal, where a user can answer.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// confirm writes question to w and reads one line from in: true for y or
// yes (any case), false for anything else or no answer.
func confirm(in io.Reader, w io.Writer, question string) (bool, error) {
	fmt.Fprint(w, question)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("read the answer: %w", err)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}
