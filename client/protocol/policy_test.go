package protocol

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The byte examples of protocol/README.md for the fields of the delivery
// policies, and the bytes of a Hello and a Nack without them, which must not
// change (a client that sends none of the new fields is unchanged).
func TestPolicyFieldsOnTheWire(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		frame *Frame
		want  []byte
	}{
		{"hello weight", HelloFrame(&Hello{ProtocolVersion: 1, Weight: 5}),
			[]byte{0, 0, 0, 6, 0x0a, 0x04, 0x10, 0x01, 0x38, 0x05}},
		{"hello observer", HelloFrame(&Hello{ProtocolVersion: 1, Observer: true}),
			[]byte{0, 0, 0, 6, 0x0a, 0x04, 0x10, 0x01, 0x40, 0x01}},
		{"hello without", HelloFrame(&Hello{ProtocolVersion: 1}),
			[]byte{0, 0, 0, 4, 0x0a, 0x02, 0x10, 0x01}},
		{"welcome observer", WelcomeFrame(&Welcome{Observer: true}),
			[]byte{0, 0, 0, 4, 0x12, 0x02, 0x60, 0x01}},
		{"nack delay reason", NackWithFrame([]uint64{42}, time.Second, "busy"),
			[]byte{0, 0, 0, 0x0e, 0x32, 0x0c, 0x0a, 0x01, 0x2a, 0x18, 0xe8, 0x07, 0x22, 0x04, 'b', 'u', 's', 'y'}},
		{"nack unprocessed", &Frame{Body: &Frame_Nack{Nack: &Nack{DeliveryIds: []uint64{42}, Unprocessed: true}}},
			[]byte{0, 0, 0, 7, 0x32, 0x05, 0x0a, 0x01, 0x2a, 0x28, 0x01}},
		{"nack without", NackWithFrame([]uint64{42}, 0, ""),
			[]byte{0, 0, 0, 5, 0x32, 0x03, 0x0a, 0x01, 0x2a}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := encodeFrames(t, tc.frame); !bytes.Equal(got, tc.want) {
				t.Fatalf("% x, want % x", got, tc.want)
			}
		})
	}
	if a, b := encodeFrames(t, NackWithFrame([]uint64{1, 2}, 0, "")), encodeFrames(t, NackFrame([]uint64{1, 2})); !bytes.Equal(a, b) {
		t.Fatalf("a Nack without delay or reason: % x, NackFrame: % x", a, b)
	}
}

func TestNackDelayAndReasonBounds(t *testing.T) {
	t.Parallel()
	if d, cut := NackDelay(&Nack{DelayMs: 1500}); d != 1500*time.Millisecond || cut {
		t.Fatalf("NackDelay(1500ms) = %v, %v", d, cut)
	}
	if d, cut := NackDelay(&Nack{DelayMs: 1 << 31}); d != MaxNackDelay || !cut {
		t.Fatalf("NackDelay(2^31 ms) = %v, %v; want %v, cut", d, cut, MaxNackDelay)
	}
	if ms := NackWithFrame(nil, time.Microsecond, "").GetNack().GetDelayMs(); ms != 1 {
		t.Fatalf("a delay of 1µs is sent as %d ms, want 1 (rounded up: never earlier)", ms)
	}
	if ms := NackWithFrame(nil, time.Hour, "").GetNack().GetDelayMs(); ms != uint32(MaxNackDelay/time.Millisecond) {
		t.Fatalf("a delay of 1h is sent as %d ms, want the maximum", ms)
	}
	long := strings.Repeat("é", MaxNackReason) // 2 bytes each
	r := NackReason(&Nack{Reason: long})
	if len(r) > MaxNackReason || !strings.HasPrefix(long, r) || len(r) < MaxNackReason-1 {
		t.Fatalf("NackReason kept %d bytes (%q...), want at most %d, cut at a rune", len(r), r[:8], MaxNackReason)
	}
	if w := WeightOf(&Hello{}); w != DefaultWeight {
		t.Fatalf("WeightOf(no weight) = %d, want %d", w, DefaultWeight)
	}
	if w := WeightOf(&Hello{Weight: 7}); w != 7 {
		t.Fatalf("WeightOf(7) = %d", w)
	}
}
