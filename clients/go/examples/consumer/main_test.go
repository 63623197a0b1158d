package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	liveness "example.invalid/liveness/clients/go"
	"example.invalid/liveness/clients/go/internal/testdaemon"
)

func TestMain(m *testing.M) { testdaemon.Main(m, main) }

// consumer is the example running as its own program, its output read line by line.
type consumer struct {
	cmd   *exec.Cmd
	lines chan string
}

func startConsumer(t *testing.T, socket, cursor string) *consumer {
	cmd := testdaemon.Program(socket, cursor)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &consumer{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			c.lines <- scanner.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(c.stop)
	return c
}

func (c *consumer) stop() {
	c.cmd.Process.Signal(syscall.SIGTERM)
	c.cmd.Wait()
}

func (c *consumer) expect(t *testing.T, line string) {
	t.Helper()
	select {
	case got := <-c.lines:
		if got != line {
			t.Fatalf("the consumer printed %q, expected %q", got, line)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the consumer did not print %q", line)
	}
}

// quiet fails on any line printed within a moment: nothing is printed twice.
func (c *consumer) quiet(t *testing.T) {
	select {
	case got, open := <-c.lines:
		if open {
			t.Fatalf("the consumer printed %q again", got)
		}
	case <-time.After(500 * time.Millisecond):
	}
}

// started waits for a first run to save where it started, once subscribed.
func started(t *testing.T, ctx context.Context, path string) {
	for ctx.Err() == nil {
		if cursor, err := liveness.LoadCursor(path); err == nil && cursor != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the consumer saved no cursor when it started")
}

// saved waits for the consumer to save the cursor of the daemon's last event: it handles an
// event, then saves, so stopping it in between would have it handle the event again.
func saved(t *testing.T, ctx context.Context, socket, path string) {
	c, err := liveness.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	status, err := c.Status(ctx)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	for ctx.Err() == nil {
		if cursor, err := liveness.LoadCursor(path); err == nil && cursor != nil && float64(cursor.Seq) == status["head_seq"] {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the consumer did not save seq %v", status["head_seq"])
}

func TestConsumerResumesAcrossRestarts(t *testing.T) {
	d := testdaemon.Start(t)
	ctx := testdaemon.Context(t, 90*time.Second)
	register := func(session string) *exec.Cmd {
		owner := testdaemon.Child(t)
		c, err := liveness.Dial(ctx, d.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Register(ctx, liveness.Registration{Session: session, Owner: liveness.OwnerPID(owner.Process.Pid)}); err != nil {
			t.Fatal(err)
		}
		return owner
	}
	cursor := filepath.Join(t.TempDir(), "cursor")
	c := startConsumer(t, d.Socket, cursor)
	// Stopped before its first end, a run is followed by one that handles the ends in
	// between.
	started(t, ctx, cursor)
	c.stop()
	testdaemon.Kill(register("early"))
	c = startConsumer(t, d.Socket, cursor)
	c.expect(t, "early owner_exited")

	a, b := register("a"), register("b")
	testdaemon.Kill(a)
	c.expect(t, "a owner_exited")

	d.Stop()
	testdaemon.Kill(b)
	d.Start()
	c.expect(t, "b owner_exited")

	saved(t, ctx, d.Socket, cursor)
	c.stop()
	testdaemon.Kill(register("c"))
	c = startConsumer(t, d.Socket, cursor)
	c.expect(t, "c owner_exited")
	c.quiet(t)
}

// The README shows this program as it is.
func TestTheReadmeShowsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	source, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	body := string(source)[strings.Index(string(source), "func main() {"):]
	if !strings.Contains(string(readme), body) {
		t.Fatalf("README.md does not show examples/consumer/main.go's main:\n%s", body)
	}
}
