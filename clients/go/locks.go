package liveness

import (
	"context"
	"errors"
)

// AcquireLock takes lock name for session and returns it with its fencing token. Held by
// another session, it fails with ErrLockHeld at once, or with Wait(timeout) waits in line
// until the lock is granted (when the holder releases it or its session ends), or the
// timeout passes (ErrLockHeld), or ctx ends.
//
// A waiting acquire has a connection of its own, so that other calls go on meanwhile;
// leaving early closes it, which takes the request out of the line.
func (c *Client) AcquireLock(ctx context.Context, name, session string, opts ...Option) (Lock, error) {
	req := (&request{Op: "lock_acquire", Name: name, Session: session}).with(opts)
	on := c
	if req.Wait {
		waiter, err := Dial(ctx, c.socket)
		if err != nil {
			return Lock{}, err
		}
		defer waiter.Close()
		on = waiter
	}
	return lockCall(on.call(ctx, req))
}

// ReleaseLock releases lock name, which session holds, and returns it as it was held;
// ErrNotHeld when session does not hold it.
func (c *Client) ReleaseLock(ctx context.Context, name, session string, opts ...Option) (Lock, error) {
	return lockCall(c.call(ctx, (&request{Op: "lock_release", Name: name, Session: session}).with(opts)))
}

// Locks lists the held locks the caller may see, by uid then name, following the daemon's
// pages.
func (c *Client) Locks(ctx context.Context, opts ...Option) ([]Lock, error) {
	var all []Lock
	err := c.pages(ctx, (&request{Op: "lock_list"}).with(opts), func(r *reply) {
		if r.Locks != nil {
			all = append(all, *r.Locks...)
		}
	})
	return all, err
}

func lockCall(r *reply, err error) (Lock, error) {
	if err != nil {
		return Lock{}, err
	}
	if r.Lock == nil {
		return Lock{}, errors.New("liveness: the reply has no lock")
	}
	return *r.Lock, nil
}
