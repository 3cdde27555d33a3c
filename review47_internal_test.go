package shardwheel

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 47: an attack on Wheel.Stop from callbacks (65bc96a's stopsDone, c664446's "outermost
// only", ccd5217, 0165483).

// nestedRound47 runs one round of the nested-Stop barrier and reports whether C's barrier saw the
// other later Stop return (false: it waited 3 s for it, a deadlock).
func nestedRound47(t *testing.T) (saw bool) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(2), WithShards(1), WithQueueSize(4))
	require.NoError(t, err)
	require.Equal(t, 1, cap(w.pool.queue))

	in := make(chan int, 2)
	goCh := make(chan struct{})
	outs := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	rets := make(chan int, 3)
	f := func() { // K and J, one on each worker
		i := w.workerIndex(goid())
		in <- i
		<-goCh
		rets <- w.Stop()
		close(outs[i])
	}
	_, err = w.AfterFunc(time.Millisecond, f)
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Millisecond, f)
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	a, b := waitFor(t, in, "K"), waitFor(t, in, "J")
	require.ElementsMatch(t, []int{0, 1}, []int{a, b})

	cDone := make(chan bool, 1)
	_, err = w.AfterFunc(time.Millisecond, func() { // C: drained by K's or J's Stop
		i := w.workerIndex(goid())
		rets <- w.Stop() // nested in the Stop that drained C
		select {         // a barrier: the other worker's Stop returns
		case <-outs[1-i]:
			cDone <- true
		case <-time.After(3 * time.Second):
			w.stopMu.Lock()
			s0, d0 := stopDepthLocked(w, 0)
			s1, d1 := stopDepthLocked(w, 1)
			t.Logf("C on worker %d stuck: stops/drains on worker 0 %d/%d, on worker 1 %d/%d",
				i, s0, d0, s1, d1)
			w.stopMu.Unlock()
			cDone <- false
		}
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, len(w.pool.queue), "C waits in the queue")
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)

	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
		"the first Stop waits for the workers")
	close(goCh)
	saw = waitFor(t, cDone, "C's barrier")
	waitFor(t, outs[0], "worker 0's Stop")
	waitFor(t, outs[1], "worker 1's Stop")
	require.Equal(t, 1, waitFor(t, first, "the first Stop"))
	for range 3 {
		require.Zero(t, <-rets)
	}
	st := booksBalance(t, w)
	require.Equal(t, uint64(1), st.Dropped)
	require.Equal(t, uint64(3), st.Fired)
	return saw
}

// TestReview47FixedNestedStopReturnKeepsLaterStopWaiting: Stop's doc: "Called from inside a
// callback, Stop ... waits for every other callback but not for ... callbacks that are themselves
// inside a Stop (two callbacks that each waited for the other would never return) ..., nor for
// what their goroutine runs after that Stop returns"; README: "each returns once the other is in
// Stop, and what the other's goroutine runs after that is not waited for". Review 44 fixed this
// for a callback's own Stop (stopsDone); review 45 (c664446) counts in stopsDone only the
// outermost Stop of a goroutine, so a Stop called from a callback that another Stop drained does
// not count: once it returns, the slot reads as running a drained callback again (inStop ==
// drained), and a later Stop that waited for that callback goes on waiting for the rest of it.
//
//  1. Two workers run K and J; C waits in the queue; a goroutine outside runs the first Stop.
//  2. K and J call later Stops (S_K, S_J); each finds the other inside a Stop; one (say S_K)
//     drains C, and S_J, its queue empty, waits for worker 0 (running drained C) at step 4.
//  3. C calls Stop (S2, nested): worker 0 is quiet, S_J is woken; S2 finds worker 1 inside S_J
//     and returns at once (S_J has not looked yet: it was only made runnable).
//  4. C, back from S2, waits for S_J to return (a barrier after Stop, as review 44's callbacks);
//     S_J now looks: inStop[0] == drained[0] == 1, stopsDone[0] unchanged: not quiet. Both wait.
//
// Nothing of this is a documented limit: C was inside a Stop while S_J waited for it, and S_J
// waits for what C's goroutine runs after that Stop returned. Racy only in whether S_J gets to
// look while S2 runs (S2 takes microseconds; S_J was just readied on S2's P): 5 rounds, any
// stuck one fails the test.
func TestReview47FixedNestedStopReturnKeepsLaterStopWaiting(t *testing.T) {
	defer goleak.VerifyNone(t)
	const rounds = 5
	stuck := 0
	for range rounds {
		if !nestedRound47(t) {
			stuck++
		}
	}
	require.Zero(t, stuck,
		"in %d of %d rounds a later Stop waited (3 s) for the rest of callback C after C's own (nested) Stop returned, while C waited for it",
		stuck, rounds)
}

// TestReview47PinLaterStopDrainEndsQueuedDeadlineContext (pin): API.md: callbacks "already handed
// to the worker pool, run to their end before Stop returns", and a deadline context's timer is a
// callback like any other. The only worker runs K; a WithTimeout context's deadline fires and its
// ender waits in the queue behind K; a goroutine outside runs the first Stop (it drops the one
// pending timer and waits for the worker). K then calls a later Stop, which drains the queue: the
// context has ended with DeadlineExceeded by the time K's Stop returns, the first Stop returns 1
// (the deadline is not counted as dropped: it fired before Stop), and the books balance.
func TestReview47PinLaterStopDrainEndsQueuedDeadlineContext(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(4))
	require.NoError(t, err)

	kIn, kGo := make(chan struct{}), make(chan struct{})
	type res struct {
		ret int
		err error
	}
	kOut := make(chan res, 1)
	var ctxErr func() error
	_, err = w.AfterFunc(time.Millisecond, func() { // K, on the only worker
		close(kIn)
		<-kGo
		r := w.Stop()
		kOut <- res{r, ctxErr()}
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, kIn, "K to start")
	ctx, cancel := w.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	ctxErr = ctx.Err
	clk.Advance(time.Millisecond) // the deadline fires: its ender waits in the queue
	require.Equal(t, 1, len(w.pool.queue), "the context's ender waits in the queue")
	require.NoError(t, ctx.Err(), "the context has not ended: its ender has not run")
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)

	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
		"the first Stop waits for the worker")
	close(kGo)
	r := waitFor(t, kOut, "K's later Stop")
	require.Zero(t, r.ret)
	require.ErrorIs(t, r.err, context.DeadlineExceeded, "K's Stop returned before the queued ender ran")
	require.Equal(t, 1, waitFor(t, first, "the first Stop"))
	waitFor(t, ctx.Done(), "the context's end")
	st := booksBalance(t, w)
	require.Equal(t, uint64(1), st.Dropped)
	require.Equal(t, uint64(2), st.Fired)
}

// TestReview47PinEveryDrainedByLaterStopStopsAgain (pin): Stop's doc: "the first Stop returns how
// many timers were pending and will now never run"; runPeriodic: a run that starts once Stop has
// begun has no next run to count. On the only worker K runs; an Every's first run fires and
// waits in the queue; a goroutine outside runs the first Stop (it drops the one pending timer,
// a 1 h one). K calls a later Stop, whose drain runs the Every's run; its f calls Stop again
// (nested, on the same worker), which returns 0 at once. The first Stop returns exactly 1 (the
// run drained after Stop began counts no next run), the Every never runs again, and the books
// balance.
func TestReview47PinEveryDrainedByLaterStopStopsAgain(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(4))
	require.NoError(t, err)

	kIn, kGo := make(chan struct{}), make(chan struct{})
	rets := make(chan int, 2)
	_, err = w.AfterFunc(time.Millisecond, func() {
		close(kIn)
		<-kGo
		rets <- w.Stop()
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, kIn, "K to start")
	runs := make(chan struct{}, 4)
	_, err = w.Every(time.Millisecond, func() {
		runs <- struct{}{}
		rets <- w.Stop()
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, len(w.pool.queue), "the Every's run waits in the queue")
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)

	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
		"the first Stop waits for the worker")
	close(kGo)
	require.Equal(t, 1, waitFor(t, first, "the first Stop"))
	require.Zero(t, <-rets)
	require.Zero(t, <-rets)
	require.Len(t, runs, 1)
	clk.Advance(time.Hour)
	require.Len(t, runs, 1, "the Every ran again after Stop")
	require.Zero(t, w.Stop())
	st := booksBalance(t, w)
	require.Equal(t, uint64(1), st.Dropped)
	require.Equal(t, uint64(2), st.Fired)
	require.Zero(t, w.Len())
}

// advancerNestedRound47 is nestedRound47 with the manual advancer in the place of one worker:
// one worker, CallerRuns, a queue of one chunk. K runs on the worker; C fills the queue; an
// Advance on a goroutine of its own runs Z itself (no room). A goroutine outside runs the first
// Stop (it waits for advMu, which the advance holds). K and Z then call later Stops; one of them
// drains C, which calls Stop (nested) and then waits for the other's Stop to return. It reports
// whether C saw it return.
func advancerNestedRound47(t *testing.T) (saw bool) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1),
		WithFullPolicy(CallerRuns))
	require.NoError(t, err)

	kIn, zIn, goCh := make(chan struct{}), make(chan struct{}), make(chan struct{})
	kOut, zOut := make(chan struct{}), make(chan struct{})
	rets := make(chan int, 3)
	_, err = w.AfterFunc(time.Millisecond, func() { // K, on the only worker
		close(kIn)
		<-goCh
		rets <- w.Stop()
		close(kOut)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, kIn, "K to start")
	cDone := make(chan bool, 1)
	_, err = w.AfterFunc(time.Millisecond, func() { // C, drained by K's or Z's Stop
		other := zOut
		if w.advancer.Load() == goid() {
			other = kOut
		}
		rets <- w.Stop()
		select {
		case <-other:
			cDone <- true
		case <-time.After(3 * time.Second):
			w.stopMu.Lock()
			s0, d0 := stopDepthLocked(w, 0)
			sa, da := stopDepthLocked(w, 1)
			t.Logf("C (on the advancer: %v) stuck: stops/drains on the worker %d/%d, on the advancer %d/%d",
				other == kOut, s0, d0, sa, da)
			w.stopMu.Unlock()
			cDone <- false
		}
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, len(w.pool.queue), "C fills the queue")
	_, err = w.AfterFunc(time.Millisecond, func() { // Z, on the advancer
		close(zIn)
		<-goCh
		rets <- w.Stop()
		close(zOut)
	})
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(advanced) }()
	waitFor(t, zIn, "Z to start on the advancer")

	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.closing) }, 5*time.Second, time.Millisecond,
		"the first Stop began")
	close(goCh)
	saw = waitFor(t, cDone, "C's barrier")
	waitFor(t, kOut, "K's Stop")
	waitFor(t, zOut, "Z's Stop")
	waitFor(t, advanced, "the Advance")
	require.Equal(t, 1, waitFor(t, first, "the first Stop"))
	for range 3 {
		require.Zero(t, <-rets)
	}
	st := booksBalance(t, w)
	require.Equal(t, uint64(1), st.Dropped)
	require.Equal(t, uint64(3), st.Fired)
	return saw
}

// TestReview47FixedNestedStopReturnKeepsLaterStopWaitingAdvancer: the same contract sentence and
// the same hole as TestReview47FixedNestedStopReturnKeepsLaterStopWaiting, through the advancer's
// slot (laterStop's steps 1 and 5, awaitQuiet(advSlot)):
//
//  1. One worker runs K; C fills the queue (one chunk); an Advance runs Z on its own goroutine
//     (CallerRuns); a goroutine outside runs the first Stop, waiting for advMu.
//  2. K calls a later Stop S_K: it waits at step 1 for the advancer. Z calls a later Stop S_Z on
//     the advancer: S_K is inside a Stop, so S_Z drains C (on the advancer: drained[adv] == 1),
//     and S_K, woken, finds the advancer running C and waits again.
//  3. C calls Stop (S2, nested): the advancer's slot is quiet, S_K is readied; S2 finds the
//     worker inside S_K and returns.
//  4. C waits for S_K to return; S_K looks: inStop[adv] == drained[adv] == 1, stopsDone and
//     advOver unchanged (the advance goes on): not quiet. Both wait.
//
// (If S_K wins C instead, the roles swap: C runs on the worker and waits for S_Z.)
func TestReview47FixedNestedStopReturnKeepsLaterStopWaitingAdvancer(t *testing.T) {
	defer goleak.VerifyNone(t)
	const rounds = 5
	stuck := 0
	for range rounds {
		if !advancerNestedRound47(t) {
			stuck++
		}
	}
	require.Zero(t, stuck,
		"in %d of %d rounds a later Stop waited (3 s) for the rest of callback C after C's own (nested) Stop returned, while C waited for it",
		stuck, rounds)
}
