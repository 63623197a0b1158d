// Package testdaemon runs the real livenessd and liveness CLI for this module's tests.
package testdaemon

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// Binary is the path of the real livenessd or liveness, built by `cargo build -p
// liveness-daemon -p liveness-cli` into the repository's target/debug, or found in
// $LIVENESS_BIN_DIR.
func Binary(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("LIVENESS_BIN_DIR")
	if dir == "" {
		_, here, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(here), "../../../../target/debug")
	}
	path, err := filepath.Abs(filepath.Join(dir, name))
	if err == nil {
		_, err = os.Stat(path)
	}
	if err != nil {
		t.Fatalf("%s is needed: run `cargo build -p liveness-daemon -p liveness-cli` (or set LIVENESS_BIN_DIR): %v", name, err)
	}
	return path
}

// Daemon is a livenessd on a temporary socket and state directory.
type Daemon struct {
	t   testing.TB
	dir string
	// Socket and State are the daemon's socket and state directory.
	Socket string
	State  string
	args   []string
	pid    int
	exited chan error
}

// Start runs a livenessd for the test, with args besides its socket and state directory,
// killed at its end.
func Start(t testing.TB, args ...string) *Daemon {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{t: t, dir: dir, Socket: filepath.Join(dir, "run/liveness.sock"), State: filepath.Join(dir, "state"), args: args}
	d.Start()
	t.Cleanup(func() {
		if d.exited != nil {
			d.Kill9()
		}
	})
	return d
}

func (d *Daemon) Log() string {
	text, _ := os.ReadFile(filepath.Join(d.dir, "livenessd.log"))
	return string(text)
}

// Start runs livenessd (again, after Stop or Kill9) and returns once it listens.
func (d *Daemon) Start() {
	d.t.Helper()
	log, err := os.OpenFile(filepath.Join(d.dir, "livenessd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		d.t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(Binary(d.t, "livenessd"), append([]string{"--socket", d.Socket, "--state-dir", d.State}, d.args...)...)
	cmd.Env = append(os.Environ(), "LIVENESS_LOG=info")
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.pid, d.exited = cmd.Process.Pid, make(chan error, 1)
	go func(exited chan error) { exited <- cmd.Wait() }(d.exited)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-d.exited:
			d.t.Fatalf("livenessd exited during start (%v):\n%s", err, d.Log())
		default:
		}
		if conn, err := net.Dial("unix", d.Socket); err == nil {
			conn.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.t.Fatalf("livenessd did not listen within 20 s:\n%s", d.Log())
}

func (d *Daemon) signal(sig syscall.Signal) {
	d.t.Helper()
	syscall.Kill(d.pid, sig)
	select {
	case <-d.exited:
		d.exited = nil
	case <-time.After(30 * time.Second):
		d.t.Fatalf("livenessd did not stop within 30 s of %v:\n%s", sig, d.Log())
	}
}

// Stop is a clean stop: SIGTERM, goodbye to every connection.
func (d *Daemon) Stop() { d.signal(syscall.SIGTERM) }

// Kill9 stops the daemon without its shutdown path.
func (d *Daemon) Kill9() { d.signal(syscall.SIGKILL) }

// CLI runs `liveness --socket S --json ARGS...` and returns its stdout, whatever its exit code.
func (d *Daemon) CLI(args ...string) []byte {
	d.t.Helper()
	cmd := exec.Command(Binary(d.t, "liveness"), append([]string{"--socket", d.Socket, "--json"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		d.t.Fatalf("liveness %v: %v", args, err)
	}
	if len(bytes.TrimSpace(out)) == 0 {
		d.t.Fatalf("liveness %v printed nothing: %s", args, stderr.String())
	}
	return out
}

// Context ends with the test, or after limit.
func Context(t testing.TB, limit time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return ctx
}

// Child runs a process (sleep 300 by default), killed at the end of the test.
func Child(t testing.TB, argv ...string) *exec.Cmd {
	t.Helper()
	if len(argv) == 0 {
		argv = []string{"sleep", "300"}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Kill(cmd) })
	return cmd
}

// Kill SIGKILLs a child and reaps it.
func Kill(cmd *exec.Cmd) {
	cmd.Process.Kill()
	cmd.Wait()
}

// runAsProgram names the environment variable that makes a test binary run its
// package's main() instead of its tests: how an example's tests run it as its own process.
const runAsProgram = "LIVENESS_TEST_RUN_MAIN"

// Main is an example's TestMain: main() when the binary runs as the program, else the tests.
func Main(m *testing.M, main func()) {
	if os.Getenv(runAsProgram) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// Program is the example's main() as a process of its own, talking to the daemon at socket.
func Program(socket string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runAsProgram+"=1", "LIVENESS_SOCKET="+socket)
	cmd.Stderr = os.Stderr
	return cmd
}
