package protocol

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Hand-written encoding and decoding of the one hot frame, a Frame holding a
// Deliver. Both produce exactly what the generated code does: WriteDeliver
// writes the bytes of proto.MarshalOptions{Deterministic: true} and
// decodeDeliver builds the message proto.Unmarshal would build. The tests and
// fuzz targets in deliver_test.go and fuzz_test.go compare them with it.

// Tags (field number << 3 | wire type) of the fields on the fast paths. All
// fit in one byte.
const (
	tagFrameDeliver = 4<<3 | byte(protowire.BytesType)

	tagDeliveryID = 1<<3 | byte(protowire.VarintType)
	tagPartition  = 2<<3 | byte(protowire.VarintType)
	tagOffset     = 3<<3 | byte(protowire.VarintType)
	tagKey        = 4<<3 | byte(protowire.BytesType)
	tagValue      = 5<<3 | byte(protowire.BytesType)
	tagHeader     = 6<<3 | byte(protowire.BytesType)
	tagTimestamp  = 7<<3 | byte(protowire.VarintType)
	tagAttempt    = 8<<3 | byte(protowire.VarintType)

	tagHeaderKey   = 1<<3 | byte(protowire.BytesType)
	tagHeaderValue = 2<<3 | byte(protowire.BytesType)
)

// sizeVarintField returns the encoded size of a proto3 varint field with a
// one-byte tag: nothing for zero.
func sizeVarintField(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

// sizeBytesField returns the encoded size of a proto3 bytes or string field
// of n bytes with a one-byte tag: nothing when empty.
func sizeBytesField(n int) int {
	if n == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(uint64(n)) + n
}

// appendVarintField appends a proto3 varint field, nothing for zero.
func appendVarintField(b []byte, tag byte, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(append(b, tag), v)
}

// sizeKeyField returns the encoded size of Deliver.key, a bytes field with
// presence: nothing for a nil key, a tag and a length for an empty one.
func sizeKeyField(key []byte) int {
	if key == nil {
		return 0
	}
	return 1 + protowire.SizeVarint(uint64(len(key))) + len(key)
}

// appendBytesHeader appends the tag and length of a proto3 bytes or string
// field of n bytes, nothing when empty. The caller writes the n bytes.
func appendBytesHeader(b []byte, tag byte, n int) []byte {
	if n == 0 {
		return b
	}
	return protowire.AppendVarint(append(b, tag), uint64(n))
}

// headerSize returns the encoded size of h, which may be nil (encoded, like
// the generated code does, as an empty message).
func headerSize(h *Header) int {
	if h == nil {
		return 0
	}
	return sizeBytesField(len(h.Key)) + sizeBytesField(len(h.Value)) + len(h.unknownFields)
}

// deliverSize returns the encoded size of d. Like proto.Marshal it fails for
// a header key that is not valid UTF-8.
func deliverSize(d *Deliver) (int, error) {
	n := sizeVarintField(d.DeliveryId) +
		sizeVarintField(uint64(int64(d.Partition))) + // negative int32s take 10 bytes
		sizeVarintField(uint64(d.Offset)) +
		sizeKeyField(d.Key) +
		sizeBytesField(len(d.Value)) +
		sizeVarintField(uint64(d.TimestampMs)) +
		sizeVarintField(uint64(d.Attempt)) +
		len(d.unknownFields)
	for i, h := range d.Headers {
		if h != nil && !utf8.ValidString(h.Key) {
			return 0, fmt.Errorf("encode frame: key of header %d is not valid UTF-8", i)
		}
		// An element of a repeated field is written even when empty.
		hn := headerSize(h)
		n += 1 + protowire.SizeVarint(uint64(hn)) + hn
	}
	return n, nil
}

// WriteDeliver encodes the frame Frame{Body: &Frame_Deliver{Deliver: d}} into
// the buffer, like WriteFrame(DeliverFrame(d)) but without an intermediate
// buffer: the key, value and header bytes are copied once, straight into the
// Writer's buffer (or written through when larger than it); a vector Writer
// (NewVectorWriter) refers to the larger ones instead, until Flush. The
// bytes are those of proto.MarshalOptions{Deterministic: true}, unknown
// fields included.
//
// It returns a *FrameTooLargeError when the encoded frame would exceed the
// maximum, and an error when a header key is not valid UTF-8 (which
// proto.Marshal refuses as well; the daemon repairs keys before it gets
// here); in both cases it writes nothing. d must not be modified while
// WriteDeliver runs, nor, for a vector Writer, its payloads until Flush.
func (w *Writer) WriteDeliver(d *Deliver) error {
	dsize, err := deliverSize(d)
	if err != nil {
		return err
	}
	size := 1 + protowire.SizeVarint(uint64(dsize)) + dsize
	if size > w.max {
		return &FrameTooLargeError{Size: uint64(size), Max: w.max}
	}
	// b collects the small bytes between the payloads. Errors of the
	// bufio.Writer are sticky: the last Write reports any earlier one.
	b := binary.BigEndian.AppendUint32(w.buf[:0], uint32(size))
	b = append(b, tagFrameDeliver)
	b = protowire.AppendVarint(b, uint64(dsize))
	b = w.appendDeliver(b, d)
	w.buf = b
	if err := w.write(b); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// appendDeliver encodes the fields of d after the bytes pending in b: each
// payload (key, value, header key and value) is written after the pending
// bytes before it (copied, or in a vector Writer referenced: payload), and
// the bytes after the last one are returned, still pending. Write errors
// are sticky: the caller's last write reports them.
func (w *Writer) appendDeliver(b []byte, d *Deliver) []byte {
	b = appendVarintField(b, tagDeliveryID, d.DeliveryId)
	b = appendVarintField(b, tagPartition, uint64(int64(d.Partition)))
	b = appendVarintField(b, tagOffset, uint64(d.Offset))
	if d.Key != nil { // a field with presence: an empty key is written
		b = protowire.AppendVarint(append(b, tagKey), uint64(len(d.Key)))
		if len(d.Key) > 0 {
			_ = w.write(b)
			w.payload(d.Key)
			b = b[:0]
		}
	}
	if b = appendBytesHeader(b, tagValue, len(d.Value)); len(d.Value) > 0 {
		_ = w.write(b)
		w.payload(d.Value)
		b = b[:0]
	}
	for _, h := range d.Headers {
		b = protowire.AppendVarint(append(b, tagHeader), uint64(headerSize(h)))
		if h == nil {
			continue
		}
		if b = appendBytesHeader(b, tagHeaderKey, len(h.Key)); len(h.Key) > 0 {
			_ = w.write(b)
			w.writeString(h.Key)
			b = b[:0]
		}
		if b = appendBytesHeader(b, tagHeaderValue, len(h.Value)); len(h.Value) > 0 {
			_ = w.write(b)
			w.payload(h.Value)
			b = b[:0]
		}
		b = append(b, h.unknownFields...)
	}
	b = appendVarintField(b, tagTimestamp, uint64(d.TimestampMs))
	b = appendVarintField(b, tagAttempt, uint64(d.Attempt))
	return append(b, d.unknownFields...)
}

// deliverAlloc holds a decoded Deliver and its oneof wrapper in one
// allocation.
type deliverAlloc struct {
	body Frame_Deliver
	msg  Deliver
}

// decodeDeliver decodes body, the bytes of one Frame, when it is exactly one
// Deliver field holding only fields of Deliver (and of its Headers) known to
// this version, each with its expected wire type and a one-byte tag. It
// returns nil when that is not so, or the bytes are malformed; the caller
// then decodes with proto.Unmarshal, which gives the same result or error as
// before the fast path existed.
//
// The result is what proto.Unmarshal would produce: the last occurrence of a
// non-repeated field wins, empty bytes fields are nil (but a key present and
// empty is empty, not nil: the field has presence), and nothing aliases
// body. The key, value and header values share one new allocation (each
// capped at its length) and the header keys one string.
func decodeDeliver(body []byte) *Frame_Deliver {
	if len(body) < 2 || body[0] != tagFrameDeliver {
		return nil
	}
	n, m := protowire.ConsumeVarint(body[1:])
	if m < 0 || n != uint64(len(body)-1-m) {
		return nil // malformed, or more than one field
	}
	msg := body[1+m:]

	// First pass: validate, take the scalars and size the allocations.
	var id, partition, offset, timestamp, attempt uint64
	var key, value []byte
	var hasKey bool
	var headers, data, keyBytes int
	for i := 0; i < len(msg); {
		tag := msg[i]
		i++
		switch tag {
		case tagDeliveryID, tagPartition, tagOffset, tagTimestamp, tagAttempt:
			v, m := protowire.ConsumeVarint(msg[i:])
			if m < 0 {
				return nil
			}
			i += m
			switch tag {
			case tagDeliveryID:
				id = v
			case tagPartition:
				partition = v
			case tagOffset:
				offset = v
			case tagTimestamp:
				timestamp = v
			default:
				attempt = v
			}
		case tagKey, tagValue, tagHeader:
			v, m := protowire.ConsumeBytes(msg[i:])
			if m < 0 {
				return nil
			}
			i += m
			switch tag {
			case tagKey:
				key, hasKey = v, true
			case tagValue:
				value = v
			default:
				hk, hv, ok := parseHeader(v)
				if !ok {
					return nil
				}
				headers++
				data += len(hv)
				keyBytes += len(hk)
			}
		default:
			return nil
		}
	}
	data += len(key) + len(value)

	// Second pass, with the sizes known: copy the bytes.
	a := new(deliverAlloc)
	d := &a.msg
	d.DeliveryId, d.Partition, d.Offset = id, int32(partition), int64(offset)
	d.TimestampMs, d.Attempt = int64(timestamp), uint32(attempt)
	buf := make([]byte, 0, data)
	take := func(v []byte) []byte {
		if len(v) == 0 {
			return nil
		}
		start := len(buf)
		buf = append(buf, v...)
		return buf[start:len(buf):len(buf)]
	}
	d.Key, d.Value = take(key), take(value)
	if hasKey && d.Key == nil {
		d.Key = []byte{} // present and empty: no record key is nil
	}
	if headers > 0 {
		var keys strings.Builder
		keys.Grow(keyBytes)
		hs := make([]Header, headers)
		d.Headers = make([]*Header, headers)
		var endsArr [16]int // where each key ends in keys
		ends := endsArr[:0]
		j := 0
		for i := 0; i < len(msg); {
			tag := msg[i]
			i++
			if tag&7 == byte(protowire.VarintType) {
				_, m := protowire.ConsumeVarint(msg[i:])
				i += m
				continue
			}
			v, m := protowire.ConsumeBytes(msg[i:])
			i += m
			if tag != tagHeader {
				continue
			}
			hk, hv, _ := parseHeader(v)
			keys.Write(hk)
			ends = append(ends, keys.Len())
			hs[j].Value = take(hv)
			d.Headers[j] = &hs[j]
			j++
		}
		all, start := keys.String(), 0
		for j, end := range ends {
			hs[j].Key = all[start:end]
			start = end
		}
	}
	a.body.Deliver = d
	return &a.body
}

// parseHeader returns the key and value of an encoded Header, or false if it
// holds anything but those two fields, is malformed, or has a key that is
// not valid UTF-8 (which proto.Unmarshal refuses).
func parseHeader(b []byte) (key, value []byte, ok bool) {
	for i := 0; i < len(b); {
		tag := b[i]
		i++
		if tag != tagHeaderKey && tag != tagHeaderValue {
			return nil, nil, false
		}
		v, m := protowire.ConsumeBytes(b[i:])
		if m < 0 {
			return nil, nil, false
		}
		i += m
		if tag == tagHeaderValue {
			value = v
			continue
		}
		if !utf8.Valid(v) {
			return nil, nil, false
		}
		key = v
	}
	return key, value, true
}
