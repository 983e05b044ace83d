package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
)

// Defaults for the zero values of Config.
const (
	DefaultMaxInFlight = 64
	DefaultDialTimeout = 5 * time.Second
	DefaultMinBackoff  = 100 * time.Millisecond
	DefaultMaxBackoff  = 5 * time.Second
)

// maxRedirects bounds the Redirect frames followed in one connection attempt.
const maxRedirects = 5

// stableSession is how long a session must last for the reconnect backoff
// to start over.
const stableSession = 2 * time.Second

// Config configures a Client. Only Addrs is required.
type Config struct {
	// Addrs are host:port addresses of daemons of one cluster. They are tried
	// in order, then round-robin; a follower redirects to the leader. In
	// spread mode one address is enough: the daemon lists the members, and
	// the client keeps a session with each at the address listed.
	Addrs []string
	// ClientID names the client in the daemon's logs; default hostname-pid.
	ClientID string
	// MaxInFlight is how many delivered, unacked messages the client holds
	// at once, and the capacity of Messages; default DefaultMaxInFlight. In
	// spread mode it is split over the members: each session asks for
	// MaxInFlight / members, rounded down, at least 1 (see the package
	// documentation).
	MaxInFlight int
	// AuthToken is sent in Hello when the daemon requires one.
	AuthToken string
	// TLS, when set, makes every connection TLS with this configuration
	// (the daemons run with --tls-cert). Its RootCAs verify the daemons'
	// certificates and its Certificates hold the client's own for mutual
	// TLS. An empty ServerName is taken from each address the client
	// connects to: the configured ones, a redirect's, a member's; a set one
	// is checked against every daemon. A daemon that refuses the client's
	// certificate, whose certificate is not trusted, or that does not speak
	// TLS stops the client (an error wrapping ErrTLS), as a wrong token does.
	TLS *tls.Config
	// DialTimeout bounds each connection attempt, handshake included;
	// default DefaultDialTimeout.
	DialTimeout time.Duration
	// NoReconnect makes Dial try each address once and the client stop, with
	// Err set, when a connection ends other than by its own choice (a member
	// that left, a new share of the credit). By default the client
	// reconnects forever until Close, waiting MinBackoff..MaxBackoff
	// (exponential, with jitter) between failed attempts, to each member on
	// its own.
	NoReconnect bool
	MinBackoff  time.Duration // default DefaultMinBackoff
	MaxBackoff  time.Duration // default DefaultMaxBackoff
	// MaxFrameSize bounds frames in both directions; default
	// protocol.DefaultMaxFrameSize. It is announced in Hello, and the daemon
	// sends no larger frame: a message that fits no connected client waits
	// at the daemon for one that announces a large enough limit. A larger
	// frame arriving all the same stops the client with Err set (a
	// *protocol.FrameTooLargeError). The daemon's Welcome may lower the
	// limit for frames the client sends.
	MaxFrameSize int
	// Weight is the client's share of the deliveries relative to the other
	// clients (Hello.weight): a canary of weight 5 beside two clients of
	// 100 gets about 5/205 of them. 0 means the default, 100.
	Weight int
	// Observe makes the client an observer: it receives a copy of every
	// message the daemon delivers to the other clients (Message.Observed)
	// and acks nothing; its copies affect neither offsets nor credit. A
	// daemon that does not confirm it stops the client with ErrNoObservers.
	// An observer that falls behind is dropped by the daemon and reconnects.
	Observe bool
	// Logger receives connection events (connected, redirected,
	// disconnected, members changed) and the worker pool's panics (see
	// Consume); nil logs nothing. A *slog.Logger is any handler's: the
	// application's own logger, whatever it writes to.
	Logger *slog.Logger
	// Batches makes deliveries arrive on Batches, the messages of the
	// frames read together as one Batch, instead of one by one on Messages
	// (which then only closes when the client stops).
	Batches bool
}

// withDefaults returns cfg with zero values replaced, or an error for a
// configuration that cannot work.
func (cfg Config) withDefaults() (Config, error) {
	if len(cfg.Addrs) == 0 {
		return cfg, ErrNoAddrs
	}
	if cfg.MaxInFlight < 0 || cfg.MaxInFlight > 1<<20 {
		return cfg, fmt.Errorf("fanout client: MaxInFlight %d out of range 0..%d", cfg.MaxInFlight, 1<<20)
	}
	if cfg.Weight < 0 || cfg.Weight > math.MaxUint32 {
		return cfg, fmt.Errorf("fanout client: Weight %d out of range 0..%d", cfg.Weight, uint32(math.MaxUint32))
	}
	if cfg.MaxFrameSize != 0 && (cfg.MaxFrameSize < protocol.MaxHelloSize || cfg.MaxFrameSize > math.MaxUint32) {
		return cfg, fmt.Errorf("fanout client: MaxFrameSize %d out of range %d..%d", cfg.MaxFrameSize, protocol.MaxHelloSize, uint32(math.MaxUint32))
	}
	if cfg.ClientID == "" {
		host, _ := os.Hostname()
		cfg.ClientID = host + "-" + strconv.Itoa(os.Getpid())
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxFrameSize == 0 {
		cfg.MaxFrameSize = protocol.DefaultMaxFrameSize
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.MinBackoff)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(discardHandler{})
	}
	return cfg, nil
}

// Client receives messages from a fanout cluster: over one connection, to
// the leader, in leader mode; over one connection per member in spread
// mode. It reconnects by itself. Its methods are safe for concurrent use.
type Client struct {
	cfg     Config
	log     *slog.Logger
	msgs    chan *Message
	batches chan *Batch // nil unless Config.Batches

	ctx    context.Context // canceled by Close (or a failed Dial)
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned
	events chan event    // links → run
	linkWG sync.WaitGroup
	// version is the version of the member list followed (nil: none); only
	// the run loop uses it.
	version *protocol.MembersVersion
	// shuttingDown is set by Shutdown: a session's failure to send its
	// final acks is then Shutdown's error.
	shuttingDown atomic.Bool

	mu       sync.Mutex // guards the fields below
	err      error      // why the client stopped on its own
	lastErr  error      // the last connection failure, for Dial's error
	closeErr error      // failure to flush the final acks and Goodbye
	links    []*link    // the links whose goroutine has not exited; run changes it
	members  []string   // the latest member list followed (sorted); nil in leader mode
}

// Dial starts a client and returns once a daemon has welcomed it, following
// redirects and retrying failures (ERROR_CODE_NO_LEADER after the delay the
// daemon asks for) until ctx ends. It fails at once on an Error frame with
// ERROR_CODE_UNAUTHORIZED or ERROR_CODE_UNSUPPORTED_VERSION; the returned
// error then wraps a *protocol.RemoteError. ctx bounds only Dial, not the
// client: call Close to stop it.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{
		cfg:    cfg,
		log:    cfg.Logger.With("client_id", cfg.ClientID),
		msgs:   make(chan *Message, cfg.MaxInFlight),
		done:   make(chan struct{}),
		events: make(chan event, 16),
	}
	if cfg.Batches {
		c.msgs = make(chan *Message)
		c.batches = make(chan *Batch, cfg.MaxInFlight)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	ready := make(chan error, 1)
	go c.run(ready)
	select {
	case err := <-ready:
		if err != nil {
			c.cancel()
			<-c.done
			return nil, fmt.Errorf("fanout client: dial: %w", err)
		}
		return c, nil
	case <-ctx.Done():
		c.cancel()
		<-c.done
		select {
		case err := <-ready:
			if err == nil {
				return nil, fmt.Errorf("fanout client: dial: %w", ctx.Err())
			}
		default:
		}
		c.mu.Lock()
		last := c.lastErr
		c.mu.Unlock()
		if last != nil {
			return nil, fmt.Errorf("fanout client: dial %v: %w (last error: %v)", cfg.Addrs, ctx.Err(), last)
		}
		return nil, fmt.Errorf("fanout client: dial %v: %w", cfg.Addrs, ctx.Err())
	}
}

// Messages returns the channel of deliveries, of every session merged. It
// is closed when the client stops for good, after Close or when Err is set.
// When the one connection of leader mode is replaced, messages of the old
// one still waiting in the channel are dropped (the daemon delivers them
// again); those already received return ErrStale from Ack, as do messages
// of a member's session that ended while others go on.
func (c *Client) Messages() <-chan *Message { return c.msgs }

// Batches returns the channel of deliveries of a client with Config.Batches:
// the messages of each frame the daemon sent together, as one Batch, of
// every session merged. It is closed when the client stops for good, as
// Messages is, and behaves as Messages does when a connection is replaced.
// Without Config.Batches it is nil.
func (c *Client) Batches() <-chan *Batch { return c.batches }

// Close sends the acks queued so far and a Goodbye on every session, waits
// for the daemons to close the connections (at most a couple of seconds),
// and stops reconnecting. Messages is closed when it returns. It returns the
// error, if any, of sending the final acks. It is safe to call more than
// once and concurrently with Ack.
func (c *Client) Close() error {
	c.cancel()
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeErr
}

// Err returns why the client stopped on its own (a permanent error from the
// daemon, a frame above MaxFrameSize, or a lost connection with
// NoReconnect), or nil.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *Client) setCloseErr(err error) {
	c.mu.Lock()
	c.closeErr = err
	c.mu.Unlock()
}

// backoff returns the wait before attempt n+1 after n failures: exponential
// from MinBackoff, capped at MaxBackoff, with the upper half jittered.
func (c *Client) backoff(n int) time.Duration {
	d := c.cfg.MaxBackoff
	if shift := n - 1; shift < 62 && c.cfg.MinBackoff <= c.cfg.MaxBackoff>>shift {
		d = c.cfg.MinBackoff << shift // no overflow: at most MaxBackoff
	}
	return d/2 + rand.N(d/2+1)
}

// connect dials addr and performs the handshake for l, asking for credit,
// following up to maxRedirects Redirect frames. It returns a welcomed
// session.
func (c *Client) connect(l *link, addr string, credit int) (*session, error) {
	for hop := 0; ; hop++ {
		s, redirect, err := c.handshake(l, addr, credit)
		if err != nil || redirect == "" {
			return s, err
		}
		if hop == maxRedirects {
			return nil, fmt.Errorf("more than %d redirects, last to %s", maxRedirects, redirect)
		}
		c.log.Info("redirected to the leader", "from", addr, "to", redirect)
		addr = redirect
	}
}

// tlsHandshake runs the TLS handshake on nc, with the server name taken
// from addr unless Config.TLS names one. nc is closed on error.
func (c *Client) tlsHandshake(ctx context.Context, nc net.Conn, addr string) (net.Conn, error) {
	cfg := c.cfg.TLS.Clone()
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		cfg.ServerName = host
	}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("TLS handshake with %s: %w", addr, tlsRefusal(err))
	}
	return tc, nil
}

// tlsRefusal wraps with ErrTLS an error that says TLS cannot work with
// this daemon: it answered in plain text, its certificate is not trusted,
// or it refused the client's (a TLS alert, which TLS 1.3 delivers with the
// first read after the handshake). Other errors are returned as they are.
func tlsRefusal(err error) error {
	var plain tls.RecordHeaderError
	var unverified *tls.CertificateVerificationError
	var op *net.OpError
	switch {
	case errors.As(err, &plain):
		return fmt.Errorf("%w: the daemon answered in plain text: its listener has no TLS (--tls-cert), or Config.TLS is set by mistake (%v)", ErrTLS, err)
	case errors.As(err, &unverified):
		return fmt.Errorf("%w: the daemon's certificate is not trusted: %w", ErrTLS, err)
	case errors.As(err, &op) && op.Op == "remote error":
		return fmt.Errorf("%w: the daemon refused the handshake (a client certificate missing, expired or from a CA it does not trust?): %w", ErrTLS, err)
	}
	return err
}

// handshake dials addr, sends Hello and reads the answer: a session for a
// Welcome, the leader's address for a Redirect, or an error. Close and
// l.stop interrupt it.
func (c *Client) handshake(l *link, addr string, credit int) (_ *session, redirect string, err error) {
	ctx, cancel := context.WithTimeout(l.ctx, c.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("dial %s: %w", addr, err)
	}
	if c.cfg.TLS != nil {
		if nc, err = c.tlsHandshake(ctx, nc, addr); err != nil {
			return nil, "", err
		}
	}
	defer func() {
		if err != nil || redirect != "" {
			_ = nc.Close()
		}
	}()
	deadline, _ := ctx.Deadline()
	_ = nc.SetDeadline(deadline)
	// Close or the timeout interrupts blocked I/O at once.
	stopAbort := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Now()) })
	defer stopAbort()

	w := protocol.NewWriter(nc, c.cfg.MaxFrameSize)
	hello := protocol.HelloFrame(&protocol.Hello{
		ClientId:        c.cfg.ClientID,
		ProtocolVersion: protocol.Version,
		MaxInFlight:     uint32(credit),
		AuthToken:       c.cfg.AuthToken,
		MaxFrameSize:    uint32(c.cfg.MaxFrameSize),
		Weight:          uint32(c.cfg.Weight),
		Observer:        c.cfg.Observe,
		Capabilities:    []protocol.Capability{protocol.Capability_CAPABILITY_MEMBERS, protocol.Capability_CAPABILITY_BATCH},
	})
	if err := w.WriteFrame(hello); err != nil {
		return nil, "", fmt.Errorf("hello to %s: %w", addr, err)
	}
	if err := w.Flush(); err != nil {
		return nil, "", fmt.Errorf("hello to %s: %w", addr, err)
	}
	r := protocol.NewSlabReader(nc, c.cfg.MaxFrameSize)
	var f protocol.Frame
	for {
		if err := r.ReadFrame(&f); err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, "", fmt.Errorf("handshake with %s: %w", addr, tlsRefusal(err))
		}
		switch b := f.Body.(type) {
		case *protocol.Frame_Welcome:
			if !stopAbort() {
				return nil, "", fmt.Errorf("handshake with %s: %w", addr, ctx.Err())
			}
			if c.cfg.Observe && !b.Welcome.GetObserver() {
				return nil, "", fmt.Errorf("handshake with %s: %w", addr, ErrNoObservers)
			}
			_ = nc.SetDeadline(time.Time{})
			return newSession(c, l, nc, addr, r, b.Welcome, credit), "", nil
		case *protocol.Frame_Redirect:
			to := b.Redirect.GetLeaderAddress()
			if to == "" {
				return nil, "", fmt.Errorf("handshake with %s: redirect without a leader address", addr)
			}
			return nil, to, nil
		case *protocol.Frame_Error:
			return nil, "", fmt.Errorf("handshake with %s: %w", addr, protocol.NewRemoteError(b.Error))
		case *protocol.Frame_Ping, *protocol.Frame_Pong:
			// Too early to answer; the Welcome will follow.
		default:
			return nil, "", fmt.Errorf("handshake with %s: unexpected %T frame", addr, b)
		}
	}
}
