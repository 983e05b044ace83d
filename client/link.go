package client

import (
	"context"
	"errors"
	"sync"
	"time"
)

// link keeps one session open: with one member in spread mode, or with the
// cluster (Config.Addrs, following redirects) in leader mode. Its goroutine
// connects, runs the session and reconnects with backoff until the client
// closes, the client's run loop stops it, or it gives up (a permanent error,
// or NoReconnect).
type link struct {
	c   *Client
	ctx context.Context // canceled by stop or Close: interrupts a dial or a backoff
	// stopCtx cancels ctx.
	stopCtx context.CancelFunc

	mu sync.Mutex // guards the fields below
	// member is the member's address; "" for the cluster link, which
	// connects to Config.Addrs in turn.
	member   string
	credit   int      // Hello.max_in_flight of the next session
	sess     *session // the welcomed session, nil between sessions
	stopping bool     // stop was called: retire the session and return
}

// newLink returns a link to member ("" for the cluster) whose sessions ask
// for credit; start runs it.
func newLink(c *Client, member string, credit int) *link {
	l := &link{c: c, member: member, credit: credit}
	l.ctx, l.stopCtx = context.WithCancel(c.ctx)
	return l
}

// start runs the link's goroutine, counted by the client's links.
func (l *link) start() {
	l.c.linkWG.Add(1)
	go func() {
		defer l.c.linkWG.Done()
		defer l.c.event(event{kind: evExited, link: l})
		l.run()
	}()
}

// stop retires the link's session (it ends once the messages it delivered
// are acked or nacked, see session.retire) and ends the link's goroutine
// after it, interrupting a dial or a backoff at once.
func (l *link) stop() {
	l.mu.Lock()
	l.stopping = true
	s := l.sess
	l.mu.Unlock()
	l.stopCtx()
	if s != nil {
		s.retire()
	}
}

// setCredit sets the credit of the link's sessions. A session that asked
// for another credit is retired and opened again with it.
func (l *link) setCredit(credit int) {
	l.mu.Lock()
	l.credit = credit
	s := l.sess
	l.mu.Unlock()
	if s != nil && s.credit != credit {
		s.retire()
	}
}

// setMember makes the link one to member ("" for the cluster link).
func (l *link) setMember(member string) {
	l.mu.Lock()
	l.member = member
	l.mu.Unlock()
}

// state returns the link's member, its current session (nil between
// sessions) and whether it is stopping.
func (l *link) state() (member string, s *session, stopping bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.member, l.sess, l.stopping
}

// addr names the link in logs: its session's address, else its member.
func (l *link) addr() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess != nil {
		return l.sess.addr
	}
	return l.member
}

// attach makes s the link's session; it reports false, and retires s, when
// the link is stopping. A session that asked for a credit the link no
// longer has (setCredit ran during its handshake) is retired too, to be
// opened again with the link's credit.
func (l *link) attach(s *session) bool {
	l.mu.Lock()
	stopping := l.stopping
	resplit := s.credit != l.credit
	if !stopping {
		l.sess = s
	}
	l.mu.Unlock()
	if stopping || resplit {
		s.retire()
	}
	return !stopping
}

// run connects, serves sessions and reconnects until Close, stop, or a
// reason to give up, which it reports to the client's run loop.
func (l *link) run() {
	c := l.c
	var (
		prefer    string // tried first: the last daemon, or a redirect target
		next      int    // next index into Config.Addrs
		failures  int    // consecutive failed attempts
		connected bool   // a session of this link was welcomed
		wait      time.Duration
	)
	for {
		if wait > 0 && !sleep(l.ctx, wait) {
			return
		}
		member, _, _ := l.state()
		addrs := c.cfg.Addrs
		if member != "" {
			addrs = []string{member}
		}
		addr := prefer
		prefer = ""
		if addr == "" {
			addr = addrs[next%len(addrs)]
			next++
		}
		l.mu.Lock()
		credit := l.credit
		l.mu.Unlock()
		s, err := c.connect(l, addr, credit)
		if err != nil {
			if l.ctx.Err() != nil {
				return
			}
			c.mu.Lock()
			c.lastErr = err
			c.mu.Unlock()
			c.log.Warn("connection attempt failed", "error", err)
			failures++
			if permanent(err) || (c.cfg.NoReconnect && (connected || failures >= len(addrs))) {
				c.event(event{kind: evGaveUp, link: l, err: err})
				return
			}
			wait = c.backoff(failures)
			if ra := retryAfter(err); ra > 0 {
				wait = ra
			}
			continue
		}
		connected = true
		s.log.Info("connected",
			"max_in_flight", s.welcome.GetMaxInFlight(),
			"heartbeat_ms", s.welcome.GetHeartbeatMs(),
			"topic", s.welcome.GetTopic(),
			"members", len(s.welcome.GetMembers()))
		// Attached first: the run loop, told of the Welcome, may retire it.
		attached := l.attach(s)
		c.event(event{kind: evWelcomed, link: l, sess: s})
		began := time.Now()
		err = s.run(c.ctx)
		l.mu.Lock()
		l.sess = nil
		stopping, newCredit := l.stopping, l.credit
		l.mu.Unlock()
		if c.ctx.Err() != nil {
			s.log.Info("closed")
			return
		}
		if !attached || stopping {
			s.log.Info("session retired: no longer needed")
			return
		}
		if s.retired() {
			// A new share of the client's credit: open the session again
			// with it, at once.
			s.log.Info("reconnecting with a new share of the credit", "from", credit, "to", newCredit)
			prefer, failures, wait = s.addr, 0, 0
			continue
		}
		s.log.Warn("disconnected", "error", err)
		prefer = s.addr
		if retryAfter(err) > 0 && len(addrs) > 1 {
			// That daemon stopped leading (NO_LEADER, shutting down):
			// the next leader is more likely among the others.
			prefer = ""
		}
		var redirect *redirectError
		if errors.As(err, &redirect) {
			prefer = redirect.addr
		}
		if permanent(err) || c.cfg.NoReconnect {
			c.event(event{kind: evGaveUp, link: l, err: err})
			return
		}
		c.dropStale(l)
		// A session that ends right after its welcome counts as a failed
		// attempt, so that a daemon that keeps dropping the client (a
		// message the client cannot take, say) is not hammered.
		if time.Since(began) >= stableSession {
			failures = 0
		}
		failures++
		wait = c.backoff(failures)
		if ra := retryAfter(err); ra > 0 {
			wait = ra
		}
	}
}

// sleep waits d or until ctx ends; it reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
