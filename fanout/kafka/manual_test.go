package kafka

import (
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// A Manual source consumes only the partitions added, each from the offset
// or policy Add gives, and nothing of a partition once Remove returned; a
// partition added again starts where that Add says.
func TestSourceManualAddRemove(t *testing.T) {
	t.Parallel()
	const topic = "t"
	cluster := newCluster(t, topic, 3)
	prod := newProducer(t, cluster)
	prod.produce(topic, 4, 0, 1, 2)
	client := newClient(t, cluster)
	src, err := NewSource(client, SourceConfig{Topic: topic, Initial: sarama.OffsetNewest, Manual: true,
		RefreshInterval: 20 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	src.Add(1, 2) // before Run: waits for it
	rec := newRecorder(DefaultBatchSize)
	run(t, src, rec)
	src.Add(0, sarama.OffsetOldest)
	testutil.WaitFor(t, testWait, "partitions 0 and 1 from where Add said", func() bool {
		return len(rec.offsetsOf(0)) == 4 && len(rec.offsetsOf(1)) == 2
	})
	if got := rec.startsOf(1); !slices.Equal(got, []int64{2}) {
		t.Fatalf("partition 1 started at %v, want [2]", got)
	}
	if got := rec.startsOf(0); !slices.Equal(got, []int64{0}) {
		t.Fatalf("partition 0 started at %v, want [0] (oldest)", got)
	}
	// A start resolved by the source is anchored, a stored one is not.
	if got := rec.anchoredOf(0); !slices.Equal(got, []int64{0}) {
		t.Fatalf("partition 0's anchored starts %v, want [0]", got)
	}
	if got := rec.anchoredOf(1); len(got) != 0 {
		t.Fatalf("partition 1 started at its stored offset but was anchored: %v", got)
	}
	if got := src.Partitions(); !slices.Equal(got, []int32{0, 1}) {
		t.Fatalf("Partitions() = %v, want [0 1]", got)
	}

	src.Remove(1)
	if got := src.Partitions(); !slices.Equal(got, []int32{0}) {
		t.Fatalf("Partitions() after Remove(1) = %v, want [0]", got)
	}
	prod.produce(topic, 1, 0, 1)
	testutil.WaitFor(t, testWait, "the new message of partition 0", func() bool { return len(rec.offsetsOf(0)) == 5 })
	src.Add(1, sarama.OffsetNewest) // again: from the newest offset, 5
	testutil.WaitFor(t, testWait, "partition 1 started again", func() bool { return len(rec.startsOf(1)) == 2 })
	if got := rec.startsOf(1); got[1] != 5 {
		t.Fatalf("partition 1 started again at %d, want 5 (newest)", got[1])
	}
	prod.produce(topic, 1, 1)
	testutil.WaitFor(t, testWait, "partition 1's new message", func() bool { return len(rec.offsetsOf(1)) == 3 })
	if got := rec.offsetsOf(1); !slices.Equal(got, []int64{2, 3, 5}) {
		t.Fatalf("partition 1 offsets %v, want 2, 3 then 5: nothing while removed", got)
	}
	if got := rec.offsetsOf(2); len(got) != 0 || len(rec.startsOf(2)) != 0 {
		t.Fatalf("partition 2 was never added but was consumed: %v", got)
	}
}
