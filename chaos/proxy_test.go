package chaos

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/internal/testutil"
)

// echoServer echoes lines on 127.0.0.1:0 until the test ends.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

func TestProxyCutClosesLinksAndRefusesNewOnesUntilHeal(t *testing.T) {
	log := logrus.NewEntry(logrus.New())
	p, err := NewProxy("127.0.0.1:0", echoServer(t), log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.Cut()
	if err := roundTrip(c); err == nil {
		t.Fatal("a link survived the cut")
	}
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		if roundTrip(c2) == nil {
			t.Fatal("a new link went through a cut proxy")
		}
		c2.Close()
	}
	p.Heal()
	testutil.WaitFor(t, 10*time.Second, "a link after the heal", func() bool {
		c3, err := net.Dial("tcp", p.Addr())
		if err != nil {
			return false
		}
		defer c3.Close()
		return roundTrip(c3) == nil
	})
}
