package protocol

import (
	"io"
	"net"

	"google.golang.org/protobuf/proto"
)

// A vector Writer (NewVectorWriter) does not copy the payloads of the
// frames it encodes (record keys, values and header values of Deliver and
// DeliverBatch frames) into a buffer: it keeps the bytes between them in a
// buffer of its own and refers to the payloads, and Flush hands the pieces
// to the connection in one call, which a TCP connection makes one writev.
// A payload smaller than VectorMin is copied all the same: a piece of the
// list costs the kernel about what copying that much costs here.

// VectorMin is the smallest payload a vector Writer refers to rather than
// copies.
const VectorMin = 512

// vectorFlushAt is how many bytes a vector Writer lets wait before it
// writes them without waiting for Flush: the connection gets the first
// part of a large batch while the rest is encoded.
const vectorFlushAt = 1 << 20

// BuffersWriter writes a list of buffers in one call. A vector Writer
// flushes through it when its writer has one (the daemon's, which puts a
// deadline on the connection first), else through net.Buffers.WriteTo:
// one writev for a *net.TCPConn, one Write per piece for other writers.
type BuffersWriter interface {
	WriteBuffers(b *net.Buffers) (int64, error)
}

// NewVectorWriter returns a Writer like NewWriter's that refers to the
// payloads of at least VectorMin bytes of the Deliver and DeliverBatch
// frames it encodes instead of copying them: they must stay unmodified
// until Flush returns. It suits a TCP connection, where Flush is one writev;
// over TLS, which encrypts each Write in records of its own, NewWriter's
// buffer does better.
func NewVectorWriter(w io.Writer, maxFrameSize int) *Writer {
	return &Writer{
		v:   &vector{dst: w, small: make([]byte, 0, 4<<10)},
		max: limit(maxFrameSize),
		buf: make([]byte, 0, 512),
		opt: proto.MarshalOptions{UseCachedSize: true}, // as NewWriterSize's
	}
}

// vector is the pending output of a vector Writer: pieces of small (the
// bytes it copied) and payloads it refers to, in order.
type vector struct {
	dst    io.Writer
	pieces net.Buffers
	small  []byte // the bytes copied since the last flush
	start  int    // where the bytes of small not yet in pieces start
	n      int    // bytes pending
	err    error  // sticky
}

// copy appends p to the pending bytes.
func (v *vector) copy(p []byte) error {
	v.small = append(v.small, p...)
	v.n += len(p)
	return v.flushIfFull()
}

// copyString is copy for a string.
func (v *vector) copyString(s string) error {
	v.small = append(v.small, s...)
	v.n += len(s)
	return v.flushIfFull()
}

// ref appends p to the pending bytes: referred to when large enough,
// copied otherwise.
func (v *vector) ref(p []byte) {
	if len(p) < VectorMin {
		_ = v.copy(p)
		return
	}
	v.cut()
	v.pieces = append(v.pieces, p)
	v.n += len(p)
	_ = v.flushIfFull()
}

// cut ends the current piece of small: the bytes copied since the last
// payload referred to. Growing small later moves the bytes after it, never
// the pieces already cut.
func (v *vector) cut() {
	if len(v.small) > v.start {
		v.pieces = append(v.pieces, v.small[v.start:len(v.small):len(v.small)])
		v.start = len(v.small)
	}
}

// flushIfFull writes the pending bytes when they reach vectorFlushAt.
func (v *vector) flushIfFull() error {
	if v.n < vectorFlushAt {
		return v.err
	}
	return v.flush()
}

// flush writes the pending bytes in one call (see BuffersWriter).
func (v *vector) flush() error {
	if v.err != nil {
		return v.err
	}
	if v.n == 0 {
		return nil
	}
	v.cut()
	pieces := v.pieces
	if bw, ok := v.dst.(BuffersWriter); ok {
		_, v.err = bw.WriteBuffers(&pieces)
	} else {
		_, v.err = pieces.WriteTo(v.dst)
	}
	clear(v.pieces) // drop the references to the payloads
	v.pieces, v.small, v.start, v.n = v.pieces[:0], v.small[:0], 0, 0
	return v.err
}
