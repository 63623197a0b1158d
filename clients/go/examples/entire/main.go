// Command entire is what a session-recording CLI such as `entire` needs from liveness, in
// one small program: a hook captures the agent process at the start of each turn and
// records the session ACTIVE; a watcher finalizes the record when that agent dies (not
// when an earlier turn's agent does), resuming after a daemon restart without losing a
// death; and the status is checked without the daemon when it is down.
//
//	entire turn-start --state DIR --session ID [--agent-pid PID]   (PID: the hook's parent)
//	entire watch --state DIR
//	entire status --state DIR
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sort"
	"strings"

	liveness "example.invalid/liveness/clients/go"
)

// record is what the tool keeps of a session, in its own files.
type record struct {
	ID     string               `json:"id"`
	Agent  liveness.Identity    `json:"agent"`
	Status string               `json:"status"` // ACTIVE or ENDED
	Reason string               `json:"reason,omitempty"`
	Exit   *liveness.ExitStatus `json:"exit,omitempty"`
}

type store string

func (s store) path(id string) string { return filepath.Join(string(s), "sessions", id+".json") }

func (s store) load(id string) (*record, error) {
	data, err := os.ReadFile(s.path(id))
	if err != nil {
		return nil, err
	}
	var r record
	return &r, json.Unmarshal(data, &r)
}

func (s store) save(r *record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.path(r.ID)), 0o755); err != nil {
		return err
	}
	tmp := s.path(r.ID) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, s.path(r.ID))
}

func (s store) all() ([]*record, error) {
	names, _ := filepath.Glob(filepath.Join(string(s), "sessions", "*.json"))
	sort.Strings(names)
	var records []*record
	for _, name := range names {
		r, err := s.load(strings.TrimSuffix(filepath.Base(name), ".json"))
		if err != nil {
			return nil, err
		}
		records = append(records, r)
	}
	return records, nil
}

// turnStart captures the agent now, while it surely runs, and hands it to the daemon: a
// new turn of a session gives it a new owner, whose death alone ends it.
func turnStart(ctx context.Context, s store, session string, agentPid int) error {
	agent, err := liveness.Capture(agentPid)
	if err != nil {
		return err
	}
	if err := s.save(&record{ID: session, Agent: agent, Status: "ACTIVE"}); err != nil {
		return err
	}
	client, err := liveness.Dial(ctx, "")
	if err != nil {
		log.Printf("the session is recorded, but %v: `entire status` checks the agent itself", err)
		return nil
	}
	defer client.Close()
	_, err = client.Register(ctx, liveness.Registration{
		Session: session, Owner: liveness.OwnerIdentity(agent), Labels: map[string]string{"tool": "entire"},
	})
	return err
}

// finalize marks a record ENDED once, if the agent that died is the one it records.
func finalize(s store, session string, agent liveness.Identity, reason string, exit *liveness.ExitStatus) error {
	r, err := s.load(session)
	if errors.Is(err, os.ErrNotExist) {
		return nil // not one of ours
	}
	if err != nil || r.Status == "ENDED" || !r.Agent.SameProcess(agent) {
		return err
	}
	r.Status, r.Reason, r.Exit = "ENDED", reason, exit
	log.Printf("%s ended: %s", session, reason)
	return s.save(r)
}

// resync finalizes what died while nobody listened (a first run, a replaced database,
// pruned events), asking the daemon, or /proc where the daemon does not know the session.
func resync(ctx context.Context, s store) error {
	records, err := s.all()
	if err != nil {
		return err
	}
	client, err := liveness.Dial(ctx, "")
	if err != nil {
		return err
	}
	defer client.Close()
	for _, r := range records {
		if r.Status != "ACTIVE" {
			continue
		}
		session, err := client.Get(ctx, r.ID)
		switch {
		case errors.Is(err, liveness.ErrNotFound):
			// Not registered (yet, or the daemon was down at its turn start): /proc decides.
			err = nil
			if verdict := liveness.Check(r.Agent); verdict.State == liveness.Dead {
				err = finalize(s, r.ID, r.Agent, verdict.Reason, nil)
			}
		case err == nil && session.Phase == liveness.Ended:
			err = finalize(s, r.ID, session.Owner, string(session.Reason), session.Exit)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// watch follows the daemon's events for good; its cursor file lets it resume.
func watch(ctx context.Context, s store) error {
	cursorPath := filepath.Join(string(s), "cursor")
	cursor, err := liveness.LoadCursor(cursorPath)
	if err != nil {
		return err
	}
	events, err := liveness.Subscribe(ctx, "", cursor, liveness.Filter{})
	if err != nil {
		return err
	}
	defer events.Close()
	if cursor == nil {
		if err := resync(ctx, s); err != nil {
			return err
		}
	}
	for {
		m, err := events.Next(ctx)
		if err != nil {
			return err
		}
		switch {
		case m.Event != nil && m.Event.Kind == liveness.KindEnded:
			err = finalize(s, m.Event.Session, m.Event.Owner, string(m.Event.Reason), m.Event.Exit)
		case m.Reset != nil, m.Gap != nil:
			err = resync(ctx, s)
		}
		if err == nil {
			err = liveness.SaveCursor(cursorPath, *events.Cursor())
		}
		if err != nil {
			return err
		}
	}
}

// status prints each session; an ACTIVE one's agent is checked in /proc, no daemon needed.
func status(s store) error {
	records, err := s.all()
	if err != nil {
		return err
	}
	for _, r := range records {
		line := fmt.Sprintf("%s %s", r.ID, r.Status)
		if r.Status == "ACTIVE" {
			line += " (agent " + string(liveness.Check(r.Agent).State) + ")"
		} else {
			line += " " + r.Reason
		}
		fmt.Println(line)
	}
	return nil
}

func main() {
	log.SetFlags(0)
	if len(os.Args) < 2 {
		log.Fatal("usage: entire turn-start|watch|status --state DIR [--session ID] [--agent-pid PID]")
	}
	flags := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	state := flags.String("state", "", "the directory of the session records")
	session := flags.String("session", "", "turn-start: the session id")
	agentPid := flags.Int("agent-pid", os.Getppid(), "turn-start: the agent's pid")
	flags.Parse(os.Args[2:])
	s, ctx := store(*state), context.Background()
	var err error
	switch os.Args[1] {
	case "turn-start":
		err = turnStart(ctx, s, *session, *agentPid)
	case "watch":
		err = watch(ctx, s)
	case "status":
		err = status(s)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}
