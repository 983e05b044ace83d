package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/nanoservice/core-fanout/fanout/zkstore"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// errVoid: a won epoch cannot be recorded in ZooKeeper because an equal or
// higher epoch is recorded already (or another node wrote first).
var errVoid = errors.New("cluster: won epoch is void: zookeeper holds an equal or higher epoch")

// fencer is the elector's access to the fence znode. Only the fence
// watcher (watchFence) calls it, one call at a time, so what it reports
// reaches the loop in the order it happened.
type fencer interface {
	// read returns the fence record (Missing when there is no znode) and a
	// channel that receives an event once it may have changed or the watch
	// is lost. A znode whose data is not a record is a Corrupt record,
	// returned with the decoding error.
	read() (record, <-chan zk.Event, error)
	// fence records epoch as led by node (client address addr) with a
	// compare-and-set and returns the record written. When the znode holds
	// an epoch >= epoch, or the CAS loses a race, it returns an error
	// wrapping errVoid and the stored epoch (0 if unknown).
	fence(epoch uint64, node, addr string) (rec record, stored uint64, err error)
	// session identifies the current ZooKeeper session; 0 when there is
	// none. A term ends when it changes.
	session() int64
	// connected reports whether ZooKeeper answers now: a node that could
	// not record a won epoch does not claim one.
	connected() bool
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
func (f *zkFencer) read() (record, <-chan zk.Event, error) {
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

// fence implements fencer.
func (f *zkFencer) fence(epoch uint64, node, addr string) (record, uint64, error) {
	data, stat, err := f.conn.Get(f.path)
	if errors.Is(err, zk.ErrNoNode) {
		if err := f.create(); err != nil {
			return record{}, 0, err
		}
		data, stat, err = f.conn.Get(f.path)
	}
	if err != nil {
		return record{}, 0, fmt.Errorf("cluster: read fence %s: %w", f.path, err)
	}
	rec, err := decode(f.path, data, stat.Version)
	if err != nil {
		return record{}, 0, err
	}
	if rec.Epoch >= epoch {
		return record{}, rec.Epoch, fmt.Errorf("fence %s holds epoch %d (node %q), not below %d: %w",
			f.path, rec.Epoch, rec.Node, epoch, errVoid)
	}
	data, err = json.Marshal(fenceRecord{Epoch: epoch, Node: node, Addr: addr})
	if err != nil {
		return record{}, 0, fmt.Errorf("cluster: encode fence: %w", err)
	}
	stat, err = f.conn.Set(f.path, data, stat.Version)
	if errors.Is(err, zk.ErrBadVersion) {
		return record{}, rec.Epoch, fmt.Errorf("fence %s changed under epoch %d: %w", f.path, epoch, errVoid)
	}
	if err != nil {
		return record{}, 0, fmt.Errorf("cluster: write fence %s: %w", f.path, err)
	}
	return record{Epoch: epoch, Node: node, Addr: addr, Version: stat.Version}, epoch, nil
}

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
	rec     record // the record written
	stored  uint64
	session int64 // the ZooKeeper session before the CAS
	err     error
}

// watchFence does all of the elector's ZooKeeper I/O, one call at a time,
// until ctx ends: it reads the fence record and watches it, re-reading after
// every change and retrying failed reads with backoff, and it runs the
// compare-and-set of each epoch sent on cas. Each read and outcome goes to
// out in order, so the loop never takes an older record for a newer one.
func watchFence(ctx context.Context, f fencer, node, addr string, cas <-chan uint64, out chan<- fenceReport) {
	send := func(r fenceReport) bool {
		select {
		case out <- r:
			return true
		case <-ctx.Done():
			return false
		}
	}
	b := backoff.Backoff{Min: 250 * time.Millisecond, Max: maxBackoff, Jitter: true}
	for {
		rec, changed, err := f.read()
		if !send(fenceReport{rec: rec, err: err}) {
			return
		}
		retry := time.NewTimer(time.Hour)
		retry.Stop()
		if err != nil && changed == nil {
			retry.Reset(b.Next())
		} else {
			b.Reset()
		}
		select {
		case <-ctx.Done():
			retry.Stop()
			return
		case <-changed:
		case <-retry.C:
		case epoch := <-cas:
			o := fenceOutcome{epoch: epoch, session: f.session()}
			o.rec, o.stored, o.err = f.fence(epoch, node, addr)
			if !send(fenceReport{cas: &o}) {
				retry.Stop()
				return
			}
		}
		retry.Stop()
	}
}
