package kafka

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"hash/crc32"
	"slices"
	"sync"
	"testing"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzBlockReader feeds the record batches and legacy message sets of a
// fetch response, as a broker sends them, through sarama's decoding and
// blockReader. The fuzzed bytes are what a partition's records field
// holds; their checksums are set before they are sent (crcFix), so that
// mutations reach the decoding rather than stop at a checksum. Whatever
// decodes must come out of blockReader without a panic, in batches of at
// most BatchSize messages, offsets rising, at or above the offset asked
// and below the next offset it returns, every byte a message holds counted
// in the buffer it names, and read_committed delivering some of what
// read_uncommitted does (all of it when no transaction is aborted).
func FuzzBlockReader(f *testing.F) {
	for _, s := range blockReaderSeeds() {
		f.Add(s.from, s.size, s.aborted, s.records)
	}
	b := newRawFetchBroker(f)
	f.Fuzz(func(t *testing.T, from uint16, size uint8, aborted, records []byte) {
		block := b.fetch(t, int64(from), aborted, records)
		if block == nil {
			return // sarama refused the bytes: the fetch fails, as it should
		}
		batchSize := int(size%8) + 1
		read := func(committed bool) ([]int64, int64) {
			r := newBlockReader(batchSize, committed)
			r.reset()
			batches, next := r.read(block, 0, int64(from))
			r.finish()
			offsets := offsetsIn(t, batches, batchSize)
			if next < int64(from) {
				t.Fatalf("next offset %d below the offset asked, %d", next, from)
			}
			for i, o := range offsets {
				if o < int64(from) || o >= next || (i > 0 && o <= offsets[i-1]) {
					t.Fatalf("offsets %v asked from %d, next %d", offsets, from, next)
				}
			}
			for _, batch := range batches {
				for _, m := range batch.Messages {
					held := max(len(m.Key), len(m.Value))
					for _, h := range m.Headers {
						held = max(held, len(h.Value))
					}
					if held > 0 && (m.Buffer == nil || m.Buffer.Size < held) {
						t.Fatalf("offset %d holds %d bytes, its buffer counts %v", m.Offset, held, m.Buffer)
					}
				}
			}
			return offsets, next
		}
		all, nextAll := read(false)
		committed, nextCommitted := read(true)
		if nextAll != nextCommitted {
			t.Fatalf("next offset %d under read_uncommitted, %d under read_committed", nextAll, nextCommitted)
		}
		if len(aborted) < 2 && !slices.Equal(all, committed) {
			t.Fatalf("no transaction aborted: read_committed %v, read_uncommitted %v", committed, all)
		}
		i := 0
		for _, o := range committed {
			for i < len(all) && all[i] != o {
				i++
			}
			if i == len(all) {
				t.Fatalf("read_committed %v is not part of read_uncommitted %v", committed, all)
			}
		}
	})
}

// rawFetchBroker is an in-process broker whose fetch responses carry given
// bytes as partition 0's records, and sarama's connection to it.
type rawFetchBroker struct {
	mu      sync.Mutex
	records []byte
	aborted []kmsg.FetchResponseTopicPartitionAbortedTransaction
	conf    *sarama.Config
	addr    string
	conn    *sarama.Broker
}

func newRawFetchBroker(f testing.TB) *rawFetchBroker {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(cluster.Close)
	b := &rawFetchBroker{conf: NewConfig("fanout-fuzz"), addr: cluster.ListenAddrs()[0]}
	cluster.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		b.mu.Lock()
		defer b.mu.Unlock()
		resp := kmsg.NewPtrFetchResponse()
		resp.Version = req.GetVersion()
		p := kmsg.NewFetchResponseTopicPartition()
		p.HighWatermark, p.LastStableOffset = 1<<20, 1<<20
		p.AbortedTransactions = b.aborted
		p.RecordBatches = b.records
		topic := kmsg.NewFetchResponseTopic()
		topic.Topic = "t"
		topic.Partitions = []kmsg.FetchResponseTopicPartition{p}
		resp.Topics = []kmsg.FetchResponseTopic{topic}
		return resp, nil, true
	})
	f.Cleanup(func() {
		if b.conn != nil {
			_ = b.conn.Close()
		}
	})
	return b
}

// fetch returns partition 0's block of a fetch response carrying records
// (checksums set) and the aborted transactions of aborted (two bytes
// each: a producer and a first offset), nil when sarama cannot decode it.
func (b *rawFetchBroker) fetch(t *testing.T, from int64, aborted, records []byte) *sarama.FetchResponseBlock {
	b.mu.Lock()
	b.records = crcFix(slices.Clone(records))
	b.aborted = b.aborted[:0]
	for i := 0; i+1 < len(aborted); i += 2 {
		a := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
		a.ProducerID, a.FirstOffset = int64(aborted[i]%4), int64(aborted[i+1])
		b.aborted = append(b.aborted, a)
	}
	b.mu.Unlock()
	if b.conn == nil || !isConnected(b.conn) {
		if b.conn != nil {
			_ = b.conn.Close()
		}
		b.conn = sarama.NewBroker(b.addr)
		if err := b.conn.Open(b.conf); err != nil {
			t.Fatalf("open: %v", err)
		}
	}
	req := &sarama.FetchRequest{MaxWaitTime: 1, MaxBytes: 1 << 24, Isolation: sarama.ReadCommitted,
		SessionEpoch: -1, Version: fetchVersion(b.conf.Version)}
	req.AddBlock("t", 0, from, 1<<20, -1)
	resp, err := b.conn.Fetch(req)
	if err != nil {
		return nil
	}
	return resp.GetBlock("t", 0)
}

// isConnected reports whether sarama still holds the broker's connection.
func isConnected(b *sarama.Broker) bool {
	ok, _ := b.Connected()
	return ok
}

// crcFix sets the checksum of each record batch (magic 2) and legacy
// message (magic 0 or 1) of records, as far as their lengths frame them,
// and returns records.
func crcFix(records []byte) []byte {
	for rest := records; len(rest) >= 17; {
		end := 12 + int(int32(binary.BigEndian.Uint32(rest[8:12])))
		if end < 17 || end > len(rest) {
			break
		}
		switch rest[16] {
		case 2:
			if end >= 21 {
				binary.BigEndian.PutUint32(rest[17:21], crc32.Checksum(rest[21:end], crc32.MakeTable(crc32.Castagnoli)))
			}
		default:
			binary.BigEndian.PutUint32(rest[12:16], crc32.ChecksumIEEE(rest[16:end]))
		}
		rest = rest[end:]
	}
	return records
}

// blockReaderSeed is one input of FuzzBlockReader.
type blockReaderSeed struct {
	from    uint16
	size    uint8
	aborted []byte
	records []byte
}

// blockReaderSeeds returns record batches (with headers, transactional,
// aborted, control, gzip-compressed) and legacy message sets (v0, v1, a v1
// gzip wrapper), each asked from the start and from the middle.
func blockReaderSeeds() []blockReaderSeed {
	rec := func(delta int32, key, value string, headers ...string) kmsg.Record {
		r := kmsg.Record{OffsetDelta: delta, TimestampDelta64: int64(delta), Value: []byte(value)}
		if key != "" {
			r.Key = []byte(key)
		}
		for i := 0; i+1 < len(headers); i += 2 {
			r.Headers = append(r.Headers, kmsg.Header{Key: headers[i], Value: []byte(headers[i+1])})
		}
		return r
	}
	batch := func(first, producer int64, attrs int16, compress bool, recs ...kmsg.Record) []byte {
		var body []byte
		for _, r := range recs {
			r.Length = 0
			n := len(r.AppendTo(nil)) - 1 // the length, a varint of 0, is one byte
			r.Length = int32(n)
			body = r.AppendTo(body)
		}
		if compress {
			attrs |= 1
			body = gzipped(body)
		}
		b := kmsg.RecordBatch{FirstOffset: first, Magic: 2, Attributes: attrs, ProducerID: producer,
			LastOffsetDelta: recs[len(recs)-1].OffsetDelta, NumRecords: int32(len(recs)), Records: body,
			FirstTimestamp: 1700000000000, MaxTimestamp: 1700000000000 + int64(len(recs))}
		b.Length = int32(len(b.AppendTo(nil)) - 12)
		return b.AppendTo(nil)
	}
	const transactional, control = 0x10, 0x20
	abortKey := string([]byte{0, 0, 0, 0})
	commitKey := string([]byte{0, 0, 0, 1})
	v0 := func(offset int64, key, value string) []byte {
		m := kmsg.MessageV0{Offset: offset, Value: []byte(value)}
		if key != "" {
			m.Key = []byte(key)
		}
		m.MessageSize = int32(len(m.AppendTo(nil)) - 12)
		return m.AppendTo(nil)
	}
	v1 := func(offset int64, attrs int8, key string, value []byte) []byte {
		m := kmsg.MessageV1{Offset: offset, Magic: 1, Attributes: attrs, Timestamp: 1700000000000 + offset, Value: value}
		if key != "" {
			m.Key = []byte(key)
		}
		m.MessageSize = int32(len(m.AppendTo(nil)) - 12)
		return crcFix(m.AppendTo(nil))
	}
	inner := slices.Concat(v1(0, 0, "a", []byte("one")), v1(1, 0, "b", []byte("two")), v1(2, 0, "", []byte("three")))
	sets := [][]byte{
		slices.Concat(
			batch(0, -1, 0, false, rec(0, "k0", "v0", "trace", "t0", "n", "x"), rec(1, "k1", "v1"), rec(2, "", "v2", "trace", "t2")),
			batch(3, -1, 0, true, rec(0, "k3", "v3"), rec(1, "k4", "v4", "h", "y"))),
		slices.Concat(
			batch(0, -1, 0, false, rec(0, "", "plain")),
			batch(1, 1, transactional, false, rec(0, "", "aborted"), rec(1, "", "aborted too")),
			batch(3, 2, transactional, false, rec(0, "", "committed")),
			batch(4, 1, transactional|control, false, rec(0, abortKey, "")),
			batch(5, 2, transactional|control, false, rec(0, commitKey, "")),
			batch(6, 1, transactional, false, rec(0, "", "after the abort"))),
		slices.Concat(v0(0, "k", "legacy zero"), v0(1, "", "another")),
		slices.Concat(v1(0, 0, "k", []byte("legacy one")), v1(1, 0x08, "", []byte("log append time")),
			v1(4, 1, "", gzipped(inner))),
	}
	var seeds []blockReaderSeed
	for i, s := range sets {
		aborted := []byte(nil)
		if i == 1 {
			aborted = []byte{1, 1}
		}
		seeds = append(seeds, blockReaderSeed{0, 3, aborted, s}, blockReaderSeed{2, 1, aborted, s})
	}
	return seeds
}

// gzipped returns b compressed with gzip.
func gzipped(b []byte) []byte {
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	_, _ = w.Write(b)
	_ = w.Close()
	return out.Bytes()
}

// The seeds of FuzzBlockReader decode as intended: every record of each
// reaches blockReader (a seed sarama refused would fuzz nothing but the
// refusal).
func TestBlockReaderSeedsDecode(t *testing.T) {
	t.Parallel()
	b := newRawFetchBroker(t)
	want := [][]int64{{0, 1, 2, 3, 4}, {0, 1, 2, 3, 6}, {0, 1}, {0, 1, 2, 3, 4}}
	for i, s := range blockReaderSeeds() {
		if s.from != 0 {
			continue
		}
		block := b.fetch(t, 0, nil, s.records)
		if block == nil {
			t.Fatalf("seed %d: sarama refused it", i)
		}
		r := newBlockReader(8, false)
		r.reset()
		batches, _ := r.read(block, 0, 0)
		r.finish()
		if got := offsetsIn(t, batches, 8); !slices.Equal(got, want[i/2]) {
			t.Errorf("seed %d: offsets %v, want %v", i, got, want[i/2])
		}
	}
}
