package kafka

import (
	"fmt"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
)

// blockOf returns partition 0's block of a response built by build.
func blockOf(build func(r *sarama.FetchResponse)) *sarama.FetchResponseBlock {
	r := &sarama.FetchResponse{}
	build(r)
	return r.GetBlock("t", 0)
}

// unsafeStringData tells whether two strings share their bytes.
func unsafeStringData(s string) *byte { return unsafe.StringData(s) }

// offsetsIn returns the offsets of the batches' messages, checking that
// every batch holds at most size messages of partition 0.
func offsetsIn(t *testing.T, batches []dispatch.Batch, size int) []int64 {
	t.Helper()
	var out []int64
	for _, b := range batches {
		if b.Partition != 0 || b.Start != -1 || len(b.Messages) == 0 || len(b.Messages) > size {
			t.Fatalf("batch of partition %d, start %d, %d messages", b.Partition, b.Start, len(b.Messages))
		}
		for _, m := range b.Messages {
			if m.Partition != 0 {
				t.Fatalf("message of partition %d", m.Partition)
			}
			if m.Buffer != nil && !slices.Contains(b.Buffers, m.Buffer) {
				t.Fatalf("offset %d aliases a buffer its batch does not list", m.Offset)
			}
			out = append(out, m.Offset)
		}
	}
	return out
}

func TestBlockReaderRecords(t *testing.T) {
	t.Parallel()
	base := time.UnixMilli(1700000000000)
	block := blockOf(func(r *sarama.FetchResponse) {
		for o := range int64(10) {
			r.AddRecordWithTimestamp("t", 0, sarama.StringEncoder(fmt.Sprint("k", o)), sarama.StringEncoder(fmt.Sprint("v", o)),
				o, base.Add(time.Duration(o)*time.Millisecond))
		}
		r.SetLastOffsetDelta("t", 0, 9)
		for i, rec := range r.GetBlock("t", 0).RecordsSet[0].RecordBatch.Records {
			if i%2 == 0 {
				rec.Headers = []*sarama.RecordHeader{{Key: []byte("trace"), Value: []byte(fmt.Sprint("h", i))},
					{Key: []byte("n"), Value: []byte("x")}}
			}
		}
	})
	r := newBlockReader(4, false)
	r.reset()
	batches, next := r.read(block, 0, 3)
	r.finish()
	if next != 10 {
		t.Fatalf("next %d, want 10", next)
	}
	if got, want := offsetsIn(t, batches, 4), offsetsFrom(3, 10); !slices.Equal(got, want) {
		t.Fatalf("offsets %v, want %v", got, want)
	}
	if n := len(batches); n != 2 {
		t.Fatalf("%d batches, want 2 (4 and 3 messages)", n)
	}
	for _, b := range batches {
		var prevKey string // header keys are shared within a batch
		for _, m := range b.Messages {
			o := m.Offset
			if string(m.Key) != fmt.Sprint("k", o) || string(m.Value) != fmt.Sprint("v", o) {
				t.Errorf("offset %d: key %q value %q", o, m.Key, m.Value)
			}
			if want := base.Add(time.Duration(o) * time.Millisecond); !m.Timestamp.Equal(want) {
				t.Errorf("offset %d: timestamp %v, want %v", o, m.Timestamp, want)
			}
			if o%2 == 0 {
				if len(m.Headers) != 2 || m.Headers[0].Key != "trace" || string(m.Headers[0].Value) != fmt.Sprint("h", o) ||
					m.Headers[1].Key != "n" {
					t.Errorf("offset %d: headers %+v", o, m.Headers)
				}
				if cap(m.Headers) != 2 {
					t.Errorf("offset %d: headers share capacity with the next message's (cap %d)", o, cap(m.Headers))
				}
				if prevKey != "" && unsafeStringData(prevKey) != unsafeStringData(m.Headers[0].Key) {
					t.Errorf("offset %d: a header key equal to the previous message's is a string of its own", o)
				}
				prevKey = m.Headers[0].Key
			} else if m.Headers != nil {
				t.Errorf("offset %d: headers %+v, want none", o, m.Headers)
			}
			if m.Buffer != r.resp {
				t.Errorf("offset %d: an uncompressed record aliases %p, not the response's buffer", o, m.Buffer)
			}
		}
	}
	if r.resp.Size == 0 {
		t.Errorf("the response's buffer has no size")
	}
}

// The records of transactions aborted are left out under read_committed
// (an aborted transaction runs from its first offset to its producer's
// abort marker), control records always; read_uncommitted gets every data
// record.
func TestBlockReaderTransactions(t *testing.T) {
	t.Parallel()
	const aborting, committing = 7, 8
	block := blockOf(func(r *sarama.FetchResponse) {
		r.AddRecordBatch("t", 0, nil, sarama.StringEncoder("plain"), 0, 0, false)
		r.AddRecordBatch("t", 0, nil, sarama.StringEncoder("aborted"), 1, aborting, true)
		r.AddRecordBatch("t", 0, nil, sarama.StringEncoder("committed"), 2, committing, true)
		r.AddRecordBatch("t", 0, nil, sarama.StringEncoder("aborted"), 3, aborting, true)
		r.AddControlRecord("t", 0, 4, aborting, sarama.ControlRecordAbort)
		r.AddControlRecord("t", 0, 5, committing, sarama.ControlRecordCommit)
		// The aborting producer's next transaction, committed.
		r.AddRecordBatch("t", 0, nil, sarama.StringEncoder("committed"), 6, aborting, true)
		r.AddControlRecord("t", 0, 7, aborting, sarama.ControlRecordCommit)
		b := r.GetBlock("t", 0)
		b.AbortedTransactions = []*sarama.AbortedTransaction{{ProducerID: aborting, FirstOffset: 1}}
	})
	for _, tt := range []struct {
		readCommitted bool
		want          []int64
	}{
		{true, []int64{0, 2, 6}},
		{false, []int64{0, 1, 2, 3, 6}},
	} {
		r := newBlockReader(DefaultBatchSize, tt.readCommitted)
		r.reset()
		batches, next := r.read(block, 0, 0)
		if next != 8 {
			t.Errorf("read_committed %v: next %d, want 8 (past the last control record)", tt.readCommitted, next)
		}
		if got := offsetsIn(t, batches, DefaultBatchSize); !slices.Equal(got, tt.want) {
			t.Errorf("read_committed %v: offsets %v, want %v", tt.readCommitted, got, tt.want)
		}
	}
}

// Messages of legacy message sets (magic 0 and 1) are delivered too.
func TestBlockReaderLegacyMessages(t *testing.T) {
	t.Parallel()
	block := blockOf(func(r *sarama.FetchResponse) {
		for o := range int64(5) {
			r.AddMessage("t", 0, nil, sarama.StringEncoder(fmt.Sprint("v", o)), o)
		}
	})
	r := newBlockReader(2, false)
	r.reset()
	batches, next := r.read(block, 0, 1)
	if next != 5 {
		t.Fatalf("next %d, want 5", next)
	}
	if got := offsetsIn(t, batches, 2); !slices.Equal(got, []int64{1, 2, 3, 4}) {
		t.Fatalf("offsets %v, want [1 2 3 4]", got)
	}
	if v := string(batches[0].Messages[0].Value); v != "v1" {
		t.Fatalf("value %q, want v1", v)
	}
}

// Records whose offsets repeat or go back (batches that overlap, or a
// broker that sends the same offset twice) are delivered once each, in
// rising order, as sarama's consumer does: the dispatcher never gets an
// offset it already has.
func TestBlockReaderOffsetsRiseOnce(t *testing.T) {
	t.Parallel()
	rec := func(delta int64) *sarama.Record {
		return &sarama.Record{OffsetDelta: delta, Value: []byte(fmt.Sprint("v", delta))}
	}
	msg := func(offset int64) *sarama.MessageBlock {
		return &sarama.MessageBlock{Offset: offset, Msg: &sarama.Message{Value: []byte(fmt.Sprint("m", offset))}}
	}
	block := &sarama.FetchResponseBlock{RecordsSet: []*sarama.Records{
		{RecordBatch: &sarama.RecordBatch{FirstOffset: 0, Records: []*sarama.Record{rec(0), rec(0), rec(2), rec(1)}}},
		{RecordBatch: &sarama.RecordBatch{FirstOffset: 1, Records: []*sarama.Record{rec(0), rec(1), rec(2)}}},
		{MsgSet: &sarama.MessageSet{Messages: []*sarama.MessageBlock{msg(5), msg(5), msg(4), msg(6)}}},
	}}
	for _, size := range []int{1, 8} {
		r := newBlockReader(size, false)
		r.reset()
		batches, next := r.read(block, 0, 0)
		r.finish()
		if got, want := offsetsIn(t, batches, size), []int64{0, 2, 3, 5, 6}; !slices.Equal(got, want) {
			t.Errorf("batch size %d: offsets %v, want %v", size, got, want)
		}
		if next != 7 {
			t.Errorf("batch size %d: next %d, want 7", size, next)
		}
	}
}

// A block holding only the beginning of a record batch larger than the
// fetch size delivers nothing: the fetcher asks again with a larger size,
// and never skips the batch.
func TestFetcherGrowsFetchSizeForLargeBatch(t *testing.T) {
	t.Parallel()
	cluster := newCluster(t, "t", 1)
	src, err := NewSource(newClient(t, cluster), SourceConfig{Topic: "t", Initial: sarama.OffsetOldest, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	f := &fetcher{s: src, reader: newBlockReader(DefaultBatchSize, false)}
	f.reader.reset()
	sub := &subscription{part: &partition{id: 0}, offset: 5, size: 1024}
	block := &sarama.FetchResponseBlock{Partial: true}
	fd, ends := f.read(sub, block)
	if ends || fd.err != nil || len(fd.batches) != 0 {
		t.Fatalf("read = %+v, ends %v; want nothing", fd, ends)
	}
	if sub.size != 2048 || sub.offset != 5 {
		t.Fatalf("size %d at offset %d, want 2048 at 5", sub.size, sub.offset)
	}
}

// BenchmarkBlockReader measures turning a fetched partition block into
// dispatch batches, per record.
func BenchmarkBlockReader(b *testing.B) {
	for _, headers := range []int{0, 2} {
		b.Run(fmt.Sprintf("records=4096/headers=%d", headers), func(b *testing.B) {
			const n = 4096
			block := blockOf(func(r *sarama.FetchResponse) {
				for o := range int64(n) {
					r.AddRecord("t", 0, nil, sarama.ByteEncoder(make([]byte, 100)), o)
				}
				r.SetLastOffsetDelta("t", 0, n-1)
				for _, rec := range r.GetBlock("t", 0).RecordsSet[0].RecordBatch.Records {
					for h := range headers {
						rec.Headers = append(rec.Headers, &sarama.RecordHeader{Key: []byte(fmt.Sprint("h", h)), Value: []byte("v")})
					}
				}
			})
			r := newBlockReader(DefaultBatchSize, true)
			b.ReportAllocs()
			for b.Loop() {
				r.reset()
				_, _ = r.read(block, 0, 0)
				r.finish()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
		})
	}
}
