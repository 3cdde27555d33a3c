package shardwheel

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestContextChildOfEndingParentKeepsCause: a child made while its parent's ender is paused
// between the CAS that ends the parent and the cancel that closes its Done and sets its cause is
// born ended with the parent's cause, as std's would be: context.Cause(child) is the parent's
// WithTimeoutCause cause, not DeadlineExceeded. The child's constructor waits in the parent's Err
// for the ender to finish.
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

// TestContextEndedKidKeepsNoSibling: a parent's ender takes its list of kids and walks it; a kid
// it has ended keeps none of its older siblings reachable through its link, so a caller holding
// the newest kid of a cancelled parent does not keep the others (and what they hold) alive.
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

// TestContextRootCancelEndsChainWithCanceled: cancelling the root of a chain of four wheel
// contexts ends every one of them with context.Canceled (Err and Cause), as the standard
// library's chain does, and releases every timer. From the grandchild down, a context's end code
// comes from a parent that its own parent ended (endParentCanceled), which must map to Canceled
// again (fromParent), not to DeadlineExceeded.
func TestContextRootCancelEndsChainWithCanceled(t *testing.T) {
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

// TestContextLateCancelSparesReusedEntry: the CancelFunc of a context whose timer fired, called
// after the entry went back to the slab and its slab block was trimmed and grown again for a new
// timer at the same index, does nothing to that timer: it stays pending and fires once, and the
// context keeps DeadlineExceeded.
func TestContextLateCancelSparesReusedEntry(t *testing.T) {
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

type ctxFiringKey struct{}

// ctxFiringRig is the argument of the callback that cancels a context whose deadline timer the
// shard fired in the same round, just before it.
type ctxFiringRig struct {
	ctx       context.Context
	cancel    context.CancelFunc
	p         weak.Pointer[ctxPayload]
	firing    bool // the context's timer was fired (not started) when the callback ran
	errBefore error
	collected bool
}

// TestContextCancelWhileTimerFiringLetsGo: API.md, of the deadline contexts: "the cancel func
// releases it at once (Len drops); once cancelled, nothing of the context is kept reachable by
// the wheel." The context's deadline timer has fired (taken from the wheel, not started) in the
// batch of a callback that runs first and cancels the context, live until then: by the time the
// cancel returns, the firing entry has let go of the context (its argument), and so of the
// parent's values, without waiting for its own turn to run.
func TestContextCancelWhileTimerFiringLetsGo(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	// A tick of 10 ms: the callback (due at 1 ms) and the context's timer (5 ms) come due in
	// the same round of the Advance, the callback first.
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0), WithTick(10*time.Millisecond))
	require.NoError(t, err)
	defer w.Stop()

	rig := &ctxFiringRig{}
	var ctxTimer Timer
	_, err = w.AfterFuncArg(time.Millisecond, func(arg any) {
		r := arg.(*ctxFiringRig)
		e := ctxTimer.s.slab.at(ctxTimer.i)
		r.firing = isGen(e.state.Load(), ctxTimer.gen) && isState(e.state.Load(), stFiring)
		r.errBefore = r.ctx.Err()
		r.cancel()
		r.ctx, r.cancel = nil, nil
		r.collected = collected(r.p)
	}, rig)
	require.NoError(t, err)
	func() {
		p := new(ctxPayload)
		rig.p = weak.Make(p)
		parent := context.WithValue(context.Background(), ctxFiringKey{}, p)
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

// ctxStart is where the manual clocks of these tests start.
var ctxStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// ctxPauseEnder pauses the ender of c right after its CAS (testHookEnded) and returns a channel
// closed once it is paused and a func that lets it go on (idempotent).
func ctxPauseEnder(t *testing.T, c context.Context) (paused <-chan struct{}, resume func()) {
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

// ctxIsDone reports whether ctx's Done channel is closed now.
func ctxIsDone(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// ctxCancelThenLook calls cancel on a goroutine and reports, for each of ctxs, whether it was done
// the moment cancel returned. If cancel has not returned within 200 ms (it waits, as std's
// would, for an ender paused by the test), resume is called so that it can return.
func ctxCancelThenLook(cancel func(), resume func(), ctxs ...context.Context) []bool {
	seen := make(chan []bool, 1)
	go func() {
		cancel()
		done := make([]bool, len(ctxs))
		for i, c := range ctxs {
			done[i] = ctxIsDone(c)
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

// TestContextCancelReturnsAfterDeadlineEnd: the contexts behave as the standard library's, whose
// timerCtx ends under its mutex, by its timer or by its CancelFunc: a CancelFunc that comes while
// the timer's end is under way waits for it, and when it returns Done is closed and every child
// is canceled. Here the deadline's ender wins the CAS that ends the context and is paused right
// after it (testHookEnded; preemption can do the same), before it closes Done and ends the std
// child. The CancelFunc, called then, loses the CAS and must not return before the ender has
// finished (awaitEnd): at its return the context and its std child are both done.
func TestContextCancelReturnsAfterDeadlineEnd(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(ctxStart)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()

	ctx, cancel := w.WithTimeout(context.Background(), time.Millisecond)
	child, cancelChild := context.WithCancel(ctx) // a std child: in q's children map
	defer cancelChild()
	paused, resume := ctxPauseEnder(t, ctx)
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(advanced) }()
	<-paused
	seen := ctxCancelThenLook(cancel, resume, ctx, child)
	<-advanced
	require.Equal(t, []bool{true, true}, seen,
		"cancel returned while the context (and its std child) was not done")
}

// TestContextParentCancelReturnsAfterKidEnd: API.md: "cancelling a parent (standard or not) has
// ended this context and every context derived from it by the time the parent's cancel returns".
// A wheel kid's own CancelFunc, on another goroutine, wins the CAS that ends the kid and is
// paused right after it, before it closes the kid's Done and ends its subtree. The parent's
// cancel then walks its kids and loses the kid's CAS: as in std, where the parent's cancel takes
// the kid's mutex and so waits for the kid's own cancel, it must not return before that end has
// finished. At its return the parent, the kid, a std grandchild and a wheel grandchild are all
// done. (A kid ended by its own deadline at that moment is the same case.)
func TestContextParentCancelReturnsAfterKidEnd(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(ctxStart)
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

	paused, resume := ctxPauseEnder(t, kid)
	kidCancelled := make(chan struct{})
	go func() { cancelKid(); close(kidCancelled) }()
	<-paused
	seen := ctxCancelThenLook(cancelParent, resume, parent, kid, stdGrand, wheelGrand)
	<-kidCancelled
	require.Equal(t, []bool{true, true, true, true}, seen,
		"the parent's cancel returned while a descendant was not done")
}

// TestContextDoneExactlyWhenAdvanceReachesDeadline: with WithWorkers(0), when Advance returns
// every timer due has run: a deadline context is done exactly when Advance has reached its
// deadline, never while Now is before it (not even by a nanosecond), for deadlines a fraction of
// a tick apart and across ticks, on two shards. Err is DeadlineExceeded and Cause the given cause
// (else DeadlineExceeded), as std's. A std child made through a wrapper (WithValue) is done with
// it, with the same Err and Cause, and still sees the wrapper's value; a cancel after the
// deadline changes nothing; String names the ancestry; every timer is released.
func TestContextDoneExactlyWhenAdvanceReachesDeadline(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(ctxStart)
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(2), WithTick(time.Millisecond))
	require.NoError(t, err)
	defer w.Stop()

	type valueKey struct{}
	cause := errors.New("too slow")
	root, cancelRoot := w.WithTimeout(context.Background(), time.Hour)
	defer cancelRoot()
	var (
		ctxs, kids []context.Context
		cancels    []context.CancelFunc
	)
	add := func(c context.Context, cancel context.CancelFunc) {
		kid, cancelKid := context.WithCancel(context.WithValue(c, valueKey{}, len(ctxs)))
		t.Cleanup(cancelKid)
		ctxs, kids, cancels = append(ctxs, c), append(kids, kid), append(cancels, cancel)
	}
	for i := 1; i <= 40; i++ { // odd indices: a cause, under the wheel root
		d := time.Duration(i) * 130 * time.Microsecond
		if i%2 == 0 {
			add(w.WithTimeoutCause(root, d, cause))
		} else {
			add(w.WithDeadline(context.Background(), clk.Now().Add(d)))
		}
	}
	add(w.WithTimeoutCause(context.Background(), 10*time.Millisecond, cause)) // the last, with a cause
	last := ctxs[len(ctxs)-1]
	require.Equal(t, 42, w.Len(), "each deadline is a timer")
	check := func() {
		t.Helper()
		now := clk.Now()
		for j, c := range ctxs {
			dl, _ := c.Deadline()
			if now.Before(dl) {
				require.False(t, ctxIsDone(c), "done %v before its deadline", dl.Sub(now))
				require.NoError(t, c.Err())
				require.False(t, ctxIsDone(kids[j]), "a std child done %v before the deadline", dl.Sub(now))
				require.NoError(t, kids[j].Err())
				continue
			}
			require.True(t, ctxIsDone(c), "not done %v after its deadline", now.Sub(dl))
			require.Equal(t, context.DeadlineExceeded, c.Err())
			require.True(t, ctxIsDone(kids[j]), "a std child live %v after the deadline", now.Sub(dl))
			require.Equal(t, context.DeadlineExceeded, kids[j].Err())
		}
	}
	for step := 0; step < 60; step++ {
		clk.Advance(100 * time.Microsecond)
		check()
	}
	dl, _ := last.Deadline()
	clk.Advance(dl.Sub(clk.Now()) - 1)
	check()
	require.NoError(t, last.Err(), "done a nanosecond before its deadline")
	clk.Advance(1)
	check()
	for j, c := range ctxs {
		want := error(context.DeadlineExceeded)
		if j%2 == 1 || c == last {
			want = cause
		}
		require.Equal(t, want, context.Cause(c), "context %d", j)
		require.Equal(t, want, context.Cause(kids[j]), "the std child of context %d", j)
		require.Equal(t, j, kids[j].Value(valueKey{}))
		require.True(t, strings.HasPrefix(kids[j].(interface{ String() string }).String(),
			"context.Background.WithDeadline("), "the std child of context %d: %v", j, kids[j])
	}
	require.Equal(t, 1, w.Len(), "only the root is left")
	for _, cancel := range cancels {
		cancel()
	}
	for _, c := range ctxs {
		require.Equal(t, context.DeadlineExceeded, c.Err(), "a cancel after the deadline changed Err")
	}
	cancelRoot()
	require.Zero(t, w.Len())
	requireBalanced(t, w)
	require.Equal(t, w.Stats().Fired, w.Stats().Lateness.Count())
}

// TestContextParentEndRacesKidsOwnEnds: a parent's ender takes its whole list of kids under its
// lock, then walks it without the lock, clearing each kid's links as it goes. With the walk
// paused inside the end of the middle kid, every other kid (some already ended by the walk, some
// not reached yet, and the middle one) is cancelled on a goroutine of its own (removeKid leaves a
// taken kid alone), the deadlines of the kids not reached yet fire, and a new kid is made, born
// ended with Canceled. No data race (-race); every kid ends with the parent's error or its own;
// every timer goes; the parent keeps no kid, and an ended kid keeps none of its siblings.
func TestContextParentEndRacesKidsOwnEnds(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(ctxStart)
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
	paused, resume := ctxPauseEnder(t, middle)
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
	select { // the middle kid's cancel (and its expiry) wait for its paused ender: let them come to it
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
		require.True(t, ctxIsDone(c))
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

// TestContextEndLoserWaitsAtOneP: the loser's wait is a runtime.Gosched loop (awaitEnd). With
// GOMAXPROCS(1) it must still let the winner finish: a manual clock with two workers fires a
// parent's and its kids' deadlines while the test cancels the kids and the parent at once, every
// winner yielding right after its CAS (testHookEnded) so that the others come to it as losers;
// every CancelFunc and Advance returns, and at each CancelFunc's return its context and every std
// child under it is done.
func TestContextEndLoserWaitsAtOneP(t *testing.T) {
	defer goleak.VerifyNone(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	hook := func(*deadlineCtx) { runtime.Gosched() }
	testHookEnded.Store(&hook)
	defer testHookEnded.Store(nil)
	clk := NewManualClock(ctxStart)
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
					if !ctxIsDone(kids[2*i]) || !ctxIsDone(kids[2*i+1]) {
						bad <- "a kid's CancelFunc returned before it (or its std child) was done"
					}
				}()
			}
			wg.Add(1)
			go func() { defer wg.Done(); clk.Advance(d) }()
			runtime.Gosched()
			cancelParent()
			for _, k := range kids {
				if !ctxIsDone(k) {
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
