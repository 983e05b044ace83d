package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"google.golang.org/protobuf/proto"
)

// sampleFrames returns one frame of every type, with every field set, and a
// few edge cases (empty bodies).
func sampleFrames() []struct {
	name  string
	frame *Frame
} {
	return []struct {
		name  string
		frame *Frame
	}{
		{"hello", HelloFrame(&Hello{ClientId: "worker-1", ProtocolVersion: Version, MaxInFlight: 32, AuthToken: "s3cret"})},
		{"hello empty", HelloFrame(&Hello{})},
		{"hello policies", HelloFrame(&Hello{ProtocolVersion: Version, Weight: 5, Observer: true})},
		{"hello capabilities", HelloFrame(&Hello{ProtocolVersion: Version, Capabilities: []Capability{Capability_CAPABILITY_MEMBERS, 99}})},
		{"welcome", WelcomeFrame(&Welcome{
			NodeId: "node-a", SessionId: 99, ProtocolVersion: Version, MaxInFlight: 16,
			AckTimeoutMs: 30000, HeartbeatMs: 5000, LivenessIntervals: 3,
			MaxFrameSize: DefaultMaxFrameSize, Topic: "orders", Observer: true,
		})},
		{"welcome members", WelcomeFrame(&Welcome{NodeId: "node-a", ProtocolVersion: Version,
			Members: MemberList([]string{"10.0.0.1:4987", "10.0.0.2:4987"})})},
		{"members", MembersFrame([]string{"10.0.0.1:4987", "10.0.0.2:4987", "[::1]:4987"}, nil)},
		{"members empty", MembersFrame(nil, nil)},
		{"redirect", RedirectFrame("10.0.0.2:4987", "node-b", 7)},
		{"deliver", DeliverFrame(&Deliver{
			DeliveryId: 1 << 40, Partition: 3, Offset: 1 << 33, Key: []byte("k"),
			Value:       []byte("hello, world"),
			Headers:     []*Header{{Key: "a", Value: []byte{0, 1, 2}}, {Key: "b"}},
			TimestampMs: 1764672000000, Attempt: 2,
		})},
		{"deliver negative", DeliverFrame(&Deliver{Partition: -1, Offset: -2, TimestampMs: -3})},
		{"ack", AckFrame([]uint64{1, 2, 3, 1 << 63})},
		{"ack empty", AckFrame(nil)},
		{"nack", NackFrame([]uint64{42})},
		{"nack delayed", NackWithFrame([]uint64{42, 43}, 1500*time.Millisecond, "db down")},
		{"touch", TouchFrame([]uint64{7, 8})},
		{"ping", PingFrame(0xdeadbeef)},
		{"ping zero", PingFrame(0)},
		{"pong", PongFrame(0xdeadbeef)},
		{"error", ErrorFrame(ErrorCode_ERROR_CODE_NO_LEADER, true, "no leader for %s", "orders")},
		{"error nonfatal", ErrorFrame(ErrorCode_ERROR_CODE_UNEXPECTED_FRAME, false, "ack before hello")},
		{"goodbye", GoodbyeFrame("shutting down")},
	}
}

// readers are the Reader constructors: the tests of reading run with each.
var readers = []struct {
	name string
	make func(io.Reader, int) *Reader
}{{"bufio", NewReader}, {"slab", NewSlabReader}}

// encodeFrames encodes frames with one Writer and a single Flush.
func encodeFrames(tb testing.TB, frames ...*Frame) []byte {
	tb.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf, 0)
	for _, f := range frames {
		if err := w.WriteFrame(f); err != nil {
			tb.Fatalf("WriteFrame(%v): %v", f, err)
		}
	}
	if err := w.Flush(); err != nil {
		tb.Fatalf("Flush: %v", err)
	}
	return buf.Bytes()
}

// encodedSize returns the size of f on the wire, length prefix included.
func encodedSize(tb testing.TB, f *Frame) int {
	tb.Helper()
	b, err := proto.Marshal(f)
	if err != nil {
		tb.Fatalf("marshal %v: %v", f, err)
	}
	return HeaderSize + len(b)
}

// rawFrame returns a length prefix declaring size followed by body.
func rawFrame(size uint32, body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, size), body...)
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range sampleFrames() {
		t.Run(tc.name, func(t *testing.T) {
			stream := encodeFrames(t, tc.frame)
			if got, want := len(stream), encodedSize(t, tc.frame); got != want {
				t.Fatalf("encoded %d bytes, want %d", got, want)
			}
			if got := binary.BigEndian.Uint32(stream); int(got) != len(stream)-HeaderSize {
				t.Fatalf("length prefix %d, body %d bytes", got, len(stream)-HeaderSize)
			}
			r := NewReader(bytes.NewReader(stream), 0)
			var got Frame
			if err := r.ReadFrame(&got); err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			if !proto.Equal(&got, tc.frame) {
				t.Fatalf("read %v, want %v", &got, tc.frame)
			}
			if err := r.ReadFrame(&got); err != io.EOF {
				t.Fatalf("ReadFrame after last frame: %v, want io.EOF", err)
			}
		})
	}
}

func TestManyFramesOneFlush(t *testing.T) {
	t.Parallel()
	var frames []*Frame
	for range 50 {
		for _, tc := range sampleFrames() {
			frames = append(frames, tc.frame)
		}
	}
	var out countingWriter
	w := NewWriter(&out, 0)
	for _, f := range frames {
		if err := w.WriteFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	if out.writes != 0 {
		t.Fatalf("%d writes before Flush", out.writes)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if out.writes != 1 {
		t.Fatalf("%d writes for %d bytes, want 1", out.writes, out.Len())
	}
	stream := out.Bytes()
	for _, split := range []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{
		{"whole", func(r io.Reader) io.Reader { return r }},
		{"one byte", iotest.OneByteReader},
		{"half", iotest.HalfReader},
	} {
		t.Run(split.name, func(t *testing.T) {
			r := NewReader(split.wrap(bytes.NewReader(stream)), 0)
			for i, want := range frames {
				var got Frame
				if err := r.ReadFrame(&got); err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if !proto.Equal(&got, want) {
					t.Fatalf("frame %d: read %v, want %v", i, &got, want)
				}
			}
			if err := r.ReadFrame(new(Frame)); err != io.EOF {
				t.Fatalf("after %d frames: %v, want io.EOF", len(frames), err)
			}
		})
	}
}

// countingWriter counts the Write calls that reach it.
type countingWriter struct {
	bytes.Buffer
	writes int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}

func TestReadErrors(t *testing.T) {
	t.Parallel()
	ping := encodeFrames(t, PingFrame(1))
	pingBody := ping[HeaderSize:]
	readErr := errors.New("connection reset")
	tests := []struct {
		name    string
		input   func() io.Reader
		max     int
		frames  int // good frames before the error
		wantErr func(error) bool
	}{
		{"empty stream is a clean EOF", func() io.Reader { return bytes.NewReader(nil) }, 0, 0, isErr(io.EOF)},
		{"EOF between frames", func() io.Reader { return bytes.NewReader(append(ping, ping...)) }, 0, 2, isErr(io.EOF)},
		{"EOF mid-header", func() io.Reader { return bytes.NewReader(append(ping, 0, 0)) }, 0, 1, isErr(io.ErrUnexpectedEOF)},
		{"EOF after header", func() io.Reader { return bytes.NewReader(ping[:HeaderSize]) }, 0, 0, isErr(io.ErrUnexpectedEOF)},
		{"EOF mid-body", func() io.Reader { return bytes.NewReader(ping[:len(ping)-1]) }, 0, 0, isErr(io.ErrUnexpectedEOF)},
		{"EOF mid-body of a large frame", func() io.Reader { return bytes.NewReader(rawFrame(1<<20, make([]byte, 3*growStep))) }, 2 << 20, 0, isErr(io.ErrUnexpectedEOF)},
		{"EOF mid-body of a frame larger than a slab", func() io.Reader {
			return bytes.NewReader(rawFrame(slabSize+10, make([]byte, slabSize+5)))
		}, 2 << 20, 0, isErr(io.ErrUnexpectedEOF)},
		{"read error mid-header", func() io.Reader { return io.MultiReader(bytes.NewReader(ping[:2]), iotest.ErrReader(readErr)) }, 0, 0, isErr(readErr)},
		{"read error mid-body", func() io.Reader { return io.MultiReader(bytes.NewReader(ping[:5]), iotest.ErrReader(readErr)) }, 0, 0, isErr(readErr)},
		{"declared length above max", func() io.Reader { return bytes.NewReader(rawFrame(1025, nil)) }, 1024, 0, isTooLarge(1025, 1024)},
		{"declared length 4 GiB-1", func() io.Reader { return bytes.NewReader(rawFrame(1<<32-1, nil)) }, 0, 0, isTooLarge(1<<32-1, DefaultMaxFrameSize)},
		{"declared length at max is read", func() io.Reader { return bytes.NewReader(rawFrame(uint32(len(pingBody)), pingBody)) }, len(pingBody), 1, isErr(io.EOF)},
		{"zero length", func() io.Reader { return bytes.NewReader(rawFrame(0, nil)) }, 0, 0, isBadFrame},
		{"no body: unknown field only", func() io.Reader { return bytes.NewReader(rawFrame(2, []byte{0x60, 0x01})) }, 0, 0, isBadFrame},
		{"garbage", func() io.Reader { return bytes.NewReader(rawFrame(4, []byte{0xff, 0xff, 0xff, 0xff})) }, 0, 0, isBadFrame},
		{"truncated inner message", func() io.Reader { return bytes.NewReader(rawFrame(2, []byte{0x42, 0x05})) }, 0, 0, isBadFrame},
		{"invalid UTF-8 string", func() io.Reader { return bytes.NewReader(rawFrame(5, []byte{0x5a, 0x03, 0x0a, 0x01, 0xff})) }, 0, 0, isBadFrame},
		{"bad frame then good frame", func() io.Reader { return bytes.NewReader(append(rawFrame(1, []byte{0xff}), ping...)) }, 0, 0, isBadFrame},
	}
	for _, tc := range tests {
		for _, rd := range readers {
			t.Run(rd.name+"/"+tc.name, func(t *testing.T) {
				r := rd.make(tc.input(), tc.max)
				var f Frame
				for i := range tc.frames {
					if err := r.ReadFrame(&f); err != nil {
						t.Fatalf("frame %d: %v", i, err)
					}
				}
				if err := r.ReadFrame(&f); !tc.wantErr(err) {
					t.Fatalf("ReadFrame error %#v is not the one expected", err)
				}
			})
		}
	}
}

// TestReadHTTP: a stream that starts as HTTP does is told apart from a
// frame too large, by ReadFrame and ReadBatch, with the error saying which
// side of HTTP the peer is; only a stream's first frame is looked at.
func TestReadHTTP(t *testing.T) {
	t.Parallel()
	ping := encodeFrames(t, PingFrame(1))
	for _, tc := range []struct {
		name, stream string
		start        string
		response     bool
	}{
		{"a server's answer", "HTTP/1.1 400 Bad Request\r\n\r\n", "HTTP", true},
		{"a GET", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "GET ", false},
		{"a POST", "POST /api HTTP/1.1\r\n\r\n", "POST", false},
		{"HTTP/2's preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "PRI ", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, batch := range []bool{false, true} {
				for _, rd := range readers {
					testReadHTTP(t, rd.make(strings.NewReader(tc.stream), 1<<32-1), batch, tc.start, tc.response) // a limit that takes the length
				}
			}
		})
	}
	// The same bytes after a first frame are a length like any other.
	for _, rd := range readers {
		r := rd.make(bytes.NewReader(append(ping, "HTTP/1.1 200 OK\r\n"...)), 0)
		var f Frame
		if err := r.ReadFrame(&f); err != nil {
			t.Fatal(err)
		}
		if err := r.ReadFrame(&f); !isTooLarge(uint64(binary.BigEndian.Uint32([]byte("HTTP"))), DefaultMaxFrameSize)(err) {
			t.Fatalf("%s: second frame: %#v, want a frame too large", rd.name, err)
		}
	}
}

// testReadHTTP reads the first frame of an HTTP stream from r with
// ReadBatch (batch) or ReadFrame and checks the HTTPError.
func testReadHTTP(t *testing.T, r *Reader, batch bool, start string, response bool) {
	t.Helper()
	var f Frame
	var err error
	if batch {
		_, err = r.ReadBatch(&f, new(Batch))
	} else {
		err = r.ReadFrame(&f)
	}
	var he *HTTPError
	if !errors.As(err, &he) || he.Start != start || he.Response() != response {
		t.Fatalf("batch %v: error %#v, want an HTTPError starting %q", batch, err, start)
	}
	if want := "this is an HTTP server (the metrics and console port?), not a fanout client port"; response && err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if !response && !strings.Contains(err.Error(), "an HTTP request ("+strings.TrimSpace(start)+")") {
		t.Errorf("error %q does not name the request", err)
	}
}

func isErr(want error) func(error) bool {
	return func(err error) bool { return err == want || (want != io.EOF && errors.Is(err, want)) }
}

func isBadFrame(err error) bool {
	return errors.Is(err, ErrBadFrame) && CodeOf(err) == ErrorCode_ERROR_CODE_BAD_FRAME
}

func isTooLarge(size uint64, max int) func(error) bool {
	return func(err error) bool {
		var e *FrameTooLargeError
		return errors.As(err, &e) && e.Size == size && e.Max == max &&
			CodeOf(err) == ErrorCode_ERROR_CODE_FRAME_TOO_LARGE
	}
}

func TestBadFrameKeepsStreamInStep(t *testing.T) {
	t.Parallel()
	stream := append(rawFrame(3, []byte{0xff, 0xff, 0xff}), encodeFrames(t, PingFrame(5))...)
	r := NewReader(bytes.NewReader(stream), 0)
	var f Frame
	if err := r.ReadFrame(&f); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("first frame: %v, want ErrBadFrame", err)
	}
	if err := r.ReadFrame(&f); err != nil || f.GetPing().GetNonce() != 5 {
		t.Fatalf("second frame: %v, %v; want ping 5", &f, err)
	}
}

func TestTooLargeDoesNotAllocateBody(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses parallel tests (it counts the whole process).
	const max = 1 << 20
	header := rawFrame(2<<30, nil) // declares 2 GiB
	src := bytes.NewReader(header)
	r := NewReader(src, max)
	var f Frame
	var err error
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	allocated := testing.AllocsPerRun(100, func() {
		src.Reset(header)
		r.r.Reset(src)
		err = r.ReadFrame(&f)
	})
	runtime.ReadMemStats(&after)
	if !isTooLarge(2<<30, max)(err) {
		t.Fatalf("ReadFrame: %v, want *FrameTooLargeError", err)
	}
	if allocated > 1 { // the *FrameTooLargeError itself
		t.Errorf("%v allocations per too-large frame, want at most 1", allocated)
	}
	// 101 runs; allow the test's own bookkeeping but not one body.
	if bytes := after.TotalAlloc - before.TotalAlloc; bytes > 64<<10 {
		t.Errorf("%d bytes allocated over 101 too-large frames", bytes)
	}
	if cap(r.buf) != 0 {
		t.Errorf("body buffer grew to %d bytes", cap(r.buf))
	}
}

func TestDeclaredSizeIsNotAllocatedUpFront(t *testing.T) {
	t.Parallel()
	// A peer declares a frame of the maximum size and sends 10 bytes of it.
	const max = 64 << 20
	r := NewReader(bytes.NewReader(rawFrame(max, make([]byte, 10))), max)
	if err := r.ReadFrame(new(Frame)); err != io.ErrUnexpectedEOF {
		t.Fatalf("ReadFrame: %v, want io.ErrUnexpectedEOF", err)
	}
	if cap(r.buf) > growStep {
		t.Errorf("buffer grew to %d bytes for 10 received", cap(r.buf))
	}
}

func TestLargeFrame(t *testing.T) {
	t.Parallel()
	// Larger than both the bufio buffers and several growth steps.
	value := bytes.Repeat([]byte("0123456789abcdef"), (1<<20)/16)
	want := DeliverFrame(&Deliver{DeliveryId: 1, Value: value})
	for _, wrap := range []func(io.Reader) io.Reader{
		func(r io.Reader) io.Reader { return r },
		iotest.HalfReader,
	} {
		r := NewReader(wrap(bytes.NewReader(encodeFrames(t, want, want))), 2<<20)
		for i := range 2 {
			var got Frame
			if err := r.ReadFrame(&got); err != nil {
				t.Fatalf("frame %d: %v", i, err)
			}
			if !proto.Equal(&got, want) {
				t.Fatalf("frame %d differs", i)
			}
		}
	}
}

func TestDecodedValueDoesNotAliasBuffer(t *testing.T) {
	t.Parallel()
	first := DeliverFrame(&Deliver{DeliveryId: 1, Key: []byte("key-one"), Value: []byte("first value")})
	second := DeliverFrame(&Deliver{DeliveryId: 2, Key: []byte("KEY-TWO"), Value: []byte("SECOND VALUE")})
	r := NewReader(bytes.NewReader(encodeFrames(t, first, second)), 0)
	var a, b Frame
	if err := r.ReadFrame(&a); err != nil {
		t.Fatal(err)
	}
	if err := r.ReadFrame(&b); err != nil {
		t.Fatal(err)
	}
	if got := a.GetDeliver(); string(got.Value) != "first value" || string(got.Key) != "key-one" {
		t.Fatalf("first delivery changed after the second was read: key %q value %q", got.Key, got.Value)
	}
	if !proto.Equal(&b, second) {
		t.Fatalf("second frame %v, want %v", &b, second)
	}
}

func TestWriterRefusesOversizedFrame(t *testing.T) {
	t.Parallel()
	const max = 1024
	tests := []struct {
		name    string
		frame   *Frame
		wantErr bool
	}{
		{"at max", DeliverFrame(&Deliver{}), false}, // value set below
		{"one above max", DeliverFrame(&Deliver{Value: make([]byte, max)}), true},
		{"far above max", DeliverFrame(&Deliver{Value: make([]byte, 1<<20)}), true},
	}
	// Make "at max" exactly max bytes: the Deliver is field 4 of Frame and
	// value is field 5 of Deliver, each with a 1-byte tag and 2-byte length.
	tests[0].frame.GetDeliver().Value = make([]byte, max-6)
	if got := encodedSize(t, tests[0].frame) - HeaderSize; got != max {
		t.Fatalf("test setup: frame is %d bytes, want %d", got, max)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			w := NewWriter(&out, max)
			err := w.WriteFrame(tc.frame)
			var tooLarge *FrameTooLargeError
			if got := errors.As(err, &tooLarge); got != tc.wantErr {
				t.Fatalf("WriteFrame: %v; want too-large error: %v", err, tc.wantErr)
			}
			if tc.wantErr {
				if w.Buffered() != 0 {
					t.Errorf("%d bytes buffered after a refused frame", w.Buffered())
				}
				if cap(w.buf) > 512 {
					t.Errorf("encode buffer grew to %d bytes for a refused frame", cap(w.buf))
				}
				if tooLarge.Max != max || tooLarge.Size <= max {
					t.Errorf("error %+v", tooLarge)
				}
			}
			// The writer is still usable and the stream in step.
			if err := w.WriteFrame(PingFrame(9)); err != nil {
				t.Fatal(err)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			r := NewReader(&out, max)
			var f Frame
			if !tc.wantErr {
				if err := r.ReadFrame(&f); err != nil || !proto.Equal(&f, tc.frame) {
					t.Fatalf("frame at max: %v", err)
				}
			}
			if err := r.ReadFrame(&f); err != nil || f.GetPing().GetNonce() != 9 {
				t.Fatalf("ping after: %v %v", &f, err)
			}
		})
	}
}

func TestWriterInvalidUTF8(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	w := NewWriter(&out, 0)
	if err := w.WriteFrame(HelloFrame(&Hello{ClientId: "\xff"})); err == nil || w.Buffered() != 0 {
		t.Fatalf("WriteFrame with invalid UTF-8: %v, %d bytes buffered; want an error and nothing written", err, w.Buffered())
	}
	// The constructors that take free text make it valid.
	for _, f := range []*Frame{
		ErrorFrame(ErrorCode_ERROR_CODE_BAD_FRAME, true, "client id %s", "\xff"),
		GoodbyeFrame("bye \xff"),
	} {
		if err := w.WriteFrame(f); err != nil {
			t.Errorf("WriteFrame(%v): %v", f, err)
		}
	}
}

func TestLimit(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want int }{
		{-1, DefaultMaxFrameSize},
		{0, DefaultMaxFrameSize},
		{1, 1},
		{1 << 32, 1<<32 - 1}, // a 4-byte prefix cannot say more
	}
	for _, tc := range tests {
		if got := limit(tc.in); got != tc.want {
			t.Errorf("limit(%d) = %d, want %d", tc.in, got, tc.want)
		}
		if got := NewWriter(io.Discard, tc.in).max; got != tc.want {
			t.Errorf("NewWriter(%d).max = %d, want %d", tc.in, got, tc.want)
		}
		if got := NewReader(strings.NewReader(""), tc.in).max; got != tc.want {
			t.Errorf("NewReader(%d).max = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestRemoteError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   *Error
		want RemoteError
		text string
	}{
		{"nil", nil, RemoteError{}, "remote error ERROR_CODE_UNSPECIFIED"},
		{
			"no leader",
			&Error{Code: ErrorCode_ERROR_CODE_NO_LEADER, Message: "election running", Fatal: true, RetryAfterMs: 1500},
			RemoteError{Code: ErrorCode_ERROR_CODE_NO_LEADER, Message: "election running", Fatal: true, RetryAfter: 1500 * time.Millisecond},
			"remote error ERROR_CODE_NO_LEADER (fatal, retry after 1.5s): election running",
		},
		{
			"non-fatal",
			&Error{Code: ErrorCode_ERROR_CODE_UNEXPECTED_FRAME, Message: "ack before hello"},
			RemoteError{Code: ErrorCode_ERROR_CODE_UNEXPECTED_FRAME, Message: "ack before hello"},
			"remote error ERROR_CODE_UNEXPECTED_FRAME: ack before hello",
		},
		{
			"retry, not fatal",
			&Error{Code: ErrorCode_ERROR_CODE_TOO_MANY_CLIENTS, RetryAfterMs: 20},
			RemoteError{Code: ErrorCode_ERROR_CODE_TOO_MANY_CLIENTS, RetryAfter: 20 * time.Millisecond},
			"remote error ERROR_CODE_TOO_MANY_CLIENTS (retry after 20ms)",
		},
		{
			"fatal only",
			ErrorFrame(ErrorCode_ERROR_CODE_UNAUTHORIZED, true, "bad token").GetError(),
			RemoteError{Code: ErrorCode_ERROR_CODE_UNAUTHORIZED, Message: "bad token", Fatal: true},
			"remote error ERROR_CODE_UNAUTHORIZED (fatal): bad token",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := NewRemoteError(tc.in)
			if *got != tc.want {
				t.Errorf("NewRemoteError = %+v, want %+v", *got, tc.want)
			}
			if got.Error() != tc.text {
				t.Errorf("Error() = %q, want %q", got.Error(), tc.text)
			}
			err := fmt.Errorf("session: %w", tc.in.Err())
			var remote *RemoteError
			if !errors.As(err, &remote) || *remote != tc.want {
				t.Errorf("Err() does not unwrap to %+v", tc.want)
			}
			if CodeOf(err) != tc.want.Code {
				t.Errorf("CodeOf = %v, want %v", CodeOf(err), tc.want.Code)
			}
		})
	}
}

func TestTemporary(t *testing.T) {
	t.Parallel()
	temporary := map[ErrorCode]bool{
		ErrorCode_ERROR_CODE_NO_LEADER:        true,
		ErrorCode_ERROR_CODE_SHUTTING_DOWN:    true,
		ErrorCode_ERROR_CODE_TOO_MANY_CLIENTS: true,
	}
	for n := range ErrorCode_name {
		code := ErrorCode(n)
		if got := Temporary(code); got != temporary[code] {
			t.Errorf("Temporary(%v) = %v, want %v", code, got, temporary[code])
		}
	}
}

func TestCodeOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want ErrorCode
	}{
		{"nil", nil, ErrorCode_ERROR_CODE_UNSPECIFIED},
		{"too large", &FrameTooLargeError{Size: 10, Max: 5}, ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"wrapped too large", fmt.Errorf("read: %w", &FrameTooLargeError{Size: 10, Max: 5}), ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"bad frame", fmt.Errorf("%w: junk", ErrBadFrame), ErrorCode_ERROR_CODE_BAD_FRAME},
		{"too many ids", fmt.Errorf("read: %w", &TooManyIDsError{Count: 10, Max: 5}), ErrorCode_ERROR_CODE_TOO_MANY_IDS},
		{"EOF", io.ErrUnexpectedEOF, ErrorCode_ERROR_CODE_INTERNAL},
		{"other", errors.New("disk on fire"), ErrorCode_ERROR_CODE_INTERNAL},
	}
	for _, tc := range tests {
		if got := CodeOf(tc.err); got != tc.want {
			t.Errorf("%s: CodeOf(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestWriterReusedFrame(t *testing.T) {
	t.Parallel()
	// The daemon may reuse one Frame (and its Deliver) for many writes.
	d := &Deliver{DeliveryId: 1, Value: []byte("short")}
	f := DeliverFrame(d)
	var want []*Frame
	var out bytes.Buffer
	w := NewWriter(&out, 0)
	for i, v := range []string{"short", "a much longer value than before", "", "mid"} {
		d.DeliveryId = uint64(i + 1)
		d.Value = []byte(v)
		d.Headers = append(d.Headers, &Header{Key: v})
		if err := w.WriteFrame(f); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		want = append(want, proto.Clone(f).(*Frame))
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&out, 0)
	for i := range want {
		var got Frame
		if err := r.ReadFrame(&got); err != nil || !proto.Equal(&got, want[i]) {
			t.Fatalf("frame %d: %v, %v; want %v", i, &got, err, want[i])
		}
	}
}
