package shardwheel

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 48: an attack on 21398ac (stopwait.go: per-slot stacks of Stop and drain frames replace
// inStop, drained and stopsDone).

// frameless48 reports whether every slot's stack of frames is empty (stopDepthLocked).
func frameless48(w *Wheel) bool {
	w.stopMu.Lock()
	defer w.stopMu.Unlock()
	for k := range w.frames {
		if s, d := stopDepthLocked(w, k); s+d != 0 {
			return false
		}
	}
	return true
}

// barrierFirst48 runs one round of the barrier with the first Stop called from a callback. Two
// callbacks run on two workers: A calls the first Stop; B, once A's Stop began (closing is
// closed), calls a later one. Each then waits up to 3 s for the other's Stop to have returned (a
// barrier after Stop, as review 44's and 47's callbacks). It reports whether A and B each saw
// the other's Stop return.
func barrierFirst48(t *testing.T, clk *ManualClock, opts ...Option) (aSaw, bSaw bool) {
	t.Helper()
	opts = append([]Option{WithWorkers(2), WithShards(2), WithQueueSize(2 * maxChunk)}, opts...)
	if clk != nil {
		opts = append(opts, WithClock(clk))
	}
	w, err := New(opts...)
	require.NoError(t, err)

	in := make(chan struct{}, 2)
	goCh := make(chan struct{})
	aOut, bOut := make(chan struct{}), make(chan struct{})
	aDone, bDone := make(chan struct{}), make(chan struct{})
	var aRet, bRet atomic.Int64
	var aSawB, bSawA atomic.Bool
	var n atomic.Int32
	f := func() {
		in <- struct{}{}
		<-goCh
		if n.Add(1) == 1 { // A: the first Stop
			defer close(aDone)
			aRet.Store(int64(w.Stop()))
			close(aOut)
			select {
			case <-bOut:
				aSawB.Store(true)
			case <-time.After(3 * time.Second):
			}
			return
		}
		defer close(bDone) // B: a later Stop, called while A is inside the first
		for !isClosed(w.closing) {
			time.Sleep(50 * time.Microsecond)
		}
		bRet.Store(int64(w.Stop()))
		close(bOut)
		select {
		case <-aOut:
			bSawA.Store(true)
		case <-time.After(3 * time.Second):
		}
	}
	_, err = w.AfterFunc(time.Hour, func() {}) // pending: the first Stop returns 1
	require.NoError(t, err)
	if clk != nil {
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
		clk.Advance(time.Millisecond) // two chunks, one for each worker
		waitFor(t, in, "the first callback")
		waitFor(t, in, "the second callback")
	} else {
		// As TestStopFromTwoCallbacks: the second is armed once the first runs, whose worker
		// let go of the keeper role and of the shard, so the other worker runs it.
		for i := range 2 {
			_, err = w.AfterFunc(0, f)
			require.NoError(t, err)
			waitFor(t, in, []string{"the first callback", "the second callback"}[i])
		}
	}
	require.Equal(t, 1, w.Len(), "both callbacks run, one on each worker")
	close(goCh)
	waitFor(t, aDone, "A")
	waitFor(t, bDone, "B")
	require.EqualValues(t, 1, aRet.Load())
	require.Zero(t, bRet.Load())
	require.Zero(t, w.Stop())
	for i, d := range w.pool.done {
		require.True(t, isClosed(d), "worker %d", i)
	}
	require.True(t, frameless48(w), "every slot's stack is empty")
	st := booksBalance(t, w)
	require.Equal(t, uint64(1), st.Dropped)
	require.Equal(t, uint64(2), st.Fired)
	return aSawB.Load(), bSawA.Load()
}

// TestReview48FixedFirstStopFromCallbackWaitsForRestOfLaterStopCallback: Stop's doc: "Called from
// inside a callback, Stop (the first call or a later one) waits for every other callback but not
// for the one it is called from, nor for callbacks that are themselves inside a Stop (two
// callbacks that each waited for the other would never return ...), nor for the rest of them and
// of the callbacks that fired with them after that Stop returns"; README's Limits name one
// deadlock only (review 44's, the first Stop from a worker waiting for an Advance). The first
// Stop, though, waits for every other worker to exit (finishStop: <-done), that is for the whole
// of every other callback, also the rest of one whose own Stop has returned:
//
//  1. A (worker 0) and B (worker 1) run; A calls Stop, the first: it closes closing and quit and
//     waits for worker 1 to exit.
//  2. B calls Stop, a later one: worker 0 is inside a Stop (quiet), the queue is empty: it returns.
//  3. B waits for A's Stop to return (the barrier); A's Stop waits for worker 1, which runs B.
//
// By the doc, A's Stop does not wait for the rest of B after B's Stop returned: both should pass
// their barriers. Deterministic: A's barrier passes, B's waits its 3 s. Not a leak: B gives up
// after 3 s, and A's Stop then returns. (The doc's "every goroutine the wheel started has exited
// by then" cannot hold together with the exception above for the first Stop: one of the two
// sentences has to give.) Manual clock and system clock.
func TestReview48FixedFirstStopFromCallbackWaitsForRestOfLaterStopCallback(t *testing.T) {
	defer goleak.VerifyNone(t)
	var stuck []string
	for _, manual := range []bool{true, false} {
		var clk *ManualClock
		if manual {
			clk = NewManualClock(time.Unix(0, 0))
		}
		aSaw, bSaw := barrierFirst48(t, clk)
		require.True(t, aSaw, "manual %v: A's barrier: B's later Stop did not return", manual)
		if !bSaw {
			stuck = append(stuck, map[bool]string{true: "manual clock", false: "system clock"}[manual])
		}
	}
	require.Empty(t, stuck,
		"deadlock (3 s): the first Stop, from callback A, waited for the rest of callback B after B's own (later) Stop returned, while B waited for it")
}

// TestReview48PinGoexitUnderStopOnWorkerAdvancer (pin): a Stop on a worker that is also the
// manual advancer marks both slots (markStop(mine, adv)) but drains on the worker's only; a
// runtime.Goexit at depth must unwind both stacks, run what fired with the dead callbacks
// exactly once, and leave the first Stop exact. API.md: "callbacks already running, or already
// handed to the worker pool, run to their end before Stop returns"; Stop returns "how many timers
// were pending".
//
//  1. One worker, a queue of one chunk. K runs on the worker; Q is queued (the queue is full).
//  2. A goroutine outside calls the first Stop: it waits for advMu. (Before that, K calls
//     clk.Advance: the worker holds advMu and is the advancer; the batch [Z, R] finds no room
//     and runs on the worker.)
//  3. Z waits until closing is closed and calls Stop (later, mine 0 and adv): it drains Q on
//     slot 0. Q calls Stop (nested: both slots marked again; it returns, excusing Q's chunk),
//     reads the stacks (slot 0: Stop, drain; advancer: Stop), then runtime.Goexit.
//  4. The goroutine unwinds: Z's Stop never returns, R runs (runFrom's deferred call), the
//     advance lets go of advMu, K's rest is skipped, and the worker is replaced.
//
// The first Stop returns 1 (the hour timer), Q, Z, R ran once each, every stack is empty.
func TestReview48PinGoexitUnderStopOnWorkerAdvancer(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1))
	require.NoError(t, err)
	require.Equal(t, 1, cap(w.pool.queue))
	advSlot := len(w.pool.done)

	kIn, kGo := make(chan struct{}), make(chan struct{})
	var kAfter, zReturned, qReturned atomic.Bool
	var qRan, zRan, rRan atomic.Int32
	var zOnAdv atomic.Bool
	// depth: slot 0's stops and drains, the advancer's stops and drains, as Q saw them.
	var depth [4]atomic.Int32
	_, err = w.AfterFunc(time.Millisecond, func() { // K
		close(kIn)
		<-kGo
		clk.Advance(time.Millisecond) // to 3 ms: Z and R
		kAfter.Store(true)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, kIn, "K to start on the worker")
	_, err = w.AfterFunc(time.Millisecond, func() { // Q, in the queue
		qRan.Add(1)
		w.Stop()
		qReturned.Store(true)
		w.stopMu.Lock()
		s0, d0 := stopDepthLocked(w, 0)
		sa, da := stopDepthLocked(w, advSlot)
		w.stopMu.Unlock()
		depth[0].Store(int32(s0))
		depth[1].Store(int32(d0))
		depth[2].Store(int32(sa))
		depth[3].Store(int32(da))
		runtime.Goexit()
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, len(w.pool.queue), "Q fills the queue")
	_, err = w.AfterFunc(time.Millisecond, func() { // Z
		zRan.Add(1)
		zOnAdv.Store(w.advancer.Load() == goid() && w.workerIndex(goid()) == 0)
		for !isClosed(w.closing) {
			time.Sleep(50 * time.Microsecond)
		}
		w.Stop()
		zReturned.Store(true)
	})
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Millisecond, func() { rRan.Add(1) }) // R, with Z
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)

	first := make(chan int, 1)
	close(kGo)
	require.Eventually(t, func() bool { return zRan.Load() == 1 }, 10*time.Second, 100*time.Microsecond,
		"Z runs on the worker, the advancer")
	go func() { first <- w.Stop() }()
	require.Equal(t, 1, waitFor(t, first, "the first Stop"))
	require.True(t, zOnAdv.Load(), "Z ran on worker 0 as the advancer")
	require.True(t, qReturned.Load(), "Q's nested Stop returned")
	require.Equal(t, [4]int32{1, 1, 1, 0}, [4]int32{depth[0].Load(), depth[1].Load(), depth[2].Load(), depth[3].Load()},
		"Q saw Z's Stop and its drain on slot 0, Z's Stop only on the advancer's")
	require.False(t, zReturned.Load(), "Q's Goexit unwound Z's Stop")
	require.False(t, kAfter.Load(), "Q's Goexit ended K too")
	require.EqualValues(t, 1, qRan.Load())
	require.EqualValues(t, 1, zRan.Load())
	require.EqualValues(t, 1, rRan.Load(), "R, fired with Z, ran once as the goroutine unwound")
	require.Zero(t, w.Stop())
	require.True(t, frameless48(w), "every slot's stack is empty")
	st := booksBalance(t, w)
	require.Equal(t, uint64(1), st.Dropped)
	require.Equal(t, uint64(4), st.Fired)
}

// TestReview48FixedFirstStopOnAdvancerWaitsForRestOfLaterStopCallback: the same barrier with the
// first Stop on the manual advancer, a goroutine that is not a worker (the review named this
// shape; the fix's author wrote the test). One worker runs B; Q fills the queue (one chunk); an
// Advance on a goroutine of its own finds no room and runs X itself (CallerRuns). X calls the
// first Stop, which waits for the worker; B, once closing is closed, calls a later Stop (it
// drains Q and returns), then waits for X's Stop to return, and X, its Stop returned, for B's.
func TestReview48FixedFirstStopOnAdvancerWaitsForRestOfLaterStopCallback(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1),
		WithFullPolicy(CallerRuns))
	require.NoError(t, err)
	bIn, xOut, bOut, bDone, xDone := make(chan struct{}), make(chan struct{}), make(chan struct{}),
		make(chan struct{}), make(chan struct{})
	var bSawX, xSawB, qRan, xOnAdv atomic.Bool
	var xRet, bRet atomic.Int64
	_, err = w.AfterFunc(time.Millisecond, func() { // B, on the worker
		defer close(bDone)
		close(bIn)
		for !isClosed(w.closing) {
			time.Sleep(50 * time.Microsecond)
		}
		bRet.Store(int64(w.Stop()))
		close(bOut)
		select {
		case <-xOut:
			bSawX.Store(true)
		case <-time.After(3 * time.Second):
		}
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, bIn, "B to start on the worker")
	_, err = w.AfterFunc(time.Millisecond, func() { qRan.Store(true) }) // Q fills the queue
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, len(w.pool.queue), "Q waits in the queue")
	_, err = w.AfterFunc(time.Millisecond, func() { // X, on the advancer
		defer close(xDone)
		xOnAdv.Store(w.workerIndex(goid()) < 0 && w.advancer.Load() == goid())
		xRet.Store(int64(w.Stop()))
		close(xOut)
		select {
		case <-bOut:
			xSawB.Store(true)
		case <-time.After(3 * time.Second):
		}
	})
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Hour, func() {}) // pending: the first Stop returns 1
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(advanced) }()
	waitFor(t, xDone, "X")
	waitFor(t, bDone, "B")
	waitFor(t, advanced, "the Advance")
	require.True(t, xOnAdv.Load(), "X ran on the advancer, not on a worker")
	require.True(t, xSawB.Load(), "X's barrier: B's later Stop returned")
	require.True(t, bSawX.Load(),
		"deadlock (3 s): the first Stop, on the advancer, waited for the rest of B after B's own Stop returned")
	require.EqualValues(t, 1, xRet.Load())
	require.Zero(t, bRet.Load())
	require.True(t, qRan.Load(), "Q ran (B's Stop drained it)")
	require.Zero(t, w.Stop())
	require.True(t, frameless48(w), "every slot's stack is empty")
	st := booksBalance(t, w)
	require.Equal(t, uint64(1), st.Dropped)
	require.Equal(t, uint64(3), st.Fired)
}
