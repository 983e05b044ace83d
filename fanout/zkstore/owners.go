package zkstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/nanoservice/core-fanout/internal/backoff"
)

// The ownership records of spread mode, below the chroot:
//
//	/fanout/<id>/<topic>/owners/<partition>   PERSISTENT: OwnerRecord (JSON)
//	/fanout/<id>/<topic>/members/<node>       EPHEMERAL: MemberRecord (JSON), one per live member
//
// A partition is owned by the member its record names, while that member's
// znode exists and belongs to the session the record names; it is free when
// released (no owner) or when that session is gone. Reserve and Release are
// compare-and-set writes on the record's version, and the version our
// Reserve left is the fence condition of the partition's commits (Version):
// as a persistent znode's version only grows, a member that lost a partition
// can never commit it again.

// OwnersPath is the znode under which the ownership records of fanout
// instance id on topic live (chroot included).
func OwnersPath(chroot, id, topic string) string {
	return chroot + "/fanout/" + id + "/" + topic + "/owners"
}

// MembersPath is the znode under which the live members of fanout instance
// id on topic keep their ephemeral znodes (chroot included).
func MembersPath(chroot, id, topic string) string {
	return chroot + "/fanout/" + id + "/" + topic + "/members"
}

// OwnerRecord is the data of a partition's ownership znode.
type OwnerRecord struct {
	Owner string `json:"owner"` // the owner's node id; "" when released
	// Session is the owner's ZooKeeper session, in hex ("0x..."): the
	// partition is owned while the owner's member znode belongs to it.
	Session    string `json:"session,omitempty"`
	Generation uint64 `json:"generation"` // the assignment generation of the reserve or release
}

// MemberRecord is the data of a member's ephemeral znode.
type MemberRecord struct {
	Node string `json:"node"`
	Addr string `json:"addr,omitempty"` // its advertised client address
}

// sessionHex formats a ZooKeeper session id as OwnerRecord.Session does.
func sessionHex(id int64) string { return "0x" + strconv.FormatUint(uint64(id), 16) }

// ErrNotOwner is returned (wrapped) by Release when the record no longer
// is the one our reserve wrote: another member took the partition over.
var ErrNotOwner = errors.New("zkstore: the ownership record changed: the partition is no longer ours")

// Owners reserves and releases this member's partitions and keeps its member
// znode. Each method is one caller's: calls of different partitions may run
// concurrently.
type Owners struct {
	conn    *zk.Conn
	dir     string // OwnersPath
	members string // MembersPath
	node    string
	addr    string
	acl     ACL
}

// NewOwners returns the ownership records of fanout instance id on topic
// for member node (advertised at addr), under chroot. Every znode it creates
// takes its ACL from acl. The caller owns conn.
func NewOwners(conn *zk.Conn, chroot, id, topic, node, addr string, acl ACL) *Owners {
	chroot, _ = cleanChroot(chroot)
	return &Owners{conn: conn, dir: OwnersPath(chroot, id, topic), members: MembersPath(chroot, id, topic),
		node: node, addr: addr, acl: acl}
}

// RecordPath is the ownership znode of partition p.
func (o *Owners) RecordPath(p int32) string { return o.dir + "/" + strconv.FormatInt(int64(p), 10) }

// memberPath is the member znode of node.
func (o *Owners) memberPath(node string) string { return o.members + "/" + node }

// Session returns the current ZooKeeper session, or 0 when it expired.
func (o *Owners) Session() int64 {
	if o.conn.State() == zk.StateExpired {
		return 0
	}
	return o.conn.SessionID()
}

// Join creates this member's ephemeral znode in the current session and
// returns the session. A znode left by another session of this node id (a
// previous incarnation whose session has not expired yet, or another live
// process with this node id) is waited for until it is gone or ctx ends: the
// partitions that session owns are not free before that anyway.
func (o *Owners) Join(ctx context.Context, waiting func(session int64)) (int64, error) {
	data, err := json.Marshal(MemberRecord{Node: o.node, Addr: o.addr})
	if err != nil {
		return 0, fmt.Errorf("zkstore: encode member record: %w", err)
	}
	if err := o.makeParents(o.members); err != nil {
		return 0, err
	}
	told := int64(0)
	for {
		sid := o.Session()
		_, err := o.conn.Create(o.memberPath(o.node), data, zk.FlagEphemeral, o.acl.For(o.memberPath(o.node)))
		if err == nil {
			return sid, nil
		}
		if !errors.Is(err, zk.ErrNodeExists) {
			return 0, fmt.Errorf("zkstore: create member znode %s: %w", o.memberPath(o.node), noAuthHint(err))
		}
		exists, stat, gone, err := o.conn.ExistsW(o.memberPath(o.node))
		switch {
		case err != nil:
			return 0, fmt.Errorf("zkstore: watch member znode %s: %w", o.memberPath(o.node), err)
		case !exists:
			continue
		case stat.EphemeralOwner == sid && sid != 0:
			return sid, nil // ours already
		}
		if told != stat.EphemeralOwner && waiting != nil {
			told = stat.EphemeralOwner
			waiting(stat.EphemeralOwner)
		}
		select {
		case <-gone:
		case <-ctx.Done():
			return 0, fmt.Errorf("zkstore: member znode %s held by session %s: %w", o.memberPath(o.node), sessionHex(stat.EphemeralOwner), ctx.Err())
		}
	}
}

// Holder is a member that holds a partition: Reserve waits for it.
type Holder struct {
	Node    string
	Session string
}

// Reserve makes this member the owner of partition p, recording generation
// gen, and returns the fence condition of the partition's commits: the
// record's version as the reserve left it. The record must be free: released,
// or held by a session that is gone (the holder's member znode is missing or
// belongs to another session), or held by this member in the current session
// (a reserve again bumps the version, which fences the commits of the earlier
// hold). While another member holds it, Reserve watches the record and the
// holder's member znode (no polling) and calls waiting once per holder; it
// returns when it reserved, or with ctx's error.
func (o *Owners) Reserve(ctx context.Context, p int32, gen uint64, waiting func(Holder)) (Version, error) {
	path := o.RecordPath(p)
	var told Holder
	b := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: true}
	for {
		if err := ctx.Err(); err != nil {
			return Version{}, fmt.Errorf("zkstore: reserve %s: %w", path, err)
		}
		sid := o.Session()
		if sid == 0 { // expired: a new session comes with the reconnect
			if !backoff.Sleep(ctx, b.Next()) {
				return Version{}, fmt.Errorf("zkstore: reserve %s: no zookeeper session: %w", path, ctx.Err())
			}
			continue
		}
		mine, err := json.Marshal(OwnerRecord{Owner: o.node, Session: sessionHex(sid), Generation: gen})
		if err != nil {
			return Version{}, fmt.Errorf("zkstore: encode ownership record: %w", err)
		}
		data, stat, changed, err := o.conn.GetW(path)
		if errors.Is(err, zk.ErrNoNode) {
			if err := o.makeParents(o.dir); err != nil {
				return Version{}, err
			}
			_, err := o.conn.Create(path, mine, 0, o.acl.For(path))
			if err == nil {
				return Version{Path: path, Version: 0}, nil
			}
			if errors.Is(err, zk.ErrNodeExists) {
				continue // created meanwhile: read it
			}
			return Version{}, fmt.Errorf("zkstore: create %s: %w", path, noAuthHint(err))
		}
		if err != nil {
			if !backoff.Sleep(ctx, b.Next()) {
				return Version{}, fmt.Errorf("zkstore: read %s: %w (then %w)", path, err, ctx.Err())
			}
			continue
		}
		var rec OwnerRecord
		if len(data) > 0 {
			if err := json.Unmarshal(data, &rec); err != nil {
				return Version{}, fmt.Errorf("zkstore: ownership record %s holds %q: %w", path, data, err)
			}
		}
		var gone <-chan zk.Event
		free := rec.Owner == "" || (rec.Owner == o.node && rec.Session == sessionHex(sid))
		if !free {
			var exists bool
			var mstat *zk.Stat
			exists, mstat, gone, err = o.conn.ExistsW(o.memberPath(rec.Owner))
			if err != nil {
				if !backoff.Sleep(ctx, b.Next()) {
					return Version{}, fmt.Errorf("zkstore: member znode of %s: %w (then %w)", rec.Owner, err, ctx.Err())
				}
				continue
			}
			free = !exists || sessionHex(mstat.EphemeralOwner) != rec.Session
		}
		if free {
			stat, err := o.conn.Set(path, mine, stat.Version)
			switch {
			case err == nil:
				return Version{Path: path, Version: stat.Version}, nil
			case errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNoNode):
				continue // changed meanwhile: look again
			default:
				return Version{}, fmt.Errorf("zkstore: write %s: %w", path, noAuthHint(err))
			}
		}
		b.Reset()
		if h := (Holder{Node: rec.Owner, Session: rec.Session}); h != told && waiting != nil {
			told = h
			waiting(h)
		}
		var ev zk.Event
		select {
		case ev = <-changed:
		case ev = <-gone:
		case <-ctx.Done():
		}
		if closing(ev) {
			return Version{}, fmt.Errorf("zkstore: reserve %s: %w", path, ev.Err)
		}
	}
}

// Release gives partition p up: it writes a released record (generation gen)
// if the record is still at v, the version our reserve left. When another
// member took the partition over meanwhile it writes nothing and returns an
// error wrapping ErrNotOwner.
func (o *Owners) Release(p int32, v Version, gen uint64) error {
	data, err := json.Marshal(OwnerRecord{Generation: gen})
	if err != nil {
		return fmt.Errorf("zkstore: encode ownership record: %w", err)
	}
	_, err = o.conn.Set(v.Path, data, v.Version)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNoNode):
		return fmt.Errorf("zkstore: release %v: %w: %w", v, ErrNotOwner, err)
	}
	return fmt.Errorf("zkstore: release %v: %w", v, noAuthHint(err))
}

// Watch returns nil once partition p's record is no longer at v (another
// member took it over, an operator changed or deleted it), or ctx's error.
// It watches the record (GetW); failures to read are retried with backoff.
func (o *Owners) Watch(ctx context.Context, v Version) error {
	b := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: true}
	for {
		_, stat, changed, err := o.conn.GetW(v.Path)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return nil
		case err != nil:
			if !backoff.Sleep(ctx, b.Next()) {
				return fmt.Errorf("zkstore: watch %v: %w", v, ctx.Err())
			}
			continue
		case stat.Version != v.Version:
			return nil
		}
		b.Reset()
		select {
		case ev := <-changed:
			if closing(ev) {
				return fmt.Errorf("zkstore: watch %v: %w", v, ev.Err)
			}
		case <-ctx.Done():
			return fmt.Errorf("zkstore: watch %v: %w", v, ctx.Err())
		}
	}
}

// closing reports whether a watch event says the connection was closed: no
// watch can be set on it any more.
func closing(ev zk.Event) bool {
	return ev.Type == zk.EventNotWatching && errors.Is(ev.Err, zk.ErrClosing)
}

// OwnerState is one partition's ownership record as read, for status.
type OwnerState struct {
	OwnerRecord
	Version int32
	// Live: the record names an owner whose member znode exists in the
	// session the record names.
	Live bool
}

// ReadOwners returns the ownership record of every partition that has one
// and the live members (node id → member record), for status. A missing
// directory means none.
func ReadOwners(conn *zk.Conn, chroot, id, topic string) (map[int32]OwnerState, map[string]MemberRecord, error) {
	members := map[string]MemberRecord{}
	sessions := map[string]string{}
	dir := MembersPath(chroot, id, topic)
	nodes, _, err := conn.Children(dir)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return nil, nil, fmt.Errorf("zkstore: list %s: %w", dir, noAuthHint(err))
	}
	for _, n := range nodes {
		data, stat, err := conn.Get(dir + "/" + n)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("zkstore: read %s/%s: %w", dir, n, noAuthHint(err))
		}
		var m MemberRecord
		_ = json.Unmarshal(data, &m) // an unreadable one still says the node is live
		m.Node = n
		members[n], sessions[n] = m, sessionHex(stat.EphemeralOwner)
	}
	out := map[int32]OwnerState{}
	dir = OwnersPath(chroot, id, topic)
	parts, _, err := conn.Children(dir)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return nil, nil, fmt.Errorf("zkstore: list %s: %w", dir, noAuthHint(err))
	}
	slices.Sort(parts)
	for _, c := range parts {
		p, err := strconv.ParseInt(c, 10, 32)
		if err != nil || p < 0 {
			continue
		}
		data, stat, err := conn.Get(dir + "/" + c)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("zkstore: read %s/%s: %w", dir, c, noAuthHint(err))
		}
		var st OwnerState
		if err := json.Unmarshal(data, &st.OwnerRecord); err != nil {
			return nil, nil, fmt.Errorf("zkstore: ownership record %s/%s holds %q: %w", dir, c, data, err)
		}
		st.Version = stat.Version
		st.Live = st.Owner != "" && sessions[st.Owner] == st.Session
		out[int32(p)] = st
	}
	return out, members, nil
}

// makeParents creates znode and its ancestors, tolerating that they exist.
func (o *Owners) makeParents(znode string) error {
	for i := 1; i <= len(znode); i++ {
		if i < len(znode) && znode[i] != '/' {
			continue
		}
		_, err := o.conn.Create(znode[:i], nil, 0, o.acl.For(znode[:i]))
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("zkstore: create %s: %w", znode[:i], noAuthHint(err))
		}
	}
	return nil
}
