package protocol

import (
	"bytes"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
)

// The byte examples of protocol/README.md's "Members and capabilities" section.
func TestMembersWireBytes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		frame *Frame
		hex   string
	}{
		{"hello with capabilities", HelloFrame(&Hello{ProtocolVersion: 1, Capabilities: []Capability{Capability_CAPABILITY_MEMBERS}}),
			"00000007" + "0a05" + "1001" + "320101"},
		{"members", MembersFrame([]string{"10.0.0.1:4987", "10.0.0.2:4987"}, nil),
			"00000024" + "6222" +
				"0a0f" + "0a0d" + hex.EncodeToString([]byte("10.0.0.1:4987")) +
				"0a0f" + "0a0d" + hex.EncodeToString([]byte("10.0.0.2:4987"))},
		{"members empty", MembersFrame(nil, nil), "00000002" + "6200"},
		{"welcome with one member", WelcomeFrame(&Welcome{ProtocolVersion: 1, Members: MemberList([]string{"a:1"})}),
			"0000000b" + "1209" + "1801" + "5205" + "0a03" + hex.EncodeToString([]byte("a:1"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := hex.EncodeToString(encodeFrames(t, tt.frame)); got != tt.hex {
				t.Errorf("encoded %s, want %s", got, tt.hex)
			}
		})
	}
}

// A capability this version does not know decodes (proto3 enums are open)
// and is simply not one the reader looks for.
func TestUnknownCapabilityDecodes(t *testing.T) {
	t.Parallel()
	// Hello{protocol_version: 1, capabilities: [1, 300]}, packed.
	body, _ := hex.DecodeString("0a07" + "1001" + "3203" + "01ac02")
	var f Frame
	if err := NewReader(bytes.NewReader(rawFrame(uint32(len(body)), body)), 0).ReadFrame(&f); err != nil {
		t.Fatalf("ReadFrame: %v", err)
	}
	h := f.GetHello()
	if !h.HasCapability(Capability_CAPABILITY_MEMBERS) {
		t.Errorf("capabilities %v: CAPABILITY_MEMBERS not found", h.GetCapabilities())
	}
	if !slices.Equal(h.GetCapabilities(), []Capability{Capability_CAPABILITY_MEMBERS, 300}) {
		t.Errorf("capabilities = %v, want [CAPABILITY_MEMBERS 300]", h.GetCapabilities())
	}
	if (&Hello{}).HasCapability(Capability_CAPABILITY_MEMBERS) || (*Hello)(nil).HasCapability(Capability_CAPABILITY_MEMBERS) {
		t.Error("a Hello without capabilities has CAPABILITY_MEMBERS")
	}
}

func TestMemberList(t *testing.T) {
	t.Parallel()
	if MemberList(nil) != nil || Addresses(nil) != nil {
		t.Error("no addresses: want nil")
	}
	addrs := []string{"b:2", "a:1", "bad\xff:3"}
	got := Addresses(MemberList(addrs))
	if want := []string{"b:2", "a:1", "bad\uFFFD:3"}; !slices.Equal(got, want) {
		t.Errorf("Addresses(MemberList(%q)) = %q, want %q (order kept, UTF-8 repaired)", addrs, got, want)
	}
	// The repaired list encodes; an invalid address would not.
	if _, err := encodeFrame(MembersFrame(addrs, nil)); err != nil {
		t.Errorf("MembersFrame with an invalid UTF-8 address: %v", err)
	}
	if _, err := encodeFrame(&Frame{Body: &Frame_Members{Members: &Members{Members: []*Member{{Address: "\xff"}}}}}); err == nil ||
		!strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("unrepaired address: err = %v, want a UTF-8 error", err)
	}
}

// encodeFrame encodes one frame, returning the Writer's error.
func encodeFrame(f *Frame) ([]byte, error) {
	var buf bytes.Buffer
	w := NewWriter(&buf, 0)
	if err := w.WriteFrame(f); err != nil {
		return nil, err
	}
	err := w.Flush()
	return buf.Bytes(), err
}

func TestMembersVersionCompare(t *testing.T) {
	t.Parallel()
	v := func(e, g uint64) *MembersVersion { return &MembersVersion{Epoch: e, Generation: g} }
	for _, c := range []struct {
		a, b *MembersVersion
		want int
	}{
		{v(2, 5), v(2, 5), 0},
		{v(2, 5), v(2, 6), -1},
		{v(3, 1), v(2, 9), 1}, // a new leader's epoch wins over an older generation
		{nil, v(1, 1), -1},
		{v(1, 1), nil, 1},
		{nil, nil, 0},
	} {
		if got := c.a.Compare(c.b); got != c.want {
			t.Errorf("%v.Compare(%v) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
