package liveness

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Identity is a process's fingerprint: equal fingerprints name the same process, and a
// PID whose start time (or pidfs inode) differs is another process. See docs/protocol.md
// §2 "Identity".
type Identity struct {
	// PID is the process id, in the PID namespace of whoever captured it.
	PID uint32 `json:"pid"`
	// StartTicks is the start time in clock ticks after boot, as the initial time
	// namespace counts it (/proc/<pid>/stat field 22).
	StartTicks uint64 `json:"start_ticks"`
	// BootID is /proc/sys/kernel/random/boot_id of the boot the process runs in.
	BootID string `json:"boot_id"`
	// Host is the host name when captured: a label, never compared.
	Host string `json:"host"`
	// PidfsIno is the pidfs inode of the process (Linux 6.9+), nil where unknown.
	PidfsIno *uint64 `json:"pidfs_ino,omitempty"`
	// Comm is the command name when captured: display only.
	Comm string `json:"comm"`
}

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

// ExitStatus is how a process ended, as wait(2) would tell its parent: Kind is "exited"
// (with Code) or "signaled" (with Signal and CoreDumped).
type ExitStatus struct {
	Kind       string
	Code       uint8
	Signal     uint8
	CoreDumped bool
}

// The kinds of ExitStatus.
const (
	Exited   = "exited"
	Signaled = "signaled"
)

// MarshalJSON writes only the fields of the status's kind.
func (e ExitStatus) MarshalJSON() ([]byte, error) {
	switch e.Kind {
	case Exited:
		return json.Marshal(struct {
			Kind string `json:"kind"`
			Code uint8  `json:"code"`
		}{e.Kind, e.Code})
	case Signaled:
		return json.Marshal(struct {
			Kind       string `json:"kind"`
			Signal     uint8  `json:"signal"`
			CoreDumped bool   `json:"core_dumped"`
		}{e.Kind, e.Signal, e.CoreDumped})
	}
	return nil, fmt.Errorf("liveness: exit status of unknown kind %q", e.Kind)
}

// UnmarshalJSON reads a tagged status and refuses kinds it does not know.
func (e *ExitStatus) UnmarshalJSON(data []byte) error {
	var raw struct {
		Kind       string `json:"kind"`
		Code       uint8  `json:"code"`
		Signal     uint8  `json:"signal"`
		CoreDumped bool   `json:"core_dumped"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	if raw.Kind != Exited && raw.Kind != Signaled {
		return fmt.Errorf("liveness: exit status of unknown kind %q", raw.Kind)
	}
	*e = ExitStatus{Kind: raw.Kind, Code: raw.Code, Signal: raw.Signal, CoreDumped: raw.CoreDumped}
	return nil
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

// Cause is why a session ended, from its owner's side (docs/protocol.md §2 "Cause"): Kind
// is "exit" (Code), "signal" (Signal, and Sender or Kernel), "oom" (Scope, Cgroup),
// "hangup", "unknown" (Reason) or "none" (the owner did not die).
type Cause struct {
	Kind   string  `json:"kind"`
	Code   *uint8  `json:"code,omitempty"`
	Signal uint8   `json:"signal,omitempty"`
	Sender *Sender `json:"sender,omitempty"`
	// Kernel is why the kernel raised the signal itself ("fault", "cpu_limit", ...).
	Kernel string `json:"kernel,omitempty"`
	// Scope is "cgroup" (Cgroup's limit was reached), "global" or "unknown".
	Scope  string `json:"scope,omitempty"`
	Cgroup string `json:"cgroup,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Sender is the process that sent a killing signal, as it was when it sent it. Session is
// set only where every reader of the ending may see that session.
type Sender struct {
	Pid        uint32 `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
	Comm       string `json:"comm"`
	UID        uint32 `json:"uid"`
	Session    string `json:"session,omitempty"`
}

// Usage is what an owner cost, from the kernel at its exit (docs/protocol.md §2 "Usage").
type Usage struct {
	CPUUserUs    uint64 `json:"cpu_user_us"`
	CPUSystemUs  uint64 `json:"cpu_system_us"`
	PeakRSSBytes uint64 `json:"peak_rss_bytes"`
	// Members are the owner's tree's members that exited while it was tracked (those
	// still running at its end are not counted): CPU summed, the largest peak.
	Members MembersUsage `json:"members"`
}

// MembersUsage is the usage of a tree's members that exited.
type MembersUsage struct {
	Exited       uint32 `json:"exited"`
	CPUUserUs    uint64 `json:"cpu_user_us"`
	CPUSystemUs  uint64 `json:"cpu_system_us"`
	PeakRSSBytes uint64 `json:"peak_rss_bytes"`
}

// Phase is a session's lifecycle phase.
type Phase string

// The phases of a session; the empty Phase means both in List.
const (
	Active Phase = "active"
	Ended  Phase = "ended"
)

// OnEnd is a session's cleanup policy: what happens to its surviving processes at its end.
type OnEnd string

// The cleanup policies; the empty OnEnd leaves the daemon's default (Leave).
const (
	Leave     OnEnd = "leave"
	Terminate OnEnd = "terminate"
)

// Session is a session as the daemon stores it (docs/protocol.md §2 "Session").
type Session struct {
	ID      string
	Owner   Identity
	Phase   Phase
	Pending bool
	// Reason is why it ended ("owner_exited", "owner_reused", "reboot", "stopped",
	// "timeout", "pending_expired"); empty while active.
	Reason string
	// Exit is the owner's exit status, when a source knew it.
	Exit *ExitStatus
	// Cause is why it ended, from its owner's side; nil while active.
	Cause *Cause
	// Usage is what the owner cost, where the kernel showed it (eBPF).
	Usage *Usage
	// DetectedBy names what noticed the owner's death ("ebpf", "pidfd", "procpoll",
	// "reconcile"); empty when no death ended it.
	DetectedBy string
	// CreatorUID is the user who registered it, the one who may see and change it.
	CreatorUID uint32
	Labels     map[string]string
	CreatedMs  int64
	UpdatedMs  int64
	// TouchedMs is the last activity; the inactivity timeout counts from it.
	TouchedMs int64
	// EndedMs is when it ended, 0 while active.
	EndedMs int64
	// PendingExpiresMs is when a pending session expires unless renamed, else 0.
	PendingExpiresMs int64
	// Survivors are the session's processes still alive when it ended.
	Survivors *Survivors
	OnEnd     OnEnd
	// GraceMs is the time between SIGTERM and SIGKILL when survivors are terminated.
	GraceMs uint64
	// Until is "tree" for a session that ends at the last exit of its tree; empty for
	// "owner", the default.
	Until string
	// OnEndRun are the end actions its creator registered (docs/end-actions.md).
	OnEndRun []ActionSpec
	// Actions is where each end action stands, in the order of OnEndRun: set by Get and
	// ActionsDone only.
	Actions []ActionState
	// FinalizedMs is when the last end action had its outcome, 0 until then (and for a
	// session without end actions, whose end is final).
	FinalizedMs int64
}

// Finalized reports whether the session has ended and each of its end actions has its
// outcome (at once for one without end actions).
func (s Session) Finalized() bool {
	return s.Phase == Ended && (len(s.OnEndRun) == 0 || s.FinalizedMs != 0)
}

// sessionJSON is Session as the wire has it: what does not apply is null.
type sessionJSON struct {
	ID               string            `json:"id"`
	Owner            Identity          `json:"owner"`
	Phase            Phase             `json:"phase"`
	Pending          bool              `json:"pending"`
	Reason           *string           `json:"reason"`
	Exit             *ExitStatus       `json:"exit"`
	Cause            *Cause            `json:"cause,omitempty"`
	Usage            *Usage            `json:"usage,omitempty"`
	DetectedBy       *string           `json:"detected_by"`
	CreatorUID       uint32            `json:"creator_uid"`
	Labels           map[string]string `json:"labels"`
	CreatedMs        int64             `json:"created_ms"`
	UpdatedMs        int64             `json:"updated_ms"`
	TouchedMs        int64             `json:"touched_ms"`
	EndedMs          *int64            `json:"ended_ms"`
	PendingExpiresMs *int64            `json:"pending_expires_ms"`
	Survivors        *Survivors        `json:"survivors,omitempty"`
	OnEnd            OnEnd             `json:"on_end"`
	GraceMs          uint64            `json:"grace_ms"`
	// Until is "tree" for a session that ends at the last exit of its tree; empty for
	// "owner", the default.
	Until       string        `json:"until,omitempty"`
	OnEndRun    []ActionSpec  `json:"on_end_run,omitempty"`
	Actions     []ActionState `json:"actions,omitempty"`
	FinalizedMs *int64        `json:"finalized_ms,omitempty"`
}

func orNil[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

func orZero[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// MarshalJSON writes null for what does not apply, as the daemon does.
func (s Session) MarshalJSON() ([]byte, error) {
	labels := s.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return json.Marshal(sessionJSON{
		s.ID, s.Owner, s.Phase, s.Pending, orNil(s.Reason), s.Exit, s.Cause, s.Usage, orNil(s.DetectedBy),
		s.CreatorUID, labels, s.CreatedMs, s.UpdatedMs, s.TouchedMs, orNil(s.EndedMs),
		orNil(s.PendingExpiresMs), s.Survivors, s.OnEnd, s.GraceMs, s.Until, s.OnEndRun, s.Actions,
		orNil(s.FinalizedMs),
	})
}

// UnmarshalJSON reads a session; the cleanup policy defaults as the daemon's does.
func (s *Session) UnmarshalJSON(data []byte) error {
	w := sessionJSON{OnEnd: Leave, GraceMs: DefaultGraceMs}
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*s = Session{
		w.ID, w.Owner, w.Phase, w.Pending, orZero(w.Reason), w.Exit, w.Cause, w.Usage, orZero(w.DetectedBy),
		w.CreatorUID, w.Labels, w.CreatedMs, w.UpdatedMs, w.TouchedMs, orZero(w.EndedMs),
		orZero(w.PendingExpiresMs), w.Survivors, w.OnEnd, w.GraceMs, w.Until, w.OnEndRun, w.Actions,
		orZero(w.FinalizedMs),
	}
	return nil
}

// DefaultGraceMs is the grace between SIGTERM and SIGKILL of a session that names none.
const DefaultGraceMs = 10000

// ActionSpec is one end action: a command the daemon runs, as the session's creator, when
// the session ends (docs/end-actions.md §1).
type ActionSpec struct {
	// Argv is the program and its arguments, run without a shell; a name without "/" is
	// looked up in the action's PATH.
	Argv []string `json:"argv"`
	// Env are NAME=value entries added to the action's clean environment.
	Env []string `json:"env,omitempty"`
	// TimeoutMs is how long it may run (nil: the daemon's 60 s; at most an hour).
	TimeoutMs *uint64 `json:"timeout_ms,omitempty"`
	// Cwd is its absolute working directory ("": the user's home).
	Cwd string `json:"cwd,omitempty"`
}

// Action returns an end action running argv with the daemon's defaults.
func Action(argv ...string) ActionSpec { return ActionSpec{Argv: argv} }

// The states of an ActionState.
const (
	ActionPending = "pending"
	ActionRunning = "running"
	ActionDone    = "done"
)

// ActionState is where one end action of a session stands: ActionPending until the
// session ends and it starts, ActionRunning, then ActionDone with its Outcome.
type ActionState struct {
	Index   uint32         `json:"index"`
	State   string         `json:"state"`
	Outcome *ActionOutcome `json:"outcome,omitempty"`
}

// ActionOutcome is what one run of an end action did (session.action events, Get).
type ActionOutcome struct {
	// Index is the action's place in the session's OnEndRun.
	Index      uint32 `json:"index"`
	StartedMs  int64  `json:"started_ms"`
	DurationMs uint64 `json:"duration_ms"`
	// Exit is how its first process ended; nil when it never ran (Error says why).
	Exit *ExitStatus `json:"exit,omitempty"`
	// TimedOut: it ran past its timeout and its process tree was ended; Killed of its
	// processes needed SIGKILL.
	TimedOut bool   `json:"timed_out,omitempty"`
	Killed   uint32 `json:"killed,omitempty"`
	// StderrTail is the last 4 KiB of its stderr; StderrBytes counts all it wrote there.
	StderrTail  string `json:"stderr_tail,omitempty"`
	StderrBytes uint64 `json:"stderr_bytes,omitempty"`
	// Error says why it could not be run (its working directory, its user, its program).
	Error string `json:"error,omitempty"`
	// FailedToStart: its program never ran (its process could not be set up, the program
	// could not be executed, or the process was stopped before its exec past the start
	// bound and killed); Error says which.
	FailedToStart bool `json:"failed_to_start,omitempty"`
	// Resumed: this run repeats one cut short by a stop or a crash of the daemon.
	Resumed bool `json:"resumed,omitempty"`
	// Skipped says why it was not run ("done_by_agent": see Client.ActionsDone).
	Skipped string `json:"skipped,omitempty"`
}

// Succeeded reports whether the action ran, in time, and exited with status 0.
func (o ActionOutcome) Succeeded() bool {
	return !o.TimedOut && o.Exit != nil && o.Exit.Kind == Exited && o.Exit.Code == 0
}

// Survivors are the members of a session's process tree alive at its end.
type Survivors struct {
	// Total counts them all; Members lists at most 1000, by pid.
	Total   uint32     `json:"total"`
	Members []Identity `json:"members"`
}

// The kinds of events; a newer daemon may send others, which consumers should ignore.
const (
	KindRegistered   = "session.registered"
	KindOwnerChanged = "session.owner_changed"
	KindRenamed      = "session.renamed"
	KindEnded        = "session.ended"
	KindReaped       = "session.reaped"
	// KindAction: one end action of the ended session has its outcome (Event.Action).
	KindAction = "session.action"
	// KindFinalized: every end action of the ended session has its outcome.
	KindFinalized    = "session.finalized"
	KindLockAcquired = "lock.acquired"
	KindLockReleased = "lock.released"
)

// Event is one entry of the event stream (docs/protocol.md §5).
type Event struct {
	Seq             uint64            `json:"seq"`
	Kind            string            `json:"kind"`
	AtMs            int64             `json:"at_ms"`
	Session         string            `json:"session"`
	Owner           Identity          `json:"owner"`
	PreviousOwner   *Identity         `json:"previous_owner,omitempty"`
	PreviousSession string            `json:"previous_session,omitempty"`
	Reason          string            `json:"reason,omitempty"`
	Exit            *ExitStatus       `json:"exit,omitempty"`
	Cause           *Cause            `json:"cause,omitempty"`
	Usage           *Usage            `json:"usage,omitempty"`
	DetectedBy      string            `json:"detected_by,omitempty"`
	ObservedMs      *int64            `json:"observed_ms,omitempty"`
	DiedMs          *int64            `json:"died_ms,omitempty"`
	Labels          map[string]string `json:"labels"`
	CreatorUID      uint32            `json:"creator_uid"`
	Survivors       *Survivors        `json:"survivors,omitempty"`
	OnEnd           OnEnd             `json:"on_end,omitempty"`
	Reaped          *Reaped           `json:"reaped,omitempty"`
	// Actions counts the session's end actions: when it is not 0, a session.finalized
	// follows its session.ended.
	Actions uint32 `json:"actions,omitempty"`
	// Action is what one end action did (session.action).
	Action *ActionOutcome `json:"action,omitempty"`
	Lock   *LockChange    `json:"lock,omitempty"`
	Hops   *Hops          `json:"hops,omitempty"`
}

// Reaped is what terminating a session's surviving processes did, by pid.
type Reaped struct {
	Terminated []uint32      `json:"terminated"`
	Killed     []uint32      `json:"killed"`
	Exited     []uint32      `json:"exited"`
	Failed     []ReapFailure `json:"failed"`
	Resumed    bool          `json:"resumed,omitempty"`
}

// ReapFailure is a process the daemon could not, or would not, end.
type ReapFailure struct {
	PID    uint32 `json:"pid"`
	Reason string `json:"reason"`
}

// LockChange is the lock a lock.acquired or lock.released event is about.
type LockChange struct {
	Name  string `json:"name"`
	Token uint64 `json:"token"`
	// Reason is "released" or "session_ended", on lock.released only.
	Reason string `json:"reason,omitempty"`
}

// Hops are CLOCK_MONOTONIC nanoseconds of a death's way through a daemon started with
// --trace-hops.
type Hops struct {
	DiedNs      *uint64 `json:"died_ns,omitempty"`
	ReadNs      uint64  `json:"read_ns"`
	CommittedNs uint64  `json:"committed_ns"`
	PublishedNs uint64  `json:"published_ns"`
}

// Lock is a held lock with its fencing token (docs/protocol.md §12).
type Lock struct {
	Name    string `json:"name"`
	UID     uint32 `json:"uid"`
	Session string `json:"session"`
	// Token is greater than that of every earlier grant of the lock: pass it to what the
	// lock protects, and have that refuse a lower one.
	Token   uint64 `json:"token"`
	SinceMs int64  `json:"since_ms"`
	Waiters uint32 `json:"waiters"`
}

// Process is one live process of a session's tree, as Processes lists it.
type Process struct {
	Identity Identity `json:"identity"`
	Owner    bool     `json:"owner"`
	PPID     uint32   `json:"ppid"`
	Cmdline  []string `json:"cmdline"`
	AgeMs    uint64   `json:"age_ms"`
}

// Subscribed acknowledges a subscription: events after Since up to Head are replayed.
type Subscribed struct {
	Since   uint64 `json:"since"`
	Head    uint64 `json:"head"`
	StoreID string `json:"store_id"`
}

// Gap says that events after Since up to PrunedThrough were deleted by retention.
type Gap struct {
	Since         uint64 `json:"since"`
	PrunedThrough uint64 `json:"pruned_through"`
}

// Lagged says that the subscriber fell behind and the daemon closes the stream.
type Lagged struct {
	LastDelivered uint64 `json:"last_delivered"`
}

// Goodbye says that the daemon is stopping.
type Goodbye struct {
	Reason string `json:"reason"`
}

// Message is one line of an event stream: exactly one field is set. A newer daemon may
// send lines this client does not know; they decode with every field nil and are skipped.
type Message struct {
	Reset   *Subscribed `json:"reset,omitempty"`
	Event   *Event      `json:"event,omitempty"`
	Gap     *Gap        `json:"gap,omitempty"`
	Lagged  *Lagged     `json:"lagged,omitempty"`
	Goodbye *Goodbye    `json:"goodbye,omitempty"`
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
