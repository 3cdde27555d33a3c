package shardwheel

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// WithDeadline returns a copy of parent that is done when the wheel reaches t, when the returned
// CancelFunc is called, or when parent is done, whichever happens first. It is
// context.WithDeadline with the deadline kept as a timer of this wheel, and code that receives the
// context cannot tell the two apart:
//   - Deadline reports t. If parent's deadline is before t, no timer is armed and the result is
//     context.WithCancel(parent), as in the standard library.
//   - Err reports nil until the context is done, then context.DeadlineExceeded (the wheel fired
//     at or after t), context.Canceled (the CancelFunc was called), or parent's Err.
//   - context.Cause reports the same as Err, except when parent ended the context: then it
//     reports parent's cause (such as the error passed to a context.CancelCauseFunc).
//   - Value asks parent. Contexts derived from the result with the standard library see the same
//     Err and Cause, and are done before the CancelFunc returns.
//   - A t already reached (on the wheel's clock) gives a context that is done at once, with
//     context.DeadlineExceeded; so does an already-done parent, with its Err.
//
// Parent cancellation reaches the context through context.AfterFunc(parent, ...), never a
// goroutine per context, and is also checked by Done and Err, so that once parent's cancel has
// returned, Err and Done of this context already report it.
//
// The CancelFunc stops the wheel's timer at once (Len drops), unregisters from parent, and may be
// called any number of times from any goroutine. It does not block.
//
// On a stopped wheel (ErrClosed) or past WithMaxPending (ErrTooManyTimers), WithDeadline returns
// context.WithDeadline(parent, t) instead, so that the caller's RPC keeps its deadline. It panics
// if parent is nil, as the standard library does.
func (w *Wheel) WithDeadline(parent context.Context, t time.Time) (context.Context, context.CancelFunc) {
	if parent == nil {
		panic("shardwheel: WithDeadline: cannot create context from nil parent")
	}
	return w.withDeadline(parent, t, t.Sub(w.opts.clock.Now()))
}

// WithTimeout returns w.WithDeadline(parent, now.Add(d)), with now read from the wheel's clock.
// Calling its CancelFunc as soon as the work is done releases the timer:
//
//	ctx, cancel := w.WithTimeout(ctx, 100*time.Millisecond)
//	defer cancel()
func (w *Wheel) WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if parent == nil {
		panic("shardwheel: WithTimeout: cannot create context from nil parent")
	}
	return w.withDeadline(parent, w.opts.clock.Now().Add(d), d)
}

// withDeadline builds the context for deadline t, which is d from now on the wheel's clock.
// The steps, in an order that lets each one race with the context's end:
//  1. Parent already done, or t already reached: end at once; nothing to arm or release.
//  2. Arm the timer. If the wheel refuses, nothing is registered yet: fall back to the std lib.
//  3. Register with parent (which may end the context from another goroutine from now on).
//  4. Publish both with the armed bit. Whoever ends the context releases the timer and the
//     registration if it saw armed; if it ended first, step 4 sees that and releases them.
//     Without a parent that can end it, step 4 is skipped: the timer, the one ender that can
//     run during construction, has nothing to release, and the CancelFunc runs only after the
//     constructor has returned, so it may read timer without the bit.
func (w *Wheel) withDeadline(parent context.Context, t time.Time, d time.Duration) (context.Context, context.CancelFunc) {
	if cur, ok := parent.Deadline(); ok && cur.Before(t) {
		return context.WithCancel(parent)
	}
	c := &deadlineCtx{parent: parent, deadline: t}
	if pdone := parent.Done(); pdone != nil {
		select {
		case <-pdone:
			c.endFromParent()
			return c, c.cancel
		default:
		}
		c.state.Store(ctxParentEnds) // before the context is shared: a plain store is enough
	}
	if d <= 0 {
		c.end(endDeadline)
		return c, c.cancel
	}
	timer, err := w.AfterFuncArg(d, expireDeadline, c)
	if err != nil {
		return context.WithDeadline(parent, t)
	}
	c.timer = timer
	if c.state.Load()&ctxParentEnds != 0 {
		if p, ok := parent.(*deadlineCtx); ok {
			// A wheel context under a wheel context: a node in the parent's list, no closures.
			n := &afterFunc{child: c}
			if p.addAfterFunc(n) {
				c.pnode = n
			} else {
				c.endFromParent()
			}
		} else {
			c.stopParent = context.AfterFunc(parent, c.endFromParent)
		}
		if old := c.state.Or(ctxArmed); old&endMask != 0 {
			c.release(old & endMask)
		}
	}
	return c, c.cancel
}

// The state word of a deadlineCtx:
//
//	bits 0..1  end      0 live; endCanceled, endDeadline or endParent, set once by the CAS
//	                    that ends the context (its CancelFunc, the timer, or the parent)
//	bit  2     armed    set once by the constructor after it wrote timer, stopParent and pnode
//	bit  3     afters   set under mu by AfterFunc when the list of afterFuncs may be non-empty
//	bit  4     parent   immutable: parent.Done() is not nil, so parent may end the context
const (
	endMask       uint32 = 3
	endCanceled   uint32 = 1
	endDeadline   uint32 = 2
	endParent     uint32 = 3
	ctxArmed      uint32 = 1 << 2
	ctxAfters     uint32 = 1 << 3
	ctxParentEnds uint32 = 1 << 4
)

// deadlineCtx is the context of WithDeadline and WithTimeout: 128 bytes, one size class, plus
// the CancelFunc's 16 (std's timerCtx, time.Timer and closures take 272).
//
// Ownership, field by field:
//   - parent, deadline: immutable.
//   - state: atomic, see the table above.
//   - done: atomic; nil until Done is first called or the context ends. Done (holding mu) makes
//     doneCh and CASes done from nil to &doneCh; the goroutine that ends the context swaps in
//     &closedChan and closes doneCh if it found it. doneCh is written once, before that CAS.
//   - timer, stopParent, pnode: written by the constructor before it sets armed; read only by
//     the goroutine that ended the context after seeing armed, or by the constructor if the end
//     came first (exactly one of the two, decided by the armed bit against the end CAS).
//   - pend: atomic; set (first CAS wins) by the parent path before its end CAS, read after seeing
//     endParent.
//   - afters, aftersDone: guarded by mu.
type deadlineCtx struct {
	parent     context.Context
	deadline   time.Time
	state      atomic.Uint32
	aftersDone bool
	done       atomic.Pointer[chan struct{}]
	doneCh     chan struct{}
	timer      Timer
	stopParent func() bool
	pnode      *afterFunc
	pend       atomic.Pointer[parentEnd]
	mu         sync.Mutex
	afters     *afterFunc
}

// parentEnd is how the parent ended a context: its Err, and for context.Cause the parent's
// *context.cancelCtx holder when the cause differs from the error (nil otherwise).
type parentEnd struct {
	err     error
	causeCC any
}

// The common parent ends, shared so that the parent path allocates nothing.
var (
	parentCanceled = &parentEnd{err: context.Canceled}
	parentExpired  = &parentEnd{err: context.DeadlineExceeded}
)

// closedChan is the Done channel of every context that ended before anyone asked for Done.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// cancelCtxKey is the key with which context.Cause asks a context for its innermost
// *context.cancelCtx (the standard library's unexported &cancelCtxKey); Cause trusts the cause
// it finds there. A deadlineCtx must not let that question through to parent: if it ended on its
// own, the parent's cancelCtx (not canceled, or canceled later with a cause) would report a
// cause the context never had. The key is learned once by calling context.Cause on a probe that
// records what it is asked: no linkname, no unsafe. Should a later Go stop asking, the key stays
// nil, Value never matches it, and the Cause tests fail loudly.
var cancelCtxKey = func() any {
	p := &keyProbe{}
	_ = context.Cause(p)
	return p.key
}()

// keyProbe is a context that is always done and records the last key it is asked for.
type keyProbe struct{ key any }

func (*keyProbe) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*keyProbe) Done() <-chan struct{}       { return closedChan }
func (*keyProbe) Err() error                  { return context.Canceled }
func (p *keyProbe) Value(key any) any         { p.key = key; return nil }

// expireDeadline is the timer callback of every deadlineCtx (one func value, no closures).
func expireDeadline(arg any) { arg.(*deadlineCtx).end(endDeadline) }

// cancel is the CancelFunc.
func (c *deadlineCtx) cancel() { c.end(endCanceled) }

// end ends the context with code unless it has ended already. The winner of the CAS, in order:
// 1. closes Done if one was made (after the end code is visible, so that a reader woken by Done
// sees Err non-nil); a context that ended with none makes a closed one on demand;
// 2. runs the afterFuncs, so that std children are done before a CancelFunc returns;
// 3. releases the timer and the parent registration, if the constructor has published them.
func (c *deadlineCtx) end(code uint32) {
	var s uint32
	for {
		s = c.state.Load()
		if s&endMask != 0 {
			return
		}
		if c.state.CompareAndSwap(s, s|code) {
			break
		}
	}
	if c.done.Load() != nil {
		c.closeDone()
	}
	if s&ctxAfters != 0 {
		c.runAfterFuncs()
	}
	if s&ctxArmed != 0 || code == endCanceled {
		c.release(code)
	}
}

// closeDone swaps in the closed channel and closes the channel it replaced, if any. The ender
// calls it if it finds done set, and lazyDone if it finds the context ended after publishing a
// channel; one of the two always does (each writes before it reads what the other writes), and
// the Swap gives the channel to exactly one of them.
func (c *deadlineCtx) closeDone() {
	if d := c.done.Swap(&closedChan); d != nil && d != &closedChan {
		close(*d)
	}
}

// release stops the timer (unless it is what fired) and unregisters from the parent. It is called
// once: by the ender if it saw the armed bit, or by the constructor if the end came first; or by
// the CancelFunc, which runs only after the constructor has returned and so needs no bit.
func (c *deadlineCtx) release(code uint32) {
	if code != endDeadline {
		c.timer.Stop()
	}
	if c.pnode != nil {
		c.parent.(*deadlineCtx).removeAfterFunc(c.pnode)
	} else if c.stopParent != nil {
		c.stopParent()
	}
}

// endFromParent ends the context with the parent's error and cause, read now, once the parent is
// done. It allocates only for an error or cause other than Canceled and DeadlineExceeded.
func (c *deadlineCtx) endFromParent() {
	if c.state.Load()&endMask != 0 {
		return
	}
	err := c.parent.Err()
	if err == nil {
		return // not done after all; nothing to do
	}
	cause := context.Cause(c.parent)
	var pe *parentEnd
	switch {
	case err == context.Canceled && cause == context.Canceled:
		pe = parentCanceled
	case err == context.DeadlineExceeded && cause == context.DeadlineExceeded:
		pe = parentExpired
	default:
		// A canceled std context that carries the cause, so that Value can hand its cancelCtx to
		// context.Cause.
		cc, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		pe = &parentEnd{err: err, causeCC: cc.Value(cancelCtxKey)}
	}
	c.pend.CompareAndSwap(nil, pe)
	c.end(endParent)
}

// Deadline returns the deadline the context was made with; ok is always true.
func (c *deadlineCtx) Deadline() (deadline time.Time, ok bool) { return c.deadline, true }

// Done returns a channel that is closed when the context ends. It is made on the first call; a
// context that ended before that returns an already closed channel. Once the context has ended
// (also through a parent whose cancel has returned), the channel it returns is closed.
func (c *deadlineCtx) Done() <-chan struct{} {
	d := c.done.Load()
	if d == &closedChan {
		return closedChan
	}
	if !c.pollParent() {
		if d != nil {
			return *d
		}
		return c.lazyDone()
	}
	// Ended: the channel is closed, or is being closed by whoever took it in closeDone, which
	// runs no other code first; wait for that, so that Err != nil and an open Done are never
	// seen together.
	ch := c.lazyDone()
	if ch != closedChan {
		<-ch
	}
	return ch
}

// lazyDone returns the Done channel, making it if there is none: the shared closed channel if
// the context has ended, or doneCh (made under mu, so that it has one writer) if not.
func (c *deadlineCtx) lazyDone() chan struct{} {
	if d := c.done.Load(); d != nil {
		return *d
	}
	if c.state.Load()&endMask != 0 {
		c.done.CompareAndSwap(nil, &closedChan)
		return *c.done.Load()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.doneCh == nil {
		c.doneCh = make(chan struct{})
	}
	if !c.done.CompareAndSwap(nil, &c.doneCh) {
		return *c.done.Load()
	}
	if c.state.Load()&endMask != 0 {
		c.closeDone() // the ender may have looked at done before our CAS
	}
	return c.doneCh
}

// Err returns nil while the context is live, then the reason it ended. A non-nil Err implies
// that Done is closed.
func (c *deadlineCtx) Err() error {
	s := c.state.Load()
	if s&endMask == 0 {
		if !c.pollParent() {
			return nil
		}
		s = c.state.Load()
	}
	if c.done.Load() != &closedChan {
		c.Done() // waits while the ender is between its CAS and closing Done
	}
	switch s & endMask {
	case endCanceled:
		return context.Canceled
	case endDeadline:
		return context.DeadlineExceeded
	}
	return c.pend.Load().err
}

// pollParent ends the context if the parent is done (its AfterFunc may not have run yet) and
// reports whether the context has ended.
func (c *deadlineCtx) pollParent() bool {
	s := c.state.Load()
	if s&endMask != 0 {
		return true
	}
	if s&ctxParentEnds == 0 {
		return false
	}
	select {
	case <-c.parent.Done():
		c.endFromParent()
		return c.state.Load()&endMask != 0
	default:
		return false
	}
}

// Value returns parent's value for key. The one exception is context.Cause's key (see
// cancelCtxKey): the context answers it with a cancelCtx holding the parent's cause if the parent
// ended it with a cause of its own, and with nil otherwise, so that Cause falls back to Err.
func (c *deadlineCtx) Value(key any) any {
	if cancelCtxKey != nil && key == cancelCtxKey {
		if c.state.Load()&endMask == endParent {
			return c.pend.Load().causeCC
		}
		return nil
	}
	return c.parent.Value(key)
}

// String describes the context as the standard library's contexts do.
func (c *deadlineCtx) String() string {
	name := fmt.Sprintf("%T", c.parent)
	if s, ok := c.parent.(fmt.Stringer); ok {
		name = s.String()
	}
	return name + ".WithDeadline(" + c.deadline.String() + ")"
}
