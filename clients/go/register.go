package liveness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// request is one request line; which fields are set depends on Op.
type request struct {
	V         int               `json:"v,omitempty"`
	ID        json.RawMessage   `json:"id,omitempty"`
	Op        string            `json:"op"`
	Session   string            `json:"session,omitempty"`
	UID       *uint32           `json:"uid,omitempty"`
	Owner     *Owner            `json:"owner,omitempty"`
	Pending   bool              `json:"pending,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	OnEnd     OnEnd             `json:"on_end,omitempty"`
	GraceMs   *uint64           `json:"grace_ms,omitempty"`
	Until     string            `json:"until,omitempty"`
	Wrappers  []string          `json:"wrappers,omitempty"`
	To        string            `json:"to,omitempty"`
	Terminate bool              `json:"terminate,omitempty"`
	Phase     Phase             `json:"phase,omitempty"`
	Limit     *uint32           `json:"limit,omitempty"`
	After     string            `json:"after,omitempty"`
	PID       *uint32           `json:"pid,omitempty"`
	Since     *uint64           `json:"since,omitempty"`
	StoreID   string            `json:"store_id,omitempty"`
	Name      string            `json:"name,omitempty"`
	Wait      bool              `json:"wait,omitempty"`
	TimeoutMs *uint64           `json:"timeout_ms,omitempty"`
	OnEndRun  *[]ActionSpec     `json:"on_end_run,omitempty"`
	Turn      string            `json:"turn,omitempty"`
	Tool      string            `json:"tool,omitempty"`
	ToolEnd   bool              `json:"tool_end,omitempty"`
	Cluster   bool              `json:"cluster,omitempty"`
}

type ownerKind int

const (
	ownerAuto ownerKind = iota + 1
	ownerPID
	ownerPidfd
	ownerIdentity
)

// Owner is the process whose death ends a session: OwnerAuto, OwnerPID or OwnerIdentity.
type Owner struct {
	kind     ownerKind
	pid      uint32
	pidfd    int
	identity Identity
}

// OwnerAuto lets the daemon walk up from the connecting process past shells and wrappers
// to the first other program. A Go program that connects by itself is that program.
func OwnerAuto() Owner { return Owner{kind: ownerAuto} }

// OwnerPID names process pid, in the caller's PID namespace. It is passed to the daemon
// as a pidfd where the kernel allows (Linux 5.3+), which names the process itself rather
// than a number that could be reused, and as the number elsewhere.
func OwnerPID(pid int) Owner { return Owner{kind: ownerPID, pid: uint32(pid)} }

// OwnerIdentity names a process by an identity captured earlier (Capture, or another
// host's `liveness check --pid N --json`).
func OwnerIdentity(id Identity) Owner { return Owner{kind: ownerIdentity, identity: id} }

// MarshalJSON writes the owner as the protocol spells it.
func (o Owner) MarshalJSON() ([]byte, error) {
	switch o.kind {
	case ownerAuto:
		return []byte(`"auto"`), nil
	case ownerPID:
		return json.Marshal(map[string]uint32{"pid": o.pid})
	case ownerPidfd:
		return json.Marshal(map[string]int{"pidfd": o.pidfd})
	case ownerIdentity:
		return json.Marshal(o.identity)
	}
	return nil, errors.New("liveness: an Owner made without OwnerAuto, OwnerPID or OwnerIdentity")
}

// UnmarshalJSON reads the four forms of docs/protocol.md "register".
func (o *Owner) UnmarshalJSON(data []byte) error {
	var auto string
	if json.Unmarshal(data, &auto) == nil {
		if auto != "auto" {
			return fmt.Errorf("liveness: owner %q is not \"auto\"", auto)
		}
		*o = OwnerAuto()
		return nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return err
	}
	switch {
	case fields["start_ticks"] != nil:
		*o = Owner{kind: ownerIdentity}
		return json.Unmarshal(data, &o.identity)
	case fields["pidfd"] != nil && len(fields) == 1:
		*o = Owner{kind: ownerPidfd}
		return json.Unmarshal(fields["pidfd"], &o.pidfd)
	case fields["pid"] != nil && len(fields) == 1:
		*o = Owner{kind: ownerPID}
		return json.Unmarshal(fields["pid"], &o.pid)
	}
	return fmt.Errorf("liveness: %s is no owner", data)
}

// Registration is a register request: which session, owned by whom.
type Registration struct {
	// Session is the id; with Pending it may be "" and the daemon makes one up.
	Session string
	Owner   Owner
	// Pending: the real id is not known yet; Rename it later, or it expires.
	Pending bool
	// Labels are stored with the session and copied into its events.
	Labels map[string]string
	// UID (root only) registers in that user's namespace of ids.
	UID *uint32
	// OnEnd is the cleanup policy ("" leaves the daemon's default, Leave).
	OnEnd OnEnd
	// Grace is the time between SIGTERM and SIGKILL (0: the daemon's 10 s).
	Grace time.Duration
	// Until is "tree" for a session that ends at the last exit of its tree ("" leaves the
	// daemon's default, "owner").
	Until string
	// Wrappers are further process names OwnerAuto skips, for this registration only.
	Wrappers []string
	// OnEndRun are commands the daemon runs, as the caller, once the session ends,
	// however it ends (docs/end-actions.md); make them idempotent. On an active session a
	// non-nil list (empty too) replaces the one it had; nil keeps it.
	OnEndRun []ActionSpec
}

// Registered is the answer to Register.
type Registered struct {
	Session Session
	// Warnings say what succeeded but looks wrong (an owner that is a launcher, one that
	// had already exited): worth showing to whoever registered.
	Warnings []string
}

// Register creates a session, or gives an active one a new owner (a new turn). An owner
// that had already died ends the session at once: check Session.Phase.
func (c *Client) Register(ctx context.Context, reg Registration) (Registered, error) {
	req := &request{
		Op: "register", Session: reg.Session, UID: reg.UID, Owner: &reg.Owner,
		Pending: reg.Pending, Labels: reg.Labels, OnEnd: reg.OnEnd, Until: reg.Until, Wrappers: reg.Wrappers,
	}
	if reg.OnEndRun != nil {
		req.OnEndRun = &reg.OnEndRun
	}
	if reg.Grace > 0 {
		ms := uint64(reg.Grace / time.Millisecond)
		req.GraceMs = &ms
	}
	var fds []int
	if reg.Owner.kind == ownerPID {
		pidfd, err := pidfdOpen(int(reg.Owner.pid))
		switch {
		case err != nil:
			return Registered{}, err
		case pidfd >= 0:
			defer closeFd(pidfd)
			req.Owner = &Owner{kind: ownerPidfd, pidfd: 0}
			fds = []int{pidfd}
		}
	}
	r, err := c.call(ctx, req, fds...)
	if err != nil {
		return Registered{}, err
	}
	return registered(req.Op, r)
}

func registered(op string, r *reply) (Registered, error) {
	if r.Session == nil {
		return Registered{}, fmt.Errorf("liveness: the reply to %s has no session", op)
	}
	return Registered{Session: *r.Session, Warnings: r.Warnings}, nil
}

// ActionsDone tells the daemon that the session's end commands were run by the caller
// itself (an agent whose own end hook ran): each end action that has not started is
// recorded as skipped ("done_by_agent") and never runs. Those that had started run to
// their end; Warnings says so. The session comes back with Actions set.
func (c *Client) ActionsDone(ctx context.Context, session string, opts ...Option) (Registered, error) {
	r, err := c.call(ctx, (&request{Op: "actions_done", Session: session}).with(opts))
	if err != nil {
		return Registered{}, err
	}
	return registered("actions_done", r)
}
