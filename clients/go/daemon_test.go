package liveness

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"example.invalid/liveness/clients/go/internal/testdaemon"
)

// daemon is the real livenessd of a test, with a client's way to reach it.
type daemon struct {
	*testdaemon.Daemon
	t      *testing.T
	socket string
}

func startDaemon(t *testing.T, args ...string) *daemon {
	d := testdaemon.Start(t, args...)
	return &daemon{Daemon: d, t: t, socket: d.Socket}
}

func (d *daemon) dial(ctx context.Context) *Client {
	d.t.Helper()
	c, err := Dial(ctx, d.socket)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { c.Close() })
	return c
}

// subscribe follows every event from now on, until the test ends.
func (d *daemon) subscribe(ctx context.Context) *Subscription {
	d.t.Helper()
	sub, err := Subscribe(ctx, d.socket, nil, Filter{})
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { sub.Close() })
	return sub
}

var (
	withTimeout = testdaemon.Context
	child       = testdaemon.Child
	kill        = testdaemon.Kill
)

// until reads the subscription until an event matches, failing on anything else than events.
func until(t *testing.T, ctx context.Context, sub *Subscription, kind EventKind, session string) *Event {
	t.Helper()
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for %s of %s: %v", kind, session, err)
		}
		if m.Event != nil && m.Event.Kind == kind && m.Event.Session == session {
			return m.Event
		}
	}
}

// sameJSON fails unless both documents say the same, but for defaulted keys.
func sameJSON(t *testing.T, what string, expected []byte, got any) {
	t.Helper()
	encoded, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	a, errA := generic(expected)
	b, errB := generic(encoded)
	if errA != nil || errB != nil {
		t.Fatalf("%s: %v %v", what, errA, errB)
	}
	if err := same(a, b, ""); err != nil {
		t.Fatalf("%s: %v\n expected %s\n got      %s", what, err, expected, encoded)
	}
}

func requireEbpf() bool { return os.Getenv("LIVENESS_REQUIRE_EBPF") == "1" }
