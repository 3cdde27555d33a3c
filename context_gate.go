package shardwheel

import (
	"context"
	"time"
)

// ctxGate is a deadlineCtx seen as the parent of its q (see lazyQ): a second method set on the
// same object, so that the gate costs no allocation. Nobody but std's propagateCancel for q and
// q's own Value and Cause lookups ever sees it.
//
// Std registers q with the gate through AfterFunc, because the gate answers &cancelCtxKey with no
// *cancelCtx whose Done is the gate's Done (std's parentCancelCtx fails) and it has an AfterFunc
// method. The func std passes is func() { q.cancel(false, gate.Err(), context.Cause(gate)) }, and
// the deadlineCtx's ender calls it on its own goroutine; so gate.Err and Cause(gate) are what q,
// and every std context under q, end with.
type ctxGate deadlineCtx

// Deadline reports the context's deadline (std never asks: propagateCancel does not look at it).
func (g *ctxGate) Deadline() (time.Time, bool) { return g.deadline, true }

// Done is closed once the context has ended, and a channel that never closes before: std only
// selects on it once, in propagateCancel, to find a parent that has already ended.
func (g *ctxGate) Done() <-chan struct{} {
	if g.state.Load()&endMask != 0 {
		return closedChan
	}
	return neverChan
}

// Err is the context's err, read from the state word without waiting (std calls it from inside
// the ender's call of the registered func, before q is canceled).
func (g *ctxGate) Err() error { return errOf(g.state.Load() & endMask) }

// Value answers &cancelCtxKey with what context.Cause needs to find the context's cause: a
// canceled std context holding the WithDeadlineCause cause after the deadline, the wheel parent's
// q when the parent ended the context, and nil otherwise (so that Cause falls back to Err:
// Canceled, or DeadlineExceeded without a cause). Other keys go to parent.
//
// The wheel parent is asked directly, never through parent.Value: std asks this while the
// context's ender cancels q, and parent may be the user's wrapper, whose Value may take the
// user's locks. Std runs no user code while it cancels; an ender that did could wait for a lock
// that a caller of a CancelFunc holds, and that CancelFunc, losing end's CAS, waits for the
// ender (end). The wheel parent is the one the constructor found through parent, and its q is
// canceled with its cause before it ends its kids.
func (g *ctxGate) Value(key any) any {
	if cancelCtxKey != nil && key == cancelCtxKey {
		switch g.state.Load() & endMask {
		case endDeadline:
			x := g.x.Load()
			if x == nil || x.cause == nil {
				return nil
			}
			h, set := context.WithCancelCause(context.Background())
			set(x.cause)
			return h // a *context.cancelCtx with cause x.cause
		case endParentCanceled, endParentDeadline:
			return g.pw.lazyQ() // set: only a wheel parent ends a context with these codes
		}
		return nil
	}
	return g.parent.Value(key)
}

// AfterFunc takes std's registration of q. It is called once, by lazyQ's context.WithCancel,
// with q's mutex held, so it must not call f. If the context is live, f is left for the ender
// (linked bit and gateF under mu, as addKid); if it ended after std checked Done, f is left in
// lateF for lazyQ to call once WithCancel has returned (lazyQ holds qmu, which guards lateF).
// lazyQ made the ctxExt before calling WithCancel.
// The stop func is never called: std calls it only when q is canceled with removeFromParent,
// that is through q's own CancelFunc, which lazyQ drops.
func (g *ctxGate) AfterFunc(f func()) (stop func() bool) {
	c := (*deadlineCtx)(g)
	x := c.x.Load()
	c.mu.Lock()
	late := c.kidsDone
	if !late {
		x.gateF = f
		if old := c.state.Or(ctxLinked); old&endMask != 0 {
			x.gateF, late = nil, true
		}
	}
	c.mu.Unlock()
	if late {
		x.lateF = f
	}
	return stopNothing
}

func stopNothing() bool { return false }
