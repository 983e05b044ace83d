package protocol

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Constructors for every frame type, so that neither the daemon nor a client
// builds the oneof wrappers by hand. They do not copy their arguments: the
// returned Frame shares the message (or slice) it was given.

// HelloFrame wraps h in a Frame.
func HelloFrame(h *Hello) *Frame { return &Frame{Body: &Frame_Hello{Hello: h}} }

// WelcomeFrame wraps w in a Frame.
func WelcomeFrame(w *Welcome) *Frame { return &Frame{Body: &Frame_Welcome{Welcome: w}} }

// RedirectFrame returns a Redirect to the leader at addr (host:port).
func RedirectFrame(addr, nodeID string, epoch uint64) *Frame {
	return &Frame{Body: &Frame_Redirect{Redirect: &Redirect{
		LeaderAddress: addr,
		LeaderNodeId:  nodeID,
		Epoch:         epoch,
	}}}
}

// DeliverFrame wraps d in a Frame.
func DeliverFrame(d *Deliver) *Frame { return &Frame{Body: &Frame_Deliver{Deliver: d}} }

// AckFrame returns an Ack of the given delivery ids.
func AckFrame(ids []uint64) *Frame {
	return &Frame{Body: &Frame_Ack{Ack: &Ack{DeliveryIds: ids}}}
}

// NackFrame returns a Nack of the given delivery ids.
func NackFrame(ids []uint64) *Frame {
	return &Frame{Body: &Frame_Nack{Nack: &Nack{DeliveryIds: ids}}}
}

// TouchFrame returns a Touch of the given delivery ids.
func TouchFrame(ids []uint64) *Frame {
	return &Frame{Body: &Frame_Touch{Touch: &Touch{DeliveryIds: ids}}}
}

// PingFrame returns a Ping carrying nonce.
func PingFrame(nonce uint64) *Frame { return &Frame{Body: &Frame_Ping{Ping: &Ping{Nonce: nonce}}} }

// PongFrame returns a Pong carrying nonce, the answer to a Ping with it.
func PongFrame(nonce uint64) *Frame { return &Frame{Body: &Frame_Pong{Pong: &Pong{Nonce: nonce}}} }

// ErrorFrame returns an Error frame with a formatted message. Invalid UTF-8 in
// the message is replaced, because a proto3 string must be valid UTF-8 and the
// frame would otherwise fail to encode. Set RetryAfterMs on the result's
// GetError() where it applies.
func ErrorFrame(code ErrorCode, fatal bool, format string, args ...any) *Frame {
	msg := fmt.Sprintf(format, args...)
	return &Frame{Body: &Frame_Error{Error: &Error{
		Code:    code,
		Message: strings.ToValidUTF8(msg, "\uFFFD"),
		Fatal:   fatal,
	}}}
}

// GoodbyeFrame returns a Goodbye with the given reason (made valid UTF-8).
func GoodbyeFrame(reason string) *Frame {
	return &Frame{Body: &Frame_Goodbye{Goodbye: &Goodbye{Reason: strings.ToValidUTF8(reason, "\uFFFD")}}}
}

// MembersFrame returns a Members frame listing the members at addrs
// (host:port), in the order given, of version v (nil: none).
func MembersFrame(addrs []string, v *MembersVersion) *Frame {
	return &Frame{Body: &Frame_Members{Members: &Members{Members: MemberList(addrs), Version: v}}}
}

// Compare orders member-list versions: by epoch, then generation; -1 when
// v is older than w, 0 when equal, +1 when newer. A nil version (none) is
// older than any other.
func (v *MembersVersion) Compare(w *MembersVersion) int {
	switch {
	case v == nil || w == nil:
		return cmp.Compare(btoi(v != nil), btoi(w != nil))
	case v.GetEpoch() != w.GetEpoch():
		return cmp.Compare(v.GetEpoch(), w.GetEpoch())
	}
	return cmp.Compare(v.GetGeneration(), w.GetGeneration())
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// MemberList returns the Member messages of addrs, in order, for
// Welcome.members and Members; nil for none. Invalid UTF-8 in an address is
// replaced, as a proto3 string must be valid UTF-8.
func MemberList(addrs []string) []*Member {
	if len(addrs) == 0 {
		return nil
	}
	ms := make([]*Member, len(addrs))
	for i, a := range addrs {
		ms[i] = &Member{Address: strings.ToValidUTF8(a, "\uFFFD")}
	}
	return ms
}

// Addresses returns the addresses of ms, in order; nil for none.
func Addresses(ms []*Member) []string {
	if len(ms) == 0 {
		return nil
	}
	addrs := make([]string, len(ms))
	for i, m := range ms {
		addrs[i] = m.GetAddress()
	}
	return addrs
}

// HasCapability reports whether the Hello announces c.
func (x *Hello) HasCapability(c Capability) bool {
	return slices.Contains(x.GetCapabilities(), c)
}
