package liveness

import (
	"errors"
	"fmt"
)

// Error is a refusal by the daemon: Code for programs, Message for people.
//
// Compare with errors.Is against the Err* values, which match any message of their code:
//
//	if errors.Is(err, liveness.ErrNotFound) { ... }
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("livenessd: %s (%s)", e.Message, e.Code)
}

// Is matches an *Error of the same code whose Message is empty (the Err* values).
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Message == "" && t.Code == e.Code
}

// Values to compare daemon errors with, by code, using errors.Is.
var (
	ErrInvalidJSON        = &Error{Code: CodeInvalidJSON}
	ErrInvalidRequest     = &Error{Code: CodeInvalidRequest}
	ErrLineTooLong        = &Error{Code: CodeLineTooLong}
	ErrUnsupportedVersion = &Error{Code: CodeUnsupportedVersion}
	ErrNotFound           = &Error{Code: CodeNotFound}
	ErrForbidden          = &Error{Code: CodeForbidden}
	ErrAmbiguous          = &Error{Code: CodeAmbiguous}
	ErrAlreadyEnded       = &Error{Code: CodeAlreadyEnded}
	ErrAlreadyExists      = &Error{Code: CodeAlreadyExists}
	ErrNotPending         = &Error{Code: CodeNotPending}
	ErrNoOwner            = &Error{Code: CodeNoOwner}
	ErrInvalidOwner       = &Error{Code: CodeInvalidOwner}
	ErrShuttingDown       = &Error{Code: CodeShuttingDown}
	ErrTooManyConnections = &Error{Code: CodeTooManyConnections}
	ErrLimitReached       = &Error{Code: CodeLimitReached}
	ErrLockHeld           = &Error{Code: CodeLockHeld}
	ErrNotHeld            = &Error{Code: CodeNotHeld}
	ErrInternal           = &Error{Code: CodeInternal}
)

// Errors of this client, not of the daemon.
var (
	// ErrClosed: the daemon closed the connection (it is stopping, or was killed).
	ErrClosed = errors.New("liveness: livenessd closed the connection")
	// ErrNoSuchProcess: the process named does not exist (in this PID namespace).
	ErrNoSuchProcess = errors.New("liveness: no such process")
	// ErrGaveUp: a subscription could not reach the daemon again within its Retry bound.
	ErrGaveUp = errors.New("liveness: livenessd did not come back")
)

// transient reports whether a daemon that is restarting could explain err.
func transient(err error) bool {
	var d *Error
	if errors.As(err, &d) {
		return d.Code == CodeShuttingDown || d.Code == CodeTooManyConnections
	}
	var c *ConnectError
	return errors.As(err, &c) || errors.Is(err, ErrClosed) || isIOError(err)
}

// ConnectError is a failure to reach the daemon's socket.
type ConnectError struct {
	Socket string
	Err    error
}

func (e *ConnectError) Error() string {
	return fmt.Sprintf("liveness: cannot connect to livenessd at %s: %v (is the daemon running? set LIVENESS_SOCKET)", e.Socket, e.Err)
}

func (e *ConnectError) Unwrap() error { return e.Err }
