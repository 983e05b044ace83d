package protocol

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// A vector Writer refers to the payloads of VectorMin bytes or more rather
// than copying them, copies the smaller ones, and hands everything to the
// connection in one call per Flush.
func TestVectorWriterRefersToPayloads(t *testing.T) {
	t.Parallel()
	large, small := bytes.Repeat([]byte{'L'}, VectorMin), bytes.Repeat([]byte{'s'}, VectorMin-1)
	hv := bytes.Repeat([]byte{'h'}, 2*VectorMin)
	ds := []*Deliver{
		{DeliveryId: 1, Value: large, Key: small, Headers: []*Header{{Key: "trace", Value: hv}}},
		{DeliveryId: 2, Value: small},
	}
	var pw piecesWriter
	w := NewVectorWriter(&pw, 0)
	if n, err := w.WriteDeliverBatch(ds, 0); n != 2 || err != nil {
		t.Fatalf("WriteDeliverBatch = %d, %v", n, err)
	}
	if err := w.WriteDeliver(ds[0]); err != nil {
		t.Fatal(err)
	}
	if pw.calls != 0 {
		t.Fatalf("%d writes before Flush", pw.calls)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if pw.calls != 1 {
		t.Fatalf("%d calls of WriteBuffers for one Flush, want 1", pw.calls)
	}
	refs := map[*byte]int{}
	for _, p := range pw.pieces {
		refs[unsafe.SliceData(p)]++
	}
	if refs[unsafe.SliceData(large)] != 2 || refs[unsafe.SliceData(hv)] != 2 {
		t.Errorf("the large value and header value were copied (referred to %d and %d times, want 2 each)",
			refs[unsafe.SliceData(large)], refs[unsafe.SliceData(hv)])
	}
	if refs[unsafe.SliceData(small)] != 0 {
		t.Errorf("a payload below VectorMin was referred to, not copied")
	}
	want, _ := marshalBatch(t, ds)
	d0, _ := marshalDeliver(t, ds[0])
	if got := bytes.Join(pw.pieces, nil); !bytes.Equal(got, append(want, d0...)) {
		t.Fatalf("wrote %x, want %x", got, append(want, d0...))
	}
}

// A vector Writer writes what is pending once it reaches vectorFlushAt,
// without waiting for Flush.
func TestVectorWriterFlushesALargeBatchInParts(t *testing.T) {
	t.Parallel()
	var pw piecesWriter
	w := NewVectorWriter(&pw, 0)
	d := &Deliver{DeliveryId: 1, Value: make([]byte, 64<<10)}
	for range 2 * vectorFlushAt / len(d.Value) {
		if err := w.WriteDeliver(d); err != nil {
			t.Fatal(err)
		}
	}
	if pw.calls == 0 {
		t.Fatalf("nothing written with %d bytes pending", w.Buffered())
	}
}

// Over TCP a vector Writer's Flush goes through net.Buffers (writev), and
// the peer reads the frames it wrote.
func TestVectorWriterOverTCP(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ds := benchBatch(300, 1000)
	w := NewVectorWriter(c, 0)
	if n, err := w.WriteDeliverBatch(ds, 0); n != len(ds) || err != nil {
		t.Fatalf("WriteDeliverBatch = %d, %v", n, err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	want, _ := marshalBatch(t, ds)
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the peer read %d bytes, want the %d of the frame", len(b), len(want))
	}
}

// BenchmarkWriteDeliverBatchTCP measures DeliverBatch frames of 250
// deliveries written and flushed to a loopback TCP connection that a
// goroutine drains: by a copying Writer and by a vector one. cpu-ns/msg is
// the process's CPU time (user and system, the reader's included) per
// delivery.
func BenchmarkWriteDeliverBatchTCP(b *testing.B) {
	for _, size := range []int{100, 512, 1024, 4096} {
		for _, vector := range []bool{false, true} {
			name := "copy"
			if vector {
				name = "vector"
			}
			b.Run(fmt.Sprintf("value=%d/%s", size, name), func(b *testing.B) { benchConn(b, size, vector, nil, nil) })
		}
	}
}

// benchConn writes DeliverBatch frames of 250 deliveries of size bytes to a
// loopback TCP connection, through wrap's listener and client's connection
// when they are not nil (TLS).
func benchConn(b *testing.B, size int, vector bool, wrap func(net.Listener) net.Listener, client func(net.Conn) net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	if wrap != nil {
		ln = wrap(ln)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(io.Discard, c)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	if client != nil {
		c = client(c)
	}
	ds := make([]*Deliver, 250)
	value := bytes.Repeat([]byte{'x'}, size)
	for i := range ds {
		ds[i] = &Deliver{DeliveryId: uint64(1 << 40), Partition: 3, Offset: int64(i), Value: value, Attempt: 1,
			TimestampMs: 1764672000000, Headers: []*Header{{Key: "trace-id", Value: []byte("0af7651916cd43dd8448eb211c80319c")}}}
	}
	w := NewWriter(c, 0)
	if vector {
		w = NewVectorWriter(c, 0)
	}
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	b.SetBytes(int64(size * len(ds)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := w.WriteDeliverBatch(ds, 0); err != nil {
			b.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*len(ds)), "cpu-ns/msg")
	c.Close()
	<-done
}

// BenchmarkWriteDeliverBatchTLS is BenchmarkWriteDeliverBatchTCP over TLS,
// where a vector Writer's pieces are written one by one (tls.Conn has no
// writev): each is a TLS record of its own.
func BenchmarkWriteDeliverBatchTLS(b *testing.B) {
	cert := selfSigned(b)
	for _, size := range []int{100, 1024, 4096} {
		for _, vector := range []bool{false, true} {
			name := "copy"
			if vector {
				name = "vector"
			}
			b.Run(fmt.Sprintf("value=%d/%s", size, name), func(b *testing.B) {
				benchConn(b, size, vector, func(l net.Listener) net.Listener {
					return tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}})
				}, func(c net.Conn) net.Conn {
					return tls.Client(c, &tls.Config{InsecureSkipVerify: true})
				})
			})
		}
	}
}

// selfSigned returns a certificate for 127.0.0.1 signed by itself.
func selfSigned(tb testing.TB) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
