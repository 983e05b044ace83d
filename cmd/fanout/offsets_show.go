package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/IBM/sarama"
	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/fanout/metrics"
	"github.com/nanoservice/core-fanout/fanout/status"
)

func offsetsShowCommand() *cli.Command {
	return &cli.Command{
		Name:      "show",
		Usage:     "show a cluster's committed offsets, the log start and end and the lag of each partition",
		UsageText: "fanout offsets show --id SERVICE_ID --topic TOPIC [--kafka host:port] [--zookeeper host:port | --offset-store kafka] [--json]",
		Description: "Reads the committed offsets and the leader record from the offset store the members'\n" +
			"heartbeats name (ZooKeeper, or the consumer group fanout_<id> in Kafka; when no member is heard,\n" +
			"--offset-store, else ZooKeeper), and each partition's log start (the oldest offset) and log end (the\n" +
			"high watermark) from Kafka. The lag is the log end minus the committed offset. It writes nothing,\n" +
			"and works while the cluster runs. Refuses (exit 2) an --offset-store other than the members'.",
		Flags: append([]cli.Flag{
			offsetStoreFlag(),
			&cli.BoolFlag{Name: "json", Usage: "print one JSON document"},
		}, offsetsClusterFlags()...),
		Action:       offsetsShowAction,
		OnUsageError: commandUsageError,
	}
}

// offsetsReport is what fanout offsets show prints.
type offsetsReport struct {
	ID         string             `json:"id"`
	Topic      string             `json:"topic"`
	Store      string             `json:"store"`      // zookeeper or kafka
	StoreFrom  string             `json:"store_from"` // how the store was chosen
	Location   string             `json:"location"`   // the offsets znode, or the group
	Leader     *status.Leader     `json:"leader"`     // nil: no leader recorded
	Partitions []partitionOffsets `json:"partitions"`
	TotalLag   int64              `json:"total_lag"` // over the partitions with a committed offset
}

// partitionOffsets is one partition of an offsetsReport; Committed and Lag
// are nil when the store holds no offset for it.
type partitionOffsets struct {
	Partition int32  `json:"partition"`
	Committed *int64 `json:"committed"`
	LogStart  int64  `json:"log_start"`
	LogEnd    int64  `json:"log_end"`
	Lag       *int64 `json:"lag"`
}

func offsetsShowAction(c *cli.Context) error {
	ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
	defer cancel()
	t, from, err := storeTarget(ctx, c, offsetsWindow)
	if err != nil {
		return err
	}
	defer t.close()
	r, err := readOffsetsReport(ctx, t)
	if err != nil {
		return err
	}
	r.StoreFrom = from
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("write offsets: %w", err)
		}
		return nil
	}
	return writeOffsetsReport(c.App.Writer, r, t.auth.Where())
}

// readOffsetsReport reads what fanout offsets show prints.
func readOffsetsReport(ctx context.Context, t *offsetsTarget) (*offsetsReport, error) {
	leader, committed, err := t.read(ctx)
	if err != nil {
		return nil, err
	}
	parts, err := t.partitions()
	if err != nil {
		return nil, err
	}
	logs, err := readLogs(t.client, t.opts.Topic, parts, committed)
	if err != nil {
		return nil, err
	}
	r := &offsetsReport{ID: t.opts.ID, Topic: t.opts.Topic, Store: t.auth.Kind().Name, Location: t.auth.Location(), Leader: leader}
	for _, p := range parts {
		st := logs[p]
		po := partitionOffsets{Partition: p, Committed: st.Committed, LogStart: st.Start, LogEnd: st.End}
		if st.Committed != nil {
			lag := metrics.Lag(st.End, *st.Committed)
			po.Lag = &lag
			r.TotalLag += lag
		}
		r.Partitions = append(r.Partitions, po)
	}
	return r, nil
}

// readLogs returns, per partition of parts, its committed offset (from
// committed) and its log start and end.
func readLogs(client sarama.Client, topic string, parts []int32, committed map[int32]int64) (map[int32]partitionState, error) {
	out := make(map[int32]partitionState, len(parts))
	for _, p := range parts {
		st := partitionState{Partition: p, Committed: optional(committed, p), AtTime: -1}
		var err error
		if st.Start, err = client.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
			return nil, fmt.Errorf("log start of %s/%d: %w", topic, p, err)
		}
		if st.End, err = client.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
			return nil, fmt.Errorf("log end of %s/%d: %w", topic, p, err)
		}
		out[p] = st
	}
	return out, nil
}

// writeOffsetsReport prints r, read from the store at where, as aligned
// tables.
func writeOffsetsReport(w io.Writer, r *offsetsReport, where string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	chosen := ""
	if r.StoreFrom != "" {
		chosen = ", chosen by " + r.StoreFrom
	}
	fmt.Fprintf(tw, "store\t%s (id %s, topic %s)%s\n", where, r.ID, r.Topic, chosen)
	if r.Leader != nil {
		fmt.Fprintf(tw, "leader\t%s (epoch %d, %s)\n", r.Leader.Node, r.Leader.Epoch, orNone(r.Leader.Addr))
	} else {
		fmt.Fprintf(tw, "leader\tnone\n")
	}
	fmt.Fprintf(tw, "lag\t%d\n", r.TotalLag)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write offsets: %w", err)
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tCOMMITTED\tLOG START\tLOG END\tLAG")
	for _, p := range r.Partitions {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%s\n", p.Partition, optInt(p.Committed), p.LogStart, p.LogEnd, optInt(p.Lag))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write offsets: %w", err)
	}
	return nil
}
