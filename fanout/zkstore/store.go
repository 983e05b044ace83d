// Package zkstore keeps committed offsets in ZooKeeper, in the layout of
// Kafka's classic ZooKeeper consumers so that lag tools can read it:
//
//	<chroot>/consumers/fanout_<id>/offsets/<topic>/<partition>
//
// Each partition znode holds the decimal string of the next offset to
// consume, so that existing tools read it. Beside the offsets, in a tree of
// its own so that listing a topic's offsets still yields only partitions,
//
//	<chroot>/consumers/fanout_<id>/progress/<topic>/<partition>
//
// holds the partition's offsets.Progress above that offset (acked ranges,
// failure counts; offsets.Progress.Encode), empty when there is none, and
//
//	<chroot>/consumers/fanout_<id>/delays/<topic>/<partition>
//
// the not-before times of its delayed messages (offsets.Progress.EncodeDelays),
// apart so that a daemon that knows no delays reads the progress as before.
// A commit writes its partitions, offsets, progress and delays, in one multi
// (all or nothing) that first checks the versions of the znodes its fence
// names (Version).
package zkstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/fanout/offsets"
	"github.com/nanoservice/core-fanout/internal/actor"
)

// defaultPort is ZooKeeper's client port, used for servers given without one.
const defaultPort = "2181"

// ParseServers splits a ZooKeeper server list into host:port entries and a
// chroot. Entries may themselves be comma-separated, and the list may end with
// a chroot as in "zk1:2181,zk2:2181/fanout". A host without a port gets 2181.
// The chroot is "" when absent or "/"; otherwise it starts with "/" and has
// no trailing "/".
func ParseServers(servers []string) (hosts []string, chroot string, err error) {
	var entries []string
	for _, s := range servers {
		entries = append(entries, strings.Split(s, ",")...)
	}
	for i, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if slash := strings.IndexByte(e, '/'); slash >= 0 {
			if i != len(entries)-1 {
				return nil, "", fmt.Errorf("zookeeper servers %q: a chroot may only end the list", servers)
			}
			e, chroot = e[:slash], e[slash:]
		}
		if _, _, err := net.SplitHostPort(e); err != nil {
			if strings.Contains(e, ":") && !strings.HasPrefix(e, "[") {
				return nil, "", fmt.Errorf("zookeeper server %q: %w", e, err)
			}
			e = net.JoinHostPort(strings.Trim(e, "[]"), defaultPort)
		}
		hosts = append(hosts, e)
	}
	if len(hosts) == 0 {
		return nil, "", fmt.Errorf("zookeeper servers %q: no host", servers)
	}
	if chroot, err = cleanChroot(chroot); err != nil {
		return nil, "", fmt.Errorf("zookeeper servers %q: %w", servers, err)
	}
	return hosts, chroot, nil
}

// cleanChroot validates a chroot and strips its trailing "/".
func cleanChroot(chroot string) (string, error) {
	if chroot == "" || chroot == "/" {
		return "", nil
	}
	c := strings.TrimSuffix(chroot, "/")
	if !strings.HasPrefix(c, "/") || path.Clean(c) != c {
		return "", fmt.Errorf("chroot %q is not a clean absolute path", chroot)
	}
	return c, nil
}

// zkLogger routes go-zookeeper's logs to logrus at debug level, and keeps
// the last failure to connect (a refused dial, a failed TLS handshake) so
// that Connect can say why it gave up.
type zkLogger struct {
	log  *logrus.Entry
	last *atomic.Pointer[string]
}

func (l zkLogger) Printf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if strings.HasPrefix(format, "failed to connect") || strings.HasPrefix(format, "authentication failed") {
		l.last.Store(&msg)
	}
	l.log.Debug(msg)
}

// Connect opens a ZooKeeper session with the servers (see ParseServers; a
// chroot on the list is ignored here: give it to New) and waits until the
// session is established. If ctx ends first it closes the connection and
// returns an error naming the servers. After success a goroutine logs
// session state changes until the connection is closed. It is
// Security{}.Connect: plain text, no authentication.
func Connect(ctx context.Context, servers []string, sessionTimeout time.Duration, log *logrus.Entry) (*zk.Conn, error) {
	return Security{}.Connect(ctx, servers, sessionTimeout, log)
}

// connect is Connect with a dialer (plain TCP or TLS).
func connect(ctx context.Context, servers []string, sessionTimeout time.Duration, log *logrus.Entry, dial zk.Dialer) (*zk.Conn, error) {
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	hosts, _, err := ParseServers(servers)
	if err != nil {
		return nil, err
	}
	log = log.WithField("zookeeper", strings.Join(hosts, ","))
	var lastFailure atomic.Pointer[string]
	conn, events, err := zk.Connect(hosts, sessionTimeout, zk.WithLogger(zkLogger{log, &lastFailure}), zk.WithDialer(dial))
	if err != nil {
		return nil, fmt.Errorf("zookeeper connect to %s: %w", strings.Join(hosts, ","), err)
	}
	for {
		select {
		case <-ctx.Done():
			conn.Close()
			if last := lastFailure.Load(); last != nil {
				return nil, fmt.Errorf("zookeeper unreachable at %s: %w (last attempt: %s)", strings.Join(hosts, ","), ctx.Err(), *last)
			}
			return nil, fmt.Errorf("zookeeper unreachable at %s: %w", strings.Join(hosts, ","), ctx.Err())
		case ev, ok := <-events:
			if !ok {
				return nil, fmt.Errorf("zookeeper unreachable at %s: connection closed", strings.Join(hosts, ","))
			}
			if ev.State != zk.StateHasSession {
				continue
			}
			log.WithField("session", fmt.Sprintf("%#x", conn.SessionID())).Info("zookeeper session established")
			var detached actor.Group // lives as long as the connection
			detached.Go(log, "zookeeper session events", func() { logEvents(log, events) }, nil)
			return conn, nil
		}
	}
}

// logEvents logs session state changes until events is closed.
func logEvents(log *logrus.Entry, events <-chan zk.Event) {
	for ev := range events {
		if ev.Type != zk.EventSession {
			continue
		}
		switch ev.State {
		case zk.StateHasSession:
			log.Info("zookeeper session established")
		case zk.StateExpired:
			log.Warn("zookeeper session expired, opening a new one")
		case zk.StateDisconnected:
			log.Info("zookeeper disconnected (reconnecting unless closed)")
		default:
			log.WithField("state", ev.State.String()).Debug("zookeeper state")
		}
	}
}

// OffsetsPath is the znode holding the offsets of topic for fanout instance
// id: <chroot>/consumers/fanout_<id>/offsets/<topic>.
func OffsetsPath(chroot, id, topic string) string {
	return chroot + "/consumers/fanout_" + id + "/offsets/" + topic
}

// ProgressPath is the znode holding, per partition, the progress above the
// committed offsets of topic for fanout instance id:
// <chroot>/consumers/fanout_<id>/progress/<topic>.
func ProgressPath(chroot, id, topic string) string {
	return chroot + "/consumers/fanout_" + id + "/progress/" + topic
}

// DelaysPath is the znode holding, per partition, the not-before times of
// the delayed messages above the committed offsets of topic for fanout
// instance id: <chroot>/consumers/fanout_<id>/delays/<topic>.
func DelaysPath(chroot, id, topic string) string {
	return chroot + "/consumers/fanout_" + id + "/delays/" + topic
}

// Version is the Condition of the ZooKeeper store's fences: the znode at
// Path (absolute: chroot included) has version Version. A commit under it
// checks that in its multi; a changed or deleted znode fences the commit.
type Version struct {
	Path    string
	Version int32
}

// String describes the condition: "<path>@<version>".
func (v Version) String() string { return fmt.Sprintf("%s@%d", v.Path, v.Version) }

// Store is an offsets.Store in ZooKeeper. It keeps no fence: each commit is
// given its own. It is safe for concurrent use; commits are serialised.
type Store struct {
	conn    *zk.Conn
	chroot  string
	dir     string // OffsetsPath
	progDir string // ProgressPath
	delDir  string // DelaysPath
	acl     ACL    // of the znodes the Store creates; set before the first Commit

	commitMu    sync.Mutex // serialises Load and Commit; guards the fields below
	parentsMade bool
	known       map[int32]bool // partition znodes known to exist
	// what each partition's progress and delays znodes are known to be; a
	// partition absent is not known yet (learnProgress)
	progress, delays map[int32]progState
}

// New returns the Store of topic for fanout instance id, under chroot (from
// ParseServers; "" for none). The caller owns conn.
func New(conn *zk.Conn, chroot, id, topic string) *Store {
	chroot, _ = cleanChroot(chroot)
	return &Store{conn: conn, chroot: chroot, dir: OffsetsPath(chroot, id, topic), progDir: ProgressPath(chroot, id, topic),
		delDir: DelaysPath(chroot, id, topic), known: map[int32]bool{}, progress: map[int32]progState{}, delays: map[int32]progState{}}
}

// SetACL sets the ACL of the znodes the Store creates (its offsets znode,
// their parents and the partitions' znodes; Security.ACL of the Store's
// chroot); the zero ACL, the default, lets anyone change them. Call it
// before the first Commit.
func (s *Store) SetACL(a ACL) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.acl = a
}

// Path is the znode under which the Store keeps its partitions' offsets.
func (s *Store) Path() string { return s.dir }

// ProgressPath is the znode under which the Store keeps its partitions'
// progress.
func (s *Store) ProgressPath() string { return s.progDir }

// Load implements offsets.Store. A missing offsets znode means no offsets.
func (s *Store) Load(ctx context.Context) (map[int32]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("zkstore: load %s: %w", s.dir, err)
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	children, _, err := s.conn.Children(s.dir)
	if errors.Is(err, zk.ErrNoNode) {
		return map[int32]int64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("zkstore: list %s: %w", s.dir, noAuthHint(err))
	}
	out := make(map[int32]int64, len(children))
	for _, c := range children {
		znode := s.dir + "/" + c
		p, err := strconv.ParseInt(c, 10, 32)
		if err != nil || p < 0 {
			return nil, fmt.Errorf("zkstore: znode %s: name is not a partition number", znode)
		}
		data, _, err := s.conn.Get(znode)
		if errors.Is(err, zk.ErrNoNode) {
			continue // deleted since listed
		}
		if err != nil {
			return nil, fmt.Errorf("zkstore: read %s: %w", znode, noAuthHint(err))
		}
		o, err := parseOffset(data)
		if err != nil {
			return nil, fmt.Errorf("zkstore: znode %s: %w", znode, err)
		}
		out[int32(p)] = o
		s.known[int32(p)] = true
	}
	return out, nil
}

// LoadPartition returns the stored offset of partition p, and false when it
// has none.
func (s *Store) LoadPartition(ctx context.Context, p int32) (int64, bool, error) {
	if err := ctx.Err(); err != nil {
		return 0, false, fmt.Errorf("zkstore: load partition %d of %s: %w", p, s.dir, err)
	}
	znode := s.partitionPath(p)
	data, _, err := s.conn.Get(znode)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("zkstore: read %s: %w", znode, noAuthHint(err))
	}
	o, err := parseOffset(data)
	if err != nil {
		return 0, false, fmt.Errorf("zkstore: znode %s: %w", znode, err)
	}
	s.commitMu.Lock()
	s.known[p] = true
	s.commitMu.Unlock()
	return o, true, nil
}

// LoadPartitionProgress returns the progress stored above partition p's
// offset (the zero Progress, base -1, when there is none). Progress that does
// not decode is reported in an error wrapping offsets.ErrBadProgress.
func (s *Store) LoadPartitionProgress(ctx context.Context, p int32) (offsets.Progress, error) {
	if err := ctx.Err(); err != nil {
		return offsets.Progress{}, fmt.Errorf("zkstore: load progress of partition %d: %w", p, err)
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return s.loadPartitionProgress(p)
}

// loadPartitionProgress reads partition p's progress and delays znodes and
// decodes them; what does not decode is reported in an error wrapping
// offsets.ErrBadProgress beside what does (see offsets.DecodeProgress), and
// is rewritten by the next commit of p (its znode holds some). s.commitMu
// must be held.
func (s *Store) loadPartitionProgress(p int32) (offsets.Progress, error) {
	progress, err := s.readSide(s.progressPath(p), s.progress, p)
	if err != nil {
		return offsets.Progress{}, err
	}
	delays, err := s.readSide(s.delaysPath(p), s.delays, p)
	if err != nil {
		return offsets.Progress{}, err
	}
	pr, err := offsets.DecodeProgress(string(progress), string(delays))
	if err != nil {
		return pr, fmt.Errorf("zkstore: znodes %s, %s: %w", s.progressPath(p), s.delaysPath(p), err)
	}
	return pr, nil
}

// readSide reads znode, partition p's in a tree beside the offsets, and
// records its state in states. A znode that does not exist reads as empty.
// s.commitMu must be held.
func (s *Store) readSide(znode string, states map[int32]progState, p int32) ([]byte, error) {
	data, _, err := s.conn.Get(znode)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		states[p] = progAbsent
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("zkstore: read %s: %w", znode, noAuthHint(err))
	}
	states[p] = stateOf(data)
	return data, nil
}

// parseOffset parses a znode value: a decimal, non-negative offset
// (surrounding white space tolerated).
func parseOffset(data []byte) (int64, error) {
	o, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil || o < 0 {
		return 0, fmt.Errorf("value %q is not an offset", data)
	}
	return o, nil
}

// Commit implements offsets.Store: one multi checks the fence's conditions
// for the given partitions (each a Version), then writes every partition.
// A commit without a fence, or under a fence of another store, is refused
// with offsets.ErrFenced. ctx is checked before the write; a write under way
// is not interrupted (it is atomic either way). The progress recorded above
// the partitions' former offsets is emptied in the same multi.
func (s *Store) Commit(ctx context.Context, fence offsets.Fence, offs map[int32]int64) error {
	return s.commitFenced(ctx, fence, offs, nil, false)
}

// LoadProgress implements offsets.ProgressStore: the progress and delays
// znodes that hold some. What does not decode is left out and reported in
// an error wrapping offsets.ErrBadProgress beside the others.
func (s *Store) LoadProgress(ctx context.Context) (map[int32]offsets.Progress, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("zkstore: load %s: %w", s.progDir, err)
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	var bad []error
	parts := map[int32]bool{}
	for _, dir := range []string{s.progDir, s.delDir} {
		children, _, err := s.conn.Children(dir)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("zkstore: list %s: %w", dir, noAuthHint(err))
		}
		for _, c := range children {
			p, err := strconv.ParseInt(c, 10, 32)
			if err != nil || p < 0 {
				bad = append(bad, fmt.Errorf("zkstore: znode %s/%s: name is not a partition number: %w", dir, c, offsets.ErrBadProgress))
				continue
			}
			parts[int32(p)] = true
		}
	}
	out := make(map[int32]offsets.Progress, len(parts))
	for p := range parts {
		pr, err := s.loadPartitionProgress(p)
		if err != nil && !errors.Is(err, offsets.ErrBadProgress) {
			return nil, err
		}
		if err != nil {
			bad = append(bad, err)
		}
		if !pr.IsZero() {
			out[p] = pr
		}
	}
	return out, errors.Join(bad...)
}

// CommitProgress implements offsets.ProgressStore: Commit that also writes
// each partition's progress (Encode) to its progress znode and its delays
// (EncodeDelays) to its delays znode, in the same multi. An empty text
// writes nothing, or empties a znode that holds some.
//
// A commit larger than one request may carry (maxMultiBytes: hundreds of
// partitions with progress) goes in several multis, in partition order,
// each checking the fence's conditions of its partitions: a partition's
// offset, progress and delays are always written together, and when one
// multi fails, the partitions of those before it are written.
func (s *Store) CommitProgress(ctx context.Context, fence offsets.Fence, offs map[int32]int64, progress map[int32]offsets.Progress) error {
	return s.commitFenced(ctx, fence, offs, progress, true)
}

// commitFenced is Commit (split false: one multi whatever its size) and
// CommitProgress (split true).
func (s *Store) commitFenced(ctx context.Context, fence offsets.Fence, offs map[int32]int64, progress map[int32]offsets.Progress, split bool) error {
	if fence.IsZero() {
		return fmt.Errorf("zkstore: commit to %s without a fence: %w", s.dir, offsets.ErrFenced)
	}
	if len(offs) == 0 {
		return nil
	}
	parts, err := s.partitions(ctx, offs)
	if err != nil {
		return err
	}
	if _, err := versions(fence, parts); err != nil {
		return fmt.Errorf("zkstore: commit to %s: %w", s.dir, err)
	}
	return s.commit(func(chunk []int32) ([]any, func(int) string, error) {
		checks, err := versions(fence, chunk)
		if err != nil {
			return nil, nil, fmt.Errorf("zkstore: commit to %s: %w", s.dir, err)
		}
		return checkOps(checks), func(i int) string { return "fence " + checks[i].String() }, nil
	}, split, parts, offs, progress)
}

// Take is a znode that a commit takes over in its own multi: a
// compare-and-set that writes Data if the znode still has Version. Taking a
// znode whose version fences other writers' commits (the leader record,
// whose version every commit of a term checks) fences them in the same
// atomic write as the offsets: none of them can commit after it, and if
// any of them changed the znode first, nothing is written.
type Take struct {
	Path    string // absolute: chroot included
	Version int32  // the version read; the write requires it
	Data    []byte // written in its place
}

// String describes the take for errors: "<path>@<version>".
func (t Take) String() string { return fmt.Sprintf("%s@%d", t.Path, t.Version) }

// CommitTaking writes offs in one multi that first takes every znode of
// takes (see Take), so that the offsets are written, and every holder of
// those versions fenced, all at once or not at all. When a znode of takes
// is no longer at its version (or gone) it writes nothing and returns an
// error wrapping offsets.ErrFenced; without takes it refuses likewise (a
// commit is always fenced).
func (s *Store) CommitTaking(ctx context.Context, takes []Take, offs map[int32]int64) error {
	if len(takes) == 0 {
		return fmt.Errorf("zkstore: commit to %s takes no znode: %w", s.dir, offsets.ErrFenced)
	}
	if len(offs) == 0 {
		return nil
	}
	parts, err := s.partitions(ctx, offs)
	if err != nil {
		return err
	}
	return s.commit(func([]int32) ([]any, func(int) string, error) {
		return takeOps(takes), func(i int) string { return "take of " + takes[i].String() }, nil
	}, false, parts, offs, nil)
}

// partitions checks ctx and offs and returns the partitions of offs in
// order.
func (s *Store) partitions(ctx context.Context, offs map[int32]int64) ([]int32, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("zkstore: commit to %s: %w", s.dir, err)
	}
	parts := make([]int32, 0, len(offs))
	for p, o := range offs {
		if p < 0 || o < 0 {
			return nil, fmt.Errorf("zkstore: commit to %s: invalid partition %d offset %d", s.dir, p, o)
		}
		parts = append(parts, p)
	}
	slices.Sort(parts)
	return parts, nil
}

// maxMultiBytes bounds the request of one multi of a commit: ZooKeeper
// refuses a request larger than its jute.maxbuffer (1 MB by default), and
// the client one larger than its buffer (1.5 MB), closing the session.
const maxMultiBytes = 512 << 10

// opOverhead is what one op of a multi takes beyond its path and data, at
// most: its header, version or flags, and a Create's ACL.
const opOverhead = 128

// preFunc returns the ops that go first in the multi of the partitions of
// chunk (the fence: version checks, or takes) and describes the one at an
// index.
type preFunc func(chunk []int32) (ops []any, describe func(int) string, err error)

// commit writes the partitions' offsets, progress and delays (empty ones
// empty a znode that holds some) in multis of at most maxMultiBytes, each
// made of the ops of pre for its partitions and their writes; with split
// false, in one multi whatever its size (CommitTaking: takes and offsets
// all at once). A failed op of pre is offsets.ErrFenced, described by the
// describe pre returned.
func (s *Store) commit(pre preFunc, split bool, parts []int32, offs map[int32]int64,
	progress map[int32]offsets.Progress) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if err := s.makeParents(); err != nil {
		return err
	}
	// A partition whose progress znode this Store has not seen may hold
	// progress of an earlier writer: it is emptied with this commit.
	if err := s.learnProgress(parts); err != nil {
		return err
	}
	texts := make(map[int32]progressTexts, len(progress))
	for p, pr := range progress {
		if o, ok := offs[p]; ok && !pr.IsZero() && pr.Base == o {
			texts[p] = progressTexts{progress: pr.Encode(), delays: pr.EncodeDelays()}
		}
	}
	for len(parts) > 0 {
		chunk := parts
		if split {
			chunk = s.chunk(parts, offs, texts)
		}
		if err := s.commitChunk(pre, chunk, offs, texts); err != nil {
			return err
		}
		parts = parts[len(chunk):]
	}
	return nil
}

// chunk returns the longest prefix of parts (at least one) whose writes
// take at most maxMultiBytes, with room for the fence's checks (one per
// partition at most). s.commitMu must be held.
func (s *Store) chunk(parts []int32, offs map[int32]int64, texts map[int32]progressTexts) []int32 {
	size := 0
	for i, p := range parts {
		n := 0
		for _, op := range s.writeOps(p, offsetData(offs[p]), texts[p]) {
			n += len(op.znode) + len(op.data) + opOverhead
		}
		n += len(s.dir) + opOverhead // a condition of a per-partition fence
		if size += n; size > maxMultiBytes && i > 0 {
			return parts[:i]
		}
	}
	return parts
}

// commitChunk runs the multi of the partitions of chunk, retrying once when
// a partition's znode appeared or vanished behind the Store's back.
// s.commitMu must be held.
func (s *Store) commitChunk(pre preFunc, chunk []int32, offs map[int32]int64, texts map[int32]progressTexts) error {
	preOps, describe, err := pre(chunk)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		ops := s.commitOps(preOps, chunk, offs, texts)
		resps, err := s.conn.Multi(ops...)
		if err == nil {
			for _, p := range chunk {
				s.known[p] = true
				written(s.progress, p, texts[p].progress)
				written(s.delays, p, texts[p].delays)
			}
			return nil
		}
		failed, opErr := failedOp(resps, err)
		if failed >= 0 && failed < len(preOps) && (errors.Is(opErr, zk.ErrBadVersion) || errors.Is(opErr, zk.ErrNoNode)) {
			return fmt.Errorf("zkstore: commit to %s: %s: %w: %w", s.dir, describe(failed), offsets.ErrFenced, opErr)
		}
		raced := errors.Is(opErr, zk.ErrNodeExists) || errors.Is(opErr, zk.ErrNoNode)
		if attempt > 0 || !raced {
			return fmt.Errorf("zkstore: commit %d partitions to %s: %w", len(chunk), s.dir, noAuthHint(err))
		}
		// A partition znode appeared (or vanished) behind our back: learn
		// which exist and retry once.
		if err := s.refreshKnown(chunk); err != nil {
			return err
		}
	}
}

// versions returns the conditions of fence for parts, each a Version.
func versions(fence offsets.Fence, parts []int32) ([]Version, error) {
	conds, err := fence.Conditions(parts)
	if err != nil {
		return nil, err
	}
	out := make([]Version, 0, len(conds))
	for _, c := range conds {
		v, ok := c.(Version)
		if !ok {
			return nil, fmt.Errorf("fence condition %v (%T) is not a ZooKeeper znode version: %w", c, c, offsets.ErrFenced)
		}
		out = append(out, v)
	}
	return out, nil
}

// checkOps are the ops of a fence: a version check per condition.
func checkOps(checks []Version) []any {
	ops := make([]any, len(checks))
	for i, c := range checks {
		ops[i] = &zk.CheckVersionRequest{Path: c.Path, Version: c.Version}
	}
	return ops
}

// takeOps are the ops of takes: a compare-and-set per znode.
func takeOps(takes []Take) []any {
	ops := make([]any, len(takes))
	for i, t := range takes {
		ops[i] = &zk.SetDataRequest{Path: t.Path, Data: t.Data, Version: t.Version}
	}
	return ops
}

// progressTexts are the texts a commit writes of a partition's progress:
// offsets.Progress.Encode and EncodeDelays.
type progressTexts struct {
	progress, delays string
}

// written records in states that partition p's znode was written with text.
func written(states map[int32]progState, p int32, text string) {
	switch {
	case text != "":
		states[p] = progFull
	case states[p] == progFull:
		states[p] = progEmpty
	}
}

// commitOps builds the multi: the fence's ops first (pre), then per
// partition in partition order one SetData or Create of its offset and,
// when it has progress or delays (texts) or its progress or delays znode
// may hold some, one of each.
func (s *Store) commitOps(pre []any, parts []int32, offs map[int32]int64, texts map[int32]progressTexts) []any {
	ops := make([]any, 0, len(pre)+3*len(parts))
	ops = append(ops, pre...)
	for _, p := range parts {
		for _, w := range s.writeOps(p, offsetData(offs[p]), texts[p]) {
			if w.exists {
				ops = append(ops, &zk.SetDataRequest{Path: w.znode, Data: w.data, Version: -1})
			} else {
				ops = append(ops, &zk.CreateRequest{Path: w.znode, Data: w.data, Acl: s.acl.For(w.znode)})
			}
		}
	}
	return ops
}

// write is one znode a commit writes: created, or set when it exists.
type write struct {
	znode  string
	data   []byte
	exists bool
}

// writeOps returns the znodes a commit writes for partition p: its offset
// (data) and, when it has progress or delays (texts) or its progress or
// delays znode may hold some, those. s.commitMu must be held.
func (s *Store) writeOps(p int32, data []byte, texts progressTexts) []write {
	out := []write{{s.partitionPath(p), data, s.known[p]}}
	side := func(znode, text string, st progState) {
		if text != "" || st == progFull {
			out = append(out, write{znode, []byte(text), st == progFull || st == progEmpty})
		}
	}
	side(s.progressPath(p), texts.progress, s.progress[p])
	side(s.delaysPath(p), texts.delays, s.delays[p])
	return out
}

// offsetData is what a partition's znode holds: its offset in decimal.
func offsetData(o int64) []byte { return []byte(strconv.FormatInt(o, 10)) }

// failedOp returns the index and error of the op that failed a multi: the
// first op with an error, else the multi's own error at index -1.
func failedOp(resps []zk.MultiResponse, err error) (int, error) {
	for i, r := range resps {
		if r.Error != nil {
			return i, r.Error
		}
	}
	return -1, err
}

// partitionPath is the znode of partition p.
func (s *Store) partitionPath(p int32) string {
	return s.dir + "/" + strconv.FormatInt(int64(p), 10)
}

// progState is what a partition's progress (or delays) znode is known to be.
type progState uint8

const (
	progUnknown progState = iota // not looked at yet
	progAbsent                   // no znode
	progEmpty                    // a znode without progress
	progFull                     // a znode that holds progress
)

// stateOf returns the state of a progress or delays znode holding data.
func stateOf(data []byte) progState {
	if len(data) > 0 {
		return progFull
	}
	return progEmpty
}

// learnProgress finds out, for the partitions whose progress or delays
// znode's state is unknown, whether it exists and holds some. s.commitMu
// must be held.
func (s *Store) learnProgress(parts []int32) error {
	for _, p := range parts {
		if s.progress[p] == progUnknown || s.delays[p] == progUnknown {
			if err := s.lookProgress(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// lookProgress records the state of partition p's progress and delays
// znodes. s.commitMu must be held.
func (s *Store) lookProgress(p int32) error {
	for _, side := range []struct {
		znode  string
		states map[int32]progState
	}{{s.progressPath(p), s.progress}, {s.delaysPath(p), s.delays}} {
		ok, stat, err := s.conn.Exists(side.znode)
		if err != nil {
			return fmt.Errorf("zkstore: exists %s: %w", side.znode, noAuthHint(err))
		}
		switch {
		case !ok:
			side.states[p] = progAbsent
		case stat.DataLength > 0:
			side.states[p] = progFull
		default:
			side.states[p] = progEmpty
		}
	}
	return nil
}

// progressPath is the progress znode of partition p.
func (s *Store) progressPath(p int32) string {
	return s.progDir + "/" + strconv.FormatInt(int64(p), 10)
}

// delaysPath is the delays znode of partition p.
func (s *Store) delaysPath(p int32) string {
	return s.delDir + "/" + strconv.FormatInt(int64(p), 10)
}

// makeParents creates the offsets, progress and delays znodes and their
// ancestors once.
func (s *Store) makeParents() error {
	if s.parentsMade {
		return nil
	}
	for _, dir := range []string{s.dir, s.progDir, s.delDir} {
		for i := 1; i < len(dir); i++ {
			if dir[i] != '/' {
				continue
			}
			if err := s.create(dir[:i]); err != nil {
				return err
			}
		}
		if err := s.create(dir); err != nil {
			return err
		}
	}
	s.parentsMade = true
	return nil
}

// create creates an empty persistent znode, tolerating that it exists.
func (s *Store) create(znode string) error {
	_, err := s.conn.Create(znode, nil, 0, s.acl.For(znode))
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("zkstore: create %s: %w", znode, noAuthHint(err))
	}
	return nil
}

// refreshKnown records which of the partitions' znodes exist, offsets,
// progress and delays.
func (s *Store) refreshKnown(parts []int32) error {
	for _, p := range parts {
		ok, _, err := s.conn.Exists(s.partitionPath(p))
		if err != nil {
			return fmt.Errorf("zkstore: exists %s: %w", s.partitionPath(p), err)
		}
		s.known[p] = ok
		if err := s.lookProgress(p); err != nil {
			return err
		}
	}
	return nil
}

var _ offsets.ProgressStore = (*Store)(nil)
