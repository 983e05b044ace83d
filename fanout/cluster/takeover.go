package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
)

// ToolNode is the node id an operator tool (fanout offsets reset) records
// when it takes the leader record over to write offsets under its own
// fence. No daemon may have it (Options.Validate refuses it), so no member
// ever takes the record for a live leader's: the next election begins at
// once.
const ToolNode = "fanout-offsets-tool"

// ErrRecordChanged: the leader record is no longer the one the tool read
// (and showed its user): a leader was elected, or left, meanwhile.
var ErrRecordChanged = errors.New("cluster: the leader record changed since it was read")

// TakeZooKeeper returns the take of the leader record of fanout instance id
// on topic (below chroot) by an operator tool, for the multi that writes the
// offsets (zkstore.Store.CommitTaking): the compare-and-set a winning claim
// makes, at the version read now, recording the epoch after the recorded
// one, led by ToolNode, with no address. Written, it ends the term of the
// leader that held the record (its commits check the version; its elector
// sees the record change), and the members elect the next leader at once
// (ToolNode is no live member). seen is the epoch the tool read before (0
// for none): a record with another epoch fails with ErrRecordChanged. A
// missing record is created at epoch 0 with acl, as a winner would.
func TakeZooKeeper(conn *zk.Conn, chroot, id, topic string, acl zkstore.ACL, seen uint64) (zkstore.Take, uint64, error) {
	f := &zkFencer{conn: conn, path: chroot + FencePath(id, topic), acl: acl}
	data, stat, err := conn.Get(f.path)
	if errors.Is(err, zk.ErrNoNode) {
		if err := f.create(); err != nil {
			return zkstore.Take{}, 0, err
		}
		data, stat, err = conn.Get(f.path)
	}
	if err != nil {
		return zkstore.Take{}, 0, fmt.Errorf("cluster: read fence %s: %w", f.path, err)
	}
	rec, err := decode(f.path, data, stat.Version)
	if err != nil {
		return zkstore.Take{}, 0, fmt.Errorf("%w: fix or delete the znode first", err)
	}
	if rec.Epoch != seen {
		return zkstore.Take{}, 0, fmt.Errorf("fence %s holds epoch %d (node %q), read as %d: %w", f.path, rec.Epoch, rec.Node, seen, ErrRecordChanged)
	}
	if rec.Epoch == math.MaxUint64 {
		return zkstore.Take{}, 0, fmt.Errorf("cluster: fence %s holds the largest epoch: nobody can take it", f.path)
	}
	epoch := rec.Epoch + 1
	data, err = json.Marshal(fenceRecord{Epoch: epoch, Node: ToolNode})
	if err != nil {
		return zkstore.Take{}, 0, fmt.Errorf("cluster: encode fence: %w", err)
	}
	return zkstore.Take{Path: f.path, Version: stat.Version, Data: data}, epoch, nil
}

// TakeKafka makes an operator tool the leader of the group of store, as a
// winning claim would: it joins with the shared static instance id at the
// epoch after the recorded one (the member's, or in an empty group the
// highest its commits name), led by ToolNode with no address. The join
// replaces the live leader's membership, whose commits and heartbeats are
// refused from then on, so its term ends. The tool commits under the
// returned membership, then leaves the group: the members elect the next
// leader (ToolNode is no live member; an empty group is a vacancy). seen is
// the epoch of the member the tool read before (0 for none): another one
// fails with ErrRecordChanged.
func TakeKafka(ctx context.Context, store *kafkastore.Store, seen uint64) (kafkastore.Member, error) {
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	f := newKafkaFencer(store, logrus.NewEntry(quiet))
	rec, err := f.describe(ctx)
	if err != nil {
		return kafkastore.Member{}, err
	}
	var held uint64 // the member's epoch; none in an empty group
	if !rec.Missing {
		held = rec.Epoch
	}
	if held != seen {
		return kafkastore.Member{}, fmt.Errorf("group %s: its member holds epoch %d (node %q), read as %d: %w",
			store.Group(), held, rec.Node, seen, ErrRecordChanged)
	}
	if rec.Epoch == math.MaxUint64 {
		return kafkastore.Member{}, fmt.Errorf("cluster: group %s names the largest epoch: nobody can take it", store.Group())
	}
	if _, _, _, err := f.fence(ctx, rec.Epoch+1, ToolNode, ""); err != nil {
		return kafkastore.Member{}, err
	}
	return *f.member, nil
}
