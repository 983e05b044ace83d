package client

import (
	"net"

	"github.com/nanoservice/core-fanout/protocol"
)

// StartExampleDaemon starts a daemon for Example that welcomes one client,
// delivers values and waits for their acks. It returns the address and a
// function that waits until every value was acked.
func StartExampleDaemon(values ...string) (addr string, wait func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer ln.Close()
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		fc := &fakeConn{nc: nc, r: protocol.NewReader(nc, 0), w: protocol.NewWriter(nc, 0)}
		if _, err := fc.read(testTimeout); err != nil {
			return
		}
		_ = fc.w.WriteFrame(protocol.WelcomeFrame(testWelcome()))
		for i, v := range values {
			_ = fc.w.WriteFrame(protocol.DeliverFrame(&protocol.Deliver{DeliveryId: uint64(i + 1), Value: []byte(v), Attempt: 1}))
		}
		_ = fc.w.Flush()
		for acked := 0; acked < len(values); {
			f, err := fc.read(testTimeout)
			if err != nil {
				return
			}
			acked += len(f.GetAck().GetDeliveryIds())
		}
	}()
	return ln.Addr().String(), func() { <-done }
}

// StartExampleBatchDaemon is StartExampleDaemon for a daemon that takes up
// CAPABILITY_BATCH: it delivers the values in one DeliverBatch frame and
// counts the ids of acks by ranges too.
func StartExampleBatchDaemon(values ...string) (addr string, wait func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer ln.Close()
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		fc := &fakeConn{nc: nc, r: protocol.NewReader(nc, 0), w: protocol.NewWriter(nc, 0)}
		if _, err := fc.read(testTimeout); err != nil {
			return
		}
		_ = fc.w.WriteFrame(protocol.WelcomeFrame(batchWelcome()))
		ds := make([]*protocol.Deliver, len(values))
		for i, v := range values {
			ds[i] = &protocol.Deliver{DeliveryId: uint64(i + 1), Value: []byte(v), Attempt: 1}
		}
		_, _ = fc.w.WriteDeliverBatch(ds, 0)
		_ = fc.w.Flush()
		for acked := 0; acked < len(values); {
			f, err := fc.read(testTimeout)
			if err != nil {
				return
			}
			acked += len(f.GetAck().GetDeliveryIds())
			for rs := f.GetAck().GetRanges(); len(rs) >= 2; rs = rs[2:] {
				acked += int(rs[1])
			}
		}
	}()
	return ln.Addr().String(), func() { <-done }
}
