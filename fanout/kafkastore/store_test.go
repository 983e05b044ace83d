package kafkastore

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/nanoservice/core-fanout/fanout/kafka"
	"github.com/nanoservice/core-fanout/fanout/offsets"
)

// newStore returns a Store of topic "jobs" (3 partitions) for id "svc" on an
// in-process Kafka, and a second Store of the same group on another client,
// as another fanout process would have.
func newStore(t *testing.T) (*Store, *Store) {
	t.Helper()
	a, b, _ := newStoreOn(t)
	return a, b
}

// newStoreOn is newStore, returning the in-process Kafka too.
func newStoreOn(t *testing.T) (*Store, *Store, *kfake.Cluster) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "jobs"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	open := func() *Store {
		client, err := sarama.NewClient(c.ListenAddrs(), kafka.NewConfig("kafkastore-test"))
		if err != nil {
			t.Fatalf("sarama client: %v", err)
		}
		t.Cleanup(func() { _ = client.Close() })
		return New(client, "svc", "jobs", 0)
	}
	return open(), open(), c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustJoin(t *testing.T, s *Store, l Leader) Member {
	t.Helper()
	m, err := s.Join(ctx(t), l)
	if err != nil {
		t.Fatalf("Join(%+v): %v", l, err)
	}
	return m
}

func mustLoad(t *testing.T, s *Store) map[int32]int64 {
	t.Helper()
	got, err := s.Load(ctx(t))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return got
}

// The group's member commits; Load returns what it committed, per
// partition, with the term in each offset's metadata.
func TestCommitAndLoad(t *testing.T) {
	a, b := newStore(t)
	if got := mustLoad(t, a); len(got) != 0 {
		t.Fatalf("a new group has offsets %v", got)
	}
	m := mustJoin(t, a, Leader{Epoch: 4, Node: "node-a", Addr: "a:4987"})
	want := map[int32]int64{0: 10, 2: 7}
	if err := a.Commit(ctx(t), offsets.TopicFence(m), want); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if got := mustLoad(t, b); !maps.Equal(got, want) {
		t.Fatalf("Load = %v, want %v", got, want)
	}
	committed, err := b.Committed(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info, ok := ParseCommitInfo(committed[2].Metadata); !ok || info != (CommitInfo{Epoch: 4, Node: "node-a"}) {
		t.Errorf("metadata %q, want epoch 4 node node-a", committed[2].Metadata)
	}
	if e, err := b.LastEpoch(ctx(t)); err != nil || e != 4 {
		t.Errorf("LastEpoch = %d, %v; want 4", e, err)
	}
}

// A later Join replaces the member: the replaced membership's commits and
// heartbeats are refused with offsets.ErrFenced and write nothing; the new
// one's go through. Describe names the new leader.
func TestJoinFencesThePreviousMember(t *testing.T) {
	a, b := newStore(t)
	old := mustJoin(t, a, Leader{Epoch: 1, Node: "node-a", Addr: "a:4987"})
	if err := a.Commit(ctx(t), offsets.TopicFence(old), map[int32]int64{0: 5}); err != nil {
		t.Fatalf("commit of the member: %v", err)
	}
	if err := a.Heartbeat(ctx(t), old); err != nil {
		t.Fatalf("heartbeat of the member: %v", err)
	}

	cur := mustJoin(t, b, Leader{Epoch: 2, Node: "node-b", Addr: "b:4987"})
	if cur.MemberID == old.MemberID {
		t.Fatalf("the second join kept member id %s", cur.MemberID)
	}
	err := a.Commit(ctx(t), offsets.TopicFence(old), map[int32]int64{0: 99})
	if !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("commit of the replaced member: %v, want ErrFenced", err)
	}
	t.Logf("replaced member's commit: %v", err)
	if err := a.Heartbeat(ctx(t), old); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("heartbeat of the replaced member: %v, want ErrFenced", err)
	}
	if got := mustLoad(t, b); got[0] != 5 {
		t.Fatalf("offset %d after the fenced commit, want 5", got[0])
	}
	if err := b.Commit(ctx(t), offsets.TopicFence(cur), map[int32]int64{0: 6}); err != nil {
		t.Fatalf("commit of the new member: %v", err)
	}
	if err := b.Heartbeat(ctx(t), cur); err != nil {
		t.Fatalf("heartbeat of the new member: %v", err)
	}

	d, err := a.Describe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	h, ok, err := d.Holder()
	if err != nil || !ok || h.MemberID != cur.MemberID || *h.Leader != (Leader{Epoch: 2, Node: "node-b", Addr: "b:4987"}) {
		t.Fatalf("Holder() = %+v, %v, %v; want member %s with node-b's metadata", h, ok, err, cur.MemberID)
	}
}

// A replaced member's Leave is refused and leaves its successor; the
// member's own Leave empties the group.
func TestLeave(t *testing.T) {
	a, b := newStore(t)
	old := mustJoin(t, a, Leader{Epoch: 1, Node: "node-a"})
	cur := mustJoin(t, b, Leader{Epoch: 2, Node: "node-b"})
	if err := a.Leave(ctx(t), old); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("leave of the replaced member: %v, want ErrFenced", err)
	}
	if err := b.Heartbeat(ctx(t), cur); err != nil {
		t.Fatalf("the successor after the replaced member's leave: %v", err)
	}
	if err := b.Leave(ctx(t), cur); err != nil {
		t.Fatalf("leave: %v", err)
	}
	d, err := a.Describe(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := d.Holder(); ok || err != nil {
		t.Fatalf("after the leave: Holder() = %v, %v; want nobody (state %s)", ok, err, d.State)
	}
}

// A commit from outside the group (EmptyFence) is taken while the group
// has no member and refused while a leader holds it.
func TestEmptyFence(t *testing.T) {
	a, b := newStore(t)
	if err := a.Commit(ctx(t), a.EmptyFence("copied"), map[int32]int64{1: 3}); err != nil {
		t.Fatalf("commit to an empty group: %v", err)
	}
	m := mustJoin(t, b, Leader{Epoch: 1, Node: "node-b"})
	err := a.Commit(ctx(t), a.EmptyFence("copied"), map[int32]int64{1: 4})
	if !errors.Is(err, offsets.ErrFenced) || !strings.Contains(err.Error(), "the group has members") {
		t.Fatalf("commit from outside while a leader holds the group: %v, want ErrFenced naming the members", err)
	}
	if got := mustLoad(t, a); got[1] != 3 {
		t.Fatalf("offset %d, want 3", got[1])
	}
	if err := b.Leave(ctx(t), m); err != nil {
		t.Fatal(err)
	}
}

// Commits without a fence, or under a fence of another kind or group, are
// refused before any request.
func TestCommitNeedsItsFence(t *testing.T) {
	a, _ := newStore(t)
	m := mustJoin(t, a, Leader{Epoch: 1, Node: "n"})
	other := m
	other.Group = "fanout_other"
	for name, f := range map[string]offsets.Fence{
		"no fence":           {},
		"another store":      offsets.TopicFence(offsets.NewMemoryStore().NewTerm()),
		"another group":      offsets.TopicFence(other),
		"two memberships":    offsets.PartitionFence(map[int32]offsets.Condition{0: m, 1: other}),
		"partition not held": offsets.PartitionFence(map[int32]offsets.Condition{1: m}),
	} {
		if err := a.Commit(ctx(t), f, map[int32]int64{0: 1, 1: 1}); !errors.Is(err, offsets.ErrFenced) {
			t.Errorf("%s: %v, want ErrFenced", name, err)
		}
	}
	if got := mustLoad(t, a); len(got) != 0 {
		t.Fatalf("refused commits wrote %v", got)
	}
}

// The metadata of a commit stays within MaxMetadata whatever the node id.
func TestCommitMetadataBounded(t *testing.T) {
	long := strings.Repeat("é", 500)
	full := offsets.Progress{Base: 0}
	for i := range int64(2 * offsets.MaxProgressBytes) {
		full.Acked = append(full.Acked, offsets.Range{First: 2*i + 1, Last: 2*i + 1})
	}
	for i := range int64(2 * offsets.MaxProgressDelays) {
		full.Delayed = append(full.Delayed, offsets.Delay{Offset: 1_000_000_007 * i, NotBefore: 1_700_000_000_000 + 900_000 - i})
	}
	meta := commitMetadata(Member{Epoch: 1<<64 - 1, Node: long}, full.Encode(), full.EncodeDelays())
	if len(meta) > MaxMetadata || meta == "" || MaxMetadata > 4096 {
		t.Fatalf("metadata of %d bytes (bound %d, brokers' default 4096): %q", len(meta), MaxMetadata, meta)
	}
	info, ok := ParseCommitInfo(meta)
	if !ok || info.Epoch != 1<<64-1 || !strings.HasPrefix(long, info.Node) || len(info.Node) > maxNode ||
		info.Progress != full.Encode() || info.Delays != full.EncodeDelays() {
		t.Fatalf("ParseCommitInfo(%q) = %+v, %v", meta, info, ok)
	}
}

// Delays travel in the metadata beside the progress, in a field of their
// own: a daemon that knows no delays (its CommitInfo, formerCommitInfo
// below) reads the progress as before and skips them; LoadProgress returns
// them with the rest, alone too, and leaves out delays of another base.
func TestCommitDelaysAndLoad(t *testing.T) {
	a, b := newStore(t)
	m := mustJoin(t, a, Leader{Epoch: 2, Node: "node-a", Addr: "a:4987"})
	pr := offsets.Progress{Base: 10, Acked: []offsets.Range{{First: 12, Last: 15}}, Failed: []offsets.Failure{{Offset: 10, Count: 2}},
		Delayed: []offsets.Delay{{Offset: 10, NotBefore: 1_700_000_020_000}, {Offset: 11, NotBefore: 1_700_000_030_000}}}
	only := offsets.Progress{Base: 5, Delayed: []offsets.Delay{{Offset: 7, NotBefore: 1_700_000_040_000}}}
	err := a.CommitProgress(ctx(t), offsets.TopicFence(m), map[int32]int64{0: 10, 1: 5}, map[int32]offsets.Progress{0: pr, 1: only})
	if err != nil {
		t.Fatalf("CommitProgress: %v", err)
	}
	got, err := b.LoadProgress(ctx(t))
	if err != nil || !reflect.DeepEqual(got, map[int32]offsets.Progress{0: pr, 1: only}) {
		t.Fatalf("LoadProgress = %+v, %v; want %+v and %+v", got, err, pr, only)
	}
	committed, err := b.Committed(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var former formerCommitInfo
	if err := json.Unmarshal([]byte(committed[0].Metadata), &former); err != nil || former.Epoch != 2 || former.Progress != pr.Encode() {
		t.Fatalf("a daemon that knows no delays reads %+v, %v from %q; want epoch 2 and progress %q",
			former, err, committed[0].Metadata, pr.Encode())
	}
	// Delays of another base than the progress are stale: left out.
	info, _ := ParseCommitInfo(committed[0].Metadata)
	stale := Committed{Offset: 10, Metadata: commitMetadata(m, "v1 b=10 f=0:2", strings.Replace(info.Delays, "b=10", "b=9", 1))}
	if pr, err := progressOf(stale); err != nil || len(pr.Delayed) != 0 || pr.Base != 10 {
		t.Fatalf("progress with stale delays = %+v, %v; want none of them", pr, err)
	}
}

// formerCommitInfo is CommitInfo as a daemon that knows no delays has it.
type formerCommitInfo struct {
	Epoch    uint64 `json:"epoch"`
	Node     string `json:"node"`
	Progress string `json:"progress,omitempty"`
}

// A group used by a consumer that is not a fanout leader has no holder,
// and says so.
func TestForeignMember(t *testing.T) {
	a, _ := newStore(t)
	d := Description{State: "Stable", ProtocolType: "consumer", Members: []GroupMember{{MemberID: "x", ClientID: "app"}}}
	if _, ok, err := d.Holder(); ok || !errors.Is(err, ErrForeignMember) {
		t.Fatalf("Holder() = %v, %v; want ErrForeignMember", ok, err)
	}
	d = Description{State: "Stable", ProtocolType: "connect"}
	if _, _, err := d.Holder(); !errors.Is(err, ErrForeignMember) {
		t.Fatalf("a group of another protocol type: %v, want ErrForeignMember", err)
	}
	_ = a
}

// A join does not wait for the metadata of a topic that does not exist
// (the daemon waits for a missing topic, and may lead meanwhile): the
// assignment is informative only, so the join asks the brokers nothing
// about the topic (asking would retry for the client's metadata retries).
func TestJoinDoesNotWaitForAMissingTopic(t *testing.T) {
	a, _, c := newStoreOn(t)
	var asked atomic.Int32 // metadata requests naming the missing topic
	c.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		for _, rt := range req.(*kmsg.MetadataRequest).Topics {
			if rt.Topic != nil && *rt.Topic == "no_such_topic" {
				asked.Add(1)
			}
		}
		return nil, nil, false // answered as usual
	})
	missing := New(a.client, "svc", "no_such_topic", 0)
	if _, err := missing.Join(ctx(t), Leader{Epoch: 1, Node: "n"}); err != nil {
		t.Fatal(err)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the join asked the brokers %d times for the missing topic's metadata, want never", n)
	}
}

// Progress travels in the metadata of its partition's offset, in the same
// commit: Load still returns the offsets, LoadProgress the progress of the
// partitions whose offset it was recorded above; a commit without progress
// clears it, and a fenced commit writes neither.
func TestCommitProgressAndLoad(t *testing.T) {
	a, b := newStore(t)
	m := mustJoin(t, a, Leader{Epoch: 2, Node: "node-a", Addr: "a:4987"})
	pr := offsets.Progress{Base: 10, Acked: []offsets.Range{{First: 12, Last: 15}}, Failed: []offsets.Failure{{Offset: 10, Count: 2}}}
	err := a.CommitProgress(ctx(t), offsets.TopicFence(m), map[int32]int64{0: 10, 1: 5},
		map[int32]offsets.Progress{0: pr, 1: {Base: 4, Acked: []offsets.Range{{First: 6, Last: 6}}}})
	if err != nil {
		t.Fatalf("CommitProgress: %v", err)
	}
	if got := mustLoad(t, b); !maps.Equal(got, map[int32]int64{0: 10, 1: 5}) {
		t.Fatalf("Load = %v", got)
	}
	got, err := b.LoadProgress(ctx(t))
	if err != nil || len(got) != 1 || got[0].Encode() != pr.Encode() {
		t.Fatalf("LoadProgress = %v, %v; want partition 0 alone (1's progress was of another base): %+v", got, err, pr)
	}
	if e, err := b.LastEpoch(ctx(t)); err != nil || e != 2 {
		t.Errorf("LastEpoch = %d, %v; want 2 with progress in the metadata", e, err)
	}

	// A new member fences the old one: its progress is not written.
	m2 := mustJoin(t, b, Leader{Epoch: 3, Node: "node-b", Addr: "b:4987"})
	stale := offsets.Progress{Base: 11, Acked: []offsets.Range{{First: 13, Last: 13}}}
	if err := a.CommitProgress(ctx(t), offsets.TopicFence(m), map[int32]int64{0: 11}, map[int32]offsets.Progress{0: stale}); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("CommitProgress of a replaced member: %v", err)
	}
	if got, _ := b.LoadProgress(ctx(t)); got[0].Encode() != pr.Encode() {
		t.Fatalf("after a fenced commit LoadProgress = %v", got)
	}
	// A commit without progress clears it.
	if err := b.Commit(ctx(t), offsets.TopicFence(m2), map[int32]int64{0: 16}); err != nil {
		t.Fatal(err)
	}
	if got, err := a.LoadProgress(ctx(t)); err != nil || len(got) != 0 {
		t.Fatalf("LoadProgress after a commit without progress = %v, %v", got, err)
	}
}
