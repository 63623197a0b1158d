package main

import (
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"example.invalid/liveness/clients/go/internal/testdaemon"
)

func TestMain(m *testing.M) { testdaemon.Main(m, main) }

var entire = testdaemon.Program

func TestSessionsAreFinalizedWhenTheirAgentDies(t *testing.T) {
	d := testdaemon.Start(t)
	ctx := testdaemon.Context(t, 90*time.Second)
	state := t.TempDir()
	s := store(state)
	run := func(args ...string) string {
		t.Helper()
		out, err := entire(d.Socket, append(args, "--state", state)...).Output()
		if err != nil {
			t.Fatalf("entire %v: %v", args, err)
		}
		return string(out)
	}
	turn := func(session string) *exec.Cmd {
		agent := testdaemon.Child(t)
		run("turn-start", "--session", session, "--agent-pid", strconv.Itoa(agent.Process.Pid))
		return agent
	}
	ended := func(session string) *record {
		t.Helper()
		for ctx.Err() == nil {
			if r, err := s.load(session); err == nil && r.Status == "ENDED" {
				return r
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("%s was not finalized", session)
		return nil
	}

	watcher := entire(d.Socket, "watch", "--state", state)
	if err := watcher.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		watcher.Process.Signal(syscall.SIGTERM)
		watcher.Wait()
	}()

	// A turn's agent dies: its session is finalized with how it died.
	testdaemon.Kill(turn("s1"))
	if r := ended("s1"); r.Reason != "owner_exited" || (r.Exit != nil && r.Exit.Signal != 9) {
		t.Fatalf("s1: %+v", r)
	}

	// A second turn has another agent: the first one's death ends nothing.
	first := turn("s2")
	second := turn("s2")
	testdaemon.Kill(first)
	testdaemon.Kill(turn("marker")) // finalized after the first agent's death was handled
	ended("marker")
	if r, _ := s.load("s2"); r.Status != "ACTIVE" || r.Agent.PID != uint32(second.Process.Pid) {
		t.Fatalf("the death of an earlier turn's agent ended s2: %+v", r)
	}
	if out := run("status"); !strings.Contains(out, "s2 ACTIVE (agent alive)") {
		t.Fatalf("status:\n%s", out)
	}

	// The agent dies while the daemon is down: the restarted daemon finds it, and the
	// watcher, which kept its place, finalizes the session.
	d.Stop()
	testdaemon.Kill(second)
	if out := run("status"); !strings.Contains(out, "s2 ACTIVE (agent dead)") {
		t.Fatalf("status without a daemon:\n%s", out)
	}
	d.Start()
	if r := ended("s2"); r.Reason != "owner_exited" || r.Agent.PID != uint32(second.Process.Pid) {
		t.Fatalf("s2: %+v", r)
	}
	if out := run("status"); !strings.Contains(out, "s1 ENDED owner_exited") || !strings.Contains(out, "s2 ENDED owner_exited") {
		t.Fatalf("status:\n%s", out)
	}
}
