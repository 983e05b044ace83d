package client_test

import (
	"net"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// startExampleDaemon starts a stand-in for a fanout daemon, written with
// the public protocol package alone, so that the examples run without Kafka:
// it welcomes one client, delivers values (in one DeliverBatch frame to a
// client that announces CAPABILITY_BATCH), delivers again what is nacked
// (the attempt counted up, by id or by range), and ends when the client
// says goodbye. It returns the address to dial.
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
		welcome := &protocol.Welcome{
			NodeId: "example", ProtocolVersion: protocol.Version, MaxInFlight: 64, AckTimeoutMs: 30000, Topic: "example",
		}
		batch := f.GetHello().HasCapability(protocol.Capability_CAPABILITY_BATCH)
		if batch {
			welcome.Capabilities = []protocol.Capability{protocol.Capability_CAPABILITY_BATCH}
		}
		_ = w.WriteFrame(protocol.WelcomeFrame(welcome))
		sent := map[uint64]*protocol.Deliver{} // by delivery id
		deliver := func(value string, attempt uint32) {
			d := &protocol.Deliver{DeliveryId: uint64(len(sent) + 1), Value: []byte(value), Attempt: attempt}
			sent[d.DeliveryId] = d
			_ = w.WriteFrame(protocol.DeliverFrame(d))
		}
		if batch {
			ds := make([]*protocol.Deliver, len(values))
			for i, v := range values {
				ds[i] = &protocol.Deliver{DeliveryId: uint64(i + 1), Value: []byte(v), Attempt: 1}
				sent[ds[i].DeliveryId] = ds[i]
			}
			_ = w.WriteFrame(protocol.DeliverBatchFrame(ds))
		} else {
			for _, v := range values {
				deliver(v, 1)
			}
		}
		for {
			if err := w.Flush(); err != nil {
				return
			}
			if err := r.ReadFrame(&f); err != nil || f.GetGoodbye() != nil {
				return
			}
			ids := f.GetNack().GetDeliveryIds()
			for rs := f.GetNack().GetRanges(); len(rs) >= 2; rs = rs[2:] {
				for id := rs[0]; id < rs[0]+rs[1]; id++ {
					ids = append(ids, id)
				}
			}
			for _, id := range ids {
				if d := sent[id]; d != nil {
					deliver(string(d.Value), d.Attempt+1)
				}
			}
		}
	}()
	return ln.Addr().String()
}
