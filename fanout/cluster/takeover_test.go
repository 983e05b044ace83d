package cluster

import (
	"errors"
	"testing"
	"time"

	"github.com/nanoservice/core-fanout/fanout/kafkastore"
	"github.com/nanoservice/core-fanout/fanout/offsets"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// An operator tool takes the Kafka group over from a live leader: the
// leader's term ends and its commits are refused, the tool's commit goes
// through, and once the tool leaves the members elect the next leader at
// the following epoch, which sees the tool's offsets.
func TestTakeKafkaFencesTheLeader(t *testing.T) {
	t.Parallel()
	c := newKafkaWithTopic(t)
	a, b := startKafkaNode(t, c, "take", "a"), startKafkaNode(t, c, "take", "b")
	testutil.WaitFor(t, 15*time.Second, "b to lead", func() bool { return len(leaders(b.node)) == 1 })
	bTerm := b.lastTerm()
	if err := b.store.Commit(testCtx(t), bTerm.Fence, map[int32]int64{0: 10, 1: 10}); err != nil {
		t.Fatal(err)
	}

	tool := kafkastore.New(newKafkaClient(t, c), "take", "jobs", 0)
	if _, err := TakeKafka(testCtx(t), tool, bTerm.Epoch+1); !errors.Is(err, ErrRecordChanged) {
		t.Fatalf("take with an epoch other than the group's: %v, want ErrRecordChanged", err)
	}
	m, err := TakeKafka(testCtx(t), tool, bTerm.Epoch)
	if err != nil {
		t.Fatal(err)
	}
	if m.Epoch != bTerm.Epoch+1 || m.Node != ToolNode {
		t.Errorf("the tool's membership names epoch %d node %q, want %d %q", m.Epoch, m.Node, bTerm.Epoch+1, ToolNode)
	}
	if err := b.store.Commit(testCtx(t), bTerm.Fence, map[int32]int64{0: 11}); !errors.Is(err, offsets.ErrFenced) {
		t.Fatalf("the old leader's commit after the take: %v, want ErrFenced", err)
	}
	if err := tool.Commit(testCtx(t), offsets.TopicFence(m), map[int32]int64{0: 2, 1: 3}); err != nil {
		t.Fatalf("the tool's commit: %v", err)
	}
	select {
	case <-bTerm.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the old leader's term outlived the take")
	}
	if err := tool.Leave(testCtx(t), m); err != nil {
		t.Fatal(err)
	}

	var next *Term
	testutil.WaitFor(t, 15*time.Second, "a new term after the tool's epoch", func() bool {
		for _, n := range []*kafkaNode{a, b} {
			if l := leaders(n.node); len(l) == 1 && n.lastTerm().Epoch > m.Epoch {
				next = n.lastTerm()
				return true
			}
		}
		return false
	})
	if next.Epoch != m.Epoch+1 {
		t.Errorf("the next term has epoch %d, want %d", next.Epoch, m.Epoch+1)
	}
	if got, err := tool.Load(testCtx(t)); err != nil || got[0] != 2 || got[1] != 3 {
		t.Errorf("offsets after the take: %v, %v; want the tool's 0:2 1:3", got, err)
	}
}
