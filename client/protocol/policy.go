package protocol

import (
	"strings"
	"time"
	"unicode/utf8"
)

// DefaultWeight is the weight of a client whose Hello gives none
// (Hello.weight 0): every such client gets an equal share.
const DefaultWeight = 100

// MaxNackDelay is the longest delay a Nack may ask for (Nack.delay_ms); the
// daemon cuts a longer one to it, so that a client cannot park a message,
// and its partition's committed offset, for good.
const MaxNackDelay = 15 * time.Minute

// MaxNackReason is how many bytes of a Nack's reason the daemon keeps.
const MaxNackReason = 256

// WeightOf returns the weight in force for a Hello: Hello.weight, or
// DefaultWeight when absent.
func WeightOf(h *Hello) int {
	if w := h.GetWeight(); w > 0 {
		return int(w)
	}
	return DefaultWeight
}

// NackDelay returns the delay a Nack asks for, cut to MaxNackDelay, and
// whether it had to be cut.
func NackDelay(n *Nack) (time.Duration, bool) {
	d := time.Duration(n.GetDelayMs()) * time.Millisecond
	if d > MaxNackDelay {
		return MaxNackDelay, true
	}
	return d, false
}

// NackReason returns a Nack's reason cut to MaxNackReason bytes, at a rune
// boundary, as valid UTF-8.
func NackReason(n *Nack) string {
	r := n.GetReason()
	if len(r) > MaxNackReason {
		cut := MaxNackReason
		for cut > 0 && !utf8.RuneStart(r[cut]) {
			cut--
		}
		r = r[:cut]
	}
	return strings.ToValidUTF8(r, "\uFFFD")
}

// NackWithFrame returns a Nack of the given delivery ids that asks for
// redelivery no earlier than delay from now (rounded up to a millisecond,
// cut to MaxNackDelay) and gives a reason; a zero delay and an empty reason
// give the same bytes as NackFrame.
func NackWithFrame(ids []uint64, delay time.Duration, reason string) *Frame {
	ms := uint32(0)
	if delay > 0 {
		ms = uint32((min(delay, MaxNackDelay) + time.Millisecond - 1) / time.Millisecond)
	}
	return &Frame{Body: &Frame_Nack{Nack: &Nack{DeliveryIds: ids, DelayMs: ms, Reason: strings.ToValidUTF8(reason, "\uFFFD")}}}
}
