package kafka

import (
	"encoding/binary"
	"slices"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/fanout/dispatch"
)

// A fetch response, as sarama decodes it, holds per partition record
// batches whose records' keys, values and header values alias memory
// sarama allocated once: the response's bytes, or for a compressed batch
// the bytes it decompressed to. blockReader turns a partition's records
// into dispatch batches without copying those bytes and without an
// allocation per record: the messages of a dispatch batch, their pointers
// and their headers are three allocations, as many records as BatchSize
// allows.

// blockReader reads the partition blocks of one fetch response. Blocks of
// every partition share resp, the response's memory.
type blockReader struct {
	batchSize     int
	readCommitted bool
	resp          *dispatch.Buffer // the response's bytes, which uncompressed records alias
	respSize      int              // the largest extent of it seen (see extent)

	keep    []bool         // scratch: which record batches of a block are delivered
	spans   [][2]int       // scratch: the legacy messages of each message set of a block
	aborted map[int64]bool // scratch: producers whose aborted transaction the records are in
	txns    []*sarama.AbortedTransaction
	legacy  []legacyMessage // scratch: the messages of legacy message sets
	bufs    []*dispatch.Buffer
}

// legacyMessage is a message of a legacy message set (magic 0 or 1),
// flattened out of its wrapper.
type legacyMessage struct {
	m      *sarama.Message
	offset int64
	time   time.Time
	buf    *dispatch.Buffer
}

// newBlockReader returns a reader of fetch responses; call reset before
// each.
func newBlockReader(batchSize int, readCommitted bool) *blockReader {
	return &blockReader{batchSize: batchSize, readCommitted: readCommitted}
}

// reset starts the next response.
func (r *blockReader) reset() { r.resp, r.respSize = &dispatch.Buffer{}, 0 }

// finish sets the response buffer's size, once every block is read and
// before any of their batches is sent.
func (r *blockReader) finish() { r.resp.Size = r.respSize }

// extent returns how many bytes of the memory b aliases lie from b's start
// to that memory's end: its capacity. The records of a batch alias one
// buffer, so the first record's extent is the batch's (a compressed batch:
// its decompressed bytes), and the largest extent among a response's first
// uncompressed records is nearly the whole response.
func extent(key, value []byte) int { return max(cap(key), cap(value)) }

// read turns block, partition p's part of the response, into batches of
// the records at or above from, and returns them with the offset to fetch
// next (at least from). Under read_committed the records of aborted
// transactions are left out; control records always are. Records below
// from (a batch is returned whole) are skipped, and so is a record whose
// offset is not above the last one delivered (a broker's batches that
// overlap): the offsets delivered rise. It returns no batch when the block
// has no record to deliver.
func (r *blockReader) read(block *sarama.FetchResponseBlock, p int32, from int64) (batches []dispatch.Batch, next int64) {
	next = from
	sets := block.RecordsSet
	if len(sets) == 0 {
		return nil, next
	}
	r.keep = slices.Grow(r.keep[:0], len(sets))[:len(sets)]
	r.spans = slices.Grow(r.spans[:0], len(sets))[:len(sets)]
	clear(r.aborted)
	if r.readCommitted && len(block.AbortedTransactions) > 0 {
		r.txns = append(r.txns[:0], block.AbortedTransactions...)
		slices.SortFunc(r.txns, func(a, b *sarama.AbortedTransaction) int {
			switch {
			case a.FirstOffset < b.FirstOffset:
				return -1
			case a.FirstOffset > b.FirstOffset:
				return 1
			}
			return 0
		})
	} else {
		r.txns = r.txns[:0]
	}
	txns := r.txns
	r.legacy = r.legacy[:0]
	total := 0  // records to deliver
	cur := from // the least offset the next record delivered may have
	for i, set := range sets {
		r.keep[i] = false
		switch {
		case set.RecordBatch != nil:
			b := set.RecordBatch
			if b.PartialTrailingRecord {
				continue // incomplete: fetched again, whole, with a larger fetch size
			}
			last := b.LastOffset()
			if n := len(b.Records); n > 0 {
				last = max(last, b.FirstOffset+b.Records[n-1].OffsetDelta)
			}
			next = max(next, last+1)
			// The aborted transactions that begin at or before this batch
			// cover its producer's batches until that producer's abort
			// marker.
			for len(txns) > 0 && txns[0].FirstOffset <= last {
				if r.aborted == nil {
					r.aborted = map[int64]bool{}
				}
				r.aborted[txns[0].ProducerID] = true
				txns = txns[1:]
			}
			if b.Control {
				if len(b.Records) > 0 && controlType(b.Records[0].Key) == sarama.ControlRecordAbort {
					delete(r.aborted, b.ProducerID)
				}
				continue
			}
			if r.readCommitted && b.IsTransactional && r.aborted[b.ProducerID] {
				continue
			}
			n := 0
			for _, rec := range b.Records {
				if o := b.FirstOffset + rec.OffsetDelta; o >= cur {
					n, cur = n+1, o+1
				}
			}
			r.keep[i], total = n > 0, total+n
		case set.MsgSet != nil:
			lo := len(r.legacy)
			n := r.flatten(set.MsgSet, &cur)
			if n > 0 {
				next = max(next, r.legacy[len(r.legacy)-1].offset+1)
			}
			r.keep[i], r.spans[i], total = n > 0, [2]int{lo, lo + n}, total+n
		}
	}
	next = max(next, cur) // a record may lie beyond its batch's last offset
	if total == 0 {
		return nil, next
	}
	return r.batches(sets, p, from, total), next
}

// controlType returns the type of a control record from its key (a
// version, then the type, both int16).
func controlType(key []byte) sarama.ControlRecordType {
	if len(key) < 4 {
		return sarama.ControlRecordUnknown
	}
	switch binary.BigEndian.Uint16(key[2:4]) {
	case 0:
		return sarama.ControlRecordAbort
	case 1:
		return sarama.ControlRecordCommit
	}
	return sarama.ControlRecordUnknown
}

// flatten appends to r.legacy the messages of a legacy message set at or
// above *cur, each above the one before (*cur follows them), unwrapping
// compressed ones, with their offsets and times as sarama's consumer
// computes them. It returns how many it appended.
func (r *blockReader) flatten(set *sarama.MessageSet, cur *int64) int {
	n := len(r.legacy)
	for _, block := range set.Messages {
		inner := block.Messages()
		var buf *dispatch.Buffer
		if block.Msg.Set != nil {
			// The wrapper's messages alias what it decompressed to.
			for _, m := range inner {
				if e := extent(m.Msg.Key, m.Msg.Value); e > 0 {
					buf = &dispatch.Buffer{Size: e}
					break
				}
			}
		}
		for _, m := range inner {
			offset := m.Offset
			ts := m.Msg.Timestamp
			if m.Msg.Version >= 1 {
				// Inner offsets of a v1 wrapper are relative to its last.
				offset += block.Offset - inner[len(inner)-1].Offset
				if m.Msg.LogAppendTime {
					ts = block.Msg.Timestamp
				}
			}
			if offset < *cur {
				continue
			}
			*cur = offset + 1
			lm := legacyMessage{m: m.Msg, offset: offset, time: ts, buf: buf}
			if buf == nil && (len(m.Msg.Key) > 0 || len(m.Msg.Value) > 0) {
				lm.buf = r.resp
				r.respSize = max(r.respSize, extent(m.Msg.Key, m.Msg.Value))
			}
			r.legacy = append(r.legacy, lm)
		}
	}
	return len(r.legacy) - n
}

// batches cuts the total records to deliver of sets (those of the sets
// r.keep marks at or above from, rising, as read counted them), in order,
// into dispatch batches of at most r.batchSize messages.
func (r *blockReader) batches(sets []*sarama.Records, p int32, from int64, total int) []dispatch.Batch {
	out := make([]dispatch.Batch, 0, (total+r.batchSize-1)/r.batchSize)
	var chunk chunk
	var used *dispatch.Buffer // the last buffer listed in r.bufs
	start := func(left int) {
		chunk = newChunk(p, min(left, r.batchSize))
		r.bufs, used = r.bufs[:0], nil
	}
	flush := func() {
		if len(chunk.ptrs) > 0 {
			out = append(out, dispatch.Batch{Partition: p, Start: -1, Messages: chunk.ptrs,
				Buffers: slices.Clone(r.bufs)})
		}
	}
	left := total
	start(left)
	use := func(b *dispatch.Buffer) {
		if b != used && b != nil && !slices.Contains(r.bufs, b) {
			r.bufs = append(r.bufs, b)
		}
		used = b
	}
	cur := from // as in read
	for i, set := range sets {
		if !r.keep[i] {
			continue
		}
		if set.RecordBatch == nil {
			for _, lm := range r.legacy[r.spans[i][0]:r.spans[i][1]] {
				if len(chunk.ptrs) == cap(chunk.ptrs) {
					flush()
					start(left)
				}
				m := chunk.add(lm.offset, lm.m.Key, lm.m.Value, lm.time, 0)
				m.Buffer = lm.buf
				use(lm.buf)
				left--
				cur = lm.offset + 1
			}
			continue
		}
		b := set.RecordBatch
		buf := r.bufferOf(b) // what this batch's records alias
		for _, rec := range b.Records {
			offset := b.FirstOffset + rec.OffsetDelta
			if offset < cur {
				continue
			}
			cur = offset + 1
			if len(chunk.ptrs) == cap(chunk.ptrs) {
				flush()
				start(left)
			}
			ts := b.MaxTimestamp
			if !b.LogAppendTime {
				ts = b.FirstTimestamp.Add(rec.TimestampDelta)
			}
			m := chunk.add(offset, rec.Key, rec.Value, ts, len(rec.Headers))
			for _, h := range rec.Headers {
				chunk.header(m, h.Key, h.Value)
			}
			m.Buffer = buf
			use(buf)
			left--
		}
	}
	flush()
	return out
}

// bufferOf returns the buffer the records of b alias: the response's for
// an uncompressed batch, one of its own for a compressed one; nil when no
// record holds a byte.
func (r *blockReader) bufferOf(b *sarama.RecordBatch) *dispatch.Buffer {
	for _, rec := range b.Records {
		e := extent(rec.Key, rec.Value)
		for _, h := range rec.Headers {
			e = max(e, extent(h.Key, h.Value))
		}
		if e == 0 {
			continue
		}
		if b.Codec != sarama.CompressionNone {
			return &dispatch.Buffer{Size: e}
		}
		r.respSize = max(r.respSize, e)
		return r.resp
	}
	return nil
}

// chunk is one dispatch batch being filled: its messages, their pointers
// and their headers, each one allocation.
type chunk struct {
	p    int32
	vals []dispatch.Message
	ptrs []*dispatch.Message
	hdrs []dispatch.Header
	prev []dispatch.Header // the headers of the last message before the current one that has some
}

// newChunk returns a chunk of partition p for n messages.
func newChunk(p int32, n int) chunk {
	return chunk{p: p, vals: make([]dispatch.Message, n), ptrs: make([]*dispatch.Message, 0, n)}
}

// add fills the next message of c, which will get headers headers
// (header).
func (c *chunk) add(offset int64, key, value []byte, ts time.Time, headers int) *dispatch.Message {
	if n := len(c.ptrs); n > 0 && len(c.ptrs[n-1].Headers) > 0 {
		c.prev = c.ptrs[n-1].Headers
	}
	m := &c.vals[len(c.ptrs)]
	m.Partition, m.Offset, m.Key, m.Value, m.Timestamp = c.p, offset, key, value, ts
	c.ptrs = append(c.ptrs, m)
	if headers > 0 && cap(c.hdrs)-len(c.hdrs) < headers {
		// Room for as many headers for each message left in the chunk:
		// one allocation when the records carry the same headers.
		c.hdrs = make([]dispatch.Header, 0, headers*(cap(c.ptrs)-len(c.ptrs)+1))
	}
	return m
}

// header appends a header to m, the message added last. A key equal to
// the one at the same index of the previous message with headers reuses its
// string, so records that carry the same header keys allocate those strings
// once per batch.
func (c *chunk) header(m *dispatch.Message, key, value []byte) {
	j := len(m.Headers)
	var k string
	if j < len(c.prev) && c.prev[j].Key == string(key) { // no allocation to compare
		k = c.prev[j].Key
	} else {
		k = string(key)
	}
	first := len(c.hdrs) - j
	c.hdrs = append(c.hdrs, dispatch.Header{Key: k, Value: value})
	m.Headers = c.hdrs[first:len(c.hdrs):len(c.hdrs)]
}
