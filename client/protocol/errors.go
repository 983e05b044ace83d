package protocol

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// HTTPError is what a Reader returns when a stream starts as HTTP does
// rather than with a frame: the peer is an HTTP server (its response starts
// "HTTP/") or an HTTP client (a request line, "GET /", "POST /", ...), not a
// fanout daemon or client; it usually means an address names the wrong
// port (a daemon's metrics and console port, say). Only a stream's first
// four bytes are checked: read as a frame length they are above 1 GiB, and
// a stream's first frame (a Hello, a Welcome or an Error) is never that
// large.
type HTTPError struct {
	// Start holds the stream's first four bytes, e.g. "HTTP" or "GET ".
	Start string
}

// Response reports whether the peer answered as an HTTP server.
func (e *HTTPError) Response() bool { return e.Start == "HTTP" }

// Error says what the peer is.
func (e *HTTPError) Error() string {
	if e.Response() {
		return "this is an HTTP server (the metrics and console port?), not a fanout client port"
	}
	return fmt.Sprintf("an HTTP request (%s), not a fanout client: this port speaks fanout's protocol", strings.TrimSpace(e.Start))
}

// httpStarts are the first four bytes of an HTTP/1 response and of the
// request lines of HTTP/1's methods and HTTP/2's preface.
var httpStarts = [...]string{"HTTP", "GET ", "HEAD", "POST", "PUT ", "DELE", "CONN", "OPTI", "TRAC", "PATC", "PRI "}

// httpStart returns a *HTTPError when b, a stream's first four bytes, are
// HTTP's, else nil.
func httpStart(b [HeaderSize]byte) error {
	for _, s := range httpStarts {
		if string(b[:]) == s {
			return &HTTPError{Start: s}
		}
	}
	return nil
}

// RemoteError is an Error frame received from the peer, as a Go error.
type RemoteError struct {
	Code       ErrorCode
	Message    string
	Fatal      bool          // the peer closes the connection after sending it
	RetryAfter time.Duration // from retry_after_ms; 0 when not given
}

// NewRemoteError converts a received Error message into a *RemoteError.
// A nil e yields a RemoteError with ERROR_CODE_UNSPECIFIED.
func NewRemoteError(e *Error) *RemoteError {
	return &RemoteError{
		Code:       e.GetCode(),
		Message:    e.GetMessage(),
		Fatal:      e.GetFatal(),
		RetryAfter: time.Duration(e.GetRetryAfterMs()) * time.Millisecond,
	}
}

// Err returns e as a Go error (a *RemoteError).
func (e *Error) Err() error { return NewRemoteError(e) }

// Error describes the remote error, e.g.
// "remote error ERROR_CODE_NO_LEADER (fatal, retry after 1s): no leader elected".
func (e *RemoteError) Error() string {
	var extra string
	switch {
	case e.Fatal && e.RetryAfter > 0:
		extra = fmt.Sprintf(" (fatal, retry after %v)", e.RetryAfter)
	case e.Fatal:
		extra = " (fatal)"
	case e.RetryAfter > 0:
		extra = fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	if e.Message == "" {
		return fmt.Sprintf("remote error %v%s", e.Code, extra)
	}
	return fmt.Sprintf("remote error %v%s: %s", e.Code, extra, e.Message)
}

// Temporary reports whether an error with this code is worth retrying later
// or on another node: NO_LEADER, SHUTTING_DOWN and TOO_MANY_CLIENTS.
func Temporary(code ErrorCode) bool {
	switch code {
	case ErrorCode_ERROR_CODE_NO_LEADER,
		ErrorCode_ERROR_CODE_SHUTTING_DOWN,
		ErrorCode_ERROR_CODE_TOO_MANY_CLIENTS:
		return true
	}
	return false
}

// CodeOf returns the wire code to report err with: the code of a wrapped
// *RemoteError, ERROR_CODE_FRAME_TOO_LARGE for a *FrameTooLargeError,
// ERROR_CODE_TOO_MANY_IDS for a *TooManyIDsError, ERROR_CODE_BAD_FRAME for
// ErrBadFrame, ERROR_CODE_INTERNAL otherwise, and ERROR_CODE_UNSPECIFIED for
// a nil err.
func CodeOf(err error) ErrorCode {
	var tooLarge *FrameTooLargeError
	var tooMany *TooManyIDsError
	var remote *RemoteError
	switch {
	case err == nil:
		return ErrorCode_ERROR_CODE_UNSPECIFIED
	case errors.As(err, &tooLarge):
		return ErrorCode_ERROR_CODE_FRAME_TOO_LARGE
	case errors.As(err, &tooMany):
		return ErrorCode_ERROR_CODE_TOO_MANY_IDS
	case errors.Is(err, ErrBadFrame):
		return ErrorCode_ERROR_CODE_BAD_FRAME
	case errors.As(err, &remote):
		return remote.Code
	}
	return ErrorCode_ERROR_CODE_INTERNAL
}
