//go:build integration

package integration

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/nanoservice/core-fanout/client"
	"github.com/nanoservice/core-fanout/client/protocol"
)

// hdrTraceparent is a W3C trace context header as a producer's tracer
// writes it: version, trace id, parent span id, flags.
const hdrTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// hdrSent are the record headers the test produces: trace context, a
// binary value, an empty one, a key given twice (order kept), non-ASCII.
var hdrSent = []sarama.RecordHeader{
	{Key: []byte("traceparent"), Value: []byte(hdrTraceparent)},
	{Key: []byte("tracestate"), Value: []byte("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")},
	{Key: []byte("bin"), Value: []byte{0x00, 0xff, 0x80, '\n', 0x01}},
	{Key: []byte("empty"), Value: []byte{}},
	{Key: []byte("dup"), Value: []byte("first")},
	{Key: []byte("dup"), Value: []byte("second")},
	{Key: []byte("clé"), Value: []byte("värde")},
}

// hdrDiff describes how got (key, value pairs) differs from hdrSent, or
// returns "".
func hdrDiff(got [][2][]byte) string {
	if len(got) != len(hdrSent) {
		return fmt.Sprintf("%d headers, want %d: %q", len(got), len(hdrSent), got)
	}
	for i, h := range hdrSent {
		if !bytes.Equal(got[i][0], h.Key) || !bytes.Equal(got[i][1], h.Value) {
			return fmt.Sprintf("header %d: %q=%q, want %q=%q", i, got[i][0], got[i][1], h.Key, h.Value)
		}
	}
	return ""
}

func clientHeaders(m *client.Message) [][2][]byte {
	var out [][2][]byte
	for _, h := range m.Headers {
		out = append(out, [2][]byte{[]byte(h.Key), h.Value})
	}
	return out
}

// Record headers reach the worker as the producer wrote them, through the
// real Kafka and daemon: a W3C traceparent (what a tracer continues the
// trace from) and the rest byte for byte, in order, duplicates kept, to the
// Go client (batch frames) on its first delivery and on a redelivery, and
// to a client that reads single Deliver frames.
func TestHeadersReachWorkersUnchanged(t *testing.T) {
	t.Parallel()
	topic := uniqueName(t, "headers")
	createTopic(t, topic, 1)
	opts := daemonOptions(t, topic)
	d := startDaemon(t, opts)

	c := dial(t, client.Config{ClientID: "headers"}, d.addr)
	produce(t, topic, &sarama.ProducerMessage{Value: sarama.StringEncoder("traced-1"), Headers: hdrSent})
	m := recv(t, c, 30*time.Second)
	if diff := hdrDiff(clientHeaders(m)); string(m.Value) != "traced-1" || m.Attempt != 1 || diff != "" {
		t.Fatalf("Go client, first delivery of %q (attempt %d): %s", m.Value, m.Attempt, diff)
	}
	if got := m.Headers[0]; got.Key != "traceparent" || string(got.Value) != hdrTraceparent {
		t.Fatalf("traceparent %q=%q", got.Key, got.Value)
	}
	if err := m.Nack(); err != nil {
		t.Fatal(err)
	}
	m = recv(t, c, 30*time.Second)
	if diff := hdrDiff(clientHeaders(m)); string(m.Value) != "traced-1" || m.Attempt != 2 || diff != "" {
		t.Fatalf("Go client, redelivery of %q (attempt %d): %s", m.Value, m.Attempt, diff)
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// A client without CAPABILITY_BATCH: single Deliver frames.
	raw := semDialRaw(t, d.addr, 0)
	raw.hello(10)
	produce(t, topic, &sarama.ProducerMessage{Value: sarama.StringEncoder("traced-2"), Headers: hdrSent})
	dv := raw.deliveries(1, 30*time.Second)[0]
	var got [][2][]byte
	for _, h := range dv.GetHeaders() {
		got = append(got, [2][]byte{[]byte(h.GetKey()), h.GetValue()})
	}
	if diff := hdrDiff(got); string(dv.GetValue()) != "traced-2" || diff != "" {
		t.Fatalf("Deliver frame of %q: %s", dv.GetValue(), diff)
	}
	raw.mustSend(protocol.AckFrame([]uint64{dv.GetDeliveryId()}))
}
