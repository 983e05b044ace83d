package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/internal/actor"
)

// Proxy is a TCP proxy on loopback that can cut the link it carries: Cut
// closes every connection through it and refuses new ones (accepted, then
// closed at once) until Heal. It stands between one daemon and Kafka,
// ZooKeeper or its clients.
type Proxy struct {
	ln     net.Listener
	target string
	log    *logrus.Entry
	g      actor.Group

	mu    sync.Mutex // guards cut and conns
	cut   bool
	conns map[net.Conn]struct{}
}

// NewProxy listens on listen and forwards each connection to target.
func NewProxy(listen, target string, log *logrus.Entry) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("proxy to %s: %w", target, err)
	}
	p := &Proxy{ln: ln, target: target, log: log, conns: map[net.Conn]struct{}{}}
	p.g.Go(log, "proxy-accept "+ln.Addr().String(), p.accept, nil)
	return p, nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection through the proxy and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Heal lets connections through again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.Cut()
	p.g.Wait()
	return err
}

// track registers c unless the proxy is cut.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

func (p *Proxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.log.WithError(err).Warn("proxy accept")
			}
			return
		}
		if !p.track(in) {
			in.Close()
			continue
		}
		p.g.Go(p.log, "proxy-conn", func() { p.serve(in) }, nil)
	}
}

// serve copies both ways between in and a new connection to the target.
func (p *Proxy) serve(in net.Conn) {
	var d net.Dialer
	out, err := d.DialContext(context.Background(), "tcp", p.target)
	if err != nil {
		p.untrack(in)
		return
	}
	if !p.track(out) {
		p.untrack(in, out)
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	p.g.Go(p.log, "proxy-pipe", func() { pipe(out, in) }, nil)
	pipe(in, out)
	// One direction ended: end both, so that neither side waits on a half-open link.
	p.untrack(in, out)
	<-done
}
