// Package kafkastore keeps fanout's committed offsets in Kafka, as the
// offsets of the consumer group fanout_<id> in the brokers' group
// coordinator, so that Kafka's own tools (kafka-consumer-groups --describe,
// lag exporters) show them, and fences them with the group's membership.
//
// The leader of a fanout cluster is the group's one member: it joins with
// the static group.instance.id InstanceID (KIP-345), which every member of
// the cluster shares, so a new leader's join replaces the old one at once
// with a new member id. Every commit carries the member id, generation and
// instance id of the membership it was made under (a Member, the Condition of
// this store's fences); the coordinator checks them against the group's
// current ones when it takes the commit, and refuses a replaced or expired
// member's commit (FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION),
// which Commit reports as offsets.ErrFenced.
//
// Per partition the group holds the next offset to consume, and a metadata
// string naming the term that committed it: {"epoch":E,"node":"N"}, and,
// when there is some, the partition's progress above the offset
// (offsets.Progress.Encode) as "progress":"v1 b=..." and the not-before
// times of its delayed messages (offsets.Progress.EncodeDelays) as
// "delays":"d1 b=..." (a field of its own, which a daemon that knows no
// delays skips); at most MaxMetadata bytes. Offset and progress are written
// by the same OffsetCommit, as one record per partition: a reader sees both
// or neither.
package kafkastore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/fanout/offsets"
)

const (
	// InstanceID is the static group.instance.id every fanout leader joins
	// its group with. All members of a cluster share it: a join replaces
	// the holder at once, so the group has one member, the leader.
	InstanceID = "fanout-leader"
	// MaxMetadata bounds the metadata string of each committed offset, in
	// bytes (brokers accept offset.metadata.max.bytes, 4096 by default):
	// the term (at most 256 bytes), the progress (at most
	// offsets.MaxProgressBytes) and the delays (offsets.MaxDelayBytes).
	MaxMetadata = 256 + offsets.MaxProgressBytes + offsets.MaxDelayBytes
	// DefaultSessionTimeout is the session timeout of a membership when
	// New is given none. Brokers accept group.min.session.timeout.ms (6 s)
	// to group.max.session.timeout.ms (30 min) by default.
	DefaultSessionTimeout = 10 * time.Second

	// protocolType is the group's protocol type: Kafka's tools describe
	// only groups of consumers.
	protocolType = "consumer"
	// protocolName is the group's one protocol (the "assignor").
	protocolName = "fanout"
	// maxNode bounds the node id written in a commit's metadata.
	maxNode = 128
)

// GroupName is the consumer group of fanout instance id: fanout_<id> (the
// same name as the ZooKeeper layout's /consumers/fanout_<id>).
func GroupName(id string) string { return "fanout_" + id }

// Store is an offsets.Store in the consumer group of a fanout instance, and
// the group's membership protocol (Join, Heartbeat, Leave, Describe) that
// fences its commits. It keeps no fence and no membership: each commit is
// given its fence. It is safe for concurrent use. Requests go to the group's
// coordinator, found through the client; each call makes one attempt
// (bounded by the client's network timeouts) and, when the coordinator has
// moved or is loading, refreshes it and returns an error: callers retry.
type Store struct {
	client  sarama.Client
	group   string
	topic   string
	session time.Duration
}

// New returns the Store of topic for fanout instance id on client, which
// the caller owns. sessionTimeout is the session timeout of the memberships
// Join makes (0: DefaultSessionTimeout).
func New(client sarama.Client, id, topic string, sessionTimeout time.Duration) *Store {
	if sessionTimeout <= 0 {
		sessionTimeout = DefaultSessionTimeout
	}
	return &Store{client: client, group: GroupName(id), topic: topic, session: sessionTimeout}
}

// Group returns the consumer group's name.
func (s *Store) Group() string { return s.group }

// Topic returns the topic whose offsets the Store keeps.
func (s *Store) Topic() string { return s.topic }

// Member is a membership of the group won by Join, and the Condition of the
// fences of the Store: a commit under it carries its generation, member id
// and InstanceID, and the coordinator refuses it once the group has another
// member id for InstanceID (a later Join) or this one's session expired.
// Epoch and Node name the term, for each commit's metadata.
type Member struct {
	Group      string
	Generation int32
	MemberID   string
	Epoch      uint64
	Node       string
	// Instance is the membership's static group.instance.id: InstanceID
	// when empty (a leader's); a spread member's node id.
	Instance string
}

// instance returns m's group.instance.id.
func (m Member) instance() string {
	if m.Instance == "" {
		return InstanceID
	}
	return m.Instance
}

// String describes the membership for logs and errors.
func (m Member) String() string {
	return fmt.Sprintf("group %s generation %d member %s", m.Group, m.Generation, m.MemberID)
}

// Empty is the Condition of a commit made from outside the group (fanout
// offsets copy): the coordinator takes it only while the group has no
// member, so never while a leader holds it. Note is the commit's metadata.
type Empty struct {
	Group string
	Note  string
}

// String describes the condition for logs and errors.
func (e Empty) String() string { return fmt.Sprintf("group %s without members", e.Group) }

// EmptyFence returns the fence of a commit from outside the group.
func (s *Store) EmptyFence(note string) offsets.Fence {
	return offsets.TopicFence(Empty{Group: s.group, Note: note})
}

// Committed is one partition's committed offset and its metadata.
type Committed struct {
	Offset   int64
	Metadata string
}

// CommitInfo is the metadata of a commit: a leader's term's epoch and node
// id (cut to 128 bytes), or a spread member's node id and the group's
// generation it committed in (epoch 0).
type CommitInfo struct {
	Epoch      uint64 `json:"epoch"`
	Node       string `json:"node"`
	Generation int32  `json:"generation,omitempty"`
	// Progress is the partition's progress above the offset
	// (offsets.Progress.Encode); empty when there is none.
	Progress string `json:"progress,omitempty"`
	// Delays are the not-before times of the partition's delayed messages
	// (offsets.Progress.EncodeDelays); empty when there are none.
	Delays string `json:"delays,omitempty"`
}

// commitMetadata returns the metadata string of a commit under cond, with
// the progress and delays given (Encode, EncodeDelays; "" for none), at most
// MaxMetadata bytes.
func commitMetadata(cond offsets.Condition, progress, delays string) string {
	var b []byte
	switch c := cond.(type) {
	case Member:
		b, _ = json.Marshal(CommitInfo{Epoch: c.Epoch, Node: cutNode(c.Node), Progress: progress, Delays: delays})
	case claimed:
		b, _ = json.Marshal(CommitInfo{Node: cutNode(c.Node), Generation: c.Generation, Progress: progress, Delays: delays})
	case Empty:
		b, _ = json.Marshal(struct {
			Note string `json:"note"`
		}{c.Note})
	}
	if len(b) > MaxMetadata {
		return ""
	}
	return string(b)
}

// cutNode cuts a node id to maxNode bytes for a commit's metadata.
func cutNode(node string) string {
	if len(node) > maxNode {
		return strings.ToValidUTF8(node[:maxNode], "")
	}
	return node
}

// ParseCommitInfo parses the metadata of a committed offset; ok is false
// when it is neither a leader's commit nor a spread member's.
func ParseCommitInfo(metadata string) (info CommitInfo, ok bool) {
	if err := json.Unmarshal([]byte(metadata), &info); err != nil || (info.Epoch == 0 && info.Generation == 0) {
		return CommitInfo{}, false
	}
	return info, true
}

// Load implements offsets.Store: the committed offsets of the topic's
// partitions.
func (s *Store) Load(ctx context.Context) (map[int32]int64, error) {
	committed, err := s.Committed(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]int64, len(committed))
	for p, c := range committed {
		out[p] = c.Offset
	}
	return out, nil
}

// Committed returns, per partition of the topic with a committed offset,
// the offset and its metadata.
func (s *Store) Committed(ctx context.Context) (map[int32]Committed, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("kafkastore: load offsets of group %s: %w", s.group, err)
	}
	coord, err := s.coordinator()
	if err != nil {
		return nil, err
	}
	req := sarama.NewOffsetFetchRequest(s.client.Config().Version, s.group, nil) // nil: every topic of the group
	resp, err := coord.FetchOffset(req)
	if err != nil {
		return nil, s.brokerError("load offsets", coord, err)
	}
	switch kerr := resp.GroupError(); kerr {
	case sarama.ErrNoError:
	case sarama.ErrGroupIDNotFound: // some brokers say so of a group that never committed
		return map[int32]Committed{}, nil
	default:
		return nil, s.groupError("load offsets", kerr)
	}
	var blocks map[int32]*sarama.OffsetFetchResponseBlock
	if g := resp.GetGroup(s.group); g != nil {
		blocks = g.Blocks[s.topic]
	} else {
		blocks = resp.Blocks[s.topic]
	}
	out := make(map[int32]Committed, len(blocks))
	for p, b := range blocks {
		if b.Err != sarama.ErrNoError {
			return nil, fmt.Errorf("kafkastore: load offset of %s/%d in group %s: %w", s.topic, p, s.group, b.Err)
		}
		if b.Offset >= 0 {
			out[p] = Committed{Offset: b.Offset, Metadata: b.Metadata}
		}
	}
	return out, nil
}

// LastEpoch returns the highest leader epoch the committed offsets'
// metadata names (0 when none does).
func (s *Store) LastEpoch(ctx context.Context) (uint64, error) {
	committed, err := s.Committed(ctx)
	if err != nil {
		return 0, err
	}
	var epoch uint64
	for _, c := range committed {
		if info, ok := ParseCommitInfo(c.Metadata); ok {
			epoch = max(epoch, info.Epoch)
		}
	}
	return epoch, nil
}

// Commit implements offsets.Store: one OffsetCommit request carries every
// partition and the fence's membership, which the coordinator checks for the
// whole request before it writes the offsets in one batch. A commit without
// a fence, under a fence of another store, or refused by the coordinator for
// its membership (replaced, expired, or the group rebalancing) returns an
// error wrapping offsets.ErrFenced. A partition the broker refuses alone (an
// unknown partition) fails the commit; the others may be stored already,
// which a retry with the same or newer offsets makes good. ctx is checked
// before the request.
func (s *Store) Commit(ctx context.Context, fence offsets.Fence, offs map[int32]int64) error {
	return s.CommitProgress(ctx, fence, offs, nil)
}

// LoadProgress implements offsets.ProgressStore: the progress in the
// metadata of each partition's committed offset, when it was recorded above
// that offset. Progress that does not decode is left out and reported in an
// error wrapping offsets.ErrBadProgress beside the others.
func (s *Store) LoadProgress(ctx context.Context) (map[int32]offsets.Progress, error) {
	committed, err := s.Committed(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]offsets.Progress, len(committed))
	var bad []error
	for p, c := range committed {
		pr, err := progressOf(c)
		if err != nil {
			bad = append(bad, fmt.Errorf("kafkastore: group %s, %s/%d: %w", s.group, s.topic, p, err))
		}
		if pr.Base == c.Offset && !pr.IsZero() {
			out[p] = pr
		}
	}
	return out, errors.Join(bad...)
}

// progressOf decodes the progress and delays in c's metadata (none: the
// zero Progress, base -1); see offsets.DecodeProgress.
func progressOf(c Committed) (offsets.Progress, error) {
	info, ok := ParseCommitInfo(c.Metadata)
	if !ok {
		return offsets.Progress{Base: -1}, nil
	}
	return offsets.DecodeProgress(info.Progress, info.Delays)
}

// CommitProgress implements offsets.ProgressStore: Commit with each
// partition's progress in the metadata of its offset, in the same request.
func (s *Store) CommitProgress(ctx context.Context, fence offsets.Fence, offs map[int32]int64, progress map[int32]offsets.Progress) error {
	if fence.IsZero() {
		return fmt.Errorf("kafkastore: commit to group %s without a fence: %w", s.group, offsets.ErrFenced)
	}
	if len(offs) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("kafkastore: commit to group %s: %w", s.group, err)
	}
	parts := make([]int32, 0, len(offs))
	for p, o := range offs {
		if p < 0 || o < 0 {
			return fmt.Errorf("kafkastore: commit to group %s: invalid partition %d offset %d", s.group, p, o)
		}
		parts = append(parts, p)
	}
	slices.Sort(parts)
	cond, err := s.condition(fence, parts)
	if err != nil {
		return fmt.Errorf("kafkastore: commit to group %s: %w", s.group, err)
	}
	coord, err := s.coordinator()
	if err != nil {
		return err
	}
	req := sarama.NewOffsetCommitRequest(s.client.Config(), s.group)
	var m Member
	switch c := cond.(type) {
	case Member:
		m = c
	case claimed:
		m = c.Member
	}
	if m.MemberID != "" {
		instance := m.instance()
		req.ConsumerGroupGeneration, req.ConsumerID, req.GroupInstanceId = m.Generation, m.MemberID, &instance
	}
	meta := commitMetadata(cond, "", "")
	for _, p := range parts {
		m := meta
		if pr, ok := progress[p]; ok && !pr.IsZero() && pr.Base == offs[p] {
			if withProgress := commitMetadata(cond, pr.Encode(), pr.EncodeDelays()); withProgress != "" {
				m = withProgress
			}
		}
		req.AddBlockWithLeaderEpoch(s.topic, p, offs[p], -1, 0, m)
	}
	resp, err := coord.CommitOffset(req)
	if err != nil {
		return s.brokerError("commit offsets", coord, err)
	}
	var failed []string
	var first sarama.KError
	for _, p := range parts {
		kerr, ok := resp.Errors[s.topic][p]
		if !ok {
			kerr = sarama.ErrUnknown
		}
		if kerr != sarama.ErrNoError {
			failed = append(failed, fmt.Sprint(p))
			if first == sarama.ErrNoError {
				first = kerr
			}
		}
	}
	if first == sarama.ErrNoError {
		return nil
	}
	if _, spread := cond.(claimed); spread && (first == sarama.ErrIllegalGeneration || first == sarama.ErrRebalanceInProgress) {
		// The group moved to a generation this member has not synced yet:
		// its partitions may stay its own, and are committed again then.
		return fmt.Errorf("kafkastore: commit under %v: the group is rebalancing: %w", cond, first)
	}
	if fencedError(first) {
		if _, empty := cond.(Empty); empty {
			return fmt.Errorf("kafkastore: commit to group %s refused: the group has members (a leader holds it): %w: %w",
				s.group, offsets.ErrFenced, first)
		}
		return fmt.Errorf("kafkastore: commit under %v refused: %w: %w", cond, offsets.ErrFenced, first)
	}
	return s.groupError(fmt.Sprintf("commit offsets of %s partitions %s", s.topic, strings.Join(failed, ",")), first)
}

// condition returns the one membership a commit of parts under fence is
// made under, of a kind this store checks, for this store's group: the
// fence's one condition (a leader's Member, or Empty), or the membership of
// the spread member whose Claims the fence's conditions are (claimed).
func (s *Store) condition(fence offsets.Fence, parts []int32) (offsets.Condition, error) {
	conds, err := fence.Conditions(parts)
	if err != nil {
		return nil, err
	}
	if len(conds) == 0 {
		return nil, fmt.Errorf("fence %v: no condition: %w", fence, offsets.ErrFenced)
	}
	switch c := conds[0].(type) {
	case Claim:
		if c.s != nil && c.s.store.group == s.group {
			return c.s.resolve(conds)
		}
	case Member:
		if len(conds) == 1 && c.Group == s.group {
			return c, nil
		}
	case Empty:
		if len(conds) == 1 && c.Group == s.group {
			return c, nil
		}
	}
	if len(conds) != 1 {
		return nil, fmt.Errorf("fence %v: a commit to a Kafka group is made under one membership: %w", fence, offsets.ErrFenced)
	}
	return nil, fmt.Errorf("fence condition %v (%T) is not a membership of group %s: %w", conds[0], conds[0], s.group, offsets.ErrFenced)
}

// coordinator returns the group's coordinator broker.
func (s *Store) coordinator() (*sarama.Broker, error) {
	b, err := s.client.Coordinator(s.group)
	if err != nil {
		return nil, fmt.Errorf("kafkastore: coordinator of group %s: %w", s.group, err)
	}
	return b, nil
}

// brokerError describes a request that failed on its way (the connection),
// and refreshes the coordinator for the next attempt.
func (s *Store) brokerError(what string, coord *sarama.Broker, err error) error {
	_ = s.client.RefreshCoordinator(s.group)
	return fmt.Errorf("kafkastore: %s of group %s at coordinator %s: %w", what, s.group, coord.Addr(), err)
}

// groupError describes an error code of the coordinator, refreshing the
// coordinator when it moved or is not ready.
func (s *Store) groupError(what string, kerr sarama.KError) error {
	switch kerr {
	case sarama.ErrNotCoordinatorForConsumer, sarama.ErrConsumerCoordinatorNotAvailable, sarama.ErrOffsetsLoadInProgress:
		_ = s.client.RefreshCoordinator(s.group)
	case sarama.ErrGroupAuthorizationFailed:
		return fmt.Errorf("kafkastore: %s of group %s: %w (the Kafka user needs Read on the group)", what, s.group, kerr)
	}
	return fmt.Errorf("kafkastore: %s of group %s: %w", what, s.group, kerr)
}

// fencedError reports whether kerr says the request's membership is not the
// group's current one.
func fencedError(kerr sarama.KError) bool {
	switch kerr {
	case sarama.ErrFencedInstancedId, sarama.ErrUnknownMemberId, sarama.ErrIllegalGeneration, sarama.ErrRebalanceInProgress:
		return true
	}
	return false
}

var _ offsets.ProgressStore = (*Store)(nil)

// LoadPartition returns partition p's committed offset (false: none).
func (s *Store) LoadPartition(ctx context.Context, p int32) (int64, bool, error) {
	committed, err := s.Committed(ctx)
	if err != nil {
		return 0, false, err
	}
	c, ok := committed[p]
	return c.Offset, ok, nil
}

// LoadPartitionProgress returns the progress stored above partition p's
// committed offset (the zero Progress, base -1, when there is none);
// progress that does not decode is reported in an error wrapping
// offsets.ErrBadProgress.
func (s *Store) LoadPartitionProgress(ctx context.Context, p int32) (offsets.Progress, error) {
	committed, err := s.Committed(ctx)
	if err != nil {
		return offsets.Progress{}, err
	}
	c, ok := committed[p]
	if !ok {
		return offsets.Progress{Base: -1}, nil
	}
	pr, err := progressOf(c)
	if err != nil {
		return offsets.Progress{Base: -1}, fmt.Errorf("kafkastore: group %s, %s/%d: %w", s.group, s.topic, p, err)
	}
	if pr.Base != c.Offset || pr.IsZero() {
		return offsets.Progress{Base: -1}, nil
	}
	return pr, nil
}
