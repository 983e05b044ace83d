package protocol

import (
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"sync"
)

// A slab Reader (NewSlabReader) reads the stream into slabs of slabSize
// bytes, each read system call taking as much as has arrived (many frames
// at once), and decodes the frames where they lie: the deliveries ReadBatch
// returns alias the slab (Batch.Buf), and no frame is copied on the way.
// When a frame does not fit in what is left of a slab, the reader goes on
// in another, taking along the frame's bytes already read; a frame larger
// than a slab gets a buffer of its own.
//
// A slab is never written again while anything references it: a batch
// aliasing it keeps it alive, and so does the reader while it reads into
// it. Once the garbage collector finds it unreachable, its finalizer puts
// it in slabFree, and the next slab a reader needs comes from there. A
// client receiving at full speed thus reads into the same few slabs, where
// allocating a buffer for every frame made the garbage collector run every
// few megabytes and clear every buffer before use.

// slabSize is the size of the slabs of a slab Reader: about four of the
// daemon's largest DeliverBatch frames (256 KiB).
const slabSize = 1 << 20

// maxFreeSlabs bounds the slabs kept for reuse, shared by the readers of
// the process (the memory they hold when nothing is received).
const maxFreeSlabs = 8

// slab is the memory of one slab.
type slab [slabSize]byte

// slabFree holds the slabs no longer referenced, for reuse.
var slabFree struct {
	mu    sync.Mutex
	slabs []*slab
}

// newSlab returns a slab from slabFree, or a new one, armed to return to
// slabFree once unreachable.
func newSlab() *slab {
	slabFree.mu.Lock()
	var s *slab
	if n := len(slabFree.slabs); n > 0 {
		s = slabFree.slabs[n-1]
		slabFree.slabs[n-1] = nil
		slabFree.slabs = slabFree.slabs[:n-1]
	}
	slabFree.mu.Unlock()
	if s == nil {
		s = new(slab)
	}
	runtime.SetFinalizer(s, freeSlab)
	return s
}

// freeSlab is the finalizer of a slab: nothing references it any more, so
// it may be written again. Beyond maxFreeSlabs it is left to the collector.
func freeSlab(s *slab) {
	slabFree.mu.Lock()
	defer slabFree.mu.Unlock()
	if len(slabFree.slabs) < maxFreeSlabs {
		slabFree.slabs = append(slabFree.slabs, s)
	}
}

// slabs is the read-ahead of a slab Reader: the slab read into, the bytes
// read so far (buf, a prefix of cur) and the first not yet consumed (pos).
type slabs struct {
	rd  io.Reader
	cur *slab
	buf []byte
	pos int
}

// NewSlabReader returns a Reader like NewReader that reads ahead into slabs
// of 1 MiB, each read system call taking as much as has arrived, instead of
// a 32 KiB buffer: the deliveries ReadBatch returns alias the slab they
// were read into (Batch.Buf), which no frame is copied into on the way and
// which is written again only once nothing references it. It suits a
// connection that receives many deliveries; each such reader holds a slab.
func NewSlabReader(r io.Reader, maxFrameSize int) *Reader {
	return &Reader{sl: &slabs{rd: r}, max: limit(maxFrameSize)}
}

// buffered returns how many bytes are read and not yet consumed.
func (s *slabs) buffered() int { return len(s.buf) - s.pos }

// fill makes at least n bytes (n <= slabSize) available at s.buf[s.pos:],
// reading as much as has arrived with each read. At the end of the stream
// it returns io.EOF when nothing was available, io.ErrUnexpectedEOF when
// some but fewer than n bytes were.
func (s *slabs) fill(n int) error {
	for s.buffered() < n {
		if s.cur == nil || slabSize-s.pos < n {
			s.move()
		}
		m, err := s.rd.Read(s.cur[len(s.buf):])
		s.buf = s.cur[:len(s.buf)+m]
		if err != nil && s.buffered() < n {
			if errors.Is(err, io.EOF) && s.buffered() > 0 {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// move goes on in another slab, taking along the bytes not yet consumed.
func (s *slabs) move() {
	next := newSlab()
	n := copy(next[:], s.buf[s.pos:])
	s.cur, s.buf, s.pos = next, next[:n], 0
}

// take consumes the next n bytes (n <= slabSize) and returns them, capped
// at their length: they alias the slab.
func (s *slabs) take(n int) ([]byte, error) {
	if err := s.fill(n); err != nil {
		return nil, err
	}
	b := s.buf[s.pos : s.pos+n : s.pos+n]
	s.pos += n
	return b, nil
}

// takeLarge consumes the next n bytes (n > slabSize) into a buffer of
// their own, allocated at once up to ownedAhead and growing as bytes
// arrive beyond (as readOwned does).
func (s *slabs) takeLarge(n int) ([]byte, error) {
	have := s.buf[s.pos:]
	s.pos = len(s.buf)
	return readOwnedAfter(s.rd, n, have)
}

// peek returns the next byte without consuming it.
func (s *slabs) peek() (byte, error) {
	if err := s.fill(1); err != nil {
		return 0, err
	}
	return s.buf[s.pos], nil
}

// bufferedFrame returns the bytes of the next frame when the whole frame
// is buffered, else nil.
func (s *slabs) bufferedFrame() []byte {
	b := s.buf[s.pos:]
	if len(b) < HeaderSize {
		return nil
	}
	n := int(binary.BigEndian.Uint32(b))
	if len(b)-HeaderSize < n {
		return nil
	}
	return b[HeaderSize : HeaderSize+n]
}
