package liveness

import (
	"encoding/json"
	"errors"
	"fmt"
)

// The wire types are in types_gen.go, generated from the daemon's own (cargo xtask
// gen-clients); this file holds what Go adds to them.

// SameProcess reports whether both identities name the same process: same boot, pid and
// start time, and the same pidfs inode where both know it.
func (id Identity) SameProcess(other Identity) bool {
	if id.PID != other.PID || id.StartTicks != other.StartTicks || id.BootID != other.BootID {
		return false
	}
	return id.PidfsIno == nil || other.PidfsIno == nil || *id.PidfsIno == *other.PidfsIno
}

func (id Identity) String() string {
	return fmt.Sprintf("%s[%d] start=%d on %s", id.Comm, id.PID, id.StartTicks, id.Host)
}

func (e ExitStatus) String() string {
	if e.Kind == Exited {
		return fmt.Sprintf("exited with code %d", e.Code)
	}
	if e.CoreDumped {
		return fmt.Sprintf("killed by signal %d (core dumped)", e.Signal)
	}
	return fmt.Sprintf("killed by signal %d", e.Signal)
}

// Finalized reports whether the session has ended and each of its end actions has its
// outcome (at once for one without end actions).
func (s Session) Finalized() bool {
	return s.Phase == Ended && (len(s.OnEndRun) == 0 || s.FinalizedMs != 0)
}

// DefaultGraceMs is the grace between SIGTERM and SIGKILL of a session that names none.
const DefaultGraceMs = 10000

// Action returns an end action running argv with the daemon's defaults.
func Action(argv ...string) ActionSpec { return ActionSpec{Argv: argv} }

// Succeeded reports whether the action ran, in time, and exited with status 0.
func (o ActionOutcome) Succeeded() bool {
	return !o.TimedOut && o.Exit != nil && o.Exit.Kind == Exited && o.Exit.Code == 0
}

// Message is one line of an event stream: exactly one field is set. A newer daemon may
// send lines this client does not know; they decode with every field nil and are skipped.
type Message struct {
	Reset   *Subscribed `json:"reset,omitempty"`
	Event   *Event      `json:"event,omitempty"`
	Gap     *Gap        `json:"gap,omitempty"`
	Lagged  *Lagged     `json:"lagged,omitempty"`
	Goodbye *Goodbye    `json:"goodbye,omitempty"`
	// FleetChange is a line of fleet_watch (docs/fleet.md).
	FleetChange *FleetChange `json:"fleet_change,omitempty"`
}

// errorBody is the error of a refused request.
type errorBody struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

// reply is one reply line; which keys are set depends on the request.
type reply struct {
	Ok         bool            `json:"ok"`
	ID         json.RawMessage `json:"id,omitempty"`
	Error      *errorBody      `json:"error,omitempty"`
	Session    *Session        `json:"session,omitempty"`
	Sessions   *[]Session      `json:"sessions,omitempty"`
	Next       *string         `json:"next,omitempty"`
	OwnerPID   *uint32         `json:"owner_pid,omitempty"`
	Status     json.RawMessage `json:"status,omitempty"`
	Subscribed *Subscribed     `json:"subscribed,omitempty"`
	Warnings   []string        `json:"warnings,omitempty"`
	Lock       *Lock           `json:"lock,omitempty"`
	Locks      *[]Lock         `json:"locks,omitempty"`
	Processes  *[]Process      `json:"processes,omitempty"`
	Fleet      *FleetView      `json:"fleet,omitempty"`
}

// errNotAReply marks a line without "ok" on a request connection: a goodbye.
var errNotAReply = errors.New("liveness: not a reply")

// decodeReply reads a reply line; a refusal becomes an *Error.
func decodeReply(line []byte) (*reply, error) {
	var probe struct {
		Ok *bool `json:"ok"`
	}
	if err := json.Unmarshal(line, &probe); err != nil {
		return nil, fmt.Errorf("liveness: unreadable reply %q: %w", line, err)
	}
	if probe.Ok == nil {
		return nil, errNotAReply
	}
	var r reply
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, fmt.Errorf("liveness: unreadable reply %q: %w", line, err)
	}
	if !r.Ok {
		if r.Error == nil {
			return nil, fmt.Errorf("liveness: an error reply without an error: %q", line)
		}
		return nil, &Error{Code: r.Error.Code, Message: r.Error.Message}
	}
	return &r, nil
}
