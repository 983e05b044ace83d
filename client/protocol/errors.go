package protocol

import (
	"errors"
	"fmt"
	"time"
)

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
