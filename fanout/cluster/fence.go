package cluster

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/nanoservice/core-fanout/fanout/zkstore"
)

// errVoid: a won epoch cannot be recorded in ZooKeeper because an equal or
// higher epoch is recorded already (or another node wrote first).
var errVoid = errors.New("cluster: won epoch is void: zookeeper holds an equal or higher epoch")

// fencer records won epochs in the fence znode. The Elector calls it off
// its loop goroutine, one call at a time.
type fencer interface {
	// fence records epoch as led by node (client address addr) with a
	// compare-and-set and returns the znode's new version. When the
	// znode holds an epoch >= epoch, or the CAS loses a race, it returns
	// an error wrapping errVoid and the stored epoch (0 if unknown).
	fence(epoch uint64, node, addr string) (version int32, stored uint64, err error)
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

// fence implements fencer.
func (f *zkFencer) fence(epoch uint64, node, addr string) (int32, uint64, error) {
	data, stat, err := f.conn.Get(f.path)
	if errors.Is(err, zk.ErrNoNode) {
		if err := f.create(); err != nil {
			return 0, 0, err
		}
		data, stat, err = f.conn.Get(f.path)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("cluster: read fence %s: %w", f.path, err)
	}
	var rec fenceRecord
	if len(data) > 0 {
		if err := json.Unmarshal(data, &rec); err != nil {
			return 0, 0, fmt.Errorf("cluster: fence %s holds %q: %w", f.path, data, err)
		}
	}
	if rec.Epoch >= epoch {
		return 0, rec.Epoch, fmt.Errorf("fence %s holds epoch %d (node %q), not below %d: %w",
			f.path, rec.Epoch, rec.Node, epoch, errVoid)
	}
	data, err = json.Marshal(fenceRecord{Epoch: epoch, Node: node, Addr: addr})
	if err != nil {
		return 0, 0, fmt.Errorf("cluster: encode fence: %w", err)
	}
	stat, err = f.conn.Set(f.path, data, stat.Version)
	if errors.Is(err, zk.ErrBadVersion) {
		return 0, rec.Epoch, fmt.Errorf("fence %s changed under epoch %d: %w", f.path, epoch, errVoid)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("cluster: write fence %s: %w", f.path, err)
	}
	return stat.Version, epoch, nil
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
