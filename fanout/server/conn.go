package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/nanoservice/core-fanout/client/protocol"
	"github.com/nanoservice/core-fanout/fanout/dispatch"
)

// closeReason says why a connection closed, for the log line and the
// dispatch.LeaveReason given to the backend.
type closeReason int

const (
	closeGoodbye        closeReason = iota // the client said goodbye
	closeDisconnect                        // the client closed the connection, or it failed
	closeDead                              // no frame within the liveness window
	closeSlow                              // queued frames not read within WriteTimeout, or the outbox bound passed
	closeProtocol                          // the client broke the protocol
	closeRejected                          // the handshake was refused (version, auth, capacity)
	closeRedirected                        // this node does not lead
	closeShutdown                          // Server.Close
	closeInternal                          // a bug: a goroutine of the connection panicked
	closeEvicted                           // no Hello yet, and the longest waiting when too many waited
	closeObserverBehind                    // an observer's queued copies passed MaxObserverBytes
	closeRevoked                           // its token or certificate is no longer accepted (Server.Reauthorize)
	closeDrained                           // the dispatcher drained the client (an operator's action)
	numCloseReasons
)

// CloseReasons names the reasons a connection closes, as indexes of
// Stats.Closed, for logs and metrics.
var CloseReasons = [numCloseReasons]string{"goodbye", "disconnect", "dead", "slow consumer", "protocol error", "rejected", "redirected", "shutdown", "internal error", "handshake evicted", "observer behind", "revoked", "drained"}

// String names the reason for logs.
func (r closeReason) String() string { return CloseReasons[r] }

// leave maps the reason to the backend's vocabulary.
func (r closeReason) leave() dispatch.LeaveReason {
	switch r {
	case closeGoodbye:
		return dispatch.LeaveGoodbye
	case closeDead:
		return dispatch.LeaveDead
	case closeSlow, closeObserverBehind:
		return dispatch.LeaveSlow
	case closeProtocol, closeRejected:
		return dispatch.LeaveProtocol
	case closeRedirected, closeShutdown, closeDrained:
		return dispatch.LeaveShutdown
	}
	return dispatch.LeaveDisconnect
}

// level is the log level of the one line logged when a connection closes.
func (r closeReason) level() logrus.Level {
	switch r {
	case closeDead, closeSlow, closeProtocol, closeRejected, closeEvicted, closeObserverBehind, closeRevoked:
		return logrus.WarnLevel
	case closeInternal:
		return logrus.ErrorLevel
	}
	return logrus.InfoLevel
}

// Bounds of the lingering close after a final frame: the client gets this
// long to read it and hang up before the socket is closed, and at most this
// many bytes it sends meanwhile are read and dropped.
const (
	lingerTimeout = 500 * time.Millisecond
	lingerBytes   = 256 << 10
)

// Buffer sizes of a connection: the reader's read-ahead, and the pump's
// write buffer for a connection that ends before its Welcome (one final
// frame; a welcomed one gets protocol.NewWriter's 64 KiB).
const (
	readAhead  = 4 << 10
	finalWrite = 512
)

// conn is one client connection. It implements dispatch.ClientSink.
type conn struct {
	s      *Server
	nc     net.Conn // the protocol's stream: raw, or a *tls.Conn over it
	raw    net.Conn // the TCP connection
	id     uint64   // session id, also the client id given to the backend
	log    *logrus.Entry
	remote string
	start  time.Time

	lastSeen   atomic.Int64  // unix nanoseconds of the last frame read
	closing    atomic.Bool   // set first thing when the connection starts closing
	obsBehind  atomic.Bool   // an observer's copies passed MaxObserverBytes: the pump closes
	drained    atomic.Bool   // the backend drained the client (Disconnect): the pump closes
	closed     chan struct{} // closed when close has done its work
	readerDone chan struct{} // closed when the reader returns
	signal     chan struct{} // capacity 1: the outbox became non-empty, or closing

	closeOnce sync.Once

	// joinMu orders Join before Leave: Join is only called while holding it
	// and before closing is set, and close reads joined while holding it.
	joinMu   sync.Mutex
	joined   bool // backend.Join was called
	reserved bool // a client slot is held (Server.reserveClient)

	// In Server.waiting while the Hello has not been read; Server.mu guards
	// these.
	waiting              bool
	helloPrev, helloNext *conn

	// maxFrame is the largest frame the client accepts (Hello.max_frame_size,
	// or the protocol's default), and batch whether it reads DeliverBatch
	// frames (CAPABILITY_BATCH). The reader sets them before queueing the
	// Welcome; the pump reads them when it writes the Welcome.
	maxFrame int
	batch    bool
	// weight (Hello.weight, or the default) and observer (Hello.observer)
	// are set by the reader before the client joins, never changed after.
	weight   int
	observer bool
	// nackCut: a Nack of this client asked for more than the longest delay
	// (logged once per connection).
	nackCut bool

	mu       sync.Mutex // guards the outbox and the fields below it
	out      []outItem  // frames and deliveries for the pump, in order
	outBytes int        // what the control entries of out are charged (MaxOutboxBytes)
	obsBytes int        // an observer: what its copies in out are charged (MaxObserverBytes)
	outSince time.Time  // when out last became non-empty
	overflow bool       // an entry was dropped at the MaxOutboxBytes bound: the pump closes
	name     string     // the client id from Hello
	identity string     // the client certificate's subject (mutual TLS), for logs
	// The credentials the client passed with, for Server.Reauthorize: its
	// certificate chain (mutual TLS), and the SHA-256 of its token when a
	// named token (Config.Authenticate) let it in.
	certs    []*x509.Certificate
	tokenSum [sha256.Size]byte
	named    bool
	final    *protocol.Frame
	// finalRaw writes final, and lingers, on raw rather than nc: the TLS
	// handshake failed, so only the TCP connection can still carry bytes.
	finalRaw bool
	// finalHTTP, when set, is written instead of a final frame: the answer
	// to an HTTP request on the client port.
	finalHTTP []byte
	reason    closeReason
	closeErr  error
	// wantMembers is set with the Welcome of a client that announced
	// CAPABILITY_MEMBERS; members is then the latest Members frame not yet
	// taken by the pump (Server.MembersChanged), written after out.
	wantMembers bool
	members     *protocol.Frame
}

func newConn(s *Server, nc net.Conn, id uint64) *conn {
	remote := nc.RemoteAddr().String()
	c := &conn{
		s:          s,
		nc:         nc,
		raw:        nc,
		id:         id,
		remote:     remote,
		start:      time.Now(),
		log:        s.log.WithFields(logrus.Fields{"remote": remote, "session": id}),
		closed:     make(chan struct{}),
		readerDone: make(chan struct{}),
		signal:     make(chan struct{}, 1),
	}
	if s.cfg.TLS != nil {
		c.nc = tls.Server(nc, s.cfg.TLS) // the reader runs the handshake, before the Hello
	}
	c.lastSeen.Store(c.start.UnixNano())
	return c
}

// close closes the connection once: it records why, tells the backend (if
// the client joined), stops the reader, and has the pump write final (when
// not nil) before the socket is closed. It never blocks on the socket.
func (c *conn) close(reason closeReason, err error, final *protocol.Frame) {
	c.closeOnce.Do(func() {
		c.closing.Store(true)
		// Even if the backend panics below, the pump must learn of the close.
		defer close(c.closed)
		c.mu.Lock()
		c.reason, c.closeErr, c.final = reason, err, final
		clear(c.out) // undelivered messages are redelivered by the backend after Leave
		c.out, c.members = nil, nil
		name, identity := c.name, c.identity
		c.mu.Unlock()
		// Stop the reader and abort a blocked write; the pump sets its own
		// deadline for the final frame.
		now := time.Now()
		_ = c.nc.SetReadDeadline(now)
		_ = c.nc.SetWriteDeadline(now)
		c.wake()
		c.s.forget(c)
		c.s.closedBy[reason].Add(1)

		c.joinMu.Lock()
		joined, reserved := c.joined, c.reserved
		c.joinMu.Unlock()
		if reserved {
			c.s.clients.Add(-1)
			c.s.countIdentity(identity, -1)
		}
		entry := c.log.WithFields(logrus.Fields{
			"client":   name,
			"reason":   reason.String(),
			"duration": time.Since(c.start).Round(time.Millisecond).String(),
		})
		if identity != "" {
			entry = entry.WithField("identity", identity)
		}
		if err != nil {
			entry = entry.WithField("error", err.Error())
		}
		entry.Log(reason.level(), "client connection closed")
		if joined {
			c.s.backend.Leave(c.id, reason.leave())
		}
	})
}

// wake signals the pump without blocking.
func (c *conn) wake() {
	select {
	case c.signal <- struct{}{}:
	default:
	}
}

// readLoop is the reader goroutine: the handshake, then frames until the
// connection closes.
func (c *conn) readLoop() {
	defer close(c.readerDone)
	// A Hello is small: a connection that has not said hello cannot make
	// the daemon read a large frame. Clients send small frames (acks), so a
	// small read-ahead buffer serves them as well as a large one.
	rd := protocol.NewReaderSize(c.nc, min(protocol.MaxHelloSize, c.s.cfg.MaxFrameSize), readAhead)
	// One Frame is reused for every read. Decoding replaces its body with
	// freshly allocated messages, so the id slices handed to the backend are
	// never overwritten by a later frame.
	var f protocol.Frame
	if !c.handshake(rd, &f) {
		return
	}
	for {
		if err := rd.ReadFrame(&f); err != nil {
			c.readFailed(err)
			return
		}
		c.lastSeen.Store(time.Now().UnixNano())
		if c.closing.Load() || !c.handle(&f) {
			return
		}
	}
}

// handle acts on one frame after the handshake. It returns false when the
// connection is closing.
func (c *conn) handle(f *protocol.Frame) bool {
	switch body := f.Body.(type) {
	case *protocol.Frame_Ack:
		c.settle(dispatch.OpAck, body.Ack.GetDeliveryIds(), body.Ack.GetRanges(), dispatch.NackInfo{})
	case *protocol.Frame_Nack:
		c.settle(dispatch.OpNack, body.Nack.GetDeliveryIds(), body.Nack.GetRanges(), c.nackInfo(body.Nack))
	case *protocol.Frame_Touch:
		c.settle(dispatch.OpTouch, body.Touch.GetDeliveryIds(), body.Touch.GetRanges(), dispatch.NackInfo{})
	case *protocol.Frame_Ping:
		c.pong(body.Ping.GetNonce())
	case *protocol.Frame_Pong:
		// A sign of life; lastSeen is already updated.
	case *protocol.Frame_Goodbye:
		c.close(closeGoodbye, fmt.Errorf("client said goodbye: %q", body.Goodbye.GetReason()), nil)
		return false
	default:
		c.unexpected(f, "after the handshake")
		return false
	}
	return true
}

// settle hands the ids and ranges of an Ack, Nack or Touch to the backend:
// the ids as a list, the ranges (pairs of a first id and a count, checked
// by the protocol's Reader) in one Settle.
func (c *conn) settle(op dispatch.Op, ids, ranges []uint64, how dispatch.NackInfo) {
	b := c.s.backend
	if len(ids) > 0 {
		switch op {
		case dispatch.OpAck:
			b.Ack(c.id, ids)
		case dispatch.OpNack:
			b.Nack(c.id, ids, how)
		default:
			b.Touch(c.id, ids)
		}
	}
	if len(ranges) > 0 {
		rs := make([]dispatch.Range, len(ranges)/2)
		for i := range rs {
			rs[i] = dispatch.Range{First: ranges[2*i], Count: ranges[2*i+1]}
		}
		b.Settle(c.id, op, rs, how)
	}
}

// nackInfo returns the delay and reason of n, logging once per connection
// a delay cut to the longest.
func (c *conn) nackInfo(n *protocol.Nack) dispatch.NackInfo {
	delay, cut := protocol.NackDelay(n)
	if cut && !c.nackCut {
		c.nackCut = true
		c.log.WithFields(logrus.Fields{"delay_ms": n.GetDelayMs(), "max": protocol.MaxNackDelay}).
			Warn("a nack asked for a delay longer than the longest: it is cut to that (logged once per connection)")
	}
	return dispatch.NackInfo{Delay: delay, Reason: protocol.NackReason(n), Unprocessed: n.GetUnprocessed()}
}

// unexpected closes the connection for a frame not allowed in its state.
func (c *conn) unexpected(f *protocol.Frame, when string) {
	kind := frameKind(f)
	c.close(closeProtocol, fmt.Errorf("unexpected %s frame %s", kind, when),
		protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_UNEXPECTED_FRAME, true, "unexpected %s frame %s", kind, when))
}

// readFailed closes the connection after a read error, telling the client
// about frames it got wrong.
func (c *conn) readFailed(err error) {
	if c.closing.Load() {
		return // the read was stopped by close
	}
	switch code := protocol.CodeOf(err); {
	case errors.Is(err, io.EOF):
		c.close(closeDisconnect, errors.New("connection closed by the client"), nil)
	case code == protocol.ErrorCode_ERROR_CODE_BAD_FRAME || code == protocol.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE ||
		code == protocol.ErrorCode_ERROR_CODE_TOO_MANY_IDS:
		c.close(closeProtocol, fmt.Errorf("read frame: %w", err), protocol.ErrorFrame(code, true, "%v", err))
	default:
		c.close(closeDisconnect, fmt.Errorf("read frame: %w", err), nil)
	}
}

// handshake reads the Hello and answers it. It returns true when the client
// is welcomed and joined to the backend.
func (c *conn) handshake(rd *protocol.Reader, f *protocol.Frame) bool {
	cfg := &c.s.cfg
	if cfg.HelloTimeout > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(cfg.HelloTimeout))
	}
	if tc, ok := c.nc.(*tls.Conn); ok && !c.tlsHandshake(tc) {
		c.s.helloRead(c)
		return false
	}
	err := rd.ReadFrame(f)
	c.s.helloRead(c)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) && !c.closing.Load() {
			c.close(closeProtocol, fmt.Errorf("no hello within %v", cfg.HelloTimeout), nil)
			return false
		}
		var notFanout *protocol.HTTPError
		if errors.As(err, &notFanout) && !c.closing.Load() {
			c.closeHTTP(notFanout)
			return false
		}
		if tlsHello(err) && !c.closing.Load() {
			// The client's TLS layer cannot read an Error frame: it reports
			// a non-TLS answer. The log says what happened.
			c.close(closeProtocol, fmt.Errorf("a TLS client on this plain-text listener (its first bytes are a TLS "+
				"handshake): give the daemon --tls-cert, or connect without TLS: %w", err),
				protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE, true, "%v: this listener speaks plain text, not TLS", err))
			return false
		}
		c.readFailed(err)
		return false
	}
	c.lastSeen.Store(time.Now().UnixNano())
	h := f.GetHello()
	if h == nil {
		c.unexpected(f, "before hello")
		return false
	}
	c.mu.Lock()
	c.name = h.GetClientId()
	c.mu.Unlock()
	if v := h.GetProtocolVersion(); v != protocol.Version {
		c.reject(protocol.ErrorCode_ERROR_CODE_UNSUPPORTED_VERSION,
			"protocol version %d is not supported; this daemon speaks version %d", v, protocol.Version)
		return false
	}
	if !c.authenticate(h.GetAuthToken()) {
		c.reject(protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED, "missing or wrong auth token")
		return false
	}
	// A follower sends clients away whatever its load, so leadership is
	// checked before capacity.
	if l := c.s.leadership(); !l.Leader {
		f, err := leadershipFrame(l)
		c.close(closeRedirected, err, f)
		return false
	}
	maxInFlight := cfg.MaxInFlight
	if m := h.GetMaxInFlight(); m != 0 && uint64(m) < uint64(maxInFlight) {
		maxInFlight = int(m)
	}
	c.maxFrame = protocol.DefaultMaxFrameSize
	if m := h.GetMaxFrameSize(); m != 0 {
		c.maxFrame = int(m)
	}
	c.batch = h.HasCapability(protocol.Capability_CAPABILITY_BATCH)
	c.weight, c.observer = protocol.WeightOf(h), h.GetObserver()
	switch c.join(h, maxInFlight) {
	case joinFull:
		c.reject(protocol.ErrorCode_ERROR_CODE_TOO_MANY_CLIENTS, "too many clients (at most %d)", cfg.MaxClients)
		return false
	case joinClosing:
		return false
	}
	rd.SetMaxFrameSize(cfg.MaxFrameSize)
	// A frame may name at most the ids the client can have in flight; the
	// reader refuses more before decoding them.
	rd.SetMaxIDs(maxInFlight)
	// From here on the pump watches liveness; the reader waits without a deadline.
	_ = c.nc.SetReadDeadline(time.Time{})
	// close may have set its deadline just before ours replaced it.
	return !c.closing.Load()
}

// tlsHandshake runs the TLS handshake of a TLS listener, within the Hello's
// deadline, and records the client certificate's subject. It returns false
// when the connection is closed: the client did not speak TLS (it is told so
// in plain text), or the handshake failed (a client certificate missing,
// from another CA or expired: the client got TLS's alert).
func (c *conn) tlsHandshake(tc *tls.Conn) bool {
	err := tc.Handshake()
	if err == nil {
		if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
			c.mu.Lock()
			c.identity = certs[0].Subject.String()
			c.certs = certs
			c.mu.Unlock()
		}
		return true
	}
	if c.closing.Load() {
		return false
	}
	var notTLS tls.RecordHeaderError
	switch {
	case errors.As(err, &notTLS) && notTLS.Conn != nil:
		c.closeRaw(closeRejected, fmt.Errorf("a plain-text client on the TLS listener: %w", err),
			protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED, true,
				"this listener speaks TLS only: connect with TLS (client.Config.TLS; fanout tail --tls-ca)"))
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.close(closeProtocol, fmt.Errorf("no TLS handshake within %v", c.s.cfg.HelloTimeout), nil)
	case errors.Is(err, io.EOF):
		c.close(closeDisconnect, fmt.Errorf("TLS handshake: connection closed by the client: %w", err), nil)
	default:
		// TLS has sent its alert; lingering on the TCP connection lets the
		// client read it rather than a reset.
		c.closeRaw(closeRejected, fmt.Errorf("TLS handshake refused: %w", err), nil)
	}
	return false
}

// tlsHello reports whether err is what reading a TLS ClientHello as a
// frame gives: a length whose bytes are a TLS handshake record's header
// (type 22, version 3.x).
func tlsHello(err error) bool {
	var tooLarge *protocol.FrameTooLargeError
	return errors.As(err, &tooLarge) && tooLarge.Size>>24 == 22 && (tooLarge.Size>>16)&0xff == 3
}

// closeHTTP closes a connection whose first bytes are HTTP's (a browser or
// curl on the client port), answering with a short HTTP 400 that names the
// port of the metrics and the console, which speaks HTTP. The close is the
// one line logged.
func (c *conn) closeHTTP(e *protocol.HTTPError) {
	console := "this daemon serves them nowhere (--metrics-listen is empty)"
	where := "the metrics and console port is not set (--metrics-listen)"
	if f := c.s.cfg.ConsoleAddr; f != nil {
		if addr := f(); addr != "" {
			port := addr
			if _, p, err := net.SplitHostPort(addr); err == nil {
				port = p
			}
			console = "they are on port " + port + " (--metrics-listen)"
			where = "the metrics and console port is " + port
		}
	}
	body := "This is a fanout client port: it speaks fanout's own protocol, not HTTP.\n" +
		"For /metrics, /healthz, /readyz and the web console, " + console + ".\n"
	c.mu.Lock()
	c.finalHTTP = fmt.Appendf(nil, "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"+
		"Content-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	c.mu.Unlock()
	c.close(closeRejected, fmt.Errorf("%w; answered HTTP 400 (%s)", e, where), nil)
}

// closeRaw closes like close, with the final frame (if any) written in plain
// text on the TCP connection: for a connection whose TLS handshake failed.
func (c *conn) closeRaw(reason closeReason, err error, final *protocol.Frame) {
	c.mu.Lock()
	c.finalRaw = true
	c.mu.Unlock()
	c.close(reason, err, final)
}

// Outcomes of conn.join.
const (
	joinOK = iota
	joinFull
	joinClosing
)

// join takes a client slot, queues the Welcome and joins the backend, all
// while holding joinMu so that a concurrent close either sees no join or
// calls Leave after it.
func (c *conn) join(h *protocol.Hello, maxInFlight int) int {
	c.joinMu.Lock()
	defer c.joinMu.Unlock()
	if c.closing.Load() {
		return joinClosing
	}
	if !c.s.reserveClient() {
		return joinFull
	}
	c.reserved = true
	c.s.countIdentity(c.identity, 1) // set by the reader, which runs this
	name := h.GetClientId()
	cfg := &c.s.cfg
	w := &protocol.Welcome{
		NodeId:            cfg.NodeID,
		SessionId:         c.id,
		ProtocolVersion:   protocol.Version,
		MaxInFlight:       uint32(maxInFlight),
		AckTimeoutMs:      uint32(cfg.AckTimeout / time.Millisecond),
		HeartbeatMs:       uint32(cfg.Heartbeat / time.Millisecond),
		LivenessIntervals: uint32(cfg.Liveness),
		MaxFrameSize:      uint32(cfg.MaxFrameSize),
		Topic:             cfg.Topic,
		Observer:          c.observer,
	}
	if c.batch {
		// The client may name ids by ranges: this daemon reads them.
		w.Capabilities = []protocol.Capability{protocol.Capability_CAPABILITY_BATCH}
	}
	// The Welcome is queued before Join, so it precedes every delivery in
	// the outbox: the pump never writes a Deliver before the Welcome. Its
	// member list is read, and wantMembers set, under the outbox lock that
	// membersChanged takes: a change of the list after the read reaches
	// the client as a Members frame, written after the Welcome.
	c.mu.Lock()
	if h.HasCapability(protocol.Capability_CAPABILITY_MEMBERS) {
		c.wantMembers = true
		addrs, v := c.s.members()
		w.Members, w.MembersVersion = protocol.MemberList(addrs), v
		if size := proto.Size(protocol.WelcomeFrame(w)); size > c.maxFrame {
			c.log.Warnf("the member list does not fit the client's max_frame_size %d in a Welcome of %d bytes: not sent",
				c.maxFrame, size)
			w.Members, w.MembersVersion = nil, nil
		}
	}
	wake := c.queueLocked(protocol.WelcomeFrame(w))
	c.mu.Unlock()
	if wake {
		c.wake()
	}
	c.joined = true
	if c.observer {
		c.s.backend.Observe(c.id, name, c)
	} else {
		c.s.backend.Join(c.id, name, maxInFlight, c)
	}
	fields := logrus.Fields{"client": name, "max_in_flight": maxInFlight, "max_frame_size": c.maxFrame,
		"batch": c.batch, "weight": c.weight, "observer": c.observer}
	if c.identity != "" { // set by the reader, which runs this
		fields["identity"] = c.identity
	}
	c.log.WithFields(fields).Debug("client welcomed")
	return joinOK
}

// reject refuses the handshake with a fatal error.
func (c *conn) reject(code protocol.ErrorCode, format string, args ...any) {
	c.close(closeRejected, fmt.Errorf("%v: "+format, append([]any{code}, args...)...),
		protocol.ErrorFrame(code, true, format, args...))
}

// authenticate checks the Hello's token against Config.AuthToken and
// Config.Authenticate; a named token's name joins the client's identity,
// and its SHA-256 is kept for Server.Reauthorize. Without either, every
// client passes.
func (c *conn) authenticate(token string) bool {
	cfg := &c.s.cfg
	switch {
	case cfg.AuthToken == "" && cfg.Authenticate == nil:
		return true
	case cfg.AuthToken != "" && tokenMatches(token, cfg.AuthToken):
		return true
	case cfg.Authenticate == nil:
		return false
	}
	sum := sha256.Sum256([]byte(token))
	name, ok := cfg.Authenticate(sum)
	if ok {
		c.mu.Lock()
		if c.identity != "" {
			c.identity += ", "
		}
		c.identity += "token " + name
		c.tokenSum, c.named = sum, true
		c.mu.Unlock()
	}
	return ok
}

// stillAuthorized checks the credentials c passed with against those in
// force now: its named token (Config.Authenticate), its certificate
// (Config.VerifyClient). The shared Config.AuthToken does not change while
// the daemon runs.
func (c *conn) stillAuthorized() error {
	cfg := &c.s.cfg
	c.mu.Lock()
	certs, sum, named := c.certs, c.tokenSum, c.named
	c.mu.Unlock()
	if named && cfg.Authenticate != nil {
		if _, ok := cfg.Authenticate(sum); !ok {
			return errors.New("its auth token is no longer accepted")
		}
	}
	if len(certs) > 0 && cfg.VerifyClient != nil {
		if err := cfg.VerifyClient(certs); err != nil {
			return fmt.Errorf("its certificate is no longer accepted: %w", err)
		}
	}
	return nil
}

// tokenMatches compares tokens in constant time; hashing first hides the
// expected token's length too.
func tokenMatches(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// frameKind names the frame's body for logs and error messages, e.g. "ack".
func frameKind(f *protocol.Frame) string {
	m := f.ProtoReflect()
	if fd := m.WhichOneof(m.Descriptor().Oneofs().Get(0)); fd != nil {
		return string(fd.Name())
	}
	return "empty"
}

// readerPanicked closes the connection after a panic in the reader; the pump
// still writes the Error frame.
func (c *conn) readerPanicked(v any) {
	c.close(closeInternal, fmt.Errorf("reader panicked: %v", v),
		protocol.ErrorFrame(protocol.ErrorCode_ERROR_CODE_INTERNAL, true, "internal error"))
}

// pumpPanicked closes the connection after a panic in the pump, which can no
// longer close the socket itself.
func (c *conn) pumpPanicked(v any) {
	c.close(closeInternal, fmt.Errorf("pump panicked: %v", v), nil)
	_ = c.nc.Close()
}
