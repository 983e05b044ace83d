package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/IBM/sarama"
	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/status"
)

// Defaults of the offsets commands.
const (
	offsetsTimeout = 30 * time.Second
	offsetsWindow  = 10 * time.Second
)

// offsetsCommand is the group of commands on a cluster's committed
// offsets.
func offsetsCommand() *cli.Command {
	return &cli.Command{
		Name:  "offsets",
		Usage: "show, reset or copy a cluster's committed offsets",
		Subcommands: []*cli.Command{
			offsetsShowCommand(),
			offsetsResetCommand(),
			offsetsCopyCommand(),
		},
	}
}

// offsetsClusterFlags are the flags of every offsets command that name the
// cluster and reach its servers (the security flags included).
func offsetsClusterFlags() []cli.Flag {
	env := func(name string) []string { return []string{"FANOUT_" + name} }
	return append([]cli.Flag{
		&cli.StringFlag{Name: "id", Usage: "service id of the cluster", EnvVars: env("ID")},
		&cli.StringFlag{Name: "topic", Usage: "the topic the cluster consumes", EnvVars: env("TOPIC")},
		&cli.StringSliceFlag{Name: "kafka", Usage: "Kafka bootstrap brokers host:port (default: Docker links, else localhost:9092)", EnvVars: env("KAFKA")},
		&cli.StringSliceFlag{Name: "zookeeper", Usage: "ZooKeeper servers host:port, the last may end in /chroot (default: Docker links, else localhost:2181; not with --offset-store kafka)", EnvVars: env("ZOOKEEPER")},
		&cli.DurationFlag{Name: "timeout", Value: offsetsTimeout, Usage: "give up after this long"},
	}, append(kafkaSecurityFlags(), zookeeperSecurityFlags()...)...)
}

// offsetStoreFlag is the --offset-store flag of the commands that work on
// the store the cluster uses.
// Without it, the store is the one the members' heartbeats name (see
// chooseStore).
func offsetStoreFlag() cli.Flag {
	return &cli.StringFlag{Name: "offset-store",
		Usage: "where the cluster keeps offsets and its leader record: zookeeper or kafka (default: the store the " +
			"members' heartbeats name; when none is heard, zookeeper)", EnvVars: []string{"FANOUT_OFFSET_STORE"}}
}

// windowFlag is the --window flag of the commands that refuse while the
// cluster runs.
func windowFlag() cli.Flag {
	return &cli.DurationFlag{Name: "window", Value: offsetsWindow, Usage: "the cluster counts as running while a daemon was heard from within this window"}
}

// offsetsOptions maps the cluster flags of an offsets command onto the
// options of the cluster they name, whose offsets are in store (with
// zookeeper, ZooKeeper is needed too; "": not known yet, see
// storeOptions), with the servers' defaults filled in. Bad values are
// usage errors.
func offsetsOptions(c *cli.Context, store string) (fanout.Options, error) {
	if c.Args().Present() {
		return fanout.Options{}, usageError(fmt.Errorf("unexpected argument %q", c.Args().First()))
	}
	kafkaAddrs, zkAddrs := c.StringSlice("kafka"), c.StringSlice("zookeeper")
	if len(kafkaAddrs) == 0 {
		kafkaAddrs = linkedAddrs(environ(), "KAFKA", 9092)
	}
	if len(zkAddrs) == 0 && usesZooKeeper(store) {
		zkAddrs = linkedAddrs(environ(), "ZK", 2181)
	}
	kafkaSec, err := kafkaSecurity(environ(), contextValues(c))
	if err != nil {
		return fanout.Options{}, usageError(err)
	}
	zkSec, err := zookeeperSecurity(environ(), contextValues(c))
	if err != nil {
		return fanout.Options{}, usageError(err)
	}
	opts := fanout.Options{ID: c.String("id"), Topic: c.String("topic"), Kafka: splitAll(kafkaAddrs), ZooKeeper: splitAll(zkAddrs),
		OffsetStore: store, KafkaSecurity: kafkaSec, ZooKeeperSecurity: zkSec}
	if err := opts.Validate(); err != nil {
		return fanout.Options{}, usageError(err)
	}
	warnings := opts.KafkaSecurity.Warnings()
	if usesZooKeeper(store) {
		warnings = append(warnings, opts.ZooKeeperSecurity.Warnings()...)
	}
	warn(c.App.ErrWriter, warnings)
	if len(opts.Kafka) == 0 {
		opts.Kafka = []string{"localhost:9092"}
	}
	if len(opts.ZooKeeper) == 0 && usesZooKeeper(store) {
		opts.ZooKeeper = []string{"localhost:2181"}
	}
	return opts, nil
}

// storeTarget connects to the cluster of an offsets command that works on
// the store the cluster uses (show, reset): its --offset-store is checked
// against, or learnt from, the heartbeats of the members heard within window
// (resolveStore). It returns how the store was chosen; close the target
// when done.
func storeTarget(ctx context.Context, c *cli.Context, window time.Duration) (*offsetsTarget, string, error) {
	given := c.String("offset-store")
	opts, err := offsetsOptions(c, given)
	if err != nil {
		return nil, "", err
	}
	choice, err := resolveStore(ctx, c, &opts, given, window)
	if err != nil {
		return nil, "", err
	}
	if given == "" && usesZooKeeper(opts.OffsetStore) {
		warn(c.App.ErrWriter, opts.ZooKeeperSecurity.Warnings())
	}
	t, err := openTarget(ctx, opts)
	if err != nil {
		return nil, "", choice.hint(err)
	}
	return t, choice.from, nil
}

// offsetsTarget is the cluster an offsets command works on, connected: a
// Kafka client and the offset store the options name.
type offsetsTarget struct {
	opts   fanout.Options
	client sarama.Client
	auth   authority.Authority
}

// openTarget connects to the servers of opts; close it when done.
func openTarget(ctx context.Context, opts fanout.Options) (*offsetsTarget, error) {
	client, err := statusClient(opts)
	if err != nil {
		return nil, err
	}
	auth, err := fanout.OpenAuthority(ctx, opts, client)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &offsetsTarget{opts: opts, client: client, auth: auth}, nil
}

// close closes the connections.
func (t *offsetsTarget) close() {
	t.auth.Close()
	_ = t.client.Close()
}

// read returns the leader record (nil: nobody leads) and the committed
// offsets of the cluster's store.
func (t *offsetsTarget) read(ctx context.Context) (*status.Leader, map[int32]int64, error) {
	leader, err := t.auth.Leader(ctx)
	if err != nil {
		return nil, nil, err
	}
	committed, err := t.auth.Offsets().Load(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("committed offsets: %w", err)
	}
	return leader, committed, nil
}

// partitions returns the topic's partitions in order.
func (t *offsetsTarget) partitions() ([]int32, error) {
	parts, err := t.client.Partitions(t.opts.Topic)
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return nil, fmt.Errorf("topic %s does not exist in Kafka at %s", t.opts.Topic, strings.Join(t.opts.Kafka, ","))
	}
	if err != nil {
		return nil, fmt.Errorf("partitions of topic %s: %w", t.opts.Topic, err)
	}
	return slices.Sorted(slices.Values(parts)), nil
}

// checkStopped returns an error when a daemon of the cluster may run (see
// checkStopped).
func (t *offsetsTarget) checkStopped(ctx context.Context, window time.Duration) error {
	return checkStopped(ctx, t.client, kafkastore.New(t.client, t.opts.ID, t.opts.Topic, 0),
		cluster.TopicName(t.opts.ID, t.opts.Topic), window, time.Now())
}

// clusterRunning is checkStopped's error when daemons of the cluster were
// heard within the window.
type clusterRunning struct {
	window  time.Duration
	members []status.Member
	now     time.Time
}

func (e *clusterRunning) Error() string {
	var names []string
	for _, m := range e.members {
		names = append(names, fmt.Sprintf("%s (%s, %s ago)", m.NodeID, m.Role, e.now.Sub(m.LastSeen).Round(100*time.Millisecond)))
	}
	return fmt.Sprintf("the cluster runs: heard within %v from %s; stop every daemon first", e.window, strings.Join(names, ", "))
}

// spread reports whether a member heard runs spread mode, where each
// member fences its own partitions: taking the leader record over does not
// stop their commits.
func (e *clusterRunning) spread() bool {
	return slices.ContainsFunc(e.members, func(m status.Member) bool { return fanout.PartitionsFencedAlone(m.Mode) })
}

func offsetsCopyCommand() *cli.Command {
	return &cli.Command{
		Name:      "copy",
		Usage:     "copy a stopped cluster's committed offsets between ZooKeeper and Kafka",
		UsageText: "fanout offsets copy --from zookeeper --to kafka --id SERVICE_ID --topic TOPIC [--kafka host:port] [--zookeeper host:port]",
		Description: "Copies the committed offsets of the cluster --id on --topic from one offset store to the other:\n" +
			"ZooKeeper (/consumers/fanout_<id>/offsets/<topic>) or Kafka (the consumer group fanout_<id>), before\n" +
			"the cluster is started with the other --offset-store. It refuses while any daemon of the cluster\n" +
			"runs (a heartbeat within --window, or a member in the group), writes every partition in one\n" +
			"atomic commit that a leader starting meanwhile would fence, then reads the offsets back and\n" +
			"compares. Offsets of partitions the source does not hold are left as they are.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "from", Usage: "the store to copy from: zookeeper or kafka"},
			&cli.StringFlag{Name: "to", Usage: "the store to copy to: kafka or zookeeper"},
			windowFlag(),
		}, offsetsClusterFlags()...),
		Action:       offsetsCopyAction,
		OnUsageError: commandUsageError,
	}
}

func offsetsCopyAction(c *cli.Context) error {
	from, to := c.String("from"), c.String("to")
	switch {
	case !isStore(from):
		return usageError(fmt.Errorf("--from %q: want %s", from, authority.Names(func(authority.Kind) bool { return true }, " or ")))
	case !isStore(to):
		return usageError(fmt.Errorf("--to %q: want %s", to, authority.Names(func(authority.Kind) bool { return true }, " or ")))
	case from == to:
		return usageError(fmt.Errorf("--from and --to are both %s: copy from one store to the other", from))
	}
	opts, err := offsetsOptions(c, authority.ZooKeeper) // both stores: ZooKeeper too
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	ends := map[string]offsetEnd{}
	var t *offsetsTarget
	for _, store := range []string{from, to} {
		o := opts
		o.OffsetStore = store
		st, err := openTarget(ctx, o)
		if err != nil {
			return err
		}
		defer st.close()
		t = st
		ends[store] = offsetEnd{name: st.auth.Where(), store: st.auth.Offsets(), fence: func() (offsets.Fence, error) {
			return st.auth.IdleFence(ctx, "fanout offsets copy from "+from)
		}}
	}

	if err := t.checkStopped(ctx, c.Duration("window")); err != nil {
		return err
	}
	parts, err := t.partitions()
	if err != nil {
		return err
	}
	return copyOffsets(ctx, ends[from], ends[to], parts, c.App.Writer)
}

// isStore reports whether name names an offset store.
func isStore(name string) bool {
	_, err := authority.Lookup(name)
	return err == nil && name != ""
}

// offsetEnd is one side of a copy: a store, and the fence of a commit to it
// while no daemon runs.
type offsetEnd struct {
	name  string // for messages: the store and where
	store offsets.Store
	fence func() (offsets.Fence, error)
}

// errNothingToCopy: the source holds no offsets.
var errNothingToCopy = errors.New("nothing to copy")

// copyOffsets copies the offsets from holds to to in one commit under to's
// fence, reads them back, compares, and prints what it did to w. parts are
// the topic's partitions: offsets of any other are refused before writing.
func copyOffsets(ctx context.Context, from, to offsetEnd, parts []int32, w io.Writer) error {
	src, err := from.store.Load(ctx)
	if err != nil {
		return fmt.Errorf("read the offsets in %s: %w", from.name, err)
	}
	if len(src) == 0 {
		return fmt.Errorf("%s holds no committed offsets: %w", from.name, errNothingToCopy)
	}
	for p := range src {
		if !slices.Contains(parts, p) {
			return fmt.Errorf("%s holds an offset of partition %d, which the topic does not have (it has %d partitions): nothing written",
				from.name, p, len(parts))
		}
	}
	before, err := to.store.Load(ctx)
	if err != nil {
		return fmt.Errorf("read the offsets in %s: %w", to.name, err)
	}
	fence, err := to.fence()
	if err != nil {
		return fmt.Errorf("fence of %s: %w", to.name, err)
	}
	if err := to.store.Commit(ctx, fence, src); err != nil {
		if errors.Is(err, offsets.ErrFenced) {
			return fmt.Errorf("write to %s refused: a daemon of the cluster started meanwhile (%w); stop it and copy again", to.name, err)
		}
		return fmt.Errorf("write to %s: %w", to.name, err)
	}
	after, err := to.store.Load(ctx)
	if err != nil {
		return fmt.Errorf("verify: read the offsets in %s: %w", to.name, err)
	}
	var wrong []string
	for p, o := range src {
		if got, ok := after[p]; !ok || got != o {
			wrong = append(wrong, fmt.Sprintf("partition %d holds %s, want %d", p, optInt(optional(after, p)), o))
		}
	}
	if len(wrong) > 0 {
		slices.Sort(wrong)
		return fmt.Errorf("verify %s after the copy: %s", to.name, strings.Join(wrong, "; "))
	}

	fmt.Fprintf(w, "copied the offsets of %d partitions from %s to %s, verified\n", len(src), from.name, to.name)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tFROM\tTO BEFORE\tTO NOW")
	for _, p := range slices.Sorted(maps.Keys(after)) {
		source := "(not in the source: kept)"
		if o, ok := src[p]; ok {
			source = fmt.Sprint(o)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\n", p, source, optInt(optional(before, p)), after[p])
	}
	return tw.Flush()
}

// optional returns a pointer to m[p], or nil when m has no p.
func optional(m map[int32]int64, p int32) *int64 {
	if o, ok := m[p]; ok {
		return &o
	}
	return nil
}

// checkStopped returns an error when a daemon of the cluster may run: a
// member's heartbeat on heartbeatTopic within window before now (one that
// left is not counted), or a member in the group of the Kafka store.
func checkStopped(ctx context.Context, client sarama.Client, group *kafkastore.Store, heartbeatTopic string, window time.Duration, now time.Time) error {
	log, err := readHeartbeats(ctx, client, heartbeatTopic, now.Add(-window), nil)
	if err != nil {
		return err
	}
	if len(log.members) > 0 {
		return &clusterRunning{window: window, members: log.members, now: now}
	}
	d, err := group.Describe(ctx)
	if err != nil {
		return err
	}
	if len(d.Members) > 0 {
		return fmt.Errorf("the group %s has members (%s; client %s at %s): a daemon runs, or stopped without leaving less than its session timeout ago; stop every daemon, or wait, and try again",
			group.Group(), d.Nodes(), d.Members[0].ClientID, d.Members[0].Host)
	}
	return nil
}
