// Package protocol is the wire protocol between a fanout daemon and its
// clients: the frames, their encoding and the limits both sides enforce.
//
// Every frame on the connection is a 4-byte big-endian length followed by
// that many bytes of one serialized Frame. The language-neutral definition
// and its specification are protocol/fanout.proto and protocol/README.md at
// the top of the daemon's repository; fanout.pb.go is generated from the
// definition. The hot frames, Deliver and DeliverBatch, are encoded and
// decoded by hand (deliver.go, batch.go), byte for byte as the generated
// code does.
//
// # Go version
//
// The package is part of the client module (see package client) and keeps
// its rules: Go 1.23, the oldest Go that google.golang.org/protobuf
// supports, and nothing newer in its code or its tests (no testing/synctest,
// T.Context or B.Loop), so that an application on Go 1.23 can import the
// client. The daemon imports this package from the client module too: a
// change made for the daemon must still build on Go 1.23.
package protocol
