package liveness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Cursor is where a consumer stands in the event stream: the last event it handled, and
// the store (database) that seq belongs to ("" when unknown, as for a bare seq).
type Cursor struct {
	Seq     uint64
	StoreID string
}

// String is the saved form, "SEQ STORE_ID", that ParseCursor reads (and `liveness watch
// --cursor` writes).
func (c Cursor) String() string {
	if c.StoreID == "" {
		return strconv.FormatUint(c.Seq, 10)
	}
	return fmt.Sprintf("%d %s", c.Seq, c.StoreID)
}

// ParseCursor reads "SEQ STORE_ID", or a bare "SEQ".
func ParseCursor(text string) (Cursor, error) {
	fields := strings.Fields(text)
	if len(fields) == 0 || len(fields) > 2 {
		return Cursor{}, fmt.Errorf("liveness: %q is no cursor (want \"SEQ STORE_ID\")", text)
	}
	seq, err := strconv.ParseUint(fields[0], 10, 64)
	if err != nil {
		return Cursor{}, fmt.Errorf("liveness: %q is no cursor: %w", text, err)
	}
	c := Cursor{Seq: seq}
	if len(fields) == 2 {
		c.StoreID = fields[1]
	}
	return c, nil
}

// LoadCursor reads a cursor saved by SaveCursor; nil when the file does not exist (a
// first run).
func LoadCursor(path string) (*Cursor, error) {
	text, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	c, err := ParseCursor(string(text))
	return &c, err
}

// SaveCursor writes c to path atomically (a temporary file renamed over it).
func SaveCursor(path string, c Cursor) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(c.String()+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Filter says which events a subscription receives.
type Filter struct {
	// Session: only this session's events ("" for every session the caller may see).
	Session string
	// UID (root only): only this user's events.
	UID *uint32
}

// Retry bounds how a Subscription reconnects to a daemon that went away: the first wait
// is First, each next one twice as long up to Max, and after GiveUpAfter without a
// connection Next fails with ErrGaveUp.
type Retry struct {
	First, Max, GiveUpAfter time.Duration
}

// DefaultRetry (0.1 s doubling to 2 s, for up to 30 s) covers a daemon restarted by its
// service manager.
var DefaultRetry = Retry{First: 100 * time.Millisecond, Max: 2 * time.Second, GiveUpAfter: 30 * time.Second}

// Subscription follows the event stream across connections: when one ends (a goodbye, a
// lagged, a killed daemon) it subscribes again after the last delivered event, retrying
// as its Retry says. The daemon replays what was committed meanwhile, and events at or
// before the cursor are dropped, so each event is delivered once.
//
// It delivers the stream's own messages: events, and for the consumer to act on, Reset
// (the cursor was of another database: resynchronize, then every event of the new one
// follows), Gap (events were pruned before they were read: resynchronize), Lagged and
// Goodbye (the subscription resumes by itself). This is the consumer's loop of
// docs/protocol.md §6, built in. A Subscription is not safe for concurrent use.
type Subscription struct {
	client *Client
	socket string
	filter Filter
	cursor *Cursor
	// Retry is how reconnections are retried; DefaultRetry unless changed.
	Retry Retry
}

// Subscribe starts a subscription on the daemon at socket ("" for DefaultSocket()) after
// cursor, or from now on when cursor is nil.
func Subscribe(ctx context.Context, socket string, cursor *Cursor, filter Filter) (*Subscription, error) {
	if socket == "" {
		socket = DefaultSocket()
	}
	s := &Subscription{socket: socket, filter: filter, Retry: DefaultRetry}
	if cursor != nil {
		copied := *cursor
		s.cursor = &copied
	}
	if err := s.reconnect(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Cursor is the last delivered event and its store: save it (SaveCursor) after handling
// each event to resume a later subscription where this one stopped. Nil only before the
// first acknowledgement of a subscription started from now.
func (s *Subscription) Cursor() *Cursor {
	if s.cursor == nil {
		return nil
	}
	c := *s.cursor
	return &c
}

// Close ends the subscription.
func (s *Subscription) Close() error {
	if s.client == nil {
		return nil
	}
	err := s.client.Close()
	s.client = nil
	return err
}

// subscribeOnce connects and subscribes after the cursor.
func (s *Subscription) subscribeOnce(ctx context.Context) error {
	client, err := Dial(ctx, s.socket)
	if err != nil {
		return err
	}
	req := &request{Op: "subscribe", Session: s.filter.Session, UID: s.filter.UID}
	if s.cursor != nil {
		seq := s.cursor.Seq
		req.Since, req.StoreID = &seq, s.cursor.StoreID
	}
	r, err := client.call(ctx, req)
	if err == nil && r.Subscribed == nil {
		err = errors.New("liveness: the reply to subscribe has no acknowledgement")
	}
	if err != nil {
		client.Close()
		return err
	}
	if s.cursor == nil {
		s.cursor = &Cursor{Seq: r.Subscribed.Since}
	}
	// The store id names the daemon's current run: a cursor it kept is valid in it, and a
	// state restored from a copy made before this run voids it.
	s.cursor.StoreID = r.Subscribed.StoreID
	s.client = client
	return nil
}

// reconnect subscribes again, waiting between attempts while the daemon may be restarting.
func (s *Subscription) reconnect(ctx context.Context) error {
	return retry(ctx, s.Retry, func() error { return s.subscribeOnce(ctx) })
}

// retry calls attempt until it succeeds, fails for good, ctx ends or time is up.
func retry(ctx context.Context, r Retry, attempt func() error) error {
	start := time.Now()
	delay := r.First
	for {
		err := attempt()
		if err == nil || !transient(err) {
			return err
		}
		if time.Since(start)+delay > r.GiveUpAfter {
			return fmt.Errorf("%w within %v: %v", ErrGaveUp, r.GiveUpAfter, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		if delay *= 2; delay > r.Max {
			delay = r.Max
		}
	}
}

// Next blocks until the next message to deliver, reconnecting as needed.
func (s *Subscription) Next(ctx context.Context) (Message, error) {
	for {
		if s.client == nil {
			if err := s.reconnect(ctx); err != nil {
				return Message{}, err
			}
		}
		m, err := s.read(ctx)
		if err != nil {
			s.Close()
			if ctx.Err() != nil {
				return Message{}, ctx.Err()
			}
			if transient(err) {
				continue // a daemon killed without a goodbye: resume after the cursor
			}
			return Message{}, err
		}
		switch {
		case m.Event != nil:
			if m.Event.Seq <= s.cursor.Seq {
				continue // delivered before this connection
			}
			s.cursor.Seq = m.Event.Seq
		case m.Reset != nil:
			s.cursor = &Cursor{Seq: 0, StoreID: m.Reset.StoreID}
		case m.Gap != nil:
			if m.Gap.PrunedThrough > s.cursor.Seq {
				s.cursor.Seq = m.Gap.PrunedThrough
			}
		case m.Lagged != nil, m.Goodbye != nil:
			s.Close() // the daemon closes the stream; the next call resumes
		default:
			continue // a line of a newer protocol
		}
		return m, nil
	}
}

// NextEvent is Next for consumers that act on events only: it skips the other messages
// (after following them).
func (s *Subscription) NextEvent(ctx context.Context) (*Event, error) {
	for {
		m, err := s.Next(ctx)
		if err != nil || m.Event != nil {
			return m.Event, err
		}
	}
}

func (s *Subscription) read(ctx context.Context) (Message, error) {
	c := s.client
	stop := abortOn(ctx, c.conn)
	line, err := c.readLine()
	stop()
	if err != nil {
		return Message{}, err
	}
	var m Message
	if err := json.Unmarshal(line, &m); err != nil {
		return Message{}, fmt.Errorf("liveness: unreadable stream line %q: %w", line, err)
	}
	return m, nil
}

// WaitForEnd blocks until session has ended and returns it ended, across daemon restarts.
// It subscribes to the session's events first and then looks it up, so an end that
// happens in between is still seen.
func WaitForEnd(ctx context.Context, socket string, session string, opts ...Option) (Session, error) {
	return waitFor(ctx, socket, session, opts, func(s Session) bool { return s.Phase == Ended },
		func(e *Event) bool { return e.Kind == KindEnded })
}

// WaitForFinalized blocks until session has ended and each of its end actions has its
// outcome (at once after the end for a session without end actions), and returns it with
// Actions set, across daemon restarts.
func WaitForFinalized(ctx context.Context, socket string, session string, opts ...Option) (Session, error) {
	return waitFor(ctx, socket, session, opts, Session.Finalized, func(e *Event) bool {
		return e.Kind == KindFinalized || (e.Kind == KindEnded && e.Actions == 0)
	})
}

// waitFor subscribes to session's events, then gets it: until it is done, the first event
// that is last makes it get the session again.
func waitFor(ctx context.Context, socket, session string, opts []Option, done func(Session) bool, last func(*Event) bool) (Session, error) {
	var req request
	for _, opt := range opts {
		opt(&req)
	}
	sub, err := Subscribe(ctx, socket, nil, Filter{Session: session, UID: req.UID})
	if err != nil {
		return Session{}, err
	}
	defer sub.Close()
	get := func(id string, uid *uint32) (Session, error) {
		var found Session
		err := retry(ctx, sub.Retry, func() error {
			c, err := Dial(ctx, sub.socket)
			if err != nil {
				return err
			}
			defer c.Close()
			found, err = c.sessionCall(ctx, &request{Op: "get", Session: id, UID: uid}, nil)
			return err
		})
		return found, err
	}
	current, err := get(session, req.UID)
	if err != nil || done(current) {
		return current, err
	}
	for {
		event, err := sub.NextEvent(ctx)
		if err != nil {
			return Session{}, err
		}
		if last(event) {
			uid := event.CreatorUID
			return get(event.Session, &uid)
		}
	}
}
