package client_test

import (
	"net"

	"github.com/nanoservice/core-fanout/protocol"
)

// startExampleDaemon starts a stand-in for a fanout daemon, written with
// the public protocol package alone, so that the examples run without Kafka:
// it welcomes one client, delivers values, delivers again what is nacked
// (the attempt counted up), and ends when the client says goodbye. It
// returns the address to dial.
func startExampleDaemon(values ...string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() {
		defer ln.Close()
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		r, w := protocol.NewReader(nc, 0), protocol.NewWriter(nc, 0)
		var f protocol.Frame
		if err := r.ReadFrame(&f); err != nil || f.GetHello() == nil {
			return
		}
		_ = w.WriteFrame(protocol.WelcomeFrame(&protocol.Welcome{
			NodeId: "example", ProtocolVersion: protocol.Version, MaxInFlight: 64, AckTimeoutMs: 30000, Topic: "example",
		}))
		sent := map[uint64]*protocol.Deliver{} // by delivery id
		deliver := func(value string, attempt uint32) {
			d := &protocol.Deliver{DeliveryId: uint64(len(sent) + 1), Value: []byte(value), Attempt: attempt}
			sent[d.DeliveryId] = d
			_ = w.WriteFrame(protocol.DeliverFrame(d))
		}
		for _, v := range values {
			deliver(v, 1)
		}
		for {
			if err := w.Flush(); err != nil {
				return
			}
			if err := r.ReadFrame(&f); err != nil || f.GetGoodbye() != nil {
				return
			}
			for _, id := range f.GetNack().GetDeliveryIds() {
				if d := sent[id]; d != nil {
					deliver(string(d.Value), d.Attempt+1)
				}
			}
		}
	}()
	return ln.Addr().String()
}
