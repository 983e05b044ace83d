package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/fanout/zkstore"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// errVoid: a won epoch cannot be recorded by the authority because an
// equal or higher epoch is recorded already (or another node wrote first).
var errVoid = errors.New("cluster: won epoch is void: the authority holds an equal or higher epoch")

// fencer is the elector's access to the authority that records the leader:
// the fence znode in ZooKeeper (zkFencer), or the group's member in Kafka
// (kafkaFencer). Only the fence watcher (watchFence) calls it, one call at a
// time, so what it reports reaches the loop in the order it happened.
type fencer interface {
	// read returns the fence record (Missing when nobody is recorded) and a
	// channel that receives an event once it may have changed or the watch
	// is lost; a nil channel means the record cannot be watched and is read
	// again after the poll interval. A record that cannot be decoded is a
	// Corrupt record, returned with the decoding error.
	read(ctx context.Context) (record, <-chan zk.Event, error)
	// fence records epoch as led by node (client address addr), if the
	// authority holds a lower epoch, and returns the record written and the
	// fence of the term's commits. When the authority holds an epoch >=
	// epoch, or another node won meanwhile, it returns an error wrapping
	// errVoid and the stored epoch (0 if unknown).
	fence(ctx context.Context, epoch uint64, node, addr string) (rec record, f offsets.Fence, stored uint64, err error)
	// release gives up what the term that wrote rec holds at the authority,
	// if anything: its term ended.
	release(ctx context.Context, rec record)
	// session identifies the current session with the authority; 0 when
	// there is none. A term ends when it changes.
	session() int64
	// connected reports whether the authority answers now: a node that
	// could not record a won epoch does not claim one.
	connected() bool
	// name names the authority in logs: "zookeeper", "kafka group ...".
	name() string
}

// Fencer is a fencer an Elector can be given (Config.Fencer): one of the
// authorities of an offset store, which says which store it is in the
// heartbeats.
type Fencer interface {
	fencer
	// offsetStore is the offset store whose authority this is.
	offsetStore() OffsetStore
	// repair says how an operator fixes an unreadable record.
	repair() string
}

// ZooKeeperFencer returns the authority of the ZooKeeper offset store of
// fanout instance id on topic: the fence znode below chroot (created, with
// its parents, with acl), on conn, which the caller owns.
func ZooKeeperFencer(conn *zk.Conn, chroot, id, topic string, acl zkstore.ACL) Fencer {
	return &zkFencer{conn: conn, path: chroot + FencePath(id, topic), acl: acl}
}

// KafkaFencer returns the authority of the Kafka offset store: the
// membership of its group (see kafkaFencer); the caller owns the store's
// client.
func KafkaFencer(store *kafkastore.Store, log *logrus.Entry) Fencer {
	return newKafkaFencer(store, log)
}

// FencePath is the fence znode of fanout instance id on topic, below the
// chroot: /fanout/<id>/<topic>/leader.
func FencePath(id, topic string) string { return "/fanout/" + id + "/" + topic + "/leader" }

// fenceRecord is the JSON data of the fence znode.
type fenceRecord struct {
	Epoch uint64 `json:"epoch"`
	Node  string `json:"node,omitempty"`
	Addr  string `json:"addr,omitempty"`
}

// releaseTimeout bounds a release run as the watcher stops.
const releaseTimeout = 3 * time.Second

// zkFencer is the fencer of a ZooKeeper connection.
type zkFencer struct {
	conn *zk.Conn
	path string      // absolute: chroot + FencePath
	acl  zkstore.ACL // of the znodes create makes
}

// decode parses the fence znode's data.
func decode(p string, data []byte, version int32) (record, error) {
	var fr fenceRecord
	if len(data) > 0 {
		if err := json.Unmarshal(data, &fr); err != nil {
			return record{}, fmt.Errorf("cluster: fence %s holds %q: %w", p, data, err)
		}
	}
	return record{Epoch: fr.Epoch, Node: fr.Node, Addr: fr.Addr, Version: version}, nil
}

// read implements fencer: GetW, or ExistsW when the znode is missing.
func (f *zkFencer) read(context.Context) (record, <-chan zk.Event, error) {
	for {
		data, stat, changed, err := f.conn.GetW(f.path)
		if errors.Is(err, zk.ErrNoNode) {
			var exists bool
			exists, _, changed, err = f.conn.ExistsW(f.path)
			if err == nil && exists {
				continue // created meanwhile
			}
			if err != nil {
				return record{}, nil, fmt.Errorf("cluster: watch fence %s: %w", f.path, err)
			}
			return record{Missing: true}, changed, nil
		}
		if err != nil {
			return record{}, nil, fmt.Errorf("cluster: read fence %s: %w", f.path, err)
		}
		rec, err := decode(f.path, data, stat.Version)
		if err != nil {
			return record{Version: stat.Version, Corrupt: true}, changed, err
		}
		return rec, changed, nil
	}
}

// fence implements fencer: a compare-and-set of the znode; the term's
// commits check the version it wrote.
func (f *zkFencer) fence(_ context.Context, epoch uint64, node, addr string) (record, offsets.Fence, uint64, error) {
	data, stat, err := f.conn.Get(f.path)
	if errors.Is(err, zk.ErrNoNode) {
		if err := f.create(); err != nil {
			return record{}, offsets.Fence{}, 0, err
		}
		data, stat, err = f.conn.Get(f.path)
	}
	if err != nil {
		return record{}, offsets.Fence{}, 0, fmt.Errorf("cluster: read fence %s: %w", f.path, err)
	}
	rec, err := decode(f.path, data, stat.Version)
	if err != nil {
		return record{}, offsets.Fence{}, 0, err
	}
	if rec.Epoch >= epoch {
		return record{}, offsets.Fence{}, rec.Epoch, fmt.Errorf("fence %s holds epoch %d (node %q), not below %d: %w",
			f.path, rec.Epoch, rec.Node, epoch, errVoid)
	}
	data, err = json.Marshal(fenceRecord{Epoch: epoch, Node: node, Addr: addr})
	if err != nil {
		return record{}, offsets.Fence{}, 0, fmt.Errorf("cluster: encode fence: %w", err)
	}
	stat, err = f.conn.Set(f.path, data, stat.Version)
	if errors.Is(err, zk.ErrBadVersion) {
		return record{}, offsets.Fence{}, rec.Epoch, fmt.Errorf("fence %s changed under epoch %d: %w", f.path, epoch, errVoid)
	}
	if err != nil {
		return record{}, offsets.Fence{}, 0, fmt.Errorf("cluster: write fence %s: %w", f.path, err)
	}
	written := record{Epoch: epoch, Node: node, Addr: addr, Version: stat.Version}
	return written, offsets.TopicFence(zkstore.Version{Path: f.path, Version: stat.Version}), epoch, nil
}

// release implements fencer: a term holds nothing in ZooKeeper but the
// record, which stays until the next term's compare-and-set.
func (f *zkFencer) release(context.Context, record) {}

// name implements fencer.
func (f *zkFencer) name() string { return "zookeeper" }

// offsetStore implements Fencer.
func (f *zkFencer) offsetStore() OffsetStore { return OffsetStore_OFFSET_STORE_ZOOKEEPER }

// repair implements Fencer.
func (f *zkFencer) repair() string { return "delete the znode to reset it" }

// create creates the fence znode (epoch 0) and its ancestors, tolerating
// that any exists.
func (f *zkFencer) create() error {
	for i := 1; i <= len(f.path); i++ {
		if i < len(f.path) && f.path[i] != '/' {
			continue
		}
		var data []byte
		if i == len(f.path) {
			data = []byte(`{"epoch":0}`)
		}
		_, err := f.conn.Create(f.path[:i], data, 0, f.acl.For(f.path[:i]))
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("cluster: create %s: %w", f.path[:i], err)
		}
	}
	return nil
}

// connected implements fencer.
func (f *zkFencer) connected() bool { return f.conn.State() == zk.StateHasSession }

// session implements fencer.
func (f *zkFencer) session() int64 {
	if f.conn.State() == zk.StateExpired {
		return 0
	}
	return f.conn.SessionID()
}

// IdleFence returns the fence of a commit to the ZooKeeper offsets of
// fanout instance id on topic made while no daemon runs (fanout offsets
// copy): the fence znode (below chroot) at its current version, created with
// epoch 0 and acl when missing. The next leader's compare-and-set changes the
// version, so such a commit is refused once a leader began.
func IdleFence(conn *zk.Conn, chroot, id, topic string, acl zkstore.ACL) (offsets.Fence, error) {
	f := &zkFencer{conn: conn, path: chroot + FencePath(id, topic), acl: acl}
	_, stat, err := conn.Get(f.path)
	if errors.Is(err, zk.ErrNoNode) {
		if err := f.create(); err != nil {
			return offsets.Fence{}, err
		}
		_, stat, err = conn.Get(f.path)
	}
	if err != nil {
		return offsets.Fence{}, fmt.Errorf("cluster: read fence %s: %w", f.path, err)
	}
	return offsets.TopicFence(zkstore.Version{Path: f.path, Version: stat.Version}), nil
}

// fenceReport is what the fence watcher tells the loop: the record as read
// now (or why it could not be read), or the outcome of a compare-and-set.
type fenceReport struct {
	rec record
	err error         // reading failed; rec is not set
	cas *fenceOutcome // the outcome of a compare-and-set, instead of a read
}

// fenceOutcome is the result of one fence CAS.
type fenceOutcome struct {
	epoch   uint64
	rec     record        // the record written
	fence   offsets.Fence // the fence of the term's commits
	stored  uint64
	session int64 // the session before the CAS
	err     error
}

// fenceReq is what the loop asks the fence watcher: the compare-and-set of
// epoch, or (release set) to give up what the ended term that wrote rec
// holds.
type fenceReq struct {
	epoch   uint64
	release bool
	rec     record
}

// watchFence does all of the elector's I/O with the authority, one call at
// a time, until ctx ends: it reads the fence record and watches it (or, when
// it cannot be watched, reads it again every poll), re-reading after every
// change and retrying failed reads with backoff, and it runs each request
// sent on reqs: a compare-and-set, or a release. Each read and outcome goes
// to out in order, so the loop never takes an older record for a newer
// one. Releases still queued when ctx ends are run before it returns.
func watchFence(ctx context.Context, f fencer, node, addr string, poll time.Duration, reqs <-chan fenceReq, out chan<- fenceReport) {
	send := func(r fenceReport) bool {
		select {
		case out <- r:
			return true
		case <-ctx.Done():
			return false
		}
	}
	defer releaseQueued(f, reqs)
	b := backoff.Backoff{Min: 250 * time.Millisecond, Max: maxBackoff, Jitter: true}
	for {
		rec, changed, err := f.read(ctx)
		if !send(fenceReport{rec: rec, err: err}) {
			return
		}
		retry := time.NewTimer(time.Hour)
		retry.Stop()
		switch {
		case err != nil && changed == nil:
			retry.Reset(b.Next())
		case changed == nil:
			b.Reset()
			retry.Reset(poll)
		default:
			b.Reset()
		}
		select {
		case <-ctx.Done():
			retry.Stop()
			return
		case <-changed:
		case <-retry.C:
		case r := <-reqs:
			if r.release {
				// Not cut short when ctx ends: a release is the last
				// word of a term that stops.
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
				f.release(rctx, r.rec)
				cancel()
				break
			}
			o := fenceOutcome{epoch: r.epoch, session: f.session()}
			o.rec, o.fence, o.stored, o.err = f.fence(ctx, r.epoch, node, addr)
			if !send(fenceReport{cas: &o}) {
				retry.Stop()
				return
			}
		}
		retry.Stop()
	}
}

// releaseQueued runs the releases still queued on reqs when the watcher
// stops (a leader that resigned and stops), each with a short deadline.
func releaseQueued(f fencer, reqs <-chan fenceReq) {
	for {
		select {
		case r := <-reqs:
			if r.release {
				ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
				f.release(ctx, r.rec)
				cancel()
			}
		default:
			return
		}
	}
}
