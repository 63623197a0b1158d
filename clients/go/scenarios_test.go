package liveness

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The scenarios of clients/contract/scenarios.md, against the real daemon.

func TestOwnerKilled(t *testing.T) {
	d := startDaemon(t)
	ctx := withTimeout(t, 30*time.Second)
	sub := d.subscribe(ctx)
	c := d.dial(ctx)
	owner := child(t)
	reg, err := c.Register(ctx, Registration{Session: "killed", Owner: OwnerPID(owner.Process.Pid), Labels: map[string]string{"tool": "go"}})
	if err != nil {
		t.Fatal(err)
	}
	if reg.Session.Phase != Active || reg.Session.Owner.PID != uint32(owner.Process.Pid) {
		t.Fatalf("registered %+v", reg.Session)
	}
	until(t, ctx, sub, KindRegistered, "killed")
	kill(owner)
	ended := until(t, ctx, sub, KindEnded, "killed")
	if ended.Reason != "owner_exited" || ended.Labels["tool"] != "go" {
		t.Fatalf("ended %+v", ended)
	}
	if requireEbpf() || ended.DetectedBy == "ebpf" {
		want := ExitStatus{Kind: Signaled, Signal: 9}
		if ended.DetectedBy != "ebpf" || ended.Exit == nil || *ended.Exit != want {
			t.Fatalf("an eBPF death carries its status: %+v", ended)
		}
	}
	session, err := c.Get(ctx, "killed")
	if err != nil {
		t.Fatal(err)
	}
	if session.Reason != ended.Reason || session.DetectedBy != ended.DetectedBy ||
		!session.Owner.SameProcess(ended.Owner) || fmt.Sprint(session.Exit) != fmt.Sprint(ended.Exit) {
		t.Fatalf("the event %+v says other than the session %+v", ended, session)
	}
	sameJSON(t, "the session as the Rust client sees it", d.CLI("get", "--session", "killed"), session)
}

func TestOperations(t *testing.T) {
	d := startDaemon(t)
	ctx := withTimeout(t, 30*time.Second)
	c := d.dial(ctx)
	owner := child(t)
	pending, err := c.Register(ctx, Registration{Pending: true, Owner: OwnerPID(owner.Process.Pid)})
	if err != nil {
		t.Fatal(err)
	}
	s := pending.Session
	if !regexp.MustCompile(`^pending-[0-9a-f]{16}$`).MatchString(s.ID) || !s.Pending || s.PendingExpiresMs == 0 {
		t.Fatalf("pending registration: %+v", s)
	}
	renamed, err := c.Rename(ctx, s.ID, "conv-1")
	if err != nil || renamed.ID != "conv-1" || renamed.Pending || renamed.PendingExpiresMs != 0 {
		t.Fatalf("rename: %+v %v", renamed, err)
	}
	if touched, err := c.Touch(ctx, "conv-1"); err != nil || touched.ID != "conv-1" {
		t.Fatalf("touch: %+v %v", touched, err)
	}
	declared, err := c.Touch(ctx, "conv-1", TurnStart(), ToolStart("Bash"))
	if err != nil || declared.Declared == nil || declared.Declared.Tool != "Bash" || declared.Declared.TurnSinceMs == nil {
		t.Fatalf("touch with a declaration: %+v %v", declared.Declared, err)
	}
	whose, err := c.Whose(ctx, owner.Process.Pid)
	if err != nil || whose.Session.ID != "conv-1" || whose.OwnerPID != uint32(owner.Process.Pid) {
		t.Fatalf("whose: %+v %v", whose, err)
	}
	processes, err := c.Processes(ctx, "conv-1")
	if err != nil || len(processes) != 1 || !processes[0].Owner || processes[0].Identity.PID != uint32(owner.Process.Pid) {
		t.Fatalf("processes: %+v %v", processes, err)
	}
	if _, err := c.Register(ctx, Registration{Session: "plain", Owner: OwnerPID(owner.Process.Pid)}); err != nil {
		t.Fatal(err)
	}
	all, err := c.List(ctx, "")
	if err != nil || len(all) != 2 || all[0].ID != "conv-1" || all[1].ID != "plain" {
		t.Fatalf("list: %+v %v", all, err)
	}
	ended, err := c.End(ctx, "conv-1")
	if err != nil || ended.Phase != Ended || ended.Reason != "stopped" || ended.EndedMs == 0 {
		t.Fatalf("end: %+v %v", ended, err)
	}
	if active, err := c.List(ctx, Active); err != nil || len(active) != 1 || active[0].ID != "plain" {
		t.Fatalf("list active: %+v %v", active, err)
	}
	refusals := []struct {
		err  error
		want *Error
	}{
		{second(c.End(ctx, "conv-1")), ErrAlreadyEnded},
		{second(c.Get(ctx, "nobody")), ErrNotFound},
		{second(c.Rename(ctx, "plain", "other")), ErrNotPending},
		{second(c.Register(ctx, Registration{Session: "plain", Owner: OwnerPID(owner.Process.Pid), OnEnd: Terminate})), ErrInvalidRequest},
	}
	for _, r := range refusals {
		var daemonErr *Error
		if !errors.Is(r.err, r.want) || !errors.As(r.err, &daemonErr) || daemonErr.Message == "" {
			t.Errorf("want %s, got %v", r.want.Code, r.err)
		}
	}
	if !errors.Is(second(c.Register(ctx, Registration{Session: "gone", Owner: OwnerPID(1 << 30)})), ErrNoSuchProcess) {
		t.Error("a pid that does not exist is refused before asking the daemon")
	}
	if status, err := c.Status(ctx); err != nil || status["store_id"] == "" {
		t.Fatalf("status: %v %v", status, err)
	}
}

func second[T any](_ T, err error) error { return err }

func TestRestartResume(t *testing.T) {
	d := startDaemon(t)
	ctx := withTimeout(t, 90*time.Second)
	sub, err := Subscribe(ctx, d.socket, nil, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	sub.Retry = Retry{First: 50 * time.Millisecond, Max: 500 * time.Millisecond, GiveUpAfter: 60 * time.Second}
	var delivered []uint64
	read := func(kind EventKind, session string) *Event {
		for {
			m, err := sub.Next(ctx)
			if err != nil {
				t.Fatalf("waiting for %s of %s: %v", kind, session, err)
			}
			if m.Event != nil {
				delivered = append(delivered, m.Event.Seq)
				if m.Event.Kind == kind && m.Event.Session == session {
					return m.Event
				}
			}
		}
	}
	register := func(session string) *exec.Cmd {
		owner := child(t)
		if _, err := d.dial(ctx).Register(ctx, Registration{Session: session, Owner: OwnerPID(owner.Process.Pid)}); err != nil {
			t.Fatal(err)
		}
		read(KindRegistered, session)
		return owner
	}
	a := register("a")
	first := *sub.Cursor()
	b := register("b")

	d.Stop()
	kill(a)
	d.Start()
	if ended := read(KindEnded, "a"); ended.DetectedBy != "reconcile" {
		t.Fatalf("a death while the daemon was down is found by the reconcile: %+v", ended)
	}

	d.Kill9()
	d.Start()
	kill(b)
	read(KindEnded, "b")

	for i := 1; i < len(delivered); i++ {
		if delivered[i] <= delivered[i-1] {
			t.Fatalf("seqs delivered out of order or twice: %v", delivered)
		}
	}
	replay, err := Subscribe(ctx, d.socket, &first, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	defer replay.Close()
	var replayed []uint64
	for len(replayed) == 0 || replayed[len(replayed)-1] < delivered[len(delivered)-1] {
		e, err := replay.NextEvent(ctx)
		if err != nil {
			t.Fatal(err)
		}
		replayed = append(replayed, e.Seq)
	}
	if fmt.Sprint(replayed) != fmt.Sprint(delivered[1:]) {
		t.Fatalf("delivered after the first cursor %v, the daemon has %v", delivered[1:], replayed)
	}
}

func TestLagged(t *testing.T) {
	d := startDaemon(t, "--subscriber-queue", "8")
	ctx := withTimeout(t, 60*time.Second)
	sub, err := Subscribe(ctx, d.socket, nil, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	owner, err := Capture(child(t).Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// Far more events than the socket's buffers and the queue of 8 hold, while the
	// subscriber reads nothing: the daemon drops it with lagged.
	c := d.dial(ctx)
	const sessions = 2000
	for i := 0; i < sessions; i++ {
		if _, err := c.Register(ctx, Registration{Session: fmt.Sprintf("s%04d", i), Owner: OwnerIdentity(owner)}); err != nil {
			t.Fatal(err)
		}
	}
	lagged := false
	for i := 0; i < sessions; {
		m, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Lagged != nil {
			lagged = true
			continue
		}
		if m.Event == nil {
			t.Fatalf("unexpected %+v", m)
		}
		if want := fmt.Sprintf("s%04d", i); m.Event.Session != want {
			t.Fatalf("event %d is of %s, expected %s: missed or twice", m.Event.Seq, m.Event.Session, want)
		}
		i++
	}
	if !lagged {
		t.Fatal("the subscriber was never told it lagged: the test proves nothing")
	}
}

func TestPages(t *testing.T) {
	d := startDaemon(t)
	ctx := withTimeout(t, 60*time.Second)
	owner, err := Capture(child(t).Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	c := d.dial(ctx)
	const count = 1001 // the daemon's pages hold 1000
	for i := 0; i < count; i++ {
		name := fmt.Sprintf("s%04d", i)
		if _, err := c.Register(ctx, Registration{Session: name, Owner: OwnerIdentity(owner)}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.AcquireLock(ctx, "lock-"+name, name); err != nil {
			t.Fatal(err)
		}
	}
	sessions, err := c.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	locks, err := c.Locks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(sessions) != count || len(locks) != count {
		t.Fatalf("%d sessions and %d locks listed, %d of each held", len(sessions), len(locks), count)
	}
	for i := 0; i < count; i++ {
		name := fmt.Sprintf("s%04d", i)
		if sessions[i].ID != name || locks[i].Name != "lock-"+name || locks[i].Session != name {
			t.Fatalf("item %d: session %s, lock %s of %s", i, sessions[i].ID, locks[i].Name, locks[i].Session)
		}
	}
}

func TestReset(t *testing.T) {
	d := startDaemon(t)
	ctx := withTimeout(t, 60*time.Second)
	sub, err := Subscribe(ctx, d.socket, nil, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	owner := child(t)
	if _, err := d.dial(ctx).Register(ctx, Registration{Session: "x", Owner: OwnerPID(owner.Process.Pid)}); err != nil {
		t.Fatal(err)
	}
	until(t, ctx, sub, KindRegistered, "x")
	storeA := sub.Cursor().StoreID

	d.Stop()
	if err := os.RemoveAll(d.State); err != nil {
		t.Fatal(err)
	}
	d.Start()
	if _, err := d.dial(ctx).Register(ctx, Registration{Session: "y", Owner: OwnerPID(owner.Process.Pid)}); err != nil {
		t.Fatal(err)
	}
	var reset *Subscribed
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Reset != nil {
			reset = m.Reset
			continue
		}
		if m.Event == nil {
			continue
		}
		if reset == nil || reset.StoreID == storeA {
			t.Fatalf("an event of the new store came without a reset first: %+v", m.Event)
		}
		if m.Event.Seq != 1 || m.Event.Session != "y" {
			t.Fatalf("the new store's first event is y's registration: %+v", m.Event)
		}
		break
	}
	if cursor := sub.Cursor(); cursor.Seq != 1 || cursor.StoreID != reset.StoreID {
		t.Fatalf("the cursor is in the new store: %+v", cursor)
	}
}

func TestLocks(t *testing.T) {
	d := startDaemon(t)
	ctx := withTimeout(t, 60*time.Second)
	c := d.dial(ctx)
	owners := map[string]*exec.Cmd{}
	for _, s := range []string{"s1", "s2"} {
		owners[s] = child(t)
		if _, err := c.Register(ctx, Registration{Session: s, Owner: OwnerPID(owners[s].Process.Pid)}); err != nil {
			t.Fatal(err)
		}
	}
	first, err := c.AcquireLock(ctx, "build", "s1")
	if err != nil || first.Session != "s1" || first.Token == 0 {
		t.Fatalf("acquire: %+v %v", first, err)
	}
	if _, err := c.AcquireLock(ctx, "build", "s1", Cluster()); err == nil || !strings.Contains(err.Error(), "--etcd") {
		t.Fatalf("a fleet lock from a daemon without --etcd: %v", err)
	}
	if again, err := c.AcquireLock(ctx, "build", "s1"); err != nil || again.Token != first.Token {
		t.Fatalf("the holder asking again gets its grant back: %+v %v", again, err)
	}
	if err := second(c.AcquireLock(ctx, "build", "s2")); !errors.Is(err, ErrLockHeld) {
		t.Fatalf("held: %v", err)
	} else if strings.Contains(err.Error(), "--wait") {
		t.Fatalf("a daemon error names no CLI option: %v", err)
	}
	start := time.Now()
	if err := second(c.AcquireLock(ctx, "build", "s2", Wait(300*time.Millisecond))); !errors.Is(err, ErrLockHeld) || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("a wait of 300 ms ends in lock_held after it: %v after %v", err, time.Since(start))
	}
	granted := make(chan Lock, 1)
	go func() {
		lock, err := c.AcquireLock(ctx, "build", "s2", Wait(0))
		if err != nil {
			t.Error(err)
		}
		granted <- lock
	}()
	for {
		locks, err := c.Locks(ctx)
		if err != nil || len(locks) != 1 || locks[0].Session != "s1" {
			t.Fatalf("lock_list: %+v %v", locks, err)
		}
		if locks[0].Waiters == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	kill(owners["s1"])
	next := <-granted
	if next.Session != "s2" || next.Token <= first.Token {
		t.Fatalf("the waiter gets the lock of the dead holder with a greater token: %+v after %+v", next, first)
	}
	if released, err := c.ReleaseLock(ctx, "build", "s2"); err != nil || released.Token != next.Token {
		t.Fatalf("release: %+v %v", released, err)
	}
	if err := second(c.ReleaseLock(ctx, "build", "s2")); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("a second release: %v", err)
	}
	d.Stop()
	d.Start()
	after, err := d.dial(ctx).AcquireLock(ctx, "build", "s2")
	if err != nil || after.Token <= next.Token {
		t.Fatalf("tokens grow across a restart: %+v after %+v (%v)", after, next, err)
	}
}

func TestWait(t *testing.T) {
	d := startDaemon(t)
	ctx := withTimeout(t, 30*time.Second)
	owner := child(t)
	if _, err := d.dial(ctx).Register(ctx, Registration{Session: "w", Owner: OwnerPID(owner.Process.Pid)}); err != nil {
		t.Fatal(err)
	}
	done := waiting(t, func() (Session, error) { return WaitForEnd(ctx, d.socket, "w") })
	kill(owner)
	if s := <-done; s.Phase != Ended || s.Reason != "owner_exited" {
		t.Fatalf("wait: %+v", s)
	}
}

// waiting runs wait in the background, and gives it time to subscribe.
func waiting(t *testing.T, wait func() (Session, error)) <-chan Session {
	done := make(chan Session, 1)
	go func() {
		s, err := wait()
		if err != nil {
			t.Error(err)
		}
		done <- s
	}()
	time.Sleep(200 * time.Millisecond)
	return done
}

// verdict is what `liveness check --identity --json` prints.
type verdict struct {
	Liveness string `json:"liveness"`
	Reason   string `json:"reason"`
}

func TestCheck(t *testing.T) {
	d := startDaemon(t) // only its CLI is used
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	strange := filepath.Join(t.TempDir(), "a) (b c")
	data, err := os.ReadFile(sleep)
	if err == nil {
		err = os.WriteFile(strange, data, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	proc := child(t, strange, "300")
	pid := proc.Process.Pid
	id, err := Capture(pid)
	if err != nil {
		t.Fatal(err)
	}
	if id.Comm != "a) (b c" {
		t.Fatalf("comm %q", id.Comm)
	}
	sameJSON(t, "the identity `liveness check --pid` captures", d.CLI("check", "--pid", strconv.Itoa(pid)), id)

	agree := func(what string, id Identity, state State, reason string) {
		t.Helper()
		got := Check(id)
		encoded, _ := json.Marshal(id)
		var cli verdict
		if err := json.Unmarshal(d.CLI("check", "--identity", string(encoded)), &cli); err != nil {
			t.Fatal(err)
		}
		if got.State != state || got.Reason != reason || string(got.State) != cli.Liveness || got.Reason != cli.Reason {
			t.Fatalf("%s: this client says %+v, `liveness check` %+v, expected %s %s", what, got, cli, state, reason)
		}
	}
	agree("a live process", id, Alive, "")
	reused := id
	reused.StartTicks++
	reused.PidfsIno = nil
	agree("its pid with another start time", reused, Dead, ReasonReused)
	rebooted := id
	rebooted.BootID = "00000000-0000-0000-0000-000000000000"
	agree("an earlier boot of this host", rebooted, Dead, ReasonRebooted)
	elsewhere := rebooted
	elsewhere.Host = "another-host.invalid"
	agree("a boot of another host", elsewhere, Unknown, "")
	kill(proc)
	agree("the process killed and reaped", id, Dead, ReasonExited)
	if _, err := Capture(pid); !errors.Is(err, ErrNoSuchProcess) {
		t.Fatalf("capture of a reaped pid: %v", err)
	}
}

// TestTimeNamespace captures a process from inside a time namespace whose boot time is
// 1000 s ahead: the start ticks are the same as outside.
func TestTimeNamespace(t *testing.T) {
	if pid := os.Getenv("LIVENESS_TEST_CAPTURE"); pid != "" {
		n, _ := strconv.Atoi(pid)
		id, err := Capture(n)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("captured %d\n", id.StartTicks)
		return
	}
	proc := child(t)
	outside, err := Capture(proc.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--time", "--boottime", "1000", "--fork",
		os.Args[0], "-test.run=^TestTimeNamespace$", "-test.v")
	cmd.Env = append(os.Environ(), "LIVENESS_TEST_CAPTURE="+strconv.Itoa(proc.Process.Pid))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("unshare: %v\n%s", err, out)
	}
	want := fmt.Sprintf("captured %d\n", outside.StartTicks)
	if !strings.Contains(string(out), want) {
		t.Fatalf("outside: %d; inside:\n%s", outside.StartTicks, out)
	}
}

func TestDefaultSocket(t *testing.T) {
	t.Setenv("LIVENESS_SOCKET", "/somewhere/else.sock")
	if got := DefaultSocket(); got != "/somewhere/else.sock" {
		t.Fatalf("LIVENESS_SOCKET wins: %s", got)
	}
	t.Setenv("LIVENESS_SOCKET", "")
	if os.Getuid() == 0 {
		if got := DefaultSocket(); got != SystemSocket {
			t.Fatalf("root: %s", got)
		}
		return
	}
	runtime := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", runtime)
	if got := DefaultSocket(); got != SystemSocket {
		t.Fatalf("no user daemon: %s", got)
	}
	os.WriteFile(filepath.Join(runtime, "liveness.sock"), nil, 0o600)
	if got := DefaultSocket(); got != filepath.Join(runtime, "liveness.sock") {
		t.Fatalf("the user's own daemon: %s", got)
	}
}

func TestEndActions(t *testing.T) {
	d := startDaemon(t)
	ctx := withTimeout(t, 60*time.Second)
	sub := d.subscribe(ctx)
	c := d.dial(ctx)
	ran := filepath.Join(t.TempDir(), "ran")
	action := Action("sh", "-c", `echo "$LIVENESS_SESSION" >>"$RAN"; echo failing >&2; exit 3`)
	action.Env = []string{"RAN=" + ran}

	owner := child(t)
	reg, err := c.Register(ctx, Registration{Session: "acted", Owner: OwnerPID(owner.Process.Pid), OnEndRun: []ActionSpec{action}})
	if err != nil {
		t.Fatal(err)
	}
	if len(reg.Session.OnEndRun) != 1 || reg.Session.OnEndRun[0].Argv[0] != "sh" {
		t.Fatalf("registered without its action: %+v", reg.Session)
	}
	done := waiting(t, func() (Session, error) { return WaitForFinalized(ctx, d.socket, "acted") })
	kill(owner)
	if ended := until(t, ctx, sub, KindEnded, "acted"); ended.Actions != 1 {
		t.Fatalf("session.ended counts 1 action: %+v", ended)
	}
	event := until(t, ctx, sub, KindAction, "acted")
	until(t, ctx, sub, KindFinalized, "acted")
	s := <-done
	if !s.Finalized() || s.FinalizedMs == 0 || len(s.Actions) != 1 || s.Actions[0].State != ActionDone {
		t.Fatalf("finalized: %+v", s)
	}
	outcome := s.Actions[0].Outcome
	if outcome == nil || outcome.Exit == nil || outcome.Exit.Code != 3 || outcome.StderrTail != "failing\n" || outcome.Succeeded() {
		t.Fatalf("the outcome: %+v", outcome)
	}
	if fmt.Sprint(*event.Action) != fmt.Sprint(*outcome) {
		t.Fatalf("the event's outcome %+v is not the session's %+v", event.Action, outcome)
	}
	if data, err := os.ReadFile(ran); err != nil || string(data) != "acted\n" {
		t.Fatalf("the action ran once: %q %v", data, err)
	}
	sameJSON(t, "the session as the Rust client sees it", d.CLI("get", "--session", "acted"), s)

	// An agent that ran its end commands itself: the daemon never runs them.
	skipped := filepath.Join(t.TempDir(), "skipped")
	owner = child(t)
	_, err = c.Register(ctx, Registration{Session: "agent-ran", Owner: OwnerPID(owner.Process.Pid), OnEndRun: []ActionSpec{Action("touch", skipped)}})
	if err != nil {
		t.Fatal(err)
	}
	answer, err := c.ActionsDone(ctx, "agent-ran")
	if err != nil {
		t.Fatal(err)
	}
	if len(answer.Session.Actions) != 1 || answer.Session.Actions[0].Outcome == nil || answer.Session.Actions[0].Outcome.Skipped != "done_by_agent" {
		t.Fatalf("actions_done: %+v", answer.Session)
	}
	kill(owner)
	s, err = WaitForFinalized(ctx, d.socket, "agent-ran")
	if err != nil || !s.Finalized() || s.Actions[0].Outcome.Skipped != "done_by_agent" {
		t.Fatalf("finalized: %+v %v", s, err)
	}
	if _, err := os.Stat(skipped); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the skipped action ran: %v", err)
	}
	if _, err := c.ActionsDone(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("actions_done of an unknown session: %v", err)
	}
}
