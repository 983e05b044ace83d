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
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
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
		Usage: "work on a cluster's committed offsets while it is stopped",
		Subcommands: []*cli.Command{
			offsetsCopyCommand(),
		},
	}
}

func offsetsCopyCommand() *cli.Command {
	env := func(name string) []string { return []string{"FANOUT_" + name} }
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
			&cli.StringFlag{Name: "id", Usage: "service id of the cluster", EnvVars: env("ID")},
			&cli.StringFlag{Name: "topic", Usage: "the topic the cluster consumes", EnvVars: env("TOPIC")},
			&cli.StringSliceFlag{Name: "kafka", Usage: "Kafka bootstrap brokers host:port (default: Docker links, else localhost:9092)", EnvVars: env("KAFKA")},
			&cli.StringSliceFlag{Name: "zookeeper", Usage: "ZooKeeper servers host:port, the last may end in /chroot (default: Docker links, else localhost:2181)", EnvVars: env("ZOOKEEPER")},
			&cli.DurationFlag{Name: "window", Value: offsetsWindow, Usage: "the cluster counts as running while a daemon was heard from within this window"},
			&cli.DurationFlag{Name: "timeout", Value: offsetsTimeout, Usage: "give up after this long"},
		}, append(kafkaSecurityFlags(), zookeeperSecurityFlags()...)...),
		Action:       offsetsCopyAction,
		OnUsageError: commandUsageError,
	}
}

func offsetsCopyAction(c *cli.Context) error {
	if c.Args().Present() {
		return usageError(fmt.Errorf("unexpected argument %q", c.Args().First()))
	}
	from, to := c.String("from"), c.String("to")
	stores := []string{fanout.OffsetStoreZooKeeper, fanout.OffsetStoreKafka}
	switch {
	case !slices.Contains(stores, from):
		return usageError(fmt.Errorf("--from %q: want zookeeper or kafka", from))
	case !slices.Contains(stores, to):
		return usageError(fmt.Errorf("--to %q: want zookeeper or kafka", to))
	case from == to:
		return usageError(fmt.Errorf("--from and --to are both %s: copy from one store to the other", from))
	}
	kafkaAddrs, zkAddrs := c.StringSlice("kafka"), c.StringSlice("zookeeper")
	if len(kafkaAddrs) == 0 {
		kafkaAddrs = linkedAddrs(environ(), "KAFKA", 9092)
	}
	if len(zkAddrs) == 0 {
		zkAddrs = linkedAddrs(environ(), "ZK", 2181)
	}
	kafkaSec, err := kafkaSecurity(environ(), contextValues(c))
	if err != nil {
		return usageError(err)
	}
	zkSec, err := zookeeperSecurity(environ(), contextValues(c))
	if err != nil {
		return usageError(err)
	}
	opts := fanout.Options{ID: c.String("id"), Topic: c.String("topic"), Kafka: splitAll(kafkaAddrs), ZooKeeper: splitAll(zkAddrs),
		KafkaSecurity: kafkaSec, ZooKeeperSecurity: zkSec}
	if err := opts.Validate(); err != nil {
		return usageError(err)
	}
	warn(c.App.ErrWriter, append(opts.KafkaSecurity.Warnings(), opts.ZooKeeperSecurity.Warnings()...))
	if len(opts.Kafka) == 0 {
		opts.Kafka = []string{"localhost:9092"}
	}
	if len(opts.ZooKeeper) == 0 {
		opts.ZooKeeper = []string{"localhost:2181"}
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()

	conn, chroot, err := toolZooKeeper(ctx, opts)
	if err != nil {
		return err
	}
	defer conn.Close()
	client, err := statusClient(opts)
	if err != nil {
		return err
	}
	defer client.Close()

	group := kafkastore.New(client, opts.ID, opts.Topic, 0)
	if err := checkStopped(ctx, client, group, cluster.TopicName(opts.ID, opts.Topic), c.Duration("window"), time.Now()); err != nil {
		return err
	}
	parts, err := client.Partitions(opts.Topic)
	if err != nil {
		return fmt.Errorf("partitions of topic %s: %w", opts.Topic, err)
	}
	acl := opts.ZooKeeperSecurity.ACL(chroot)
	zs := zkstore.New(conn, chroot, opts.ID, opts.Topic)
	zs.SetACL(acl)
	ends := map[string]offsetEnd{
		fanout.OffsetStoreZooKeeper: {name: "zookeeper " + zs.Path(), store: zs, fence: func() (offsets.Fence, error) {
			return cluster.IdleFence(conn, chroot, opts.ID, opts.Topic, acl)
		}},
		fanout.OffsetStoreKafka: {name: "kafka group " + group.Group(), store: group, fence: func() (offsets.Fence, error) {
			return group.EmptyFence("fanout offsets copy from " + from), nil
		}},
	}
	return copyOffsets(ctx, ends[from], ends[to], parts, c.App.Writer)
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
	members, err := readMembers(ctx, client, heartbeatTopic, now.Add(-window))
	if err != nil {
		return err
	}
	if len(members) > 0 {
		var names []string
		for _, m := range members {
			names = append(names, fmt.Sprintf("%s (%s, %s ago)", m.NodeID, m.Role, now.Sub(m.LastSeen).Round(100*time.Millisecond)))
		}
		return fmt.Errorf("the cluster runs: heard within %v from %s; stop every daemon first", window, strings.Join(names, ", "))
	}
	d, err := group.Describe(ctx)
	if err != nil {
		return err
	}
	if len(d.Members) > 0 {
		return fmt.Errorf("the group %s has a member (%s, client %s at %s): a leader runs, or stopped without leaving less than its session timeout ago; stop it, or wait, and copy again",
			group.Group(), d.Members[0].MemberID, d.Members[0].ClientID, d.Members[0].Host)
	}
	return nil
}
