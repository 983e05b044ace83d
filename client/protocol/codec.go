package protocol

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Version is the protocol version this package speaks (Hello.protocol_version).
const Version = 1

// DefaultMaxFrameSize is the largest frame accepted when none is configured:
// 4 MiB of protobuf bytes, not counting the 4-byte length prefix.
const DefaultMaxFrameSize = 4 << 20

// MaxHelloSize is the largest Hello frame a daemon accepts: a Hello holds a
// client id and an auth token, and a connection that has not said hello yet
// must not make the daemon read megabytes.
const MaxHelloSize = 4 << 10

// HeaderSize is the size of the big-endian length prefix of every frame.
const HeaderSize = 4

// ErrBadFrame is wrapped by every error about a frame whose bytes do not decode.
var ErrBadFrame = errors.New("bad frame")

// FrameTooLargeError reports a frame longer than the maximum frame size. A
// Reader returns it before allocating or reading the frame's body.
type FrameTooLargeError struct {
	Size uint64 // the declared or encoded size
	Max  int    // the limit in force
}

// Error describes the sizes.
func (e *FrameTooLargeError) Error() string {
	return fmt.Sprintf("frame of %d bytes exceeds the maximum of %d", e.Size, e.Max)
}

// TooManyIDsError reports an Ack, Nack or Touch frame naming more delivery
// ids than a Reader's limit (SetMaxIDs), counting the ids listed and those
// of the ranges. The Reader returns it after reading the frame's bytes:
// before decoding them when the ids listed and the ranges (each names at
// least one id) already pass the limit, so they are never allocated; else
// after decoding, when the ranges' counts do. The stream stays in step.
type TooManyIDsError struct {
	Count int // the ids the frame names
	Max   int // the limit in force
}

// Error describes the counts.
func (e *TooManyIDsError) Error() string {
	return fmt.Sprintf("frame names %d delivery ids, more than the %d allowed", e.Count, e.Max)
}

// limit returns the frame size limit in force for a configured maximum: the
// default for a non-positive one, and never more than a 4-byte length prefix
// can express.
func limit(maxFrameSize int) int {
	if maxFrameSize <= 0 {
		return DefaultMaxFrameSize
	}
	return int(min(uint64(maxFrameSize), math.MaxUint32))
}

// growStep is how much a Reader's buffer may grow ahead of the bytes that
// have actually arrived.
const growStep = 64 << 10

// keepBuffer is the largest frame buffer a Reader keeps between frames: after
// a larger frame the buffer is released, so that one large frame does not pin
// its size for the life of the connection.
const keepBuffer = 64 << 10

// Reader reads length-prefixed frames. It reuses one buffer for the frame
// bytes (a slab Reader, NewSlabReader, reads into slabs); messages decoded
// by ReadFrame never alias it. A Reader is not safe for
// concurrent use. After any error other than one wrapping ErrBadFrame or a
// *TooManyIDsError the stream is out of step and the Reader must not be used
// again.
type Reader struct {
	r       *bufio.Reader // nil for a slab Reader
	sl      *slabs        // a slab Reader's (NewSlabReader)
	max     int
	maxIDs  int // 0: no limit
	hdr     [HeaderSize]byte
	buf     []byte
	started bool // a frame's header was read: HTTP is looked for only before
}

// NewReader returns a Reader that refuses frames larger than maxFrameSize
// bytes (DefaultMaxFrameSize when maxFrameSize <= 0). It buffers r.
func NewReader(r io.Reader, maxFrameSize int) *Reader {
	return NewReaderSize(r, maxFrameSize, 32<<10)
}

// NewReaderSize is NewReader with a read-ahead buffer of bufSize bytes
// instead of 32 KiB (at least 16). Frames larger than it are read straight
// into the frame buffer, so a small one costs only more system calls for
// streams of small frames.
func NewReaderSize(r io.Reader, maxFrameSize, bufSize int) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, bufSize), max: limit(maxFrameSize)}
}

// SetMaxFrameSize changes the largest frame the Reader accepts from the next
// frame on (DefaultMaxFrameSize when maxFrameSize <= 0). The daemon reads a
// Hello under a small limit and raises it once the session is open.
func (r *Reader) SetMaxFrameSize(maxFrameSize int) { r.max = limit(maxFrameSize) }

// SetMaxIDs limits the delivery ids one Ack, Nack or Touch frame may name,
// in its list and its ranges together; 0 (the default) means no limit. A
// frame naming more is refused with a *TooManyIDsError.
func (r *Reader) SetMaxIDs(n int) { r.maxIDs = max(n, 0) }

// ReadFrame reads the next frame into f, replacing its contents. It returns
// io.EOF at a clean end between frames, io.ErrUnexpectedEOF for a frame cut
// short, a *FrameTooLargeError for a declared length above the maximum, a
// *TooManyIDsError for an Ack, Nack or Touch above the SetMaxIDs limit, an
// error wrapping ErrBadFrame for bytes that do not decode (or ranges that
// CheckRanges refuses), a *HTTPError when the stream starts as HTTP does,
// or the underlying read error.
func (r *Reader) ReadFrame(f *Frame) error {
	size, err := r.readHeader()
	if err != nil {
		return err
	}
	body, err := r.readBody(int(size))
	if err != nil {
		return unexpected(err)
	}
	return r.decode(body, f)
}

// readHeader reads a frame's length prefix and checks it: against the
// maximum, and for the stream's first frame, against HTTP's first bytes.
func (r *Reader) readHeader() (uint32, error) {
	if r.sl != nil {
		hdr, err := r.sl.take(HeaderSize)
		if err != nil {
			return 0, err
		}
		copy(r.hdr[:], hdr)
	} else if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		return 0, err
	}
	if !r.started {
		r.started = true
		if err := httpStart(r.hdr); err != nil {
			return 0, err
		}
	}
	size := binary.BigEndian.Uint32(r.hdr[:])
	if uint64(size) > uint64(r.max) {
		return 0, &FrameTooLargeError{Size: uint64(size), Max: r.max}
	}
	return size, nil
}

// decode decodes body, the bytes of one frame, into f (ReadFrame).
func (r *Reader) decode(body []byte, f *Frame) error {
	if cap(r.buf) > keepBuffer {
		// Decoded messages never alias the buffer: the next frame starts
		// from a small one again.
		defer func() { r.buf = nil }()
	}
	if r.maxIDs > 0 {
		if n := countIDs(body); n > r.maxIDs {
			return &TooManyIDsError{Count: n, Max: r.maxIDs}
		}
	}
	if d := decodeDeliver(body); d != nil {
		// The fast path for the hot frame; the result is what
		// proto.Unmarshal would give. Reset, as Unmarshal does, drops what
		// f held before.
		f.Reset()
		f.Body = d
		return nil
	}
	if err := proto.Unmarshal(body, f); err != nil {
		return fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	if f.Body == nil {
		return fmt.Errorf("%w: frame has no body", ErrBadFrame)
	}
	return r.checkIDs(f)
}

// Field numbers of the Frame bodies that carry delivery ids.
const (
	fieldAck   = 5
	fieldNack  = 6
	fieldTouch = 7
)

// countIDs counts, without decoding them, the delivery ids listed (field 1,
// one per varint, packed or not) and the ranges (field 2, one per pair of
// varints: a range names at least one id) of the Ack, Nack and Touch bodies
// of an encoded Frame, in every occurrence of those bodies. Protobuf merges
// repeated occurrences of a body and drops them for another body of the
// oneof, so what decodes never holds more than it counts: it bounds what
// decoding allocates (checkIDs counts the ids of the ranges after). It stops
// at the first malformed field; Unmarshal then reports the frame as bad.
func countIDs(b []byte) int {
	n := 0
	for len(b) > 0 {
		num, typ, tn := protowire.ConsumeTag(b)
		if tn < 0 {
			return n
		}
		b = b[tn:]
		if typ == protowire.BytesType && (num == fieldAck || num == fieldNack || num == fieldTouch) {
			msg, mn := protowire.ConsumeBytes(b)
			if mn < 0 {
				return n
			}
			ids, rangeValues := countVarints(msg)
			n += ids + (rangeValues+1)/2
			b = b[mn:]
			continue
		}
		fn := protowire.ConsumeFieldValue(num, typ, b)
		if fn < 0 {
			return n
		}
		b = b[fn:]
	}
	return n
}

// countVarints counts the values of fields 1 and 2 in an encoded Ack, Nack
// or Touch: the varints of a packed run end in bytes below 0x80.
func countVarints(b []byte) (ids, ranges int) {
	for len(b) > 0 {
		num, typ, tn := protowire.ConsumeTag(b)
		if tn < 0 {
			return ids, ranges
		}
		b = b[tn:]
		var n *int
		switch num {
		case 1:
			n = &ids
		case 2:
			n = &ranges
		}
		switch {
		case n != nil && typ == protowire.VarintType:
			*n++
		case n != nil && typ == protowire.BytesType:
			packed, pn := protowire.ConsumeBytes(b)
			if pn < 0 {
				return ids, ranges
			}
			for _, c := range packed {
				if c < 0x80 {
					*n++
				}
			}
		}
		fn := protowire.ConsumeFieldValue(num, typ, b)
		if fn < 0 {
			return ids, ranges
		}
		b = b[fn:]
	}
	return ids, ranges
}

// idsOf returns the delivery ids and ranges of an Ack, Nack or Touch body;
// ok is false for any other frame.
func idsOf(f *Frame) (ids, ranges []uint64, ok bool) {
	switch b := f.Body.(type) {
	case *Frame_Ack:
		return b.Ack.GetDeliveryIds(), b.Ack.GetRanges(), true
	case *Frame_Nack:
		return b.Nack.GetDeliveryIds(), b.Nack.GetRanges(), true
	case *Frame_Touch:
		return b.Touch.GetDeliveryIds(), b.Touch.GetRanges(), true
	}
	return nil, nil, false
}

// CheckRanges reports whether ranges is a valid list of delivery id ranges
// (Ack.ranges): pairs of a first id and a count of at least 1, the last id
// of each (first + count - 1) not past 2^64-1. It returns how many ids they
// name, or an error wrapping ErrBadFrame.
func CheckRanges(ranges []uint64) (uint64, error) {
	if len(ranges)%2 != 0 {
		return 0, fmt.Errorf("%w: %d range values, not pairs of a first id and a count", ErrBadFrame, len(ranges))
	}
	var n uint64
	for i := 0; i < len(ranges); i += 2 {
		first, count := ranges[i], ranges[i+1]
		if count == 0 || first+(count-1) < first {
			return 0, fmt.Errorf("%w: range of %d ids from %d", ErrBadFrame, count, first)
		}
		if n += count; n < count {
			n = math.MaxUint64 // saturate: more than any limit
		}
	}
	return n, nil
}

// checkIDs checks the ranges of a decoded Ack, Nack or Touch and, with a
// limit, the number of ids it names: the list's and the ranges'.
func (r *Reader) checkIDs(f *Frame) error {
	ids, ranges, ok := idsOf(f)
	if !ok {
		return nil
	}
	n, err := CheckRanges(ranges)
	if err != nil {
		return err
	}
	if n += uint64(len(ids)); r.maxIDs > 0 && n > uint64(r.maxIDs) {
		return &TooManyIDsError{Count: int(min(n, math.MaxInt)), Max: r.maxIDs}
	}
	return nil
}

// readBody reads the next n bytes into the reused buffer. A body larger than
// the buffer grows it at most growStep (or doubling) ahead of the bytes
// actually received, so a peer that declares a large frame and then sends
// little cannot make the Reader allocate the whole declared size.
func (r *Reader) readBody(n int) ([]byte, error) {
	if r.sl != nil && n <= slabSize {
		return r.sl.take(n) // decoded messages never alias it: nothing keeps the slab
	}
	if r.sl != nil {
		return r.sl.takeLarge(n)
	}
	if n <= cap(r.buf) {
		_, err := io.ReadFull(r.r, r.buf[:n])
		return r.buf[:n], err
	}
	b := r.buf[:0]
	for len(b) < n {
		want := min(n, len(b)+max(growStep, len(b)))
		if cap(b) < want {
			nb := make([]byte, len(b), want)
			copy(nb, b)
			b = nb
			r.buf = nb
		}
		m, err := io.ReadFull(r.r, b[len(b):want])
		b = b[:len(b)+m]
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// readOwned reads the next n bytes into memory that nothing else will write
// (ReadBatch's deliveries alias it): a new buffer, or a slab's bytes.
func (r *Reader) readOwned(n int) ([]byte, error) {
	switch {
	case r.sl == nil:
		return readOwned(r.r, n)
	case n <= slabSize:
		return r.sl.take(n)
	}
	return r.sl.takeLarge(n)
}

// peek returns the next byte without consuming it.
func (r *Reader) peek() (byte, error) {
	if r.sl != nil {
		return r.sl.peek()
	}
	b, err := r.r.Peek(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

// Buffered reports how many bytes are read from the connection but not yet
// decoded.
func (r *Reader) Buffered() int {
	if r.sl != nil {
		return r.sl.buffered()
	}
	return r.r.Buffered()
}

// Writer writes length-prefixed frames into a buffer. Nothing reaches the
// underlying writer until the buffer fills or Flush is called, so many frames
// can share one system call. A Writer is not safe for concurrent use.
type Writer struct {
	w     *bufio.Writer // nil for a vector Writer
	v     *vector       // a vector Writer's (vector.go)
	max   int
	buf   []byte
	sizes []int // WriteDeliverBatch: the size of each Deliver of the frame
	opt   proto.MarshalOptions
}

// NewWriter returns a Writer that refuses to encode frames larger than
// maxFrameSize bytes (DefaultMaxFrameSize when maxFrameSize <= 0).
func NewWriter(w io.Writer, maxFrameSize int) *Writer {
	return NewWriterSize(w, maxFrameSize, 64<<10)
}

// NewWriterSize is NewWriter with a buffer of bufSize bytes instead of
// 64 KiB: frames written before a Flush share system calls up to that size.
func NewWriterSize(w io.Writer, maxFrameSize, bufSize int) *Writer {
	return &Writer{
		w:   bufio.NewWriterSize(w, bufSize),
		max: limit(maxFrameSize),
		buf: make([]byte, 0, 512),
		// WriteFrame sizes f first (refreshing its size cache); marshal
		// reuses those sizes rather than computing them again.
		opt: proto.MarshalOptions{UseCachedSize: true},
	}
}

// SetMaxFrameSize changes the largest frame the Writer encodes
// (DefaultMaxFrameSize when maxFrameSize <= 0).
func (w *Writer) SetMaxFrameSize(maxFrameSize int) { w.max = limit(maxFrameSize) }

// WriteFrame encodes f into the buffer. It returns a *FrameTooLargeError,
// without encoding or writing anything, when the encoded frame would exceed
// the maximum. f must not be modified while WriteFrame runs.
func (w *Writer) WriteFrame(f *Frame) error {
	// Not w.opt: with UseCachedSize, Size would return a stale size for a
	// Frame modified since it was last written.
	size := proto.Size(f)
	if size > w.max {
		return &FrameTooLargeError{Size: uint64(size), Max: w.max}
	}
	buf, err := w.opt.MarshalAppend(w.buf[:HeaderSize], f)
	if err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	w.buf = buf
	if len(buf)-HeaderSize != size {
		return fmt.Errorf("encode frame: %d bytes encoded, %d sized: frame modified during WriteFrame", len(buf)-HeaderSize, size)
	}
	binary.BigEndian.PutUint32(buf, uint32(size))
	if err := w.write(buf); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// Flush writes the buffered frames to the underlying writer.
func (w *Writer) Flush() error {
	var err error
	if w.v != nil {
		err = w.v.flush()
	} else {
		err = w.w.Flush()
	}
	if err != nil {
		return fmt.Errorf("flush frames: %w", err)
	}
	return nil
}

// Buffered reports how many encoded bytes wait for Flush.
func (w *Writer) Buffered() int {
	if w.v != nil {
		return w.v.n
	}
	return w.w.Buffered()
}

// write writes bytes of a frame that the Writer copies; errors are sticky.
func (w *Writer) write(p []byte) error {
	if w.v != nil {
		return w.v.copy(p)
	}
	_, err := w.w.Write(p)
	return err
}

// payload writes a payload of a frame: copied, or referred to by a vector
// Writer when large enough; errors are sticky (the next write reports
// them).
func (w *Writer) payload(p []byte) {
	if w.v != nil {
		w.v.ref(p)
		return
	}
	_, _ = w.w.Write(p)
}

// writeString writes a string of a frame (a header key), copied; errors
// are sticky.
func (w *Writer) writeString(s string) {
	if w.v != nil {
		_ = w.v.copyString(s)
		return
	}
	_, _ = w.w.WriteString(s)
}
