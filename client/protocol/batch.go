package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
)

// Hand-written encoding and decoding of DeliverBatch, the hot frame of
// clients with CAPABILITY_BATCH. WriteDeliverBatch writes the bytes of
// proto.MarshalOptions{Deterministic: true}; ReadBatch decodes the fields
// proto.Unmarshal would, into flat structs that alias the frame's buffer.
// The tests and fuzz targets in batch_test.go and fuzz_test.go compare them
// with the generated code.

// Tags of the DeliverBatch frame and of its repeated Deliver.
const (
	tagFrameDeliverBatch = 13<<3 | byte(protowire.BytesType)
	tagBatchDelivery     = 1<<3 | byte(protowire.BytesType)
)

// DeliverBatchFrame wraps ds in a DeliverBatch Frame.
func DeliverBatchFrame(ds []*Deliver) *Frame {
	return &Frame{Body: &Frame_DeliverBatch{DeliverBatch: &DeliverBatch{Deliveries: ds}}}
}

// WriteDeliverBatch encodes one DeliverBatch frame holding the longest
// prefix of ds whose frame fits in budget bytes (length prefix excluded;
// the Writer's maximum when budget <= 0 or larger) and returns how many
// deliveries it holds. The bytes are those of WriteFrame(DeliverBatchFrame
// (ds[:n])) with proto.MarshalOptions{Deterministic: true}; each payload is
// copied once, straight into the Writer's buffer, or referred to by a
// vector Writer, as by WriteDeliver.
//
// It writes nothing and returns 0 with a *FrameTooLargeError when not even
// ds[0] fits (it may still fit as a Deliver frame, a few bytes smaller),
// with nil for an empty ds, and with an error for a header key that is not
// valid UTF-8 among the deliveries it sized. No element of ds may be nil or
// modified while WriteDeliverBatch runs, nor, for a vector Writer, its
// payloads until Flush.
func (w *Writer) WriteDeliverBatch(ds []*Deliver, budget int) (int, error) {
	limit := w.max
	if budget > 0 {
		limit = min(limit, budget)
	}
	sizes := w.sizes[:0]
	body := 0
	for _, d := range ds {
		dsize, err := deliverSize(d)
		if err != nil {
			return 0, err
		}
		elem := 1 + protowire.SizeVarint(uint64(dsize)) + dsize
		if frameSize(body+elem) > limit {
			if len(sizes) == 0 {
				return 0, &FrameTooLargeError{Size: uint64(frameSize(elem)), Max: limit}
			}
			break
		}
		body += elem
		sizes = append(sizes, dsize)
	}
	w.sizes = sizes
	if len(sizes) == 0 {
		return 0, nil
	}
	b := binary.BigEndian.AppendUint32(w.buf[:0], uint32(frameSize(body)))
	b = append(b, tagFrameDeliverBatch)
	b = protowire.AppendVarint(b, uint64(body))
	for i, dsize := range sizes {
		b = append(b, tagBatchDelivery)
		b = protowire.AppendVarint(b, uint64(dsize))
		b = w.appendDeliver(b, ds[i])
	}
	w.buf = b
	if err := w.write(b); err != nil {
		return 0, fmt.Errorf("write frame: %w", err)
	}
	return len(sizes), nil
}

// frameSize is the size of a Frame holding one length-delimited body of n
// bytes under a one-byte tag.
func frameSize(n int) int { return 1 + protowire.SizeVarint(uint64(n)) + n }

// Delivery is one delivery read by ReadBatch: the fields of a Deliver.
// Key, Value and the header values alias the frame's buffer (Batch.Buf);
// empty ones are nil, as proto.Unmarshal makes them, except an empty Key:
// Key is nil only for a record without a key (the field has presence).
type Delivery struct {
	ID          uint64 // Deliver.delivery_id
	Partition   int32
	Offset      int64
	Key         []byte
	Value       []byte
	Headers     []HeaderField // nil when none
	TimestampMs int64
	Attempt     uint32
}

// HeaderField is one record header of a Delivery.
type HeaderField struct {
	Key   string
	Value []byte
}

// Batch holds the deliveries of one Deliver or DeliverBatch frame read by
// ReadBatch. Buf holds the frame's bytes and is never written again while
// referenced, so Key, Value and header values stay valid as long as they
// are referenced: a buffer allocated for that frame alone, or (a slab
// Reader's) a part of a slab, whose other parts hold other frames;
// Deliveries (and their Headers slices) are reused by the next ReadBatch
// into the same Batch. Header keys are strings of their own, shared with
// the previous delivery's when equal.
type Batch struct {
	Deliveries []Delivery
	Buf        []byte

	headers []HeaderField // backing array of the Deliveries' Headers
}

// ownedAhead is how far ReadBatch allocates a delivery frame's buffer ahead
// of the bytes received: at once up to it, then growing as they arrive
// (see readBody).
const ownedAhead = 1 << 20

// ReadBatch reads the next frame like ReadFrame. A frame of deliveries (a
// Deliver or a DeliverBatch) goes into b, replacing what it held, and
// ReadBatch returns true; any other frame goes into f, as ReadFrame would
// decode it. The deliveries are those proto.Unmarshal decodes (an empty
// DeliverBatch holds none). A frame the hand-written decoder does not take
// (an unknown field, say) is decoded by proto.Unmarshal into f and copied
// into b; its bytes then alias f's messages, not Buf.
//
// Unlike ReadFrame, ReadBatch allocates a delivery frame's buffer (Buf)
// at its declared size up to 1 MiB before the bytes arrive (the size is
// checked against the maximum first); it grows larger ones as bytes arrive.
// A slab Reader allocates none for a frame that fits in a slab.
func (r *Reader) ReadBatch(f *Frame, b *Batch) (bool, error) {
	size, err := r.readHeader()
	if err != nil {
		return false, err
	}
	if size == 0 {
		return false, r.decode(nil, f)
	}
	tag, err := r.peek()
	if err != nil {
		return false, unexpected(err)
	}
	var body []byte
	if tag == tagFrameDeliver || tag == tagFrameDeliverBatch {
		if body, err = r.readOwned(int(size)); err != nil {
			return false, unexpected(err)
		}
		if decodeDeliveries(body, b) {
			b.Buf = body
			return true, nil
		}
	} else if body, err = r.readBody(int(size)); err != nil {
		return false, unexpected(err)
	}
	if err := r.decode(body, f); err != nil {
		return false, err
	}
	if !b.fromFrame(f) {
		return false, nil
	}
	f.Reset()
	return true, nil
}

// DeliveriesBuffered reports whether the next frame is a Deliver or
// DeliverBatch frame within the size limit whose bytes have all been read
// from the connection already: ReadBatch returns it without waiting. (Only
// a slab Reader says so; another reports false.)
func (r *Reader) DeliveriesBuffered() bool {
	if r.sl == nil {
		return false
	}
	body := r.sl.bufferedFrame()
	return len(body) > 0 && len(body) <= r.max && (body[0] == tagFrameDeliver || body[0] == tagFrameDeliverBatch)
}

// unexpected turns the end of the stream inside a frame into
// io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readOwned reads the next n bytes into a new buffer: allocated at once up
// to ownedAhead, growing as bytes arrive beyond.
func readOwned(r io.Reader, n int) ([]byte, error) { return readOwnedAfter(r, n, nil) }

// readOwnedAfter is readOwned for n bytes of which have (at most n) were
// read already: they are copied to the new buffer's start.
func readOwnedAfter(r io.Reader, n int, have []byte) ([]byte, error) {
	b := make([]byte, 0, max(min(n, ownedAhead), len(have)))
	b = append(b, have...)
	for len(b) < n {
		want := min(n, len(b)+max(ownedAhead, len(b)))
		if cap(b) < want {
			nb := make([]byte, len(b), want)
			copy(nb, b)
			b = nb
		}
		m, err := io.ReadFull(r, b[len(b):want])
		b = b[:len(b)+m]
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// fromFrame copies the deliveries of f, a Deliver or DeliverBatch frame,
// into b, aliasing their bytes; false for any other frame.
func (b *Batch) fromFrame(f *Frame) bool {
	var ds []*Deliver
	switch body := f.Body.(type) {
	case *Frame_Deliver:
		ds = []*Deliver{body.Deliver}
	case *Frame_DeliverBatch:
		ds = body.DeliverBatch.GetDeliveries()
	default:
		return false
	}
	b.reset()
	b.Buf = nil
	for _, d := range ds {
		first := len(b.headers)
		for _, h := range d.GetHeaders() {
			b.headers = append(b.headers, HeaderField{Key: h.GetKey(), Value: h.GetValue()})
		}
		b.Deliveries = append(b.Deliveries, Delivery{
			ID: d.GetDeliveryId(), Partition: d.GetPartition(), Offset: d.GetOffset(),
			Key: d.GetKey(), Value: d.GetValue(), Headers: b.headersFrom(first),
			TimestampMs: d.GetTimestampMs(), Attempt: d.GetAttempt(),
		})
	}
	return true
}

func (b *Batch) reset() {
	clear(b.Deliveries) // drop references to the previous frame's bytes
	clear(b.headers)
	b.Deliveries, b.headers = b.Deliveries[:0], b.headers[:0]
}

// headersFrom returns the headers appended since first, nil when none.
func (b *Batch) headersFrom(first int) []HeaderField {
	if first == len(b.headers) {
		return nil
	}
	return b.headers[first:len(b.headers):len(b.headers)]
}

// decodeDeliveries decodes body, the bytes of one Frame, into b when it is
// exactly one Deliver field, or one DeliverBatch field holding only
// Delivers, with only the fields decodeDeliver takes. The bytes alias body.
// It returns false when that is not so or the bytes are malformed; b is
// then garbage, and the caller decodes with proto.Unmarshal.
func decodeDeliveries(body []byte, b *Batch) bool {
	if len(body) < 2 || (body[0] != tagFrameDeliver && body[0] != tagFrameDeliverBatch) {
		return false
	}
	n, m := protowire.ConsumeVarint(body[1:])
	if m < 0 || n != uint64(len(body)-1-m) {
		return false // malformed, or more than one field
	}
	msg := body[1+m:]
	b.reset()
	if body[0] == tagFrameDeliver {
		return b.decodeDeliver(msg)
	}
	for len(msg) > 0 {
		if msg[0] != tagBatchDelivery {
			return false
		}
		v, m := protowire.ConsumeBytes(msg[1:])
		if m < 0 || !b.decodeDeliver(v) {
			return false
		}
		msg = msg[1+m:]
	}
	return true
}

// decodeDeliver appends the delivery encoded in msg, a Deliver message, to
// b, with the rules of decodeDeliver (the function): false for any field
// it does not take.
func (b *Batch) decodeDeliver(msg []byte) bool {
	var d Delivery
	first := len(b.headers)
	// The header keys of the previous delivery, to share equal strings.
	var prev []HeaderField
	if n := len(b.Deliveries); n > 0 {
		prev = b.Deliveries[n-1].Headers
	}
	for i := 0; i < len(msg); {
		tag := msg[i]
		i++
		switch tag {
		case tagDeliveryID, tagPartition, tagOffset, tagTimestamp, tagAttempt:
			v, m := protowire.ConsumeVarint(msg[i:])
			if m < 0 {
				return false
			}
			i += m
			switch tag {
			case tagDeliveryID:
				d.ID = v
			case tagPartition:
				d.Partition = int32(v)
			case tagOffset:
				d.Offset = int64(v)
			case tagTimestamp:
				d.TimestampMs = int64(v)
			default:
				d.Attempt = uint32(v)
			}
		case tagKey, tagValue, tagHeader:
			v, m := protowire.ConsumeBytes(msg[i:])
			if m < 0 {
				return false
			}
			i += m
			switch tag {
			case tagKey:
				d.Key = v[:len(v):len(v)] // presence: an empty key is empty, not nil
			case tagValue:
				d.Value = nilIfEmpty(v)
			default:
				hk, hv, ok := parseHeader(v)
				if !ok {
					return false
				}
				var key string
				if j := len(b.headers) - first; j < len(prev) && prev[j].Key == string(hk) { // no allocation to compare
					key = prev[j].Key
				} else {
					key = string(hk)
				}
				b.headers = append(b.headers, HeaderField{Key: key, Value: nilIfEmpty(hv)})
			}
		default:
			return false
		}
	}
	d.Headers = b.headersFrom(first)
	b.Deliveries = append(b.Deliveries, d)
	return true
}

// nilIfEmpty returns v, or nil when it is empty (as proto.Unmarshal
// decodes an empty proto3 bytes field), capped at its length so that an
// append to it never writes into the next field's bytes.
func nilIfEmpty(v []byte) []byte {
	if len(v) == 0 {
		return nil
	}
	return v[:len(v):len(v)]
}
