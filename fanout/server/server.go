// Package server is the TCP front of the daemon: it accepts client
// connections, runs the fanout.v1 handshake on each, and connects every
// welcomed client to the dispatcher through the dispatch.Backend and
// dispatch.ClientSink seam.
//
// Each connection has two goroutines: a reader, the only reader of the
// socket, which turns Ack/Nack/Touch frames into Backend calls, and a pump,
// the only writer, which encodes queued deliveries and control frames and
// flushes them once per batch. See conn.go and outbox.go.
package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
	"github.com/nanoservice/core-fanout/internal/actor"
	"github.com/nanoservice/core-fanout/internal/backoff"
)

// Defaults for the zero values of Config fields.
const (
	DefaultHeartbeat    = 5 * time.Second
	DefaultLiveness     = 2
	DefaultWriteTimeout = 10 * time.Second
	DefaultHelloTimeout = 10 * time.Second
	// DefaultMaxOutboxBytes bounds the control frames queued for one
	// connection: thousands of Pongs, where a client that reads needs a few.
	DefaultMaxOutboxBytes = 256 << 10
	// DefaultMaxHandshakes bounds the connections that have not sent their
	// Hello yet; each holds two goroutines and a read buffer: about 8 KiB
	// of heap and 7.5 KiB of stacks (BenchmarkHandshakingConnection), 16 MiB
	// at this bound.
	DefaultMaxHandshakes = 1024
	// DefaultMaxObserverBytes bounds the copies queued for one observer and
	// not yet written: a burst of a few thousand messages fits.
	DefaultMaxObserverBytes = 16 << 20
)

// minOutboxBytes is the smallest MaxOutboxBytes: room for a Welcome, an
// Error and a Goodbye with long texts.
const minOutboxBytes = 16 << 10

// noLeaderRetry is the retry_after_ms told to clients when no leader is
// known and Leadership.RetryAfter is zero.
const noLeaderRetry = time.Second

// Config configures a Server. Zero durations and counts take the defaults
// documented on each field.
type Config struct {
	Listen       string        // address to listen on, e.g. ":4987"
	NodeID       string        // this node's id, told in Welcome
	Topic        string        // the Kafka topic served, told in Welcome
	MaxInFlight  int           // cap on a client's in-flight limit; a Hello asking 0 gets this
	AckTimeout   time.Duration // the dispatcher's ack timeout, only told to clients in Welcome
	Heartbeat    time.Duration // ping interval; default DefaultHeartbeat
	Liveness     int           // heartbeats of silence before a client is dropped; default DefaultLiveness
	WriteTimeout time.Duration // a queued frame not written within this closes the client as slow; default DefaultWriteTimeout
	HelloTimeout time.Duration // time allowed to send Hello after connecting; default DefaultHelloTimeout
	MaxFrameSize int           // largest frame accepted from a client; default protocol.DefaultMaxFrameSize
	MaxClients   int           // welcomed clients allowed at once; 0 means unlimited
	// MaxOutboxBytes bounds the control frames (Pongs above all) queued for
	// one connection and not yet written; passing it closes the connection as
	// a slow consumer. Default DefaultMaxOutboxBytes.
	MaxOutboxBytes int
	// MaxHandshakes bounds the connections accepted that have not sent their
	// Hello yet; when one more arrives, the one that has waited longest is
	// closed. Default DefaultMaxHandshakes.
	MaxHandshakes int
	// MaxObserverBytes bounds the copies (payload bytes and a small
	// overhead each) queued for one observer (Hello.observer) and not yet
	// written; passing it closes the observer's connection ("observer
	// behind"), so that an observer never holds the daemon back. Default
	// DefaultMaxObserverBytes.
	MaxObserverBytes int
	AuthToken        string // when set, Hello.auth_token must equal it (or pass Authenticate)
	// Authenticate, when set, checks Hello.auth_token, given as its
	// SHA-256, against named tokens (--auth-tokens-file) and returns the
	// token's name, which then names the client in the logs. A client
	// passes with AuthToken or with a token Authenticate knows. It is called
	// by the connection's reader at each Hello, and by Reauthorize, and must
	// compare in constant time.
	Authenticate func(sum [sha256.Size]byte) (name string, ok bool)
	// VerifyClient, when set, checks a client's certificate chain (mutual
	// TLS) against the client CA in force now; Reauthorize ends the
	// sessions whose chain it refuses.
	VerifyClient func(chain []*x509.Certificate) error
	// TLS, when set, makes the listener speak TLS with this configuration
	// (tlsconf.Server.Config: TLS 1.2 minimum, certificates re-read when
	// their files change). The handshake runs within HelloTimeout; a
	// configuration that requires client certificates refuses clients
	// without a good one there. A plain-text client is answered in plain
	// text with an Error UNAUTHORIZED that says so.
	TLS *tls.Config
	// Leadership reports whether this node leads the cluster. It is asked at
	// every Hello; nil means this node always leads.
	Leadership func() Leadership
	Logger     *logrus.Entry // nil means the logrus standard logger

	// Members lists the advertised addresses (host:port) of the members
	// that own partitions, sorted, and the list's version (the spread-mode
	// assignment's epoch and generation); nil and nil in leader mode. It is
	// asked for the Welcome of each client that announces
	// CAPABILITY_MEMBERS, with the connection's lock held, and by
	// MembersChanged: it must not block (read a snapshot) and must not call
	// the Server. Nil means no members.
	Members func() ([]string, *protocol.MembersVersion)

	// ConsoleAddr returns the address of the daemon's metrics and console
	// listener ("" when it has none). It is named in the short HTTP 400
	// answer to an HTTP request on the client port; nil means none.
	ConsoleAddr func() string
}

// Leadership is this node's view of the cluster leader.
type Leadership struct {
	Leader     bool   // this node leads and serves clients
	LeaderAddr string // the leader's client address (host:port), when Known
	LeaderID   string // the leader's node id, when Known
	Epoch      uint64 // the leader's epoch, when Known
	Known      bool   // a follower knows who leads: clients are redirected there
	// RetryAfter is how long clients should wait before retrying when no
	// leader is known (an election takes about a cluster heartbeat or a
	// leader timeout); zero means one second.
	RetryAfter time.Duration
}

// withDefaults returns c with the zero values replaced by defaults.
func (c Config) withDefaults() Config {
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Liveness == 0 {
		c.Liveness = DefaultLiveness
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.HelloTimeout == 0 {
		c.HelloTimeout = DefaultHelloTimeout
	}
	if c.MaxFrameSize == 0 {
		c.MaxFrameSize = protocol.DefaultMaxFrameSize
	}
	if c.MaxOutboxBytes == 0 {
		c.MaxOutboxBytes = DefaultMaxOutboxBytes
	}
	if c.MaxHandshakes == 0 {
		c.MaxHandshakes = DefaultMaxHandshakes
	}
	if c.MaxObserverBytes == 0 {
		c.MaxObserverBytes = DefaultMaxObserverBytes
	}
	if c.Logger == nil {
		c.Logger = logrus.NewEntry(logrus.StandardLogger())
	}
	return c
}

// validate reports the first invalid field of a Config with defaults applied.
func (c Config) validate() error {
	const maxMillis = time.Duration(math.MaxUint32) * time.Millisecond
	switch {
	case c.Listen == "":
		return errors.New("Listen is empty")
	case c.NodeID == "":
		return errors.New("NodeID is empty")
	case c.Topic == "":
		return errors.New("Topic is empty")
	case c.MaxInFlight <= 0 || uint64(c.MaxInFlight) > math.MaxUint32:
		return fmt.Errorf("MaxInFlight must be in [1, %d], got %d", uint32(math.MaxUint32), c.MaxInFlight)
	case c.AckTimeout < time.Millisecond || c.AckTimeout > maxMillis:
		return fmt.Errorf("AckTimeout must be in [1ms, %v], got %v", maxMillis, c.AckTimeout)
	case c.Heartbeat < time.Millisecond || c.Heartbeat > maxMillis:
		return fmt.Errorf("Heartbeat must be in [1ms, %v], got %v", maxMillis, c.Heartbeat)
	case c.Liveness < 1 || c.Liveness > 1000:
		return fmt.Errorf("Liveness must be in [1, 1000], got %d", c.Liveness)
	case c.WriteTimeout < 0:
		return fmt.Errorf("WriteTimeout must be positive, got %v", c.WriteTimeout)
	case c.HelloTimeout < 0:
		return fmt.Errorf("HelloTimeout must be positive, got %v", c.HelloTimeout)
	case c.MaxFrameSize < 0 || uint64(c.MaxFrameSize) > math.MaxUint32:
		return fmt.Errorf("MaxFrameSize must be in [1, %d], got %d", uint32(math.MaxUint32), c.MaxFrameSize)
	case c.MaxClients < 0:
		return fmt.Errorf("MaxClients must not be negative, got %d", c.MaxClients)
	case c.MaxOutboxBytes < minOutboxBytes:
		return fmt.Errorf("MaxOutboxBytes must be at least %d, got %d", minOutboxBytes, c.MaxOutboxBytes)
	case c.MaxHandshakes < 1:
		return fmt.Errorf("MaxHandshakes must be at least 1, got %d", c.MaxHandshakes)
	case c.MaxObserverBytes < minOutboxBytes:
		return fmt.Errorf("MaxObserverBytes must be at least %d, got %d", minOutboxBytes, c.MaxObserverBytes)
	}
	return nil
}

// Server accepts client connections and connects them to a dispatch.Backend.
type Server struct {
	cfg     Config
	backend dispatch.Backend
	log     *logrus.Entry

	nextID   atomic.Uint64 // the last session id handed out
	clients  atomic.Int64  // welcomed (or being welcomed) clients, for MaxClients and Clients
	routines actor.Group   // every goroutine of the server
	closedBy [numCloseReasons]atomic.Uint64

	stopOnce sync.Once // closes the listener once

	mu      sync.Mutex // guards the fields below
	ln      net.Listener
	stopCtx func() bool // unregisters the context.AfterFunc of Start
	closed  bool
	conns   map[uint64]*conn // open connections by session id
	waiting hello            // connections that have not sent their Hello, oldest first
	// identities counts the welcomed clients by identity (certificate
	// subject, token name; "" for neither).
	identities map[string]int
}

// hello is the list of connections waiting for their Hello, oldest first,
// linked through conn.helloPrev and conn.helloNext. Server.mu guards it.
type hello struct {
	first, last *conn
	n           int
}

func (l *hello) push(c *conn) {
	c.helloPrev, c.helloNext, c.waiting = l.last, nil, true
	if l.last != nil {
		l.last.helloNext = c
	} else {
		l.first = c
	}
	l.last = c
	l.n++
}

func (l *hello) remove(c *conn) {
	if !c.waiting {
		return
	}
	if c.helloPrev != nil {
		c.helloPrev.helloNext = c.helloNext
	} else {
		l.first = c.helloNext
	}
	if c.helloNext != nil {
		c.helloNext.helloPrev = c.helloPrev
	} else {
		l.last = c.helloPrev
	}
	c.helloPrev, c.helloNext, c.waiting = nil, nil, false
	l.n--
}

// Stats are the server's gauges and counters, for metrics.
type Stats struct {
	Handshaking int // connections that have not sent their Hello
	// Closed counts the connections closed since the server started, by
	// reason (CloseReasons names them).
	Closed [numCloseReasons]uint64
	// Identities counts the welcomed clients by identity: the client
	// certificate's subject (mutual TLS) and the named token's name; ""
	// for clients with neither.
	Identities map[string]int
}

// Stats returns a snapshot of the server's gauges and counters.
func (s *Server) Stats() Stats {
	var st Stats
	s.mu.Lock()
	st.Handshaking = s.waiting.n
	st.Identities = make(map[string]int, len(s.identities))
	for id, n := range s.identities {
		st.Identities[id] = n
	}
	s.mu.Unlock()
	for i := range st.Closed {
		st.Closed[i] = s.closedBy[i].Load()
	}
	return st
}

// Session is an open client connection past its Hello, for the console.
type Session struct {
	ID   uint64 // session id, also the client's id in the backend
	Name string // the client id from its Hello
	// Identity is who the client proved to be: its certificate's subject
	// (mutual TLS) and/or its named token's name; "" when neither.
	Identity string
	Remote   string    // the client's address
	Since    time.Time // when the connection was accepted
}

// Sessions returns the open connections that have sent their Hello, in no
// particular order. Welcomed clients are among them; so, briefly, are
// connections being refused or redirected.
func (s *Server) Sessions() []Session {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		if !c.waiting {
			conns = append(conns, c)
		}
	}
	s.mu.Unlock()
	out := make([]Session, len(conns))
	for i, c := range conns {
		c.mu.Lock()
		name, identity := c.name, c.identity
		c.mu.Unlock()
		out[i] = Session{ID: c.id, Name: name, Identity: identity, Remote: c.remote, Since: c.start}
	}
	return out
}

// New validates cfg and returns a Server that is not yet listening.
func New(cfg Config, backend dispatch.Backend) (*Server, error) {
	if backend == nil {
		return nil, errors.New("server: nil backend")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("server: invalid config: %w", err)
	}
	return &Server{
		cfg:     cfg,
		backend: backend,
		log:     cfg.Logger.WithField("component", "server"),
		conns:   make(map[uint64]*conn),

		identities: make(map[string]int),
	}, nil
}

// Start binds Config.Listen and accepts connections in the background until
// StopAccepting or Close. When ctx is done the server closes as by Close.
// It returns once the listener is bound, so Addr is valid after it.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errors.New("server: start after close")
	case s.ln != nil:
		return errors.New("server: already started")
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("server: listen on %s: %w", s.cfg.Listen, err)
	}
	s.ln = ln
	s.stopCtx = context.AfterFunc(ctx, func() { _ = s.Close() })
	log := s.log.WithField("addr", ln.Addr().String())
	s.spawn(log, "accept", func() { s.acceptLoop(ln, log) }, nil)
	log.Info("listening for clients")
	return nil
}

// Addr returns the address the server listens on, or nil before Start.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// StopAccepting closes the listener. Connections already accepted stay open.
func (s *Server) StopAccepting() { _ = s.stopAccepting() }

func (s *Server) stopAccepting() error {
	s.mu.Lock()
	ln := s.ln
	s.mu.Unlock()
	if ln == nil {
		return nil
	}
	var err error
	s.stopOnce.Do(func() {
		if cerr := ln.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
			err = fmt.Errorf("server: close listener: %w", cerr)
		}
	})
	return err
}

// Close stops accepting, closes every connection (a welcomed client leaves
// the backend with dispatch.LeaveShutdown after an Error SHUTTING_DOWN), and
// waits for all of the server's goroutines to end: up to lingerTimeout
// (half a second) when a client does not hang up after the final frame. It
// may be called more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	first := !s.closed
	s.closed = true
	stopCtx := s.stopCtx
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	if stopCtx != nil {
		stopCtx()
	}
	err := s.stopAccepting()
	if first {
		for _, c := range conns {
			c.close(closeShutdown, errShutdown,
				protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_SHUTTING_DOWN, true, "the daemon is shutting down"))
		}
	}
	s.routines.Wait()
	return err
}

// Reauthorize checks again the credentials of every connection that
// passed them, against the tokens and the client CA in force now
// (Config.Authenticate, Config.VerifyClient), and ends, with a fatal Error
// UNAUTHORIZED, each whose named token or certificate is no longer
// accepted: a welcomed client leaves the backend, which gives the
// deliveries it held to other clients at once. The daemon calls it when
// the tokens file or the TLS files changed, and on SIGHUP. It returns the
// number of connections it ended.
func (s *Server) Reauthorize() int {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	ended := 0
	for _, c := range conns {
		if c.closing.Load() {
			continue
		}
		if err := c.stillAuthorized(); err != nil {
			c.close(closeRevoked, err, protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED, true,
				"the daemon no longer accepts this client: %v", err))
			ended++
		}
	}
	return ended
}

// errShutdown is the close error of connections closed by Server.Close.
var errShutdown = errors.New("server shutting down")

// Clients returns the number of connected, welcomed clients.
func (s *Server) Clients() int { return int(s.clients.Load()) }

// RedirectAll sends every connection a Redirect to the leader l names (or,
// when l does not know the leader, an Error NO_LEADER) and closes it; welcomed
// clients leave the backend with dispatch.LeaveShutdown. It does nothing when
// l says this node leads. Config.Leadership should report the new state
// before RedirectAll is called, so that reconnecting clients are redirected too.
func (s *Server) RedirectAll(l Leadership) {
	if l.Leader {
		return
	}
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		f, err := leadershipFrame(l)
		c.close(closeRedirected, err, f)
	}
}

// MembersChanged sends every welcomed client that announced
// CAPABILITY_MEMBERS the list Config.Members returns now, in a Members
// frame. The daemon calls it after the list changed, holding nothing
// Config.Members takes. It never blocks on a client: a connection holds at
// most one list not yet written, the latest, one frame shared by every
// connection.
func (s *Server) MembersChanged() {
	f := protocol.MembersFrame(s.members())
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.membersChanged(f)
	}
}

// members returns Config.Members' list and version, or nil without one.
func (s *Server) members() ([]string, *protocol.MembersVersion) {
	if s.cfg.Members == nil {
		return nil, nil
	}
	return s.cfg.Members()
}

// leadership returns the current leadership, asking Config.Leadership.
func (s *Server) leadership() Leadership {
	if s.cfg.Leadership == nil {
		return Leadership{Leader: true}
	}
	return s.cfg.Leadership()
}

// leadershipFrame returns the frame that sends a client away from a follower:
// a Redirect when the leader is known, else a fatal Error NO_LEADER.
func leadershipFrame(l Leadership) (*protocol.Frame, error) {
	if l.Known {
		return protocol.RedirectFrame(l.LeaderAddr, l.LeaderID, l.Epoch),
			fmt.Errorf("redirected to leader %s at %s (epoch %d)", l.LeaderID, l.LeaderAddr, l.Epoch)
	}
	f := protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_NO_LEADER, true, "no leader is elected; retry later")
	retry := l.RetryAfter
	if retry <= 0 {
		retry = noLeaderRetry
	}
	f.GetError().RetryAfterMs = uint32(retry / time.Millisecond)
	return f, errors.New("no leader is known")
}

// reserveClient takes a client slot, respecting MaxClients.
func (s *Server) reserveClient() bool {
	n := s.clients.Add(1)
	if s.cfg.MaxClients > 0 && n > int64(s.cfg.MaxClients) {
		s.clients.Add(-1)
		return false
	}
	return true
}

// acceptLoop accepts connections until the listener is closed. Failures
// such as running out of file descriptors are retried with a backoff.
func (s *Server) acceptLoop(ln net.Listener, log *logrus.Entry) {
	b := backoff.Backoff{Min: 5 * time.Millisecond, Max: time.Second}
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				log.Info("stopped accepting clients")
				return
			}
			wait := b.Next()
			log.WithError(err).Warnf("accept failed; retrying in %v", wait)
			time.Sleep(wait)
			continue
		}
		b.Reset()
		s.serveConn(nc)
	}
}

// serveConn registers a new connection and starts its goroutines. When
// MaxHandshakes connections are already waiting for their Hello, the one
// that has waited longest is closed: a flood of silent connections cannot
// keep a real client out, which sends its Hello as soon as it connects.
func (s *Server) serveConn(nc net.Conn) {
	id := s.nextID.Add(1)
	c := newConn(s, nc, id)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	s.conns[id] = c
	s.waiting.push(c)
	var evict *conn
	if s.waiting.n > s.cfg.MaxHandshakes {
		evict = s.waiting.first
		s.waiting.remove(evict)
	}
	s.mu.Unlock()
	s.spawn(c.log, "reader", c.readLoop, c.readerPanicked)
	s.spawn(c.log, "pump", c.pump, c.pumpPanicked)
	if evict != nil {
		evict.close(closeEvicted,
			fmt.Errorf("more than %d connections waiting for hello; this one waited longest", s.cfg.MaxHandshakes),
			protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_TOO_MANY_CLIENTS, true, "too many connections waiting for hello"))
	}
}

// countIdentity adds delta to the welcomed clients of identity.
func (s *Server) countIdentity(identity string, delta int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.identities[identity] += delta; s.identities[identity] <= 0 {
		delete(s.identities, identity)
	}
}

// helloRead takes c off the list of connections waiting for their Hello.
func (s *Server) helloRead(c *conn) {
	s.mu.Lock()
	s.waiting.remove(c)
	s.mu.Unlock()
}

// forget removes a closed connection from the registry.
func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c.id)
	s.waiting.remove(c)
	s.mu.Unlock()
}

// spawn runs fn in a goroutine owned by the server. A panic in fn is
// logged with its stack and handed to onPanic (when not nil) so that only
// the goroutine's own connection is closed.
func (s *Server) spawn(log *logrus.Entry, name string, fn func(), onPanic func(v any)) {
	if onPanic == nil {
		onPanic = func(any) {}
	}
	s.routines.Go(log, name, fn, onPanic)
}
