package shardwheel

import (
	"context"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Deadline contexts: WithDeadline, WithTimeout and their Cause forms.
//
// The contract (API.md) is "the standard library's, in every observable way". What the standard
// library does that a custom context type cannot copy decides the design:
//
//  1. When a parent is canceled, std runs no user code at all: it closes channels and cancels the
//     std contexts held in its children map (*cancelCtx, *timerCtx, *afterFuncCtx; the last one
//     starts a goroutine). So the only contexts that can be done by the time a std parent's cancel
//     returns are std contexts registered under it.
//  2. A std context derived from ours through a wrapper (WithValue, a struct embedding ours) costs
//     no goroutine only if it finds, by Value(&cancelCtxKey), a *cancelCtx whose Done channel is
//     the wrapper's Done channel; it then sits in that cancelCtx's children map and, when it is
//     canceled, copies that cancelCtx's err and cause.
//  3. A std *cancelCtx gets the err it ends with from its cancel func (Canceled), from its parent
//     (the parent's err), or from its own *time.Timer (*timerCtx only: DeadlineExceeded).
//
// Together: under a parent that std can cancel on its own (a std WithCancel, an http request's
// context), a context whose std descendants end with DeadlineExceeded at the deadline, but end
// synchronously with the parent, needs a *time.Timer of the runtime; a wheel timer cannot give
// both (the one *cancelCtx the descendants copy from has one parent edge: to the std parent, or
// to code of ours, never both). So the wheel supplies the deadline only where every way the
// context can end is code of this package: the parent chain up to a context that is never done
// (Background, TODO, WithoutCancel; through WithValue and other wrappers that keep Done) contains
// only wheel deadline contexts. Everywhere else WithDeadline is context.WithDeadlineCause itself,
// so that it is identical, not nearly so. See withDeadline.
//
// Inside that closed world a deadlineCtx is a custom context (no goroutine, no runtime timer),
// and std contexts derived from it attach to q, a real std cancelCtx made on first demand:
// q = context.WithCancel(gate), where the gate (the same object seen through the ctxGate type) is
// an AfterFunc-er: std registers q's cancellation with it, and the ender of the deadlineCtx calls
// that registration, which runs q.cancel(false, gate.Err(), context.Cause(gate)) synchronously.
// So q, and with it every std descendant, ends with the deadlineCtx's own err and cause, before
// the CancelFunc (or the timer callback, or the wheel parent's ender) returns.

// WithDeadline returns a copy of parent that is done when the wheel reaches t, when the returned
// CancelFunc is called, or when parent is done, whichever happens first: context.WithDeadline
// with the deadline kept as a timer of this wheel where that changes nothing observable (see
// withDeadline), and context.WithDeadline itself elsewhere.
//
// It panics if parent is nil, as the standard library does.
func (w *Wheel) WithDeadline(parent context.Context, t time.Time) (context.Context, context.CancelFunc) {
	return w.WithDeadlineCause(parent, t, nil)
}

// WithDeadlineCause is WithDeadline, and once the deadline has passed context.Cause of the result
// reports cause (context.DeadlineExceeded if cause is nil), as context.WithDeadlineCause does.
// The CancelFunc does not set the cause.
func (w *Wheel) WithDeadlineCause(parent context.Context, t time.Time, cause error) (context.Context, context.CancelFunc) {
	if parent == nil {
		panic("cannot create context from nil parent")
	}
	return w.withDeadline(parent, t, t.Sub(w.opts.clock.Now()), cause)
}

// WithTimeout returns w.WithDeadline(parent, now.Add(d)), with now read from the wheel's clock.
// Calling its CancelFunc as soon as the work is done releases the timer:
//
//	ctx, cancel := w.WithTimeout(ctx, 100*time.Millisecond)
//	defer cancel()
func (w *Wheel) WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return w.WithTimeoutCause(parent, d, nil)
}

// WithTimeoutCause returns w.WithDeadlineCause(parent, now.Add(d), cause), now read from the
// wheel's clock.
func (w *Wheel) WithTimeoutCause(parent context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	if parent == nil {
		panic("cannot create context from nil parent")
	}
	return w.withDeadline(parent, w.opts.clock.Now().Add(d), d, cause)
}

// withDeadline builds the context for deadline t, which is d from now on the wheel's clock.
//
// Which parents get a wheel timer (the closed world, see the top of the file), decided as std
// decides where a child registers: parent.Done() is nil (never canceled), or parent is a
// deadlineCtx, or parent leads by Value(wheelCtxKey) to a deadlineCtx whose Done is parent's
// Done and by Value(&cancelCtxKey) to that deadlineCtx's q (a wrapper that keeps Done and the
// cause; std checks a wrapper's *cancelCtx the same way: causeFrom). A std cancelable context in
// between answers wheelCtxKey too, but with its own Done, so it falls back.
// Any other parent gets context.WithDeadlineCause(parent, t, cause); so do a stopped wheel and
// WithMaxPending (the caller's RPC must not break). With a ManualClock that std context's timer
// runs on the real clock: t is a time on the manual clock's scale. A context made before Stop
// whose timer Stop drops ends the same way from then on (timerDropped): a stopped wheel follows
// no clock, and its contexts, old and new, end as context.WithDeadline(parent, t) does.
//
// The steps of the wheel path, in an order that lets each one race with the context's end:
//  1. The wheel parent has ended, or t is reached: the context is born ended; nothing to release.
//  2. Arm the timer. If the wheel refuses, nothing is registered yet: fall back to the std lib.
//  3. Link into the wheel parent's list (which may end the context from another goroutine).
//  4. Publish timer and link with the armed bit. Whoever ends the context releases them if it saw
//     armed; if it ended first, step 4 sees that and releases them itself.
func (w *Wheel) withDeadline(parent context.Context, t time.Time, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	if cur, ok := parent.Deadline(); ok && cur.Before(t) {
		return context.WithCancel(parent) // std returns exactly this
	}
	pw, ok := parent.(*deadlineCtx) // no Done call: that would make pw's q
	if !ok {
		if pdone := parent.Done(); pdone != nil {
			pw, _ = parent.Value(wheelCtxKey).(*deadlineCtx)
			if pw == nil || pw.Done() != pdone || !causeFrom(parent, pw) {
				return context.WithDeadlineCause(parent, t, cause)
			}
		}
	}
	c := &deadlineCtx{w: w, parent: parent, deadline: t, pw: pw}
	if cause != nil {
		c.x.Store(&ctxExt{cause: cause}) // before the context is shared
	}
	// A parent that has ended is asked by Err, not by its state word: Err waits for an ender
	// paused after its CAS to close the parent's Done and set its cause, which this context's
	// Cause reads from the parent's q (ctxGate.Value). A live parent costs one load either way.
	// Not shared yet: a plain store, born finished (end's losers have no winner to wait for).
	if pw != nil && pw.Err() != nil {
		c.state.Store(fromParent(pw.state.Load()&endMask) | ctxFinished)
		return c, c.cancel
	}
	if d <= 0 {
		c.state.Store(endDeadline | ctxFinished)
		return c, c.cancel
	}
	timer, err := w.AfterFuncArg(d, expireDeadline, (*ctxTimer)(c))
	if err != nil {
		return context.WithDeadlineCause(parent, t, cause)
	}
	c.timer = timer
	if pw != nil && !pw.addKid(c) {
		pw.Err() // the parent's ender took its kids: wait for it to finish q, as above
		c.end(fromParent(pw.state.Load() & endMask))
	}
	if old := c.state.Or(ctxArmed); old&endMask != 0 {
		c.release(old & endMask)
	}
	return c, c.cancel
}

// causeFrom reports whether a wrapper parent leads std's cause lookup to pw's q, as it leads
// Value(wheelCtxKey) to pw: parent.Value(&cancelCtxKey) is the *cancelCtx whose cause std would
// copy into a child of parent. A wrapper that answers that key itself (say with the cancelCtx of
// other values it merges in) would make a std child's Cause differ from a wheel kid's, which is
// read from pw's q (ctxGate.Value, which runs no user code during an end): such a parent falls
// back to the standard library. pw.Done() has made pw's q before this is asked.
func causeFrom(parent context.Context, pw *deadlineCtx) bool {
	return cancelCtxKey == nil || parent.Value(cancelCtxKey) == any(pw.loadQ())
}

// testHookEnded, set only by tests, runs in end right after the CAS that ends a context. It is
// atomic because ends run on goroutines no test waits for: a runtime timer that took over a
// dropped deadline (timerDropped) may end a context of an earlier test while a later one sets
// the hook.
var testHookEnded atomic.Pointer[func(*deadlineCtx)]

// The state word of a deadlineCtx:
//
//	bits 0..2  end       0 live, else how it ended; set once, by the CAS in end
//	bit  3     armed     set once by the constructor after it wrote timer
//	bit  4     linked    set under mu once kids or gateF may be non-empty
//	bit  5     finished  set once by the winner of end's CAS when its end is complete (Done
//	                     closed, the subtree ended, the timer and link released if armed); a
//	                     context born ended has it from birth
const (
	endMask           uint32 = 7
	endCanceled       uint32 = 1 // its CancelFunc
	endDeadline       uint32 = 2 // its timer, or a deadline already past at construction
	endParentCanceled uint32 = 3 // its wheel parent ended with Canceled
	endParentDeadline uint32 = 4 // its wheel parent ended with DeadlineExceeded
	ctxArmed          uint32 = 1 << 3
	ctxLinked         uint32 = 1 << 4
	ctxFinished       uint32 = 1 << 5
)

// fromParent is the end code of a context whose wheel parent ended with code.
func fromParent(code uint32) uint32 {
	if code == endCanceled || code == endParentCanceled {
		return endParentCanceled
	}
	return endParentDeadline
}

// errOf is the Err of a context that ended with code (nil while live). Inside the closed world
// every context ends with Canceled or DeadlineExceeded; other causes reach Cause through Value.
func errOf(code uint32) error {
	switch code {
	case 0:
		return nil
	case endCanceled, endParentCanceled:
		return context.Canceled
	}
	return context.DeadlineExceeded
}

// deadlineCtx is the wheel's deadline context.
//
// Ownership, field by field:
//   - w, parent, deadline: immutable.
//   - pw: immutable: the wheel parent (nil if none), written before the context is shared or
//     linked. The context is in pw's kids list only if addKid took it; removeKid tells.
//   - state: atomic, see the table above.
//   - timer: written by the constructor before it sets armed; read only by the goroutine that
//     ended the context after seeing armed, or by the constructor if the end came first (exactly
//     one of the two, decided by the armed bit against the end CAS).
//   - prev, next: this context's links in pw's kids list, guarded by pw.mu. Once pw's ender has
//     taken the list, only that ender writes them: it clears prev under the lock (removeKid skips
//     a taken kid), then walks next without it, clearing each as it goes so that an ended kid
//     keeps none of its siblings.
//   - kids, kidsDone: guarded by mu. kidsDone is set by the ender when it takes the list, which
//     only an ender whose CAS saw the linked bit does; if none did, kidsDone stays false and a
//     later addKid or gate.AfterFunc learns of the end from its own Or of the linked bit.
//   - x: atomic, written once: by the constructor (a cause) or under mu by ext. What only a Cause
//     form or the first Done, Value(&cancelCtxKey), or a Wheel.Stop that dropped the timer needs
//     lives there, so that the context of the hot path (make, cancel) is 128 bytes, one size
//     class below std's timerCtx alone.
type deadlineCtx struct {
	w          *Wheel
	parent     context.Context
	deadline   time.Time
	state      atomic.Uint32
	kidsDone   bool
	timer      Timer
	pw         *deadlineCtx
	prev, next *deadlineCtx
	mu         sync.Mutex
	kids       *deadlineCtx
	x          atomic.Pointer[ctxExt]
}

// ctxExt is the part of a deadlineCtx made on demand.
//   - cause: immutable (the WithDeadlineCause cause; nil for DeadlineExceeded).
//   - gateF: guarded by the context's mu (std's registration of q, see ctxGate.AfterFunc).
//   - q: atomic, written once, under qmu, by lazyQ; lateF is guarded by qmu.
//   - rt: atomic, written once, by timerDropped (under a shard's mu, in Wheel.Stop): the runtime
//     timer that carries the deadline once the wheel's timer was dropped; stopped by release.
type ctxExt struct {
	cause error
	gateF func()
	q     atomic.Value // context.Context: the *context.cancelCtx of lazyQ
	qmu   sync.Mutex
	lateF func()
	rt    atomic.Pointer[time.Timer]
}

// ext returns c's ctxExt, making it (under mu, so once) on the first call.
func (c *deadlineCtx) ext() *ctxExt {
	if x := c.x.Load(); x != nil {
		return x
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if x := c.x.Load(); x != nil {
		return x
	}
	x := &ctxExt{}
	c.x.Store(x)
	return x
}

// loadQ returns q if it has been published, else nil.
func (c *deadlineCtx) loadQ() context.Context {
	if x := c.x.Load(); x != nil {
		if q := x.q.Load(); q != nil {
			return q.(context.Context)
		}
	}
	return nil
}

// wheelCtxKey is the Value key with which a deadlineCtx answers itself, so that a child finds it
// through wrappers (its address is the key, as std's &cancelCtxKey).
var wheelCtxKey = new(byte)

// closedChan and neverChan are the gate's Done channels: always closed, and never closed.
var (
	closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
	neverChan  = make(chan struct{})
)

// cancelCtxKey is the key with which context.Cause and std's children ask a context for its
// innermost *context.cancelCtx (the standard library's unexported &cancelCtxKey). It is learned
// once by calling context.Cause on a probe that records what it is asked: no linkname, no unsafe.
// Should a later Go stop asking, the key stays nil, Value never matches it, and the ported tests
// (ctxstd_test.go) fail loudly.
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

// ctxTimer is a deadlineCtx as the argument of its own wheel timer: a second method set on the
// same object (no allocation), so that Wheel.Stop tells a context's timer from a user's timer that
// happens to carry a context of ours as its argument. Only a ctxTimer is told that its timer was
// dropped (timerDropped).
type ctxTimer deadlineCtx

// expireDeadline is the timer callback of every deadlineCtx (one func value, no closures).
func expireDeadline(arg any) { (*deadlineCtx)(arg.(*ctxTimer)).end(endDeadline) }

// timerDropped is told by Wheel.Stop (letGoDropped, under a shard's mu) that Stop moved the
// context's wheel timer from pending to dropped: it will never fire, and the entry no longer
// refers to the context. So that the context still ends at its deadline, and never before, as
// std's does, a runtime timer takes the deadline over: time.AfterFunc(time.Until(deadline)),
// which is what context.WithDeadline arms, read on the same scale (a deadline already passed
// fires at once, on the runtime's goroutine: nothing of the context's end runs under the
// shard's mu, where a parent's end would stop its children's timers). With a ManualClock the
// deadline is a time on the manual clock's scale and the runtime timer reads it on the real
// clock, as the std context that withDeadline returns after Stop does: a stopped wheel follows
// the manual clock no more (Stop detaches it), and its contexts, made before Stop or after, end
// alike.
//
// The steps, and who may be paused between them:
//  1. Already ended: nothing to do; the ender (or the constructor) releases the rest, and the
//     entry it would stop is dropped already (Timer.Stop reports false).
//  2. Arm the runtime timer and publish it in x.rt.
//  3. Load the state again: ended meanwhile, stop the runtime timer here.
//
// An ender (cancel, the wheel parent's end) does its CAS and then, in release, loads x.rt and
// stops what it finds. Both orders are covered: if 3's load missed the CAS, the CAS came after
// 2's store, so release's load sees the timer; otherwise 3 stops it (both may: Stop is
// idempotent). So a cancelled context is never held by a runtime timer beyond its cancel, and
// only a context still live at its deadline is ended by it, with DeadlineExceeded and its cause,
// through end, as by its wheel timer. A constructor paused between AfterFuncArg and its armed
// bit changes nothing here: timerDropped reads only deadline (immutable), state and x (atomic),
// never timer or pw, and whoever ends the context calls release once, as always: the ender if
// it saw armed, else the constructor once its Or of armed sees the end (withDeadline).
// It runs at most once per context: a context has one wheel timer, dropped at most once.
// It takes c.mu (ext) under the shard's mu: nothing holds c.mu while it arms, stops or drains a
// wheel timer, so the order is never the other way round.
func (t *ctxTimer) timerDropped() {
	c := (*deadlineCtx)(t)
	if c.state.Load()&endMask != 0 { // 1.
		return
	}
	if h := testHookDropped.Load(); h != nil {
		(*h)(c, 1) // tests only: paused between 1 and 2
	}
	x := c.ext()
	rt := time.AfterFunc(time.Until(c.deadline), func() { c.end(endDeadline) })
	x.rt.Store(rt) // 2.
	if h := testHookDropped.Load(); h != nil {
		(*h)(c, 2) // tests only: paused between 2 and 3
	}
	if c.state.Load()&endMask != 0 { // 3.
		rt.Stop()
	}
}

// testHookDropped, set only by tests, runs in timerDropped after its step 1 and after its step 2
// (atomic, as testHookEnded).
var testHookDropped atomic.Pointer[func(c *deadlineCtx, step int)]

// cancel is the CancelFunc.
func (c *deadlineCtx) cancel() { c.end(endCanceled) }

// end ends the context with code unless it has ended already. The winner of the CAS, in order:
//  1. takes, under mu, q's registration and the list of wheel children, and closes both to
//     later registrations;
//  2. cancels q (closing Done and ending every std descendant, with this context's err and
//     cause), then ends each wheel child (which does the same for its own subtree);
//  3. releases the timer and the link in the wheel parent, if the constructor has published them.
//
// All of it runs before the CancelFunc, the timer callback or the parent's end returns: when any
// of them returns, the whole subtree is done. That holds for a loser of the CAS too, as for std's
// cancel, which takes the context's mutex before it finds it canceled: the loser waits for the
// winner's finished bit (awaitEnd). The winner never waits for a loser: it holds no lock of a
// loser's, and a loser waits holding none. Nothing here blocks (q.cancel takes std's locks
// briefly; children's ends recurse down a finite tree, as std's cancel does).
// The ender cancels q (f, the gate's registration) before it ends the kids: a kid's Cause reads
// the cause through this context's q (ctxGate.Value), so it must be set by the time the kid
// ends. A child made while an ender is between its CAS and that cancel waits in Err for it
// (withDeadline).
func (c *deadlineCtx) end(code uint32) {
	var s uint32
	for {
		s = c.state.Load()
		if s&endMask != 0 {
			c.awaitEnd(s)
			return
		}
		if c.state.CompareAndSwap(s, s|code) {
			break
		}
	}
	if h := testHookEnded.Load(); h != nil {
		(*h)(c) // tests only: an ender paused here, between its CAS and q's cancel
	}
	if s&ctxLinked != 0 {
		c.mu.Lock()
		var f func()
		if x := c.x.Load(); x != nil {
			f, x.gateF = x.gateF, nil
		}
		kids := c.kids
		c.kids, c.kidsDone = nil, true
		for k := kids; k != nil; k = k.next {
			k.prev = nil // taken: removeKid of k leaves the list alone from now on
		}
		c.mu.Unlock()
		if f != nil {
			f()
		}
		for k := kids; k != nil; {
			next := k.next
			k.next = nil // an ended kid a caller keeps must not keep its older siblings
			k.end(fromParent(code))
			k = next
		}
	}
	if s&ctxArmed != 0 {
		c.release(code)
	}
	c.state.Or(ctxFinished)
}

// awaitEnd returns once the winner of end's CAS has finished, given s, a state that has ended.
// A loser is rare (a cancel racing the deadline, the parent's end or another cancel) and the
// winner's steps are short and never wait for it, so it yields rather than blocks: a winner
// paused between its CAS and its finished bit (preemption, GC) gets the P back.
// A winner that is a constructor's end of its own context (withDeadline, the parent ended
// first) has not set armed yet, so its finished bit comes before the constructor releases the
// timer; nobody else holds that context yet but its parent's ender, for which it has ended.
func (c *deadlineCtx) awaitEnd(s uint32) {
	for s&ctxFinished == 0 {
		runtime.Gosched()
		s = c.state.Load()
	}
}

// release stops the timer (unless it is what fired: the wheel has let go of the entry then) and
// unlinks the context from its wheel parent (unless the parent ended it: the parent took its list).
// After it, the wheel holds nothing of the context: Timer.Stop drops the entry's arg at once,
// and after Wheel.Stop the entry let go of it when it was dropped; the runtime timer that took
// over a dropped timer's deadline, if any, is stopped here (see timerDropped for the race with
// its arming; stopping one that fired, or twice, does nothing).
func (c *deadlineCtx) release(code uint32) {
	if code != endDeadline {
		c.timer.Stop()
	}
	if x := c.x.Load(); x != nil {
		if rt := x.rt.Load(); rt != nil {
			rt.Stop()
		}
	}
	if c.pw != nil && code != endParentCanceled && code != endParentDeadline {
		c.pw.removeKid(c)
	}
}

// addKid links k into c's list and reports true, or reports false if c has ended. The linked bit
// is set after linking and under mu: an ender whose CAS saw the bit takes the list (under mu, so
// after this call); one whose CAS came first made our Or see its end code, and then k is unlinked
// again and ended by the caller.
func (c *deadlineCtx) addKid(k *deadlineCtx) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kidsDone {
		return false
	}
	k.next = c.kids
	if k.next != nil {
		k.next.prev = k
	}
	c.kids = k
	if old := c.state.Or(ctxLinked); old&endMask != 0 {
		c.unlinkLocked(k)
		return false
	}
	return true
}

// removeKid unlinks k if it is still in c's list. A kid is in the list if and only if it is the
// head or has a prev; the ender clears prev of every kid it takes.
func (c *deadlineCtx) removeKid(k *deadlineCtx) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k.prev == nil && c.kids != k {
		return
	}
	c.unlinkLocked(k)
}

func (c *deadlineCtx) unlinkLocked(k *deadlineCtx) {
	if k.prev != nil {
		k.prev.next = k.next
	} else {
		c.kids = k.next
	}
	if k.next != nil {
		k.next.prev = k.prev
	}
	k.prev, k.next = nil, nil
}

// lazyQ returns q, the std cancelCtx that carries Done and adopts std descendants, making it on
// the first call: context.WithCancel(gate). Made while c is live, q registers through
// gate.AfterFunc and is canceled by c's ender; made after c ended, std sees the gate's closed Done
// and q is born canceled with c's err and cause. The one race, c ending inside WithCancel between
// those two checks, is caught in gate.AfterFunc, which leaves the call to us (lateF): it cannot
// call it itself, std holds q's mutex around AfterFunc. q is published only after that call, so
// whoever gets q from lazyQ after c's ender returned gets it canceled.
func (c *deadlineCtx) lazyQ() context.Context {
	if q := c.loadQ(); q != nil {
		return q
	}
	x := c.ext()
	x.qmu.Lock()
	defer x.qmu.Unlock()
	if q := x.q.Load(); q != nil {
		return q.(context.Context)
	}
	q, qcancel := context.WithCancel((*ctxGate)(c))
	_ = qcancel // never called: q ends only through the gate, with c's err and cause
	if f := x.lateF; f != nil {
		x.lateF = nil
		f()
	}
	x.q.Store(q)
	return q
}

// Deadline returns the deadline the context was made with; ok is always true.
func (c *deadlineCtx) Deadline() (deadline time.Time, ok bool) { return c.deadline, true }

// Done returns q's Done channel: the same channel on every call, closed by the ender (or born
// closed) before Err reports non-nil.
func (c *deadlineCtx) Done() <-chan struct{} { return c.lazyQ().Done() }

// Err returns nil while the context is live, then Canceled or DeadlineExceeded. If q has been
// made (so a Done channel may be out), it waits for q's Done to close first: the ender closes it
// right after its CAS, and a late registration is completed before q is published. So a non-nil
// Err implies that every Done channel handed out is closed, as in std (golang/go#75533).
//
// q not yet published is not enough to skip the wait: a lazyQ may be between its registration
// (taken and not yet called by an ender paused after its CAS) and its publication, and would
// then hand this goroutine's next Done an open channel. So with a ctxExt (lazyQ makes it before
// anything else) Err waits for qmu, behind which every lazyQ in flight publishes; one that starts
// later sees the end and makes q born canceled. Without a ctxExt no lazyQ has begun.
func (c *deadlineCtx) Err() error {
	code := c.state.Load() & endMask
	if code == 0 {
		return nil
	}
	if x := c.x.Load(); x != nil {
		q := x.q.Load()
		if q == nil {
			x.qmu.Lock()
			q = x.q.Load()
			x.qmu.Unlock()
		}
		if q != nil {
			<-q.(context.Context).Done()
		}
	}
	return errOf(code)
}

// Value answers std's &cancelCtxKey with q (so that std contexts derived from this one, directly
// or through wrappers, sit in q's children map, and context.Cause reads q's cause), wheelCtxKey
// with the context itself, and every other key from parent.
func (c *deadlineCtx) Value(key any) any {
	if key == wheelCtxKey {
		return c
	}
	if cancelCtxKey != nil && key == cancelCtxKey {
		return c.lazyQ()
	}
	return c.parent.Value(key)
}

// String describes the context as std's timerCtx does, the time left read on the wheel's clock.
func (c *deadlineCtx) String() string {
	return contextName(c.parent) + ".WithDeadline(" + c.deadline.String() + " [" +
		c.deadline.Sub(c.w.opts.clock.Now()).String() + "])"
}

// contextName is std's: the String of a Stringer, else the dynamic type.
func contextName(c context.Context) string {
	if s, ok := c.(interface{ String() string }); ok {
		return s.String()
	}
	return reflect.TypeOf(c).String()
}
