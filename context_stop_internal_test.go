package shardwheel

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

type ctxPayloadKey struct{}

// droppedRT returns the runtime timer that took over c's deadline at Stop, or nil.
func droppedRT(c *deadlineCtx) *time.Timer {
	if x := c.x.Load(); x != nil {
		return x.rt.Load()
	}
	return nil
}

// requireEnded waits up to a second for ctx to end and checks its Err.
func requireEnded(t *testing.T, ctx context.Context, want error) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatalf("%v: not done a second later", ctx)
	}
	require.Equal(t, want, ctx.Err())
}

// TestContextStopEndsLiveContextAtDeadline: a context made while the wheel runs still ends at its
// deadline, with DeadlineExceeded, after Stop dropped its timer, as the standard library's with
// the same deadline does; a context.AfterFunc on it runs. Stop counts the dropped timer, and
// Stats.Dropped shows it.
func TestContextStopEndsLiveContextAtDeadline(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w, err := New(WithShards(1), WithWorkers(1))
	require.NoError(t, err)
	const d = 50 * time.Millisecond
	ctx, cancel := w.WithTimeout(context.Background(), d)
	defer cancel()
	ran := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { close(ran) })
	defer stop()
	ref, refCancel := context.WithTimeout(context.Background(), d)
	defer refCancel()

	require.Equal(t, 1, w.Stop(), "the context's timer was pending and is dropped")

	<-ref.Done() // the standard library's context ends at the deadline
	require.Equal(t, context.DeadlineExceeded, ref.Err())
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
	}
	dl, _ := ctx.Deadline()
	require.Equal(t, context.DeadlineExceeded, ctx.Err(),
		"the wheel's context is still live %v after its deadline: Stop dropped its timer", time.Since(dl))
	select {
	case <-ran:
	case <-time.After(time.Second):
		t.Fatal("context.AfterFunc on the context never ran")
	}
	requireBalanced(t, w)
	require.Equal(t, uint64(1), w.Stats().Dropped)
}

// TestContextStopLetsGoOfCanceledContext: a context cancelled after Stop is not kept reachable by
// the stopped wheel: the dropped entry let go of its argument. (On this manual clock at 1970 the
// deadline is long past on the real clock, so the context may also have ended by its runtime
// timer first; see TestContextStopLetsGoOfCanceledContextSystemClock for one whose runtime timer
// is pending.)
func TestContextStopLetsGoOfCanceledContext(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w, err := New(WithClock(NewManualClock(time.Unix(0, 0))), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	// mk makes a context that holds a fresh payload, runs before, cancels the context and
	// keeps nothing of it.
	mk := func(before func()) weak.Pointer[ctxPayload] {
		p := new(ctxPayload)
		_, cancel := w.WithTimeout(context.WithValue(context.Background(), ctxPayloadKey{}, p), time.Hour)
		before()
		cancel()
		return weak.Make(p)
	}
	live := mk(func() {})
	require.True(t, collected(live), "control: cancelled on a running wheel, the context is gone")
	stopped := mk(func() { w.Stop() })
	require.True(t, collected(stopped), "a cancelled context's values are kept reachable by the stopped wheel")
	runtime.KeepAlive(w)
}

// TestContextStopLetsGoOfCanceledContextSystemClock: a context an hour from its deadline at Stop
// is held by the runtime timer that took its deadline over, and its cancel stops that timer, so
// nothing keeps it (the stopped wheel's entry, or the runtime's timer heap) once cancelled.
func TestContextStopLetsGoOfCanceledContextSystemClock(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w, err := New(WithShards(2), WithWorkers(1))
	require.NoError(t, err)
	var c *deadlineCtx
	mk := func() (weak.Pointer[ctxPayload], context.CancelFunc) {
		p := new(ctxPayload)
		ctx, cancel := w.WithTimeout(context.WithValue(context.Background(), ctxPayloadKey{}, p), time.Hour)
		c = ctx.(*deadlineCtx)
		return weak.Make(p), cancel
	}
	held, cancel := mk()
	require.Equal(t, 1, w.Stop())
	rt := droppedRT(c)
	require.NotNil(t, rt, "Stop handed the deadline to a runtime timer")
	c = nil
	require.False(t, collected(held), "control: live, the context waits for its deadline")
	require.Nil(t, keptArg(w), "the dropped entry let go of the context at Stop")
	cancel()
	cancel = nil
	require.False(t, rt.Stop(), "the cancel stopped the runtime timer")
	rt = nil // a *time.Timer keeps its func, and so the context: the test's own reference goes
	require.True(t, collected(held), "a context cancelled after Stop is kept reachable")
	runtime.KeepAlive(w)
}

// TestContextStopNeverEarlyWithSubtree: after Stop, contexts of several shards end at their
// deadline and not before, with their cause, and so does every context derived from them: a
// wheel child with the same deadline, a standard child, a context.AfterFunc. Stop counts each
// wheel timer it dropped, once.
func TestContextStopNeverEarlyWithSubtree(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w, err := New(WithShards(4), WithWorkers(2))
	require.NoError(t, err)
	cause := errors.New("too slow")
	type tree struct {
		ctx, kid, std context.Context
		ran           chan time.Time
	}
	var trees []tree
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	for i := range 8 {
		ctx, cancel := w.WithTimeoutCause(context.Background(), time.Duration(100+10*i)*time.Millisecond, cause)
		dl, _ := ctx.Deadline()
		kid, kcancel := w.WithDeadline(ctx, dl) // the same deadline: a wheel context
		_, isWheel := kid.(*deadlineCtx)
		require.True(t, isWheel)
		std, scancel := context.WithCancel(kid)
		cancels = append(cancels, cancel, kcancel, scancel)
		tr := tree{ctx: ctx, kid: kid, std: std, ran: make(chan time.Time, 1)}
		context.AfterFunc(std, func() { tr.ran <- time.Now() })
		trees = append(trees, tr)
	}
	require.Equal(t, 16, w.Stop(), "every wheel timer was pending")
	for _, tr := range trees {
		dl, _ := tr.ctx.Deadline()
		select {
		case <-tr.ctx.Done():
		case <-time.After(2 * time.Second):
			t.Fatalf("%v: not done after Stop", tr.ctx)
		}
		require.False(t, time.Now().Before(dl), "done %v before its deadline", time.Until(dl))
		for _, c := range []context.Context{tr.ctx, tr.kid, tr.std} {
			requireEnded(t, c, context.DeadlineExceeded)
		}
		require.Equal(t, cause, context.Cause(tr.ctx))
		// The kid's own deadline (no cause) and its parent's are the same instant: either may
		// end it first, as with std's timerCtx; its standard child copies whichever it was.
		if kc := context.Cause(tr.kid); kc != cause {
			require.Equal(t, context.DeadlineExceeded, kc)
		}
		require.Equal(t, context.Cause(tr.kid), context.Cause(tr.std))
		at := <-tr.ran
		require.False(t, at.Before(dl), "context.AfterFunc ran before the deadline")
	}
	requireBalanced(t, w)
	require.Equal(t, uint64(16), w.Stats().Dropped)
	require.Zero(t, w.Stats().Fired, "the runtime timers are not callbacks of the wheel")
}

// TestContextStopManualClockAsFallback: on a ManualClock, a context made before Stop ends after
// Stop exactly as the standard context that a context made after Stop falls back to: its
// deadline, a time on the manual clock's scale, read against the real clock. At a start in 1970
// both end at once; at a start of now, both stay live for the hour of real time they have left,
// and their cancel ends them with Canceled.
func TestContextStopManualClockAsFallback(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, tc := range []struct {
		name  string
		start time.Time
		ended bool
	}{
		{"1970", time.Unix(0, 0), true},
		{"now", time.Now(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := NewManualClock(tc.start)
			w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
			require.NoError(t, err)
			clk.Advance(time.Minute)
			before, cancelBefore := w.WithTimeout(context.Background(), time.Hour)
			defer cancelBefore()
			require.Equal(t, 1, w.Stop())
			after, cancelAfter := w.WithTimeout(context.Background(), time.Hour)
			defer cancelAfter()
			_, isWheel := after.(*deadlineCtx)
			require.False(t, isWheel, "made after Stop: the standard library's context")
			db, _ := before.Deadline()
			da, _ := after.Deadline()
			require.Equal(t, db, da, "the same deadline on the manual clock")
			if tc.ended {
				requireEnded(t, before, context.DeadlineExceeded)
				requireEnded(t, after, context.DeadlineExceeded)
				return
			}
			time.Sleep(20 * time.Millisecond)
			require.NoError(t, before.Err())
			require.NoError(t, after.Err())
			rt := droppedRT(before.(*deadlineCtx))
			require.NotNil(t, rt)
			cancelBefore()
			cancelAfter()
			require.Equal(t, context.Canceled, before.Err())
			require.Equal(t, context.Canceled, after.Err())
			require.False(t, rt.Stop(), "the cancel stopped the runtime timer")
		})
	}
}

// TestContextCancelPausedAcrossStopDrop: a cancel paused between the CAS that ends the context
// and its release, while Stop drops the timer. Stop's drop wins the entry (pending -> dropped:
// the paused cancel has not stopped it yet), counts it, and hands nothing to a runtime timer (the
// context has ended); the cancel's release then finds the entry dropped (Timer.Stop reports
// false). The entry keeps nothing; the books balance with the timer counted as dropped.
func TestContextCancelPausedAcrossStopDrop(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w, _, _ := parkWheel(t)
	ctx, cancel := w.WithTimeout(context.Background(), time.Hour)
	c := ctx.(*deadlineCtx)
	e := c.timer.s.slab.at(c.timer.i)
	paused, resume := make(chan struct{}), make(chan struct{})
	hook := func(k *deadlineCtx) {
		if k == c {
			close(paused)
			<-resume
		}
	}
	testHookEnded.Store(&hook)
	defer testHookEnded.Store(nil)
	canceled := make(chan struct{})
	go func() { cancel(); close(canceled) }()
	<-paused
	require.Equal(t, 1, w.Stop(), "the paused cancel had not stopped the timer: Stop drops it")
	require.Nil(t, droppedRT(c), "an ended context gets no runtime timer")
	require.Nil(t, e.arg, "the dropped entry let go of the context")
	require.Nil(t, e.f)
	close(resume)
	<-canceled
	require.Equal(t, context.Canceled, ctx.Err())
	require.False(t, c.timer.Stop(), "dropped")
	st := w.Stats()
	require.Zero(t, st.Stopped)
	require.Equal(t, uint64(1), st.Dropped)
	requireBalanced(t, w)
}

// TestContextCancelInsideDropHandOff: a cancel that runs while Stop hands the deadline over to a
// runtime timer (timerDropped), between its steps: before the runtime timer is armed (the
// cancel's release finds none; step 3 sees the end and stops it) and after it is published
// (release stops it; so may step 3). Either way the runtime timer ends stopped: it neither holds
// the cancelled context nor ends it again.
func TestContextCancelInsideDropHandOff(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, step := range []int{1, 2} {
		w, err := New(WithShards(1), WithWorkers(1))
		require.NoError(t, err)
		ctx, cancel := w.WithTimeout(context.Background(), time.Hour)
		c := ctx.(*deadlineCtx)
		hooked := 0
		hook := func(k *deadlineCtx, at int) {
			if k == c && at == step {
				hooked++
				cancel() // on Stop's goroutine, under the shard's mu
			}
		}
		testHookDropped.Store(&hook)
		n := w.Stop()
		testHookDropped.Store(nil)
		require.Equal(t, 1, n)
		require.Equal(t, 1, hooked, "step %d", step)
		require.Equal(t, context.Canceled, ctx.Err())
		rt := droppedRT(c)
		require.NotNil(t, rt, "step %d: armed (the context was live at step 1)", step)
		require.False(t, rt.Stop(), "step %d: the runtime timer was left running", step)
		requireBalanced(t, w)
	}
}

// TestContextExpiryFiredBeforeStopDrop: the context's own timer fired in the batch whose first
// callback calls Stop. The entry was firing, not pending, so Stop does not drop it (its count
// is 0) and no runtime timer is armed: Stop, called from a callback, returns at once, and the
// advance goes on to run the context's callback, which ends the context, counted as fired. One
// tick later instead, the timer is still pending at Stop: dropped, counted, and the context ends
// by its runtime timer (the manual clock's 1970 deadline is past on the real clock: at once).
func TestContextExpiryFiredBeforeStopDrop(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, tc := range []struct {
		name    string
		ctxD    time.Duration
		dropped int
	}{
		{"same tick", time.Millisecond, 0},
		{"next tick", 2 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, clk, _ := parkWheel(t)
			stopped := -1
			_, err := w.AfterFunc(time.Millisecond, func() { stopped = w.Stop() })
			require.NoError(t, err)
			ctx, cancel := w.WithTimeout(context.Background(), tc.ctxD)
			defer cancel()
			clk.Advance(2 * time.Millisecond)
			require.Equal(t, tc.dropped, stopped, "what Stop found pending")
			requireEnded(t, ctx, context.DeadlineExceeded)
			st := w.Stats()
			require.Equal(t, uint64(tc.dropped), st.Dropped)
			require.Equal(t, uint64(2-tc.dropped), st.Fired)
			require.Equal(t, st.Fired, st.Lateness.Count())
			requireBalanced(t, w)
			if tc.dropped == 0 {
				require.Nil(t, droppedRT(ctx.(*deadlineCtx)), "fired by the wheel: no runtime timer")
			}
		})
	}
}

// TestContextStopWhileConstructorPaused: Stop drops a context's timer while its constructor is
// paused between AfterFuncArg and the armed bit (here: waiting for the wheel parent's mu in
// addKid). The runtime timer takes the deadline over all the same; the constructor then links
// the context and arms it. If the deadline came while it was paused, the runtime timer ended the
// context unarmed and the constructor releases it (unlinking it from the parent again); else
// the context ends at its deadline, or by its cancel, which stops the runtime timer.
func TestContextStopWhileConstructorPaused(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, tc := range []struct {
		name       string
		d          time.Duration // the child's timeout
		pauseAfter time.Duration // how long the constructor stays paused after Stop
		cancel     bool
	}{
		{"deadline while paused", 40 * time.Millisecond, 80 * time.Millisecond, false},
		{"deadline after", 40 * time.Millisecond, 0, false},
		{"cancelled after", 30 * time.Minute, 0, true}, // before the parent's hour: a wheel child
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := New(WithShards(2), WithWorkers(1))
			require.NoError(t, err)
			parent, cancelParent := w.WithTimeout(context.Background(), time.Hour)
			defer cancelParent()
			p := parent.(*deadlineCtx)
			p.Done()    // p's ctxExt exists: Stop's hand-off of p's own timer takes no p.mu
			p.mu.Lock() // the child's constructor will wait here, in addKid
			type made struct {
				ctx    context.Context
				cancel context.CancelFunc
			}
			ch := make(chan made)
			go func() {
				ctx, cancel := w.WithTimeout(parent, tc.d)
				ch <- made{ctx, cancel}
			}()
			for start := time.Now(); w.Len() < 2; runtime.Gosched() {
				// Until the child's timer is scheduled: its constructor has not armed it.
				if time.Since(start) > 5*time.Second {
					p.mu.Unlock()
					t.Fatal("the child got no wheel timer")
				}
			}
			require.Equal(t, 2, w.Stop())
			time.Sleep(tc.pauseAfter)
			p.mu.Unlock()
			m := <-ch
			defer m.cancel()
			c := m.ctx.(*deadlineCtx)
			require.NotNil(t, droppedRT(c))
			dl, _ := c.Deadline()
			if tc.cancel {
				require.NoError(t, c.Err())
				m.cancel()
				require.Equal(t, context.Canceled, c.Err())
				require.False(t, droppedRT(c).Stop(), "the cancel stopped the runtime timer")
			} else {
				requireEnded(t, c, context.DeadlineExceeded)
				require.False(t, time.Now().Before(dl), "ended before its deadline")
				// Done closes before the ender unlinks the child; a cancel that loses to the
				// ender returns only once it has finished (end's awaitEnd).
				m.cancel()
			}
			p.mu.Lock()
			kids := p.kids
			p.mu.Unlock()
			require.Nil(t, kids, "the ended child is unlinked from its parent")
			require.NoError(t, parent.Err())
			requireBalanced(t, w)
		})
	}
}

// TestContextStopRace: producers make contexts (some with wheel children), cancel some at random
// moments, while Stop drops the rest; contexts made after Stop fall back to the standard
// library's. Every context ends: a cancelled one with Canceled, any other with
// DeadlineExceeded, never before its deadline; the books balance. Runtime timers that took over
// dropped deadlines end contexts (and their children) while Stop is still dropping other shards,
// so children's timers are stopped, dropped, or found dropped in every order.
func TestContextStopRace(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	rounds := 20
	if testing.Short() {
		rounds = 5
	}
	for range rounds {
		w, err := New(WithShards(4), WithWorkers(2))
		require.NoError(t, err)
		var early, wrong atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(int64(g)), 0))
				<-start
				for range 50 {
					d := time.Duration(rng.IntN(3000)) * time.Microsecond
					ctx, cancel := w.WithTimeout(context.Background(), d)
					kid, kcancel := ctx, context.CancelFunc(func() {})
					if rng.IntN(2) == 0 {
						dl, _ := ctx.Deadline()
						kid, kcancel = w.WithDeadline(ctx, dl)
					}
					cancelled := rng.IntN(3) == 0
					pause := time.Duration(rng.IntN(2000)) * time.Microsecond
					wg.Add(1)
					go func() {
						defer wg.Done()
						defer kcancel()
						if cancelled {
							time.Sleep(pause)
							cancel()
						} else {
							defer cancel()
						}
						for _, c := range []context.Context{ctx, kid} {
							select {
							case <-c.Done():
							case <-time.After(5 * time.Second):
								wrong.Add(1)
								return
							}
							now := time.Now()
							dl, _ := c.Deadline()
							switch c.Err() {
							case context.DeadlineExceeded:
								if now.Before(dl) {
									early.Add(1)
								}
							case context.Canceled:
								if !cancelled {
									wrong.Add(1)
								}
							default:
								wrong.Add(1)
							}
						}
					}()
				}
			}()
		}
		close(start)
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
		w.Stop()
		wg.Wait()
		require.Zero(t, early.Load(), "contexts ended before their deadline")
		require.Zero(t, wrong.Load(), "contexts ended with the wrong error, or never")
		// A context's Done closes before its ender releases its timer: the runtime timer of a
		// parent may still be stopping a child's wheel timer (one whose shard Stop had not
		// dropped yet when the parent ended) after every waiter returned.
		require.Eventually(t, func() bool {
			st := w.Stats()
			return st.Scheduled == st.Fired+st.Stopped+st.Dropped+uint64(st.Pending)
		}, time.Second, time.Millisecond, "counters: %+v", w.Stats())
	}
}

// TestContextStopTellsOnlyContextsOwnTimer: a caller passes one of the wheel's contexts as the
// argument of an AfterFuncArg timer of its own. Stop drops both timers, and only the context's
// own timer hands its deadline over to a runtime timer: Stop tells an entry's argument of the
// drop only if it asks to be told (dropNotified), which the context does only as the argument of
// its own timer (ctxTimer), never as a caller's argument. Both entries let go of the context, the
// caller's func never runs, and the context still ends at its deadline, once.
func TestContextStopTellsOnlyContextsOwnTimer(t *testing.T) {
	w, err := New(WithShards(1), WithWorkers(1))
	require.NoError(t, err)
	ctx, cancel := w.WithTimeout(context.Background(), 60*time.Millisecond)
	defer cancel()
	c := ctx.(*deadlineCtx)
	ran := make(chan struct{}, 1)
	user, err := w.AfterFuncArg(time.Hour, func(arg any) { ran <- struct{}{} }, ctx)
	require.NoError(t, err)
	handed := 0
	hook := func(k *deadlineCtx, step int) {
		if step == 1 {
			handed++
			require.Same(t, c, k)
		}
	}
	testHookDropped.Store(&hook)
	n := w.Stop()
	testHookDropped.Store(nil)
	require.Equal(t, 2, n)
	require.Equal(t, 1, handed, "one hand-off: the context's own timer")
	require.Nil(t, user.s.slab.at(user.i).arg, "the caller's dropped entry let go of the context")
	require.Nil(t, keptArg(w))
	require.NotNil(t, droppedRT(c))
	dl, _ := ctx.Deadline()
	requireEnded(t, ctx, context.DeadlineExceeded)
	require.False(t, time.Now().Before(dl), "ended before its deadline")
	select {
	case <-ran:
		t.Fatal("the caller's dropped timer ran")
	case <-time.After(10 * time.Millisecond):
	}
	requireBalanced(t, w)
}

// TestContextStopDroppedParentEndsKidOnOpenShard: Stop drops the timer of a parent context on
// shard 0 whose deadline has passed on the real clock (a manual clock in 1970): its runtime
// timer ends it at once, on another goroutine, while Stop still holds shard 0's mu (paused in
// the hand-off) and has not yet closed shard 1's ring, where the parent's wheel child has its
// timer. The child ends with its parent, its end stops its timer there (counted as stopped, not
// dropped: Stop's return is exact), and nothing waits on Stop's mu: no deadlock.
func TestContextStopDroppedParentEndsKidOnOpenShard(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(2), WithWorkers(1))
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	var (
		parent, kid context.Context
		cancels     []context.CancelFunc
	)
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	// Find a parent on shard 0 and a wheel child on shard 1. The shard follows the caller's P
	// (its token, kept in a sync.Pool), and a new goroutine mostly runs on its spawner's P: two
	// GCs empty the token pool, whose next token takes the next shard, so each arm after them
	// alternates shards (under -race the shard follows the goroutine's stack: each attempt runs
	// on a new one). Without the GCs the search fails now and then.
	fresh := func() { runtime.GC(); runtime.GC() }
	var tries, onZero, kids int
	for i := 0; i < 2000 && kid == nil; i++ {
		tries++
		ch := make(chan struct{})
		go func() {
			defer close(ch)
			fresh()
			p, pc := w.WithTimeout(context.Background(), time.Hour)
			if p.(*deadlineCtx).timer.s != w.shards[0] {
				pc()
				return
			}
			onZero++
			dl, _ := p.Deadline()
			for j := 0; j < 50; j++ {
				kids++
				done := make(chan struct{})
				var k context.Context
				var kc context.CancelFunc
				fresh()
				go func() { defer close(done); k, kc = w.WithDeadline(p, dl) }()
				<-done
				if k.(*deadlineCtx).timer.s == w.shards[1] {
					parent, kid, cancels = p, k, []context.CancelFunc{pc, kc}
					return
				}
				kc()
			}
			pc()
		}()
		<-ch
	}
	require.NotNil(t, kid, "could not place a parent on shard 0 and its child on shard 1 (%d tries, %d parents on shard 0, %d children tried)", tries, onZero, kids)
	pc, kc := parent.(*deadlineCtx), kid.(*deadlineCtx)
	require.Equal(t, 2, w.Len())
	stoppedBefore := w.Stats().Stopped // the search's cancelled contexts
	var kidDone bool
	hook := func(c *deadlineCtx, step int) {
		if c != pc || step != 2 {
			return
		}
		// Under shard 0's mu; shard 1's ring is still open.
		require.Zero(t, w.shards[1].ring.tail.Load()&ringClosed, "shard 1 not reached yet")
		select {
		case <-kc.Done():
			kidDone = true
		case <-time.After(5 * time.Second):
		}
	}
	testHookDropped.Store(&hook)
	n := w.Stop()
	testHookDropped.Store(nil)
	require.True(t, kidDone, "the parent's runtime timer never ended the child while Stop held shard 0")
	require.Equal(t, context.DeadlineExceeded, parent.Err())
	require.Equal(t, context.DeadlineExceeded, kid.Err())
	require.Nil(t, droppedRT(kc), "the child ended before Stop reached its timer: no hand-off")
	require.Eventually(t, func() bool {
		st := w.Stats()
		return st.Scheduled == st.Fired+st.Stopped+st.Dropped+uint64(st.Pending)
	}, 5*time.Second, time.Millisecond, "counters: %+v", w.Stats())
	require.Equal(t, 1, n, "the parent's timer is dropped; the child's was stopped by its end")
	require.Equal(t, stoppedBefore+1, w.Stats().Stopped, "the child's timer, stopped by its end")
	require.Nil(t, keptArg(w))
	runtime.KeepAlive(w)
}
