package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nanoservice/core-fanout/fanout"
	"github.com/nanoservice/core-fanout/fanout/authority"
	"github.com/nanoservice/core-fanout/fanout/cluster"
	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/status"
)

// storeChoice is the offset store a tool reads, and why that one.
type storeChoice struct {
	store   string // an authority.Kind's name
	from    string // how it was chosen, for the user
	guessed bool   // the default: neither given nor said
}

// hint adds to err, an error reaching the store, what to do when the
// store was guessed: the default store out of reach may be a cluster that
// keeps its offsets in another.
func (c storeChoice) hint(err error) error {
	if err == nil || !c.guessed {
		return err
	}
	return fmt.Errorf("%w (%s)", err, otherStores(c.store, "a cluster that keeps its offsets in %[2]s: --offset-store %[1]s"))
}

// otherStores lists, for the stores other than store, format with the
// store's name and title, joined by "; ".
func otherStores(store, format string) string {
	var out []string
	for _, k := range authority.Kinds() {
		if k.Name != store {
			out = append(out, fmt.Sprintf(format, k.Name, k.Title))
		}
	}
	return strings.Join(out, "; ")
}

// chooseStore decides which offset store a tool (status, offsets show,
// offsets reset) works on. given is --offset-store ("" when not given),
// zkGiven whether --zookeeper was; members are the members heard within
// window, each saying its own store (or not: older members); kafkaOffsets
// whether the group fanout_<id> holds offsets of the topic (asked only when
// neither given nor said).
//
//   - Nobody says: given; else refused when the Kafka group holds offsets
//     (the cluster may keep them there, or have moved them); else
//     ZooKeeper, the default (and the tool says so, naming --offset-store
//     kafka).
//   - Every member that says names one store: that one. A different
//     --offset-store, or --zookeeper with the Kafka store, is refused: the
//     tool would read a store the cluster does not use (another ZooKeeper's
//     leader record and offsets, or none) and show it beside live members.
//   - Members name both: given, else refused (the cluster itself is
//     misconfigured; its members log it).
func chooseStore(given string, zkGiven bool, members []status.Member, window time.Duration, kafkaOffsets bool) (storeChoice, error) {
	said := map[string][]string{} // store -> node ids
	for _, m := range members {
		if m.OffsetStore != "" {
			said[m.OffsetStore] = append(said[m.OffsetStore], m.NodeID)
		}
	}
	heard := func(store string) string {
		return fmt.Sprintf("the members heard within %v (%s) keep their offsets in %s", window, strings.Join(said[store], ", "),
			storeWhere(store))
	}
	switch len(said) {
	case 0:
		if given != "" {
			return storeChoice{store: given, from: "--offset-store"}, nil
		}
		if kafkaOffsets {
			return storeChoice{}, fmt.Errorf("no member heard within %v says which offset store the cluster uses, and the "+
				"Kafka group fanout_<id> holds offsets of the topic: run this with --offset-store kafka "+
				"(or --offset-store zookeeper for the offsets in ZooKeeper)", window)
		}
		def := authority.Kinds()[0]
		return storeChoice{def.Name, fmt.Sprintf("the default: no member heard within %v says which store it uses; %s",
			window, otherStores(def.Name, "--offset-store %[1]s for a cluster that keeps its offsets in %[2]s")), true}, nil
	case 1:
		store := slices.Collect(maps.Keys(said))[0]
		switch {
		case given != "" && given != store:
			return storeChoice{}, fmt.Errorf("%s, not %s: run this with --offset-store %s", heard(store), storeWhere(given), store)
		case !usesZooKeeper(store) && zkGiven:
			return storeChoice{}, fmt.Errorf("%s, not ZooKeeper: run this with --offset-store %s and without --zookeeper", heard(store), store)
		case given != "":
			return storeChoice{store: store, from: "--offset-store, as the members' heartbeats say"}, nil
		}
		return storeChoice{store: store, from: "the members' heartbeats"}, nil
	}
	if given != "" {
		return storeChoice{store: given, from: "--offset-store (the members heard use both stores)"}, nil
	}
	var where, flags []string
	for _, k := range authority.Kinds() {
		if len(said[k.Name]) > 0 {
			where = append(where, fmt.Sprintf("%s in %s", strings.Join(said[k.Name], ", "), k.Title))
		}
		flags = append(flags, "--offset-store "+k.Name)
	}
	return storeChoice{}, fmt.Errorf("the members heard within %v keep their offsets in different stores (%s): give every "+
		"member the same --offset-store; to read one store meanwhile, run this with %s", window,
		strings.Join(where, "; "), strings.Join(flags, " or "))
}

// storeWhere names a store for messages: its Where, or the name itself
// when it names no store.
func storeWhere(store string) string {
	if k, err := authority.Lookup(store); err == nil && store != "" {
		return k.Where
	}
	return store
}

// usesZooKeeper reports whether the store named store keeps its records in
// ZooKeeper ("": not known yet, no).
func usesZooKeeper(store string) bool {
	k, err := authority.Lookup(store)
	return err == nil && store != "" && k.ZooKeeper
}

// resolveStore sets opts.OffsetStore for a tool: --offset-store (given,
// "" when not) checked against, or learnt from, the heartbeats of the
// cluster's members within window (see chooseStore); with ZooKeeper and no
// --zookeeper, the default servers. It returns the choice. A choice it
// refuses is a usage error.
func resolveStore(ctx context.Context, c *cli.Context, opts *fanout.Options, given string, window time.Duration) (storeChoice, error) {
	client, err := statusClient(*opts)
	if err != nil {
		return storeChoice{}, err
	}
	defer client.Close()
	log, err := readHeartbeats(ctx, client, cluster.TopicName(opts.ID, opts.Topic), time.Now().Add(-window), []byte(opts.ClusterSecret))
	if err != nil {
		return storeChoice{}, err
	}
	var kafkaOffsets bool
	if given == "" && !slices.ContainsFunc(log.members, func(m status.Member) bool { return m.OffsetStore != "" }) {
		// Nobody says: does the Kafka group hold offsets? A group that
		// cannot be read (no permission) is taken for one that holds none.
		held, err := kafkastore.New(client, opts.ID, opts.Topic, 0).Load(ctx)
		kafkaOffsets = err == nil && len(held) > 0
	}
	choice, err := chooseStore(given, len(c.StringSlice("zookeeper")) > 0, log.members, window, kafkaOffsets)
	if err != nil {
		return storeChoice{}, usageError(err)
	}
	opts.OffsetStore = choice.store
	if usesZooKeeper(opts.OffsetStore) && len(opts.ZooKeeper) == 0 {
		opts.ZooKeeper = splitAll(linkedAddrs(environ(), "ZK", 2181))
		if len(opts.ZooKeeper) == 0 {
			opts.ZooKeeper = []string{"localhost:2181"}
		}
	}
	return choice, nil
}
