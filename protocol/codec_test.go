package protocol

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// encodedSize returns the size of f on the wire, length prefix included.
func encodedSize(tb testing.TB, f *Frame) int {
	tb.Helper()
	b, err := proto.Marshal(f)
	if err != nil {
		tb.Fatalf("marshal %v: %v", f, err)
	}
	return HeaderSize + len(b)
}
