// Package liveness is a client for livenessd, the Linux exit-notification daemon: tell it
// which process owns which session, learn when that process dies, and hold locks that are
// released when their session ends. It speaks the protocol of docs/protocol.md over the
// daemon's Unix socket, with the standard library only.
//
// A Client makes one call per request (Register, Rename, Touch, End, Get, List, Whose,
// Processes, Status, AcquireLock, ReleaseLock, Locks). A refusal by the daemon is an
// *Error carrying its Code; compare with errors.Is(err, liveness.ErrNotFound). A
// Subscription follows the event stream across daemon restarts, resuming after the last
// event it delivered, so a consumer sees every event once. Capture and Check read a
// process's fingerprint from /proc without a daemon, as `liveness check` does.
package liveness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// SystemSocket is where the system daemon (the systemd unit, run as root) listens.
const SystemSocket = "/run/liveness/liveness.sock"

// DefaultSocket is the socket a client talks to when none is named, by the same rules as
// the liveness CLI: $LIVENESS_SOCKET; for root, the system socket; for another user, the
// user's own daemon's socket ($XDG_RUNTIME_DIR/liveness.sock, or liveness.sock in the
// user's state directory) if it exists, else the system socket.
func DefaultSocket() string {
	if socket := os.Getenv("LIVENESS_SOCKET"); socket != "" {
		return socket
	}
	if os.Getuid() == 0 {
		return SystemSocket
	}
	own := ""
	if runtime := os.Getenv("XDG_RUNTIME_DIR"); runtime != "" {
		own = filepath.Join(runtime, "liveness.sock")
	} else if state := userStateDir(); state != "" {
		own = filepath.Join(state, "liveness.sock")
	}
	if own != "" {
		if _, err := os.Stat(own); err == nil {
			return own
		}
	}
	return SystemSocket
}

// userStateDir is a non-root daemon's default state directory, "" without one.
func userStateDir() string {
	if dir := os.Getenv("LIVENESS_STATE_DIR"); dir != "" {
		return dir
	}
	if state := os.Getenv("XDG_STATE_HOME"); state != "" {
		return filepath.Join(state, "liveness")
	}
	if home := os.Getenv("HOME"); home != "" {
		return filepath.Join(home, ".local/state/liveness")
	}
	return ""
}

// Client is a connection to livenessd. Its calls are safe for concurrent use and are
// served one at a time, in order. A call whose context ends drops the connection (its
// reply would arrive out of turn); the next call connects again.
type Client struct {
	socket string
	mu     sync.Mutex
	conn   *net.UnixConn
	reader *bufio.Reader
}

// Dial connects to the daemon at socket, or at DefaultSocket() when socket is "".
func Dial(ctx context.Context, socket string) (*Client, error) {
	if socket == "" {
		socket = DefaultSocket()
	}
	c := &Client{socket: socket}
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Socket is the path of the daemon's socket.
func (c *Client) Socket() string { return c.socket }

// Close closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

func (c *Client) connect(ctx context.Context) error {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return &ConnectError{Socket: c.socket, Err: err}
	}
	c.conn = conn.(*net.UnixConn)
	c.reader = bufio.NewReader(conn)
	return nil
}

// drop forgets a connection that is out of step or broken.
func (c *Client) drop() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// ioError is a failure of an established connection.
type ioError struct{ err error }

func (e *ioError) Error() string {
	return "liveness: lost the connection to livenessd: " + e.err.Error()
}
func (e *ioError) Unwrap() error { return e.err }

func isIOError(err error) bool {
	var e *ioError
	return errors.As(err, &e)
}

// abortOn makes the connection's pending reads and writes fail when ctx ends; the
// returned function stops watching.
func abortOn(ctx context.Context, conn *net.UnixConn) func() {
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-ctx.Done():
			conn.SetDeadline(time.Unix(1, 0))
		case <-done:
		}
	}()
	return func() {
		close(done)
		<-watched
		conn.SetDeadline(time.Time{})
	}
}

// send writes one request line, with descriptors passed along (SCM_RIGHTS).
func (c *Client) send(req *request, fds []int) error {
	req.V = ProtocolVersion
	line, err := json.Marshal(req)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	if len(fds) > 0 {
		_, _, err = c.conn.WriteMsgUnix(line, unixRights(fds), nil)
	} else {
		_, err = c.conn.Write(line)
	}
	if err != nil {
		return &ioError{err}
	}
	return nil
}

// readLine reads one line, however long.
func (c *Client) readLine() ([]byte, error) {
	line, err := c.reader.ReadBytes('\n')
	if err != nil {
		// Nothing at the end of the connection, or a line it cut short.
		if errors.Is(err, io.EOF) {
			return nil, ErrClosed
		}
		return nil, &ioError{err}
	}
	return line, nil
}

// call sends one request and reads its reply.
func (c *Client) call(ctx context.Context, req *request, fds ...int) (*reply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		if err := c.connect(ctx); err != nil {
			return nil, err
		}
	}
	stop := abortOn(ctx, c.conn)
	err := c.send(req, fds)
	var line []byte
	if err == nil {
		line, err = c.readLine()
	}
	stop()
	if err != nil {
		c.drop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	r, err := decodeReply(line)
	if errors.Is(err, errNotAReply) {
		// A goodbye: the daemon is stopping and closes the connection.
		c.drop()
		return nil, ErrClosed
	}
	return r, err
}

// ProtocolVersion is the version of the protocol this client speaks.
const ProtocolVersion = 1

// Option adjusts a request: ForUser, TerminateSurvivors, Wait, and Touch's declarations.
type Option func(*request)

// with applies opts to the request.
func (r *request) with(opts []Option) *request {
	for _, opt := range opts {
		opt(r)
	}
	return r
}

// ForUser names the session (or lock, or events) of user uid: root only, for ids that
// several users have (see docs/protocol.md "Session ids").
func ForUser(uid uint32) Option { return func(r *request) { r.UID = &uid } }

// TerminateSurvivors makes End also terminate the session's surviving processes,
// whatever its cleanup policy.
func TerminateSurvivors() Option { return func(r *request) { r.Terminate = true } }

// TurnStart declares, with Touch, that the agent's turn starts (its user sent a prompt).
func TurnStart() Option { return func(r *request) { r.Turn = "start" } }

// TurnEnd declares, with Touch, that the agent's turn ended: it waits for its user.
func TurnEnd() Option { return func(r *request) { r.Turn = "end" } }

// ToolStart declares, with Touch, that a tool starts: the session is not stalled while it
// runs, up to the daemon's --tool-stall-after.
func ToolStart(name string) Option { return func(r *request) { r.Tool = name } }

// ToolEnd declares, with Touch, that the tool in flight ended.
func ToolEnd() Option { return func(r *request) { r.ToolEnd = true } }

// Cluster makes AcquireLock and ReleaseLock act on a fleet lock, one for every host whose
// daemon runs with --etcd (docs/fleet.md), instead of this host's.
func Cluster() Option { return func(r *request) { r.Cluster = true } }

// Wait makes AcquireLock wait in line for a lock another session holds, at most timeout
// (0: as long as it takes), instead of failing with ErrLockHeld at once.
func Wait(timeout time.Duration) Option {
	return func(r *request) {
		r.Wait = true
		if timeout > 0 {
			ms := uint64((timeout + time.Millisecond - 1) / time.Millisecond)
			r.TimeoutMs = &ms
		}
	}
}

func (c *Client) sessionCall(ctx context.Context, req *request, opts []Option) (Session, error) {
	r, err := c.call(ctx, req.with(opts))
	if err != nil {
		return Session{}, err
	}
	if r.Session == nil {
		return Session{}, fmt.Errorf("liveness: the reply to %s has no session", req.Op)
	}
	return *r.Session, nil
}

// Rename gives the pending session `session` its real id `to`.
func (c *Client) Rename(ctx context.Context, session, to string, opts ...Option) (Session, error) {
	return c.sessionCall(ctx, &request{Op: "rename", Session: session, To: to}, opts)
}

// Touch records activity, postponing the inactivity timeout of an owner that cannot be
// watched (an identity of another host). With TurnStart, TurnEnd, ToolStart or ToolEnd it
// also declares the agent's phase, which the daemon judges a stall by (docs/activity.md).
func (c *Client) Touch(ctx context.Context, session string, opts ...Option) (Session, error) {
	return c.sessionCall(ctx, &request{Op: "touch", Session: session}, opts)
}

// End ends a session now (reason "stopped") and returns it ended.
func (c *Client) End(ctx context.Context, session string, opts ...Option) (Session, error) {
	return c.sessionCall(ctx, &request{Op: "end", Session: session}, opts)
}

// Get returns one session.
func (c *Client) Get(ctx context.Context, session string, opts ...Option) (Session, error) {
	return c.sessionCall(ctx, &request{Op: "get", Session: session}, opts)
}

// List returns every session the caller may see, in phase ("" for both), oldest first,
// following the daemon's pages.
func (c *Client) List(ctx context.Context, phase Phase) ([]Session, error) {
	var all []Session
	err := c.pages(ctx, &request{Op: "list", Phase: phase}, func(r *reply) {
		if r.Sessions != nil {
			all = append(all, *r.Sessions...)
		}
	})
	return all, err
}

// pages calls req for each page of its answer, handing each reply to take.
func (c *Client) pages(ctx context.Context, req *request, take func(*reply)) error {
	for {
		r, err := c.call(ctx, req)
		if err != nil {
			return err
		}
		take(r)
		if r.Next == nil {
			return nil
		}
		req.After = *r.Next
	}
}

// Whose is the answer of Client.Whose.
type Whose struct {
	// Session is the active session that owns the process or its nearest owned ancestor.
	Session Session
	// OwnerPID is that owner's pid in the caller's PID namespace (0 outside it).
	OwnerPID uint32
}

// Whose finds the active session that owns process pid (in the caller's PID namespace)
// or its nearest ancestor that owns one; ErrNotFound if none does.
func (c *Client) Whose(ctx context.Context, pid int) (Whose, error) {
	p := uint32(pid)
	r, err := c.call(ctx, &request{Op: "whose", PID: &p})
	if err != nil {
		return Whose{}, err
	}
	if r.Session == nil {
		return Whose{}, errors.New("liveness: the reply to whose has no session")
	}
	w := Whose{Session: *r.Session, OwnerPID: r.Session.Owner.PID}
	if r.OwnerPID != nil {
		w.OwnerPID = *r.OwnerPID
	}
	return w, nil
}

// Processes lists the live processes of an active session's tree, the owner included,
// following the daemon's pages.
func (c *Client) Processes(ctx context.Context, session string, opts ...Option) ([]Process, error) {
	var all []Process
	err := c.pages(ctx, (&request{Op: "processes", Session: session}).with(opts), func(r *reply) {
		if r.Processes != nil {
			all = append(all, *r.Processes...)
		}
	})
	return all, err
}

// Status is what the daemon says about itself: informational, and its shape may grow
// (docs/protocol.md "status"), so it is given as decoded JSON.
func (c *Client) Status(ctx context.Context) (map[string]any, error) {
	r, err := c.call(ctx, &request{Op: "status"})
	if err != nil {
		return nil, err
	}
	var status map[string]any
	return status, json.Unmarshal(r.Status, &status)
}
