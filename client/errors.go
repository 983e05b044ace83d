package client

import (
	"errors"
	"time"

	"github.com/nanoservice/core-fanout/client/protocol"
)

var (
	// ErrStale is returned by Ack, Nack and Touch on a message that arrived on
	// a connection that has since ended. Its delivery id meant something only
	// to that connection's daemon, which will deliver the message again;
	// nothing is sent.
	ErrStale = errors.New("fanout client: message belongs to a closed connection")

	// ErrAlreadyAcked is returned by Ack, Nack and Touch on a message that was
	// already acked or nacked. Nothing is sent.
	ErrAlreadyAcked = errors.New("fanout client: message already acked or nacked")

	// ErrClosed is returned by Ack, Nack and Touch after Close.
	ErrClosed = errors.New("fanout client: closed")

	// ErrNoAddrs is returned by Dial when Config.Addrs is empty.
	ErrNoAddrs = errors.New("fanout client: no daemon addresses configured")

	// ErrNoObservers ends a client with Config.Observe whose daemon did not
	// confirm it observes (Welcome.observer): a daemon older than observers
	// would hand it work to ack.
	ErrNoObservers = errors.New("fanout client: the daemon does not support observers")
	// ErrTLS is wrapped by the error of a connection on which TLS cannot
	// work: the daemon does not speak TLS, its certificate is not trusted,
	// or it refused the client's certificate. It stops the client.
	ErrTLS = errors.New("TLS refused")
)

// permanent reports whether err ends the client instead of a reconnect:
// an Error frame saying the token is wrong or the protocol version is not
// spoken; a frame larger than the client accepts (Config.MaxFrameSize), which
// the daemon would send again after a reconnect; a TLS refusal (ErrTLS);
// and an Error frame saying
// the client sent a frame too large or naming too many ids, which would
// happen again too. Every other failure, including other error codes, is
// retried.
func permanent(err error) bool {
	var tooLarge *protocol.FrameTooLargeError
	if errors.As(err, &tooLarge) || errors.Is(err, ErrNoObservers) || errors.Is(err, ErrTLS) {
		return true
	}
	var re *protocol.RemoteError
	if !errors.As(err, &re) {
		return false
	}
	switch re.Code {
	case protocol.ErrorCode_ERROR_CODE_UNAUTHORIZED, protocol.ErrorCode_ERROR_CODE_UNSUPPORTED_VERSION,
		protocol.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE, protocol.ErrorCode_ERROR_CODE_TOO_MANY_IDS:
		return true
	}
	return false
}

// retryAfter returns how long the daemon asked to wait before retrying, or 0.
func retryAfter(err error) time.Duration {
	var re *protocol.RemoteError
	if errors.As(err, &re) {
		return re.RetryAfter
	}
	return 0
}
