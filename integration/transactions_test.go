//go:build integration

package integration

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/fanout/kafka"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// txnProducer is a real transactional sarama producer of topic, partition
// 0; closed at cleanup.
type txnProducer struct {
	t     *testing.T
	topic string
	sp    sarama.SyncProducer
}

func newTxnProducer(t *testing.T, topic string) *txnProducer {
	t.Helper()
	cfg := kafka.NewConfig("fanout-integration-txn")
	cfg.Producer.Idempotent = true
	cfg.Producer.Transaction.ID = uniqueName(t, "txn")
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Net.MaxOpenRequests = 1
	sp, err := sarama.NewSyncProducer(kafkaAddrs(t), cfg)
	if err != nil {
		t.Fatalf("transactional producer: %v", err)
	}
	t.Cleanup(func() { _ = sp.Close() })
	return &txnProducer{t: t, topic: topic, sp: sp}
}

// begin starts a transaction and sends values in it.
func (p *txnProducer) begin(values ...string) {
	p.t.Helper()
	if err := p.sp.BeginTxn(); err != nil {
		p.t.Fatalf("BeginTxn: %v", err)
	}
	for _, v := range values {
		if _, _, err := p.sp.SendMessage(&sarama.ProducerMessage{Topic: p.topic, Value: sarama.StringEncoder(v)}); err != nil {
			p.t.Fatalf("send %q in a transaction: %v", v, err)
		}
	}
}

func (p *txnProducer) commit() {
	p.t.Helper()
	if err := p.sp.CommitTxn(); err != nil {
		p.t.Fatalf("CommitTxn: %v", err)
	}
}

func (p *txnProducer) abort() {
	p.t.Helper()
	if err := p.sp.AbortTxn(); err != nil {
		p.t.Fatalf("AbortTxn: %v", err)
	}
}

// A real transactional producer commits one transaction, aborts one and
// commits another. Under read_committed (the default) only the committed
// records are delivered, and the committed offset goes past the aborted
// records and the transaction markers once the records after them are
// acked; read_uncommitted delivers the aborted ones too.
func TestTransactionsIsolation(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	txn := newTxnProducer(t, topic)
	txn.begin("committed-0", "committed-1") // offsets 0, 1; marker 2
	txn.commit()
	txn.begin("aborted-0", "aborted-1") // 3, 4; marker 5
	txn.abort()
	txn.begin("committed-2") // 6; marker 7
	txn.commit()

	for _, tc := range []struct {
		isolation string
		want      map[string]int64 // value -> offset
		committed int64
	}{
		{"", map[string]int64{"committed-0": 0, "committed-1": 1, "committed-2": 6}, 7},
		{"read_uncommitted", map[string]int64{"committed-0": 0, "committed-1": 1, "aborted-0": 3, "aborted-1": 4, "committed-2": 6}, 7},
	} {
		t.Run("isolation="+tc.isolation, func(t *testing.T) {
			opts := daemonOptions(t, topic)
			opts.Isolation = tc.isolation
			d := startDaemon(t, opts)
			c := dial(t, client.Config{}, d.addr)
			got := map[string]int64{}
			for !slices.Contains(slices.Collect(maps.Keys(got)), "committed-2") { // the last record: every other came before
				m := recv(t, c, 30*time.Second)
				got[string(m.Value)] = m.Offset
				if err := m.Ack(); err != nil {
					t.Fatalf("ack: %v", err)
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("delivered %v, want %v", got, tc.want)
			}
			testutil.WaitFor(t, 10*time.Second, "the offset after the last record committed", func() bool {
				return zkOffsets(t, opts.ID, topic)[0] == tc.committed
			})
		})
	}
}

// Newest under read_committed is the last stable offset: a daemon that
// starts (--initial-offset newest) while a transaction is open delivers its
// records once it commits, instead of starting after them at the high
// watermark.
func TestNewestUnderReadCommittedKeepsAnOpenTransaction(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "topic")
	createTopic(t, topic, 1)
	produce(t, topic, &sarama.ProducerMessage{Value: sarama.StringEncoder("before")}) // offset 0
	txn := newTxnProducer(t, topic)
	txn.begin("open-0", "open-1") // offsets 1, 2: the high watermark is 3, the last stable offset 1

	opts := daemonOptions(t, topic)
	opts.InitialOffset = "newest"
	d := startDaemon(t, opts)
	c := dial(t, client.Config{}, d.addr)
	// The start is anchored before any delivery: once stored, it was
	// resolved.
	testutil.WaitFor(t, 30*time.Second, "the start offset stored", func() bool {
		_, ok := zkOffsets(t, opts.ID, topic)[0]
		return ok
	})
	if o := zkOffsets(t, opts.ID, topic)[0]; o != 1 {
		t.Errorf("started at %d, want 1 (the last stable offset)", o)
	}
	txn.commit()
	got := recvValues(t, c, []string{"open-0", "open-1"}, true, 30*time.Second)
	if want := map[string]procPO{"open-0": {0, 1}, "open-1": {0, 2}}; !maps.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
}
