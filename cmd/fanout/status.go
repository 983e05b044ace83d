package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/IBM/sarama"
	"github.com/urfave/cli/v2"
	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/status"
)

// Defaults of the status command.
const (
	statusTimeout = 15 * time.Second
	statusWindow  = 10 * time.Second
)

func statusCommand() *cli.Command {
	env := func(name string) []string { return []string{"FANOUT_" + name} }
	return &cli.Command{
		Name:      "status",
		Usage:     "show a fanout cluster: mode, members, leader and epoch, assignment and handoffs (spread mode), committed offsets, high watermarks and lag",
		UsageText: "fanout status --id SERVICE_ID --topic TOPIC [--kafka host:port] [--zookeeper host:port | --offset-store kafka] [--json]",
		Description: "Reads the last --window of heartbeats on fanout_<id>_<topic> (members, mode, each member's\n" +
			"offset store and readiness, the leader's assignment), the leader record and the committed offsets\n" +
			"from the offset store the members say they use (ZooKeeper, or the consumer group fanout_<id> in\n" +
			"Kafka; when no member says, --offset-store or ZooKeeper), the ownership records (spread mode, in\n" +
			"ZooKeeper), and each partition's high watermark from Kafka. What the store does not hold yet is shown\n" +
			"as none. In spread mode it lists each member's partitions and lag, and the partitions whose owner is\n" +
			"not the one assigned (handoffs in progress). Refuses (exit 2) an --offset-store other than the one\n" +
			"the members use. Exits 1 when Kafka or ZooKeeper cannot be reached.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "id", Usage: "service id of the cluster", EnvVars: env("ID")},
			&cli.StringFlag{Name: "topic", Usage: "the topic the cluster consumes", EnvVars: env("TOPIC")},
			&cli.StringSliceFlag{Name: "kafka", Usage: "Kafka bootstrap brokers host:port (default: Docker links, else localhost:9092)", EnvVars: env("KAFKA")},
			&cli.StringSliceFlag{Name: "zookeeper", Usage: "ZooKeeper servers host:port, the last may end in /chroot (default: Docker links, else localhost:2181; not with --offset-store kafka)", EnvVars: env("ZOOKEEPER")},
			offsetStoreFlag(),
			&cli.DurationFlag{Name: "window", Value: statusWindow, Usage: "members are those heard from within this window"},
			&cli.DurationFlag{Name: "timeout", Value: statusTimeout, Usage: "give up reaching Kafka or ZooKeeper after this long"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON document"},
			clusterSecretFlag(),
		}, append(kafkaSecurityFlags(), zookeeperSecurityFlags()...)...),
		Action:       statusAction,
		OnUsageError: commandUsageError,
	}
}

func statusAction(c *cli.Context) error {
	if c.Args().Present() {
		return usageError(fmt.Errorf("unexpected argument %q", c.Args().First()))
	}
	kafkaAddrs, zkAddrs := c.StringSlice("kafka"), c.StringSlice("zookeeper")
	if len(kafkaAddrs) == 0 {
		kafkaAddrs = linkedAddrs(environ(), "KAFKA", 9092)
	}
	kafkaSec, err := kafkaSecurity(environ(), contextValues(c))
	if err != nil {
		return usageError(err)
	}
	zkSec, err := zookeeperSecurity(environ(), contextValues(c))
	if err != nil {
		return usageError(err)
	}
	secret, err := readSecret(environ(), contextValues(c), secretCluster)
	if err != nil {
		return usageError(err)
	}
	opts := fanout.Options{ID: c.String("id"), Topic: c.String("topic"), Kafka: splitAll(kafkaAddrs), ZooKeeper: splitAll(zkAddrs),
		OffsetStore: c.String("offset-store"), KafkaSecurity: kafkaSec, ZooKeeperSecurity: zkSec, ClusterSecret: secret}
	if err := opts.Validate(); err != nil {
		return usageError(err)
	}
	warn(c.App.ErrWriter, opts.KafkaSecurity.Warnings())
	if len(opts.Kafka) == 0 {
		opts.Kafka = []string{"localhost:9092"}
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	choice, err := resolveStore(ctx, c, &opts, c.String("offset-store"), c.Duration("window"))
	if err != nil {
		return err
	}
	st, err := readStatus(ctx, opts, c.Duration("window"), time.Now())
	if err != nil {
		return choice.hint(err)
	}
	st.StoreFrom = choice.from
	if c.Bool("json") {
		return status.Encode(c.App.Writer, st)
	}
	return writeStatus(c.App.Writer, st, time.Now())
}

// readStatus gathers the status of the cluster opts names. Data the store
// or Kafka does not hold yet is left empty; unreachable servers are errors.
func readStatus(ctx context.Context, opts fanout.Options, window time.Duration, now time.Time) (*status.Status, error) {
	st := &status.Status{ID: opts.ID, Topic: opts.Topic, HeartbeatTopic: cluster.TopicName(opts.ID, opts.Topic),
		OffsetStore: opts.OffsetStore}

	client, err := statusClient(opts)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	auth, err := fanout.OpenAuthority(ctx, opts, client)
	if err != nil {
		return nil, err
	}
	defer auth.Close()
	if st.Leader, err = auth.Leader(ctx); err != nil {
		return nil, err
	}
	committed, err := auth.Offsets().Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("committed offsets: %w", err)
	}
	var held authority.Holdings // who holds each partition in spread mode, where the store keeps it
	if o, ok := auth.Owners(); ok {
		if held, err = o.Read(ctx); err != nil {
			return nil, fmt.Errorf("the partitions' holders: %w", err)
		}
	}
	parts, err := client.Partitions(opts.Topic)
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return nil, fmt.Errorf("topic %s does not exist in Kafka at %s", opts.Topic, strings.Join(opts.Kafka, ","))
	}
	if err != nil {
		return nil, fmt.Errorf("partitions of topic %s: %w", opts.Topic, err)
	}
	slices.Sort(parts)
	for _, p := range parts {
		hw, err := client.GetOffset(opts.Topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("high watermark of %s/%d: %w", opts.Topic, p, err)
		}
		var off *int64
		if o, ok := committed[p]; ok {
			off = &o
		}
		st.AddPartition(p, hw, off, "")
	}
	log, err := readHeartbeats(ctx, client, st.HeartbeatTopic, now.Add(-window), []byte(opts.ClusterSecret))
	if err != nil {
		return nil, err
	}
	st.Members, st.Unauthenticated = log.members, log.ignored
	st.Pause = status.LatestPause(st.Members)
	for _, m := range st.Members {
		if st.Leader != nil && m.NodeID == st.Leader.Node {
			st.Mode = m.Mode
		}
	}
	a := held.Assignment // the store's, when it assigns
	if a == nil {
		a = log.assignment(st.Leader) // else the elected leader's
	}
	st.AddSpread(a, held.Holders)
	return st, nil
}

// statusClient returns a Kafka client for the tools (status, offsets): the
// daemon's configuration with short dial and metadata retries.
func statusClient(opts fanout.Options) (sarama.Client, error) {
	cfg, err := opts.KafkaSecurity.Config("fanout-status")
	if err != nil {
		return nil, err
	}
	cfg.Net.DialTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = 2
	client, err := sarama.NewClient(opts.Kafka, cfg)
	if err != nil {
		return nil, kafka.DescribeError(opts.Kafka, opts.KafkaSecurity, err)
	}
	return client, nil
}

// heartbeatLog is what a window of a cluster's heartbeat log says.
type heartbeatLog struct {
	// members has each member's last heartbeat, ordered by node id; members
	// that left are dropped.
	members []status.Member
	// assignments has the last assignment each leader published in its
	// epoch, by leaderKey.
	assignments map[string]*cluster.Assignment
	// ignored counts the records without a valid MAC.
	ignored int
}

// leaderKey names a leader's epoch in heartbeatLog.assignments.
func leaderKey(node string, epoch uint64) string { return fmt.Sprintf("%d %s", epoch, node) }

// assignment returns the last assignment leader published in its epoch, or
// nil (no leader, or none published): heartbeats are not authenticated, the
// leader record says who leads.
func (h *heartbeatLog) assignment(leader *status.Leader) *cluster.Assignment {
	if leader == nil {
		return nil
	}
	return h.assignments[leaderKey(leader.Node, leader.Epoch)]
}

// readHeartbeats reads the heartbeats on topic since from, taking only the
// records with a valid MAC with secret (all of them without one). A
// missing topic means no members.
func readHeartbeats(ctx context.Context, client sarama.Client, topic string, from time.Time, secret []byte) (*heartbeatLog, error) {
	out := &heartbeatLog{assignments: map[string]*cluster.Assignment{}}
	if _, err := client.Partitions(topic); errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return out, nil
	} else if err != nil {
		return nil, fmt.Errorf("heartbeat topic %s: %w", topic, err)
	}
	start, err := client.GetOffset(topic, 0, from.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("heartbeat topic %s: offset at %s: %w", topic, from.Format(time.RFC3339), err)
	}
	end, err := client.GetOffset(topic, 0, sarama.OffsetNewest)
	if err != nil {
		return nil, fmt.Errorf("heartbeat topic %s: high watermark: %w", topic, err)
	}
	if start < 0 || start >= end {
		return out, nil // nothing within the window
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("heartbeat consumer: %w", err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, start)
	if err != nil {
		return nil, fmt.Errorf("read heartbeat topic %s from %d: %w", topic, start, err)
	}
	defer pc.AsyncClose()

	last := map[string]status.Member{}
	for next := start; next < end; {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read heartbeat topic %s (offsets %d to %d): %w", topic, start, end, ctx.Err())
		case err := <-pc.Errors():
			return nil, fmt.Errorf("read heartbeat topic %s: %w", topic, err)
		case m := <-pc.Messages():
			next = m.Offset + 1
			if !cluster.Authentic(secret, topic, m) {
				out.ignored++
				continue
			}
			var hb cluster.Heartbeat
			if err := proto.Unmarshal(m.Value, &hb); err != nil || hb.GetNodeId() == "" {
				continue // not a heartbeat: skip it, as the elector does
			}
			if hb.GetLeaving() {
				delete(last, hb.GetNodeId())
				continue
			}
			last[hb.GetNodeId()] = status.MemberOf(&hb, m.Timestamp)
			if hb.GetRole() == cluster.Role_ROLE_LEADER {
				if a := cluster.AssignmentOf(&hb); a != nil && a.Epoch == hb.GetEpoch() {
					out.assignments[leaderKey(hb.GetNodeId(), hb.GetEpoch())] = a
				}
			}
		}
	}
	out.members = make([]status.Member, 0, len(last))
	for _, m := range last {
		out.members = append(out.members, m)
	}
	slices.SortFunc(out.members, func(a, b status.Member) int { return strings.Compare(a.NodeID, b.NodeID) })
	return out, nil
}

// writeStatus prints st as aligned tables; ages are relative to now.
func writeStatus(w io.Writer, st *status.Status, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "cluster\t%s (id %s, topic %s)\n", st.HeartbeatTopic, st.ID, st.Topic)
	if st.OffsetStore != "" {
		store := st.OffsetStore
		if k, err := authority.Lookup(store); err == nil {
			store = k.Label(st.ID)
		}
		if st.StoreFrom != "" {
			store += ", chosen by " + st.StoreFrom
		}
		fmt.Fprintf(tw, "store\t%s\n", store)
	}
	fmt.Fprintf(tw, "mode\t%s\n", orUnknown(st.Mode))
	if st.Leader != nil {
		fmt.Fprintf(tw, "leader\t%s (epoch %d, %s)\n", st.Leader.Node, st.Leader.Epoch, orNone(st.Leader.Addr))
	} else {
		fmt.Fprintf(tw, "leader\tnone\n")
	}
	fmt.Fprintf(tw, "lag\t%d\n", st.TotalLag)
	if p := st.Pause; p != nil {
		fmt.Fprintf(tw, "delivery\t%s\n", pauseText(p, now))
	}
	if st.Unauthenticated > 0 {
		fmt.Fprintf(tw, "warning\t%d heartbeat records without a valid MAC ignored: someone writes unauthenticated records\n", st.Unauthenticated)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write status: %w", err)
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tADDR\tROLE\tEPOCH\tSTORE\tLAST HEARTBEAT\tREADY")
	if len(st.Members) == 0 {
		fmt.Fprintln(tw, "none")
	}
	for _, m := range st.Members {
		age := now.Sub(m.LastSeen).Round(100 * time.Millisecond)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s ago\t%s\n", m.NodeID, orNone(m.Addr), m.Role, m.Epoch, orUnknown(m.OffsetStore),
			max(age, 0), readyText(m))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write status: %w", err)
	}

	if slices.ContainsFunc(st.Members, func(m status.Member) bool { return m.LastAction != nil }) {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MEMBER\tLAST ACTION\tBY\tWHEN")
		for _, m := range st.Members {
			if a := m.LastAction; a != nil {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s ago\n", m.NodeID, strings.TrimSpace(a.Kind+" "+a.Target), a.By,
					max(now.Sub(a.At).Round(time.Second), 0))
			}
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write status: %w", err)
		}
	}

	if a := st.Assignment; a != nil {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "ASSIGNED TO (generation %d, epoch %d)\tADDR\tPARTITIONS\tOWNED\tLAG\n", a.Generation, a.Epoch)
		for _, m := range a.Members {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", m.NodeID, orNone(m.Addr), cluster.PartitionRanges(m.Partitions),
				cluster.PartitionRanges(m.Owned), m.Lag)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write status: %w", err)
		}
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "HANDOFF\tFROM\tTO\tSTATE")
		if len(st.Handoffs) == 0 {
			fmt.Fprintln(tw, "none")
		}
		for _, h := range st.Handoffs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", h.Partition, orNone(h.From), h.To, h.State)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write status: %w", err)
		}
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if st.Assignment != nil {
		fmt.Fprintln(tw, "PARTITION\tCOMMITTED\tHIGH WATERMARK\tLAG\tOWNER")
	} else {
		fmt.Fprintln(tw, "PARTITION\tCOMMITTED\tHIGH WATERMARK\tLAG")
	}
	for _, p := range st.Partitions {
		if st.Assignment != nil {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\n", p.Partition, optInt(p.Committed), p.HighWatermark, optInt(p.Lag), orNone(p.Owner))
			continue
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\n", p.Partition, optInt(p.Committed), p.HighWatermark, optInt(p.Lag))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write status: %w", err)
	}
	return nil
}

// pauseText says whether the cluster's deliveries are paused, who asked
// and when (relative to now).
func pauseText(p *status.Pause, now time.Time) string {
	word := "flowing, resumed"
	if p.Paused {
		word = "paused"
	}
	return fmt.Sprintf("%s by %s %s ago (asked of %s, version %d)", word, p.By, max(now.Sub(p.At).Round(time.Second), 0), p.Node, p.Version)
}

// readyText is a member's readiness as its heartbeat says: yes, no and
// why, or unknown (its heartbeats do not say).
func readyText(m status.Member) string {
	switch {
	case m.Ready == nil:
		return "unknown"
	case *m.Ready:
		return "yes"
	}
	return "no: " + m.Reason
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func optInt(v *int64) string {
	if v == nil {
		return "none"
	}
	return strconv.FormatInt(*v, 10)
}
