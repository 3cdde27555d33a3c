package shardwheel

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestContextChildOfEndingParentKeepsCause (found by review): a parent WithTimeoutCause whose
// deadline has fired, its ender paused between the CAS that ends it and the cancel that closes
// its Done and sets its cause. A child made then saw the end bit, was born ended, and read the
// parent's cause before it was set: context.Cause(child) was DeadlineExceeded for good, where
// std gives the parent's cause. The child now waits in the parent's Err for the ender.
func TestContextChildOfEndingParentKeepsCause(t *testing.T) {
	clk := NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, err := New(WithClock(clk), WithWorkers(0))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	cause := errors.New("parent's cause")
	p, cancelP := w.WithTimeoutCause(context.Background(), time.Millisecond, cause)
	defer cancelP()
	p.Done() // q exists: the ender has a Done to close after its CAS
	paused, resume := make(chan struct{}), make(chan struct{})
	hook := func(c *deadlineCtx) {
		if c == p.(*deadlineCtx) {
			close(paused)
			<-resume
		}
	}
	testHookEnded.Store(&hook)
	defer testHookEnded.Store(nil)
	go clk.Advance(time.Millisecond) // fires p's deadline; its ender pauses after the CAS
	<-paused
	made := make(chan context.Context)
	dl, _ := p.Deadline() // no later than the parent's, or std's WithCancel would be returned
	go func() {
		c, cancel := w.WithDeadline(p, dl)
		defer cancel()
		made <- c
	}()
	time.Sleep(20 * time.Millisecond) // time for the child to be made, had it not waited
	close(resume)
	c := <-made
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("child Err = %v, want DeadlineExceeded", c.Err())
	}
	if got := context.Cause(c); got != cause {
		t.Fatalf("context.Cause(child) = %v, want the parent's cause %v", got, cause)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("the child is done while the parent's Done is open")
	}
}

// TestContextEndedKidKeepsNoSibling: a parent's ender takes its list of kids and walks it; a kid it
// has ended must not keep its older siblings reachable through its link. Before the ender cleared
// each kid's next, a caller holding the newest kid of a cancelled parent kept every older sibling
// (and what they hold) alive.
func TestContextEndedKidKeepsNoSibling(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, err := New()
	require.NoError(t, err)
	defer w.Stop()

	parent, cancelParent := w.WithTimeout(context.Background(), time.Hour)
	older := func() weak.Pointer[deadlineCtx] {
		a, cancelA := w.WithTimeout(parent, 30*time.Minute)
		_ = cancelA // dropped with a; calling it would unlink a before the parent's end
		return weak.Make(a.(*deadlineCtx))
	}()
	newest, cancelNewest := w.WithTimeout(parent, 30*time.Minute)
	defer cancelNewest()

	cancelParent()
	<-newest.Done()
	runtime.GC()
	runtime.GC()
	require.Nil(t, older.Value(), "an ended kid keeps its older sibling reachable")
	runtime.KeepAlive(newest)
}

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

// TestContextStopEndsLiveContextAtDeadline (review 27, was TestReview27StopLeavesLiveContextUndone):
// a context made while the wheel runs ends at its deadline after Stop dropped its timer, as the
// standard library's with the same deadline does; so does a context.AfterFunc on it. Stop counts
// the dropped timer.
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

// TestContextStopLetsGoOfCanceledContext (review 27, was TestReview27StoppedWheelKeepsCanceledContext):
// a context cancelled after Stop is not kept reachable by the stopped wheel: the dropped entry let
// go of its argument. (On this manual clock at 1970 the deadline is long past on the real clock,
// so the context may also have ended by its runtime timer first; see
// TestContextStopLetsGoOfCanceledContextSystemClock for one whose runtime timer is pending.)
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
// is 0) and no runtime timer is armed: the wheel's callback runs after Stop returns and ends the
// context, counted as fired. One tick later instead, the timer is still pending at Stop: dropped,
// counted, and the context ends by its runtime timer (the manual clock's 1970 deadline is past
// on the real clock: at once).
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

// TestMutation36CanceledRootReachesGrandchild: cancelling the root of a chain of three wheel
// contexts ends every one of them with context.Canceled, as the standard library's chain does;
// the grandchild's end code comes from its parent's end code (endParentCanceled), which must map
// to Canceled again. Kills: context.go, fromParent mapping only endCanceled to a parent's cancel.
func TestMutation36CanceledRootReachesGrandchild(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, _ := newManualWheel(t, WithShards(1), WithWorkers(0))
	root, cancel := w.WithTimeout(context.Background(), time.Hour)
	kid, kcancel := w.WithTimeout(root, time.Hour)
	defer kcancel()
	grand, gcancel := w.WithTimeout(kid, time.Hour)
	defer gcancel()
	great, xcancel := w.WithTimeout(grand, time.Hour)
	defer xcancel()
	_, ok := great.(*deadlineCtx)
	require.True(t, ok, "a chain of wheel contexts under Background stays on the wheel")
	require.Equal(t, 4, w.Len())

	cancel()
	for i, c := range []context.Context{root, kid, grand, great} {
		require.ErrorIs(t, c.Err(), context.Canceled, "context %d of the chain", i)
		require.NotErrorIs(t, c.Err(), context.DeadlineExceeded, "context %d of the chain", i)
		require.ErrorIs(t, context.Cause(c), context.Canceled, "context %d of the chain", i)
		select {
		case <-c.Done():
		default:
			t.Fatalf("context %d of the chain is not done", i)
		}
	}
	require.Equal(t, 0, w.Len(), "the chain's timers were not released")
}

// TestReview27ContextCancelAcrossTrim (pin): a context whose timer fired, whose entry went back
// to the slab, was trimmed away and re-grown for another timer, does nothing to that timer when
// its cancel func is called late; nor does one cancelled by its wheel parent after such a cycle.
func TestReview27ContextCancelAcrossTrim(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	ctx, cancel := w.WithTimeout(context.Background(), time.Millisecond)
	dc := ctx.(*deadlineCtx)
	clk.Advance(time.Millisecond)
	require.Equal(t, context.DeadlineExceeded, ctx.Err())
	require.Equal(t, blockBytes, w.TrimNow())
	fired := 0
	h, err := w.AfterFunc(time.Hour, func() { fired++ })
	require.NoError(t, err)
	i, _ := h.Slot()
	ci, _ := dc.timer.Slot()
	require.Equal(t, ci, i, "the new timer took the context's old index")
	cancel()
	require.Equal(t, 1, w.Len())
	require.Equal(t, context.DeadlineExceeded, ctx.Err())
	clk.Advance(time.Hour)
	require.Equal(t, 1, fired)
}

// TestReview29UserTimerWithContextArg: a caller passes one of the wheel's contexts as the
// argument of a timer of its own. Stop drops both timers; only the context's own hands its
// deadline to a runtime timer (the caller's func is not expireDeadline), both entries let go of
// the context, the caller's func never runs, and the context still ends at its deadline, once.
func TestReview29UserTimerWithContextArg(t *testing.T) {
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

// TestReview29DroppedParentEndsKidOnOpenShard: Stop drops the timer of a parent context on
// shard 0 whose deadline has passed on the real clock (a manual clock in 1970): its runtime
// timer ends it at once, on another goroutine, while Stop still holds shard 0's mu (paused in
// the hand-off) and has not yet closed shard 1's ring, where the parent's wheel child has its
// timer. The child ends with its parent, its end stops its timer there (counted as stopped, not
// dropped: Stop's return is exact), and nothing waits on Stop's mu: no deadlock.
func TestReview29DroppedParentEndsKidOnOpenShard(t *testing.T) {
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
	// (pick.go), and a new goroutine mostly runs on its spawner's P: two GCs empty the token
	// pool, whose next token takes the next shard, so each arm after them alternates shards
	// (under -race the shard follows the goroutine's stack: each attempt runs on a new one).
	// Without them the search failed about once in 180 runs (CI, 2026-11-26).
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

type r32Key struct{}

// r32CtxRig is the argument of the callback that cancels a context whose deadline timer the
// shard fired in the same round, just before it.
type r32CtxRig struct {
	ctx       context.Context
	cancel    context.CancelFunc
	p         weak.Pointer[r32Payload]
	firing    bool // the context's timer was fired (not started) when the callback ran
	errBefore error
	collected bool
}

// TestReview32FixedCancelOfFiringContextKeepsIt (bug, memory; same root cause as
// TestReview32FixedStopOfFiringTimerKeepsArg): API.md, of the deadline contexts: "the cancel func
// releases it at once (Len drops); once cancelled, nothing of the context is kept reachable by the
// wheel." A context whose deadline timer the shard has just fired, behind a callback that runs
// first in the same batch, is cancelled by that callback: Err is context.Canceled, and yet the
// wheel's entry still holds the context (its arg) and through it the parent's values, until the
// worker reaches the entry.
func TestReview32FixedCancelOfFiringContextKeepsIt(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	// A tick of 10 ms: the callback (due at 1 ms) and the context's timer (5 ms) come due in
	// the same round of the Advance, the callback first.
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0), WithTick(10*time.Millisecond))
	require.NoError(t, err)
	defer w.Stop()

	rig := &r32CtxRig{}
	var ctxTimer Timer
	_, err = w.AfterFuncArg(time.Millisecond, func(arg any) {
		r := arg.(*r32CtxRig)
		e := ctxTimer.s.slab.at(ctxTimer.i)
		r.firing = isGen(e.state.Load(), ctxTimer.gen) && isState(e.state.Load(), stFiring)
		r.errBefore = r.ctx.Err()
		r.cancel()
		r.ctx, r.cancel = nil, nil
		r.collected = r32Gone(r.p)
	}, rig)
	require.NoError(t, err)
	func() {
		p := new(r32Payload)
		rig.p = weak.Make(p)
		parent := context.WithValue(context.Background(), r32Key{}, p)
		rig.ctx, rig.cancel = w.WithTimeout(parent, 5*time.Millisecond)
		ctxTimer = rig.ctx.(*deadlineCtx).timer
	}()
	require.NotZero(t, ctxTimer.s, "the context has a wheel timer")
	clk.Advance(10 * time.Millisecond)
	require.True(t, rig.firing, "the context's timer was fired before the callback ran")
	require.NoError(t, rig.errBefore)
	require.Zero(t, w.Len())
	require.True(t, rig.collected, "a cancelled context is kept reachable by the wheel")
}

var start37 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// pauseEnder37 pauses the ender of c right after its CAS (testHookEnded) and returns a channel
// closed once it is paused and a func that lets it go on (idempotent).
func pauseEnder37(t *testing.T, c context.Context) (paused <-chan struct{}, resume func()) {
	t.Helper()
	target := c.(*deadlineCtx)
	pp := newPausePoint()
	hook := func(c *deadlineCtx) {
		if c == target {
			pp.pause()
		}
	}
	testHookEnded.Store(&hook)
	t.Cleanup(func() { pp.unpause(); testHookEnded.Store(nil) })
	return pp.reached, pp.unpause
}

// isDone37 reports whether ctx's Done channel is closed now.
func isDone37(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// cancelThenLook37 calls cancel on a goroutine and reports, for each of ctxs, whether it was done
// the moment cancel returned. If cancel has not returned within 200 ms (it waits, as std's
// would, for an ender paused by the test), resume is called so that it can return.
func cancelThenLook37(cancel func(), resume func(), ctxs ...context.Context) []bool {
	seen := make(chan []bool, 1)
	go func() {
		cancel()
		done := make([]bool, len(ctxs))
		for i, c := range ctxs {
			done[i] = isDone37(c)
		}
		seen <- done
	}()
	select {
	case s := <-seen:
		resume()
		return s
	case <-time.After(200 * time.Millisecond):
	}
	resume()
	return <-seen
}

// TestReview37FixedCancelReturnsBeforeDeadlineEnderCloses: API.md: "cancelling a parent (standard
// or not) has ended this context and every context derived from it by the time the parent's
// cancel returns, as it has for the standard library's own". In std (Go 1.26 context.go,
// cancelCtx.cancel) every end of a timerCtx, its timer's and its CancelFunc's, runs under the
// context's mu, and the loser takes that mu before it sees "already canceled": a CancelFunc that
// comes while the timer's end runs waits for it, and when it returns Done is closed and every
// child is canceled. Here end's loser returns at once (context.go:376-378), while the winner may
// still be between its CAS (context.go:380) and the cancel of q that closes Done and ends the std
// children (context.go:399-401) or the walk that ends the wheel kids (context.go:402-407).
// The interleaving:
//  1. the deadline fires: expireDeadline -> end(endDeadline) wins the CAS and is paused before
//     q's cancel (here by testHookEnded; on a busy machine by preemption: a 2-worker manual-clock
//     loop of Advance racing cancel saw it 3 times in 20000 rounds without any hook);
//  2. the user calls cancel(): end(endCanceled) loads an end code and returns;
//  3. ctx.Done() is still open, and so is a std child's, after cancel returned (and ctx.Err()
//     blocks in its wait for q's Done until the paused ender goes on).
//
// Failed 5 of 5 (-race -count=5) on 84fb636; fixed since: end's loser waits for the winner's
// finished bit (awaitEnd), so cancel returns only after the test lets the paused ender go on.
func TestReview37FixedCancelReturnsBeforeDeadlineEnderCloses(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(start37)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()

	ctx, cancel := w.WithTimeout(context.Background(), time.Millisecond)
	child, cancelChild := context.WithCancel(ctx) // a std child: in q's children map
	defer cancelChild()
	paused, resume := pauseEnder37(t, ctx)
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(advanced) }()
	<-paused
	seen := cancelThenLook37(cancel, resume, ctx, child)
	<-advanced
	require.Equal(t, []bool{true, true}, seen,
		"cancel returned while the context (and its std child) was not done")
}

// TestReview37FixedParentCancelReturnsBeforeKidEnderCloses: the same root cause seen from a
// parent. A wheel kid is being cancelled by its own CancelFunc on another goroutine, paused
// between its CAS (context.go:380) and q's cancel (context.go:399-401). The parent's cancel:
// its ender takes the list and walks it, and k.end (context.go:405) loses the CAS and returns at
// once (context.go:376-378). The parent's cancel returns while the kid, a std grandchild under
// the kid and a wheel grandchild are all live (Done open). In std the parent's cancel calls
// child.cancel, which takes the kid's mu and so waits for the kid's own cancel to finish: all
// three would be done. (A kid ended by its own deadline at that moment is the same case.)
// Failed 5 of 5 (-race -count=5) on 84fb636; fixed since, as the test above.
func TestReview37FixedParentCancelReturnsBeforeKidEnderCloses(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(start37)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()

	parent, cancelParent := w.WithTimeout(context.Background(), time.Hour)
	kid, cancelKid := w.WithTimeout(parent, time.Minute)
	stdGrand, cancelStdGrand := context.WithCancel(kid)
	defer cancelStdGrand()
	wheelGrand, cancelWheelGrand := w.WithTimeout(kid, time.Second)
	defer cancelWheelGrand()
	kid.Done()
	wheelGrand.Done()

	paused, resume := pauseEnder37(t, kid)
	kidCancelled := make(chan struct{})
	go func() { cancelKid(); close(kidCancelled) }()
	<-paused
	seen := cancelThenLook37(cancelParent, resume, parent, kid, stdGrand, wheelGrand)
	<-kidCancelled
	require.Equal(t, []bool{true, true, true, true}, seen,
		"the parent's cancel returned while a descendant was not done")
}

// TestReview37PinNeverEarlyNeverLost: on a manual clock, deadlines a fraction of a tick apart and
// across ticks are done exactly when the clock has reached them: never while Now is before the
// deadline, always once Advance (WithWorkers(0): callbacks run inside it) reached it; Err and
// Cause as std's, and every timer released.
func TestReview37PinNeverEarlyNeverLost(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(start37)
	w, err := New(WithClock(clk), WithWorkers(0), WithTick(time.Millisecond))
	require.NoError(t, err)
	defer w.Stop()

	cause := errors.New("review 37")
	root, cancelRoot := w.WithTimeout(context.Background(), time.Hour)
	defer cancelRoot()
	var ctxs []context.Context
	for i := 1; i <= 40; i++ {
		d := time.Duration(i) * 130 * time.Microsecond
		var c context.Context
		if i%2 == 0 {
			c, _ = w.WithTimeoutCause(root, d, cause)
		} else {
			c, _ = w.WithDeadline(context.Background(), clk.Now().Add(d))
		}
		ctxs = append(ctxs, c)
	}
	require.Equal(t, 41, w.Len(), "each deadline is a timer")
	for step := 0; step < 60; step++ {
		clk.Advance(100 * time.Microsecond)
		now := clk.Now()
		for _, c := range ctxs {
			dl, _ := c.Deadline()
			if now.Before(dl) {
				require.False(t, isDone37(c), "done %v before its deadline", dl.Sub(now))
				require.NoError(t, c.Err())
				continue
			}
			require.True(t, isDone37(c), "not done %v after its deadline", now.Sub(dl))
			require.Equal(t, context.DeadlineExceeded, c.Err())
		}
	}
	for i, c := range ctxs {
		if i%2 == 1 {
			require.Equal(t, cause, context.Cause(c))
		} else {
			require.Equal(t, context.DeadlineExceeded, context.Cause(c))
		}
	}
	require.Equal(t, 1, w.Len(), "only the root is left")
	cancelRoot()
	require.Zero(t, w.Len())
}

// TestReview37PinParentWalkRacesKidsOwnEnds: commit 16abd6a's walk (context.go:402-407) clears
// each kid's next without the lock. Paused in the middle of the walk (the parent's ender inside
// the end of the middle kid), the other kids, already taken, are cancelled on other goroutines
// (removeKid must skip them: context.go:461), their deadlines fire, a new kid is made (born ended)
// and the middle kid's own cancel runs: no race (-race), every kid ends with the parent's error
// or its own, the timers all go, and an ended kid keeps none of its siblings.
func TestReview37PinParentWalkRacesKidsOwnEnds(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(start37)
	w, err := New(WithClock(clk), WithWorkers(2))
	require.NoError(t, err)
	defer w.Stop()

	parent, cancelParent := w.WithTimeout(context.Background(), time.Hour)
	type kid struct {
		cancel context.CancelFunc
		weak   weak.Pointer[deadlineCtx]
	}
	var kids []kid
	var middle context.Context
	for i := 0; i < 9; i++ {
		c, cancel := w.WithTimeout(parent, time.Duration(1+i%3)*time.Millisecond)
		if i == 4 {
			middle = c
		}
		kids = append(kids, kid{cancel, weak.Make(c.(*deadlineCtx))})
	}
	paused, resume := pauseEnder37(t, middle)
	parentDone := make(chan struct{})
	go func() { cancelParent(); close(parentDone) }()
	<-paused
	middle = nil
	var wg sync.WaitGroup
	for i, k := range kids {
		if i%2 == 0 {
			wg.Add(1)
			go func() { defer wg.Done(); k.cancel() }()
		}
	}
	wg.Add(1)
	go func() { // the deadlines of the kids the walk has not reached
		defer wg.Done()
		clk.Advance(2 * time.Millisecond)
	}()
	late, cancelLate := w.WithTimeout(parent, time.Hour)
	require.Equal(t, context.Canceled, late.Err(), "a kid made during the walk is born ended")
	cancelLate()
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select { // now: the middle kid's cancel (and its expiry) returns at once; a fix may wait
	case <-all:
	case <-time.After(200 * time.Millisecond):
	}
	resume()
	<-all
	<-parentDone
	testHookEnded.Store(nil) // the hook holds the middle kid
	require.Eventually(t, func() bool { return w.Len() == 0 }, 5*time.Second, time.Millisecond,
		"a kid's timer is left")
	for _, k := range kids {
		k.cancel()
	}
	for i, k := range kids {
		c := k.weak.Value()
		require.NotNil(t, c)
		require.True(t, isDone37(c))
		require.Contains(t, []error{context.Canceled, context.DeadlineExceeded}, c.Err(), "kid %d", i)
		require.Nil(t, c.next, "kid %d keeps a sibling", i)
		require.Nil(t, c.prev, "kid %d keeps a sibling", i)
	}
	require.Nil(t, parent.(*deadlineCtx).kids)
	kept := kids[len(kids)-1].weak.Value() // the newest: the head of the list the walk took
	kids = kids[:len(kids)-1]
	for i := range kids {
		kids[i].cancel = nil // a CancelFunc keeps its context
	}
	runtime.GC()
	runtime.GC()
	for i, k := range kids {
		require.Nil(t, k.weak.Value(), "kid %d is kept while its newest sibling is", i)
	}
	runtime.KeepAlive(kept)
}

var start38 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// lockedBag38 is a context wrapper of a common kind: a struct embedding its parent, with values
// of its own behind a mutex that its Value takes for every key (here a one-token semaphore, so
// that the test can break a deadlock it finds rather than hang: closing abort lets Value go on
// without the lock). Done, Err and Deadline are the parent's, so a wheel parent stays in the
// closed world (withDeadline finds it through Value(wheelCtxKey)).
type lockedBag38 struct {
	context.Context
	sem     chan struct{}
	abort   chan struct{}
	watch   atomic.Bool   // set once the setup is over: then a cancelCtxKey look is reported
	entered chan struct{} // closed at the first such look
	once    sync.Once
	vals    map[any]any
}

func newLockedBag38(parent context.Context) *lockedBag38 {
	return &lockedBag38{
		Context: parent,
		sem:     make(chan struct{}, 1),
		abort:   make(chan struct{}),
		entered: make(chan struct{}),
		vals:    map[any]any{},
	}
}

// lock takes the bag's lock, or reports false once abort is closed.
func (b *lockedBag38) lock() bool {
	select {
	case b.sem <- struct{}{}:
		return true
	case <-b.abort:
		return false
	}
}

func (b *lockedBag38) unlock() { <-b.sem }

func (b *lockedBag38) Value(key any) any {
	if b.watch.Load() && key == cancelCtxKey {
		b.once.Do(func() { close(b.entered) })
	}
	if b.lock() {
		defer b.unlock()
	}
	if v, ok := b.vals[key]; ok {
		return v
	}
	return b.Context.Value(key)
}

// TestReview38FixedSessionCloseDeadlocksWithShutdown: API.md asks for the standard library's
// behaviour "in every observable way". Review 37's fix makes a loser of end's CAS wait for the
// winner's finished bit (context.go:386, end -> awaitEnd, context.go:431-436), and the comment
// above end (context.go:373-374) argues "the winner never waits for a loser: it holds no lock of
// a loser's". But the winner runs user code: ending a wheel kid with its own end code
// (context.go:414, endParentCanceled), the kid's end calls its gate registration f
// (context.go:408-409), std's closure func() { q.cancel(false, gate.Err(), context.Cause(gate)) },
// and Cause(gate) -> ctxGate.Value (context_afterfunc.go:50-51) -> g.parent.Value(&cancelCtxKey):
// the Value of the wrapper the kid was made under. That wrapper is user code, and a common kind
// takes a lock: a session that embeds its context and keeps values behind a mutex, whose Close
// takes that mutex and calls the session context's CancelFunc. The interleaving:
//  1. G1 (the session's Close) takes the session's lock;
//  2. G2 (the server's shutdown) cancels the server context: its end ends the session context
//     (sctx.end(endParentCanceled) wins the CAS), whose end ends a request made under the session
//     (req.end wins) -> req's f -> Cause(req's gate) -> session.Value(&cancelCtxKey), which waits
//     for the lock;
//  3. G1 calls the session context's CancelFunc: sctx.end loses the CAS -> awaitEnd spins until
//     G2 sets sctx's finished bit, after G2's Value returns, which needs G1's lock. Neither G1
//     nor G2 ever returns.
//
// The same program on the standard library (first part of the test) completes: std's cancel
// passes err and cause down to its children (cancelCtx.cancel) and calls no Value, so the
// request's Done closes at the shutdown whatever the session's lock; and the session context's
// CancelFunc calls Value only on its own parent (removeChild: the server), never on the session
// wrapper below it. Before review 37 (84fb636) the loser returned at once and this program
// completed here too. Bounded: after 2 s the test lets the session's Value go on without the
// lock, and fails. Failed 5 of 5 (-race -count=5) on 2f7ff88: the order is forced by channels.
// Fixed since: ctxGate.Value asks the wheel parent for its q directly, so an ender runs no user
// code (as std's), and G2 ends everything without the session's lock.
func TestReview38FixedSessionCloseDeadlocksWithShutdown(t *testing.T) {
	defer goleak.VerifyNone(t)

	// The standard library: server, session context, session, a request under the session.
	{
		server, cancelServer := context.WithCancel(context.Background())
		sctx, cancelS := context.WithTimeout(server, time.Hour)
		session := newLockedBag38(sctx)
		req, cancelReq := context.WithTimeout(session, time.Minute)
		defer cancelReq()
		req.Done()
		require.True(t, session.lock()) // 1.
		done := make(chan struct{})
		go func() { cancelServer(); cancelS(); close(done) }() // 2. and 3., in this order
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			close(session.abort)
			<-done
			t.Fatal("std: the shutdown or the session's CancelFunc waited for the session's lock")
		}
		require.True(t, isDone37(req), "std: the request ended with the shutdown")
		session.unlock()
		require.Equal(t, context.Canceled, req.Err())
	}

	clk := NewManualClock(start38)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()

	server, cancelServer := w.WithTimeout(context.Background(), 2*time.Hour)
	sctx, cancelS := w.WithTimeout(server, time.Hour)
	session := newLockedBag38(sctx)
	req, cancelReq := w.WithTimeout(session, time.Minute)
	defer cancelReq()
	_, onWheel := req.(*deadlineCtx)
	require.True(t, onWheel, "the session keeps its context's Done: the request is a wheel context")
	req.Done() // a select on Done: q is made, and the request's end calls its registration
	session.watch.Store(true)

	closer := make(chan struct{})
	locked := make(chan struct{})
	shut := make(chan struct{})
	go func() { // G1: the session's Close
		defer close(closer)
		session.lock() // 1.
		close(locked)
		select {
		case <-session.entered: // 2. has come to the session's Value (before the fix)
		case <-shut: // or has ended everything without it (since)
		}
		cancelS() // 3.
		session.unlock()
	}()
	<-locked
	go func() { cancelServer(); close(shut) }() // G2: the shutdown

	deadlocked := false
	select {
	case <-closer:
	case <-time.After(2 * time.Second):
		deadlocked = true
		close(session.abort) // let G2's Value go on without the lock
		<-closer
	}
	<-shut
	require.False(t, deadlocked, "the session's CancelFunc, called under the session's lock, "+
		"waited forever for the shutdown's end of the session context, which waited for that "+
		"lock in the session's Value (for its request's Cause)")
	require.Equal(t, context.Canceled, sctx.Err())
	require.Equal(t, context.Canceled, req.Err())
	require.Zero(t, w.Len())
}

// TestReview38FixedCloseUnderWrapperLockSelfDeadlocks: the same root cause without any race, and
// older than review 37 (it fails on 84fb636 too). The session's Close takes the session's lock
// and calls the session context's CancelFunc, which wins the CAS: its end ends the request made
// under the session (context.go:414) and the request's f computes Cause(req's gate) ->
// session.Value(&cancelCtxKey) (context_afterfunc.go:50-51) on the same goroutine, under the
// lock it holds: a self-deadlock. On the standard library (first part) the CancelFunc never calls
// the Value of a wrapper below the context (cancelCtx.cancel passes err and cause down; removeChild
// asks the context's own parent). Bounded at 2 s, as above. Failed 5 of 5 on 2f7ff88
// (deterministic); fixed since, as above.
func TestReview38FixedCloseUnderWrapperLockSelfDeadlocks(t *testing.T) {
	defer goleak.VerifyNone(t)
	closeUnderLock := func(sctx context.Context, cancelS context.CancelFunc, session *lockedBag38,
		req context.Context) bool {
		req.Done()
		done := make(chan struct{})
		go func() {
			defer close(done)
			if session.lock() {
				defer session.unlock()
			}
			cancelS()
		}()
		select {
		case <-done:
			return true
		case <-time.After(2 * time.Second):
			close(session.abort)
			<-done
			return false
		}
	}

	sctx, cancelS := context.WithTimeout(context.Background(), time.Hour)
	session := newLockedBag38(sctx)
	req, cancelReq := context.WithTimeout(session, time.Minute)
	defer cancelReq()
	require.True(t, closeUnderLock(sctx, cancelS, session, req), "std: Close did not return")
	require.Equal(t, context.Canceled, req.Err())

	clk := NewManualClock(start38)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	sctx, cancelS = w.WithTimeout(context.Background(), time.Hour)
	session = newLockedBag38(sctx)
	req, cancelReq = w.WithTimeout(session, time.Minute)
	defer cancelReq()
	_, onWheel := req.(*deadlineCtx)
	require.True(t, onWheel)
	require.True(t, closeUnderLock(sctx, cancelS, session, req),
		"Close (the session's lock held, then the session context's CancelFunc) never returned: "+
			"the CancelFunc's end of the request asked the session's Value for its Cause")
	require.Equal(t, context.Canceled, req.Err())
	require.Zero(t, w.Len())
}

// TestReview38PinLoserWaitsAtOneP: the loser's wait is a runtime.Gosched loop (awaitEnd). With
// GOMAXPROCS(1) it must still let the winner finish: a manual clock with two workers fires a
// parent's and its kids' deadlines while the test cancels the kids and the parent at once, every
// winner yielding right after its CAS (testHookEnded) so that the others come to it as losers;
// every CancelFunc and Advance returns, and at each CancelFunc's return its context and every std
// child under it is done. (On 84fb636, before the losers waited, this fails.)
func TestReview38PinLoserWaitsAtOneP(t *testing.T) {
	defer goleak.VerifyNone(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	hook := func(*deadlineCtx) { runtime.Gosched() }
	testHookEnded.Store(&hook)
	defer testHookEnded.Store(nil)
	clk := NewManualClock(start38)
	w, err := New(WithClock(clk), WithWorkers(2), WithShards(2))
	require.NoError(t, err)
	defer w.Stop()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for round := range 300 {
			d := time.Duration(1+round%3) * time.Millisecond
			parent, cancelParent := w.WithTimeout(context.Background(), d)
			var kids []context.Context
			var cancels []context.CancelFunc
			for range 3 {
				k, cancel := w.WithTimeout(parent, d)
				std, cancelStd := context.WithCancel(k)
				defer cancelStd()
				kids = append(kids, k, std)
				cancels = append(cancels, cancel)
			}
			var wg sync.WaitGroup
			bad := make(chan string, 8)
			for i, cancel := range cancels {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cancel()
					if !isDone37(kids[2*i]) || !isDone37(kids[2*i+1]) {
						bad <- "a kid's CancelFunc returned before it (or its std child) was done"
					}
				}()
			}
			wg.Add(1)
			go func() { defer wg.Done(); clk.Advance(d) }()
			runtime.Gosched()
			cancelParent()
			for _, k := range kids {
				if !isDone37(k) {
					bad <- "the parent's CancelFunc returned before a descendant was done"
					break
				}
			}
			wg.Wait()
			close(bad)
			for s := range bad {
				t.Error(s)
				return
			}
		}
	}()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("a CancelFunc or an Advance did not return at GOMAXPROCS(1)")
	}
	require.Zero(t, w.Len())
}

// start39 is far in the future: a context that falls back to std under a ManualClock runs its
// timer on the real clock with a deadline on the manual clock's scale (withDeadline's doc).
var start39 = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)

// merged39 is a context wrapper of a known kind (a "merged" or "detached values" context): Done,
// Err and Deadline are those of the embedded context, and Value looks in a second context first
// (values), then in the embedded one. Its Done is the embedded context's, so a wheel context made
// under it whose embedded context is a wheel context is in the closed world (withDeadline finds
// the wheel parent through Value(wheelCtxKey), which values does not answer).
type merged39 struct {
	context.Context
	values context.Context
}

func (m merged39) Value(key any) any {
	if v := m.values.Value(key); v != nil {
		return v
	}
	return m.Context.Value(key)
}

// TestReview39FixedMergedWrapperCauseNotStd: API.md: "context.Cause ... behave as the standard
// library's in every observable way", through wrappers. m = merged39{P, V}: P a deadline context
// (the wheel's, or std's in the reference run), V = context.WithCancelCause(Background). Std: a
// context K made under m finds no *cancelCtx whose Done is m's Done (m.Value(&cancelCtxKey) is
// V's), so K's end and its cause come from m itself: child.cancel(false, m.Err(), Cause(m)), at
// once in propagateCancel if m is done, else on std's goroutine; and Cause(m) is V's cause (nil
// while V is live, and K's cause then becomes its err). Two cases:
//  1. P ends by its deadline, with causeP; then K2 = WithDeadline(m, P's deadline) is born ended,
//     and G under K2 too. Std: Cause(K2) == Cause(G) == DeadlineExceeded.
//  2. P (deadline 1h) live; K1 = WithTimeout(m, 30m) made; V canceled with causeV; P's CancelFunc.
//     Std: Cause(K1) == causeV.
//
// Before 4aaec8c the wheel asked the same (ctxGate.Value -> g.parent.Value(&cancelCtxKey) =
// m.Value) and agreed with std. Since, context_afterfunc.go:58 (case endParentCanceled,
// endParentDeadline: return g.pw.lazyQ()) reads P's q directly, past the wrapper the context was
// made under: Cause(K2) == Cause(G) == causeP, Cause(K1) == Canceled. Deterministic (ManualClock;
// std in a synctest bubble): failed 5 of 5 on 4aaec8c; passed on 2f7ff88. Fixed since: a wrapper
// parent must also lead std's cause lookup (Value(&cancelCtxKey)) to the wheel parent's q, or
// the context falls back to the standard library (causeFrom), so K1 and K2 are std's here.
func TestReview39FixedMergedWrapperCauseNotStd(t *testing.T) {
	defer goleak.VerifyNone(t)
	causeP, causeV := errors.New("P's deadline"), errors.New("V's cause")
	type run struct {
		withD func(p context.Context, d time.Duration) (context.Context, context.CancelFunc)
		withC func(p context.Context, d time.Duration, c error) (context.Context, context.CancelFunc)
		pass  func(d time.Duration)
	}
	body := func(t *testing.T, r run) []error {
		var out []error
		// 1.
		p, cancelP := r.withC(context.Background(), time.Second, causeP)
		defer cancelP()
		v, cancelV := context.WithCancelCause(context.Background())
		defer cancelV(nil)
		m := merged39{Context: p, values: v}
		r.pass(time.Second)
		k2, cancelK2 := r.withD(m, 0)
		defer cancelK2()
		g, cancelG := r.withD(k2, 0)
		defer cancelG()
		require.Equal(t, context.DeadlineExceeded, k2.Err())
		require.Equal(t, context.DeadlineExceeded, g.Err())
		out = append(out, context.Cause(p), context.Cause(k2), context.Cause(g))
		// 2.
		p, cancelP = r.withC(context.Background(), time.Hour, causeP)
		defer cancelP()
		v, cancelV = context.WithCancelCause(context.Background())
		defer cancelV(nil)
		m = merged39{Context: p, values: v}
		k1, cancelK1 := r.withD(m, 30*time.Minute)
		defer cancelK1()
		cancelV(causeV)
		cancelP()
		<-k1.Done() // std: its goroutine
		require.Equal(t, context.Canceled, k1.Err())
		return append(out, context.Cause(k1))
	}

	var std []error
	synctest.Test(t, func(t *testing.T) {
		// d is from the deadline of the first P: WithDeadline(m, that deadline) for d == 0
		var first time.Time
		std = body(t, run{
			withD: func(p context.Context, d time.Duration) (context.Context, context.CancelFunc) {
				if d == 0 {
					return context.WithDeadline(p, first)
				}
				return context.WithTimeout(p, d)
			},
			withC: func(p context.Context, d time.Duration, c error) (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithTimeoutCause(p, d, c)
				if first.IsZero() {
					first, _ = ctx.Deadline()
				}
				return ctx, cancel
			},
			pass: func(d time.Duration) { time.Sleep(d); synctest.Wait() },
		})
	})
	require.Equal(t, []error{causeP, context.DeadlineExceeded, context.DeadlineExceeded, causeV}, std,
		"std: K's cause is Cause(m) at its end")

	clk := NewManualClock(start39)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	var first time.Time
	got := body(t, run{
		withD: func(p context.Context, d time.Duration) (context.Context, context.CancelFunc) {
			var ctx context.Context
			var cancel context.CancelFunc
			if d == 0 {
				ctx, cancel = w.WithDeadline(p, first)
			} else {
				ctx, cancel = w.WithTimeout(p, d)
			}
			_, onWheel := ctx.(*deadlineCtx)
			require.False(t, onWheel, "m answers std's cause key with V's cancelCtx, not P's q: "+
				"a context made under m (or under one made there) is the standard library's")
			return ctx, cancel
		},
		withC: func(p context.Context, d time.Duration, c error) (context.Context, context.CancelFunc) {
			ctx, cancel := w.WithTimeoutCause(p, d, c)
			if first.IsZero() {
				first, _ = ctx.Deadline()
			}
			return ctx, cancel
		},
		pass: clk.Advance,
	})
	require.Equal(t, std, got, "Cause of P, K2 (born ended under m), G (K2's kid), K1 (ended by "+
		"P's cancel, V canceled with causeV): the wheel reads P's q past the wrapper m")
	require.Zero(t, w.Len())
}

// embed39 is a struct embedding its context, overriding Value for a key of its own only.
type embed39 struct {
	context.Context
	k, v any
}

func (e embed39) Value(key any) any {
	if key == e.k {
		return e.v
	}
	return e.Context.Value(key)
}

type key39 struct{}

// world39 builds a tree with the wheel's constructors or std's. Kinds of deadline: short (ends at
// fire), long (never ends in the test), past (born at its deadline).
type world39 struct {
	mk      func(p context.Context, kind int, cause error) (context.Context, context.CancelFunc)
	fire    func()
	cancels []func()
}

const (
	short39 = iota
	long39
	past39
)

func (wd *world39) dl(p context.Context, kind int, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := wd.mk(p, kind, cause)
	wd.cancels = append(wd.cancels, cancel)
	return ctx, cancel
}

func (wd *world39) std(p context.Context, cause error) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(p)
	wd.cancels = append(wd.cancels, func() { cancel(nil) })
	return ctx, cancel
}

// TestReview39PinTreesMatchStd: trees mixing wheel deadline contexts (causes at several levels),
// WithValue, a struct embedding a wheel context, std WithCancelCause / WithDeadlineCause /
// WithoutCancel / AfterFunc, parents ended by deadline and by cancel, kids born ended (parent
// ended, or past deadline): Err and Cause of every node equal those of the same tree built with
// the standard library only (run in a synctest bubble, fired by its fake clock).
func TestReview39PinTreesMatchStd(t *testing.T) {
	defer goleak.VerifyNone(t)
	cA, cB, cC, cS := errors.New("A"), errors.New("B"), errors.New("C"), errors.New("S")
	scenarios := map[string]func(wd *world39) []context.Context{
		"root deadline, wrappers, born-ended kids": func(wd *world39) []context.Context {
			r, _ := wd.dl(context.Background(), short39, cA)
			v := context.WithValue(r, key39{}, 1)
			k, _ := wd.dl(v, long39, cB)
			e := embed39{Context: k, k: key39{}, v: 2}
			g, _ := wd.dl(e, long39, cC)
			s1, _ := wd.std(g, nil)
			s2, c2 := context.WithDeadlineCause(k, time.Now().Add(time.Hour), cS)
			wd.cancels = append(wd.cancels, c2)
			stop := context.AfterFunc(g, func() {})
			wd.cancels = append(wd.cancels, func() { stop() })
			wo := context.WithoutCancel(k)
			lw, _ := wd.dl(wo, long39, cC)
			wd.fire()
			b1, _ := wd.dl(v, long39, cB) // born ended: parent ended by deadline
			b2, _ := wd.dl(embed39{Context: b1, k: 1, v: 1}, past39, cC)
			b3, _ := wd.std(b2, nil)
			return []context.Context{r, v, k, e, g, s1, s2, wo, lw, b1, b2, b3}
		},
		"middle deadline, root cancel later": func(wd *world39) []context.Context {
			r, cancelR := wd.dl(context.Background(), long39, cA)
			k, _ := wd.dl(context.WithValue(r, key39{}, 1), short39, cB)
			g, _ := wd.dl(embed39{Context: k}, long39, cC)
			s, _ := wd.std(g, nil)
			k2, _ := wd.dl(r, long39, cB)
			g2, _ := wd.dl(k2, long39, cC)
			wd.fire()
			cancelR()
			b, _ := wd.dl(r, long39, cC)
			bp, _ := wd.dl(k, past39, cA)
			return []context.Context{r, k, g, s, k2, g2, b, bp}
		},
		"root canceled, causes below, std in between": func(wd *world39) []context.Context {
			r, cancelR := wd.dl(context.Background(), long39, cA)
			s, cancelS := wd.std(r, nil)
			ks, _ := wd.dl(s, long39, cB) // under a std cancelCtx: std's own
			k, _ := wd.dl(r, short39, cB)
			sg, _ := wd.std(k, nil)
			cancelS(cS)
			cancelR()
			wd.fire()
			b, _ := wd.dl(embed39{Context: k}, past39, cC)
			return []context.Context{r, s, ks, k, sg, b}
		},
		"kid deadline, parent canceled after": func(wd *world39) []context.Context {
			r, cancelR := wd.dl(context.Background(), long39, cA)
			k, _ := wd.dl(r, short39, cB)
			g, _ := wd.dl(k, long39, nil)
			sd, c := context.WithDeadlineCause(g, time.Now().Add(time.Hour), cS)
			wd.cancels = append(wd.cancels, c)
			k2, cancelK2 := wd.dl(r, long39, cB)
			g2, _ := wd.dl(k2, short39, cC)
			cancelK2()
			wd.fire()
			cancelR()
			return []context.Context{r, k, g, sd, k2, g2}
		},
	}
	type res struct{ err, cause []error }
	look := func(ctxs []context.Context) res {
		var r res
		for _, c := range ctxs {
			r.err = append(r.err, c.Err())
			r.cause = append(r.cause, context.Cause(c))
		}
		return r
	}
	for name, sc := range scenarios {
		var want res
		synctest.Test(t, func(t *testing.T) {
			wd := &world39{
				mk: func(p context.Context, kind int, cause error) (context.Context, context.CancelFunc) {
					d := map[int]time.Duration{short39: time.Second, long39: time.Hour, past39: -time.Second}[kind]
					return context.WithTimeoutCause(p, d, cause)
				},
				fire: func() { time.Sleep(time.Second); synctest.Wait() },
			}
			want = look(sc(wd))
			for _, c := range wd.cancels {
				c()
			}
			synctest.Wait()
		})
		clk := NewManualClock(start39)
		w, err := New(WithClock(clk), WithWorkers(0))
		require.NoError(t, err)
		wd := &world39{
			mk: func(p context.Context, kind int, cause error) (context.Context, context.CancelFunc) {
				d := map[int]time.Duration{short39: time.Second, long39: time.Hour, past39: -time.Second}[kind]
				return w.WithTimeoutCause(p, d, cause)
			},
			fire: func() { clk.Advance(time.Second) },
		}
		got := look(sc(wd))
		require.Equal(t, want, got, name)
		for _, c := range wd.cancels {
			c()
		}
		require.Zero(t, w.Len(), name)
		w.Stop()
	}
}

// TestReview39PinRacingKidsUnderLockedWrapper: a parent P (deadline with causeP) ends by its
// timer on one goroutine while another makes kids under a locking wrapper of P (lockedBag38), so
// that a kid (deadline and cause P's own, so that whichever timer ends it, err and cause are P's)
// is born ended, loses addKid to P's ender, is linked and ended by it, or ends by its own timer. Then, with
// the wrapper's lock held, the kid's CancelFunc, Err, Cause, a grandkid's and a std child's all
// return (bounded: 2 s) with P's err and cause, as std's; no end waits for the wrapper's lock,
// and nothing spins for a finished bit that is never set. Under -race: pw and the state word.
func TestReview39PinRacingKidsUnderLockedWrapper(t *testing.T) {
	defer goleak.VerifyNone(t)
	causeP := errors.New("P's deadline")
	clk := NewManualClock(start39)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	for i := 0; i < 200; i++ {
		p, cancelP := w.WithTimeoutCause(context.Background(), time.Millisecond, causeP)
		dl, _ := p.Deadline()
		bag := newLockedBag38(p)
		advanced := make(chan struct{})
		go func() { clk.Advance(time.Millisecond); close(advanced) }()
		// P's deadline, and its cause: whichever timer ends k, its err and cause are P's
		k, cancelK := w.WithDeadlineCause(bag, dl, causeP)
		_, onWheel := k.(*deadlineCtx)
		require.True(t, onWheel)
		done := make(chan []error)
		go func() {
			require.True(t, bag.lock())
			defer bag.unlock()
			<-advanced
			g, cancelG := w.WithTimeout(k, time.Hour)
			s, cancelS := context.WithCancel(k)
			cancelK()
			out := []error{k.Err(), context.Cause(k), g.Err(), context.Cause(g), s.Err(), context.Cause(s)}
			cancelG()
			cancelS()
			done <- out
		}()
		select {
		case out := <-done:
			require.Equal(t, []error{context.DeadlineExceeded, causeP, context.DeadlineExceeded, causeP,
				context.DeadlineExceeded, causeP}, out, "iteration %d", i)
		case <-time.After(2 * time.Second):
			close(bag.abort)
			<-done
			t.Fatalf("iteration %d: a CancelFunc, Err or Cause under the wrapper's lock waited", i)
		}
		cancelP()
	}
	require.Zero(t, w.Len())
}
