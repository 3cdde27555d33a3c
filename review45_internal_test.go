package shardwheel

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 45: an attack on 65bc96a (stopsDone; later Stops on the advancer mark its slot).

// chainRound45 runs one round of the nested-drain chain on a manual clock with one worker.
//
//   - P, on the worker, calls a later Stop once the first Stop (from a goroutine outside) began;
//     the advancer's slot is not quiet then (the advancer runs X, not in a Stop), so P's Stop
//     waits at step 1.
//   - X, run on the advancer (the queue was full; closing is closed), calls a later Stop once P's
//     is marked. That Stop marks the advancer's slot (quiet), sees the worker quiet, and drains
//     C1; C1 (on the advancer) calls Stop again, which drains C2, and so on: every callback run
//     on the advancer while the queue still holds chunks calls Stop. Each nested Stop marks the
//     advancer's slot before it drains (inStop > drained: quiet), a window in which P's Stop may
//     pass step 1.
//   - The callback that the chain runs once the queue is empty (L) calls no Stop: it runs, on the
//     advancer, for up to 300 ms, or until P's Stop returned.
//
// P's Stop, having passed step 1, never looks at the advancer's slot again (step 4 waits for
// workers only): it finds the queue empty and returns while L, handed to the pool before P's
// Stop was called, not inside a Stop, still runs. It reports whether that happened.
func chainRound45(t *testing.T, n int) (hit bool) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithTick(time.Millisecond),
		WithQueueSize(n*maxChunk))
	require.NoError(t, err)
	require.Equal(t, n, cap(w.pool.queue))

	var (
		pIn       = make(chan struct{})
		pOut      = make(chan struct{})
		advanced  = make(chan struct{})
		first     = make(chan int, 1)
		pRet      atomic.Int64
		lRunning  atomic.Int32
		lRan      atomic.Int32
		hitInL    atomic.Bool
		hitInP    atomic.Bool
		xRet      atomic.Int64
		onWorker  atomic.Int32
		nestedRet atomic.Int64
		nested    atomic.Int32
	)
	// P: on the worker.
	_, err = w.AfterFunc(time.Millisecond, func() {
		close(pIn)
		for !isClosed(w.closing) {
			time.Sleep(50 * time.Microsecond)
		}
		pRet.Store(int64(w.Stop()))
		if lRunning.Load() > 0 {
			hitInP.Store(true)
		}
		close(pOut)
	})
	require.NoError(t, err)
	// C1..Cn: one chunk each (one round each), queued while P runs.
	chain := func() {
		if w.manual != nil && w.advancer.Load() == goid() {
			if len(w.pool.queue) > 0 {
				nested.Add(1)
				nestedRet.Add(int64(w.Stop()))
				return
			}
			// L: not in a Stop, handed to the pool before P's Stop was called.
			lRunning.Add(1)
			lRan.Add(1)
			deadline := time.Now().Add(300 * time.Millisecond)
			for time.Now().Before(deadline) {
				if isClosed(pOut) {
					hitInL.Store(true)
					break
				}
				time.Sleep(100 * time.Microsecond)
			}
			lRunning.Add(-1)
			return
		}
		onWorker.Add(1)
	}
	for i := range n {
		_, err = w.AfterFunc(time.Duration(2+i)*time.Millisecond, chain)
		require.NoError(t, err)
	}
	// X: its round finds the queue full; Block waits until the first Stop closes closing, then
	// X runs on the advancer.
	_, err = w.AfterFunc(time.Duration(2+n)*time.Millisecond, func() {
		for {
			w.stopMu.Lock()
			stops, _ := stopDepthLocked(w, 0)
			marked := stops > 0
			w.stopMu.Unlock()
			if marked {
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
		xRet.Store(int64(w.Stop()))
	})
	require.NoError(t, err)
	go func() {
		clk.Advance(time.Duration(2+n) * time.Millisecond)
		close(advanced)
	}()
	waitFor(t, pIn, "P to start on the worker")
	require.Eventually(t, func() bool { return len(w.pool.queue) == n }, 10*time.Second,
		100*time.Microsecond, "the chain fills the queue")
	// X fired (it waits in its round's dispatch for room): the first Stop drops nothing.
	require.Eventually(t, func() bool { return w.minNext() == never }, 10*time.Second,
		100*time.Microsecond, "X fired")
	go func() { first <- w.Stop() }()

	waitFor(t, pOut, "P's Stop")
	waitFor(t, advanced, "the Advance")
	firstRet := waitFor(t, first, "the first Stop")
	require.Zero(t, firstRet, "%+v x=%d nested=%d onWorker=%d lRan=%d", w.Stats(), xRet.Load(), nested.Load(), onWorker.Load(), lRan.Load())
	require.Zero(t, pRet.Load())
	require.Zero(t, xRet.Load())
	require.Zero(t, nestedRet.Load())
	st := w.Stats()
	require.Equal(t, uint64(n+2), st.Fired, "%+v", st)
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "%+v", st)
	require.Equal(t, st.Fired, st.Lateness.Count(), "%+v", st)
	require.Equal(t, int32(n), lRan.Load()+onWorker.Load()+nested.Load(), "each chain callback ran once")
	return hitInL.Load() || hitInP.Load()
}

// TestReview45FixedWorkerLaterStopSkipsChunkDrainedByAdvancerNestedStop: see chainRound45. A later
// Stop on a worker returns while a callback that was in the queue when it was called runs on the
// manual advancer, drained there by a nested later Stop.
func TestReview45FixedWorkerLaterStopSkipsChunkDrainedByAdvancerNestedStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	hits, rounds := 0, 0
	deadline := time.Now().Add(60 * time.Second)
	for rounds < 40 && time.Now().Before(deadline) {
		rounds++
		if chainRound45(t, 200) {
			hits++
		}
	}
	require.Zero(t, hits,
		"in %d of %d rounds a worker's later Stop returned while L, a callback handed to the pool before it was called and not inside a Stop, still ran on the advancer",
		hits, rounds)
}

// goexitRound45: a manual clock with two workers, the Advance over. Vp and Vq run one on each
// worker; H, K and Z wait in the queue in that order. A goroutine outside calls the first Stop;
// then each of Vp and Vq calls a later Stop. Whichever worker drains H calls Stop again inside it
// (its slot is quiet again), and that nested Stop drains K, which calls runtime.Goexit: the
// worker's goroutine unwinds both its Stops (stopsDone moves by two) and a replacement starts,
// which takes Z from the queue. The other worker's Stop marked itself before that unwind, so its
// copy of stopsDone is older: awaitQuiet finds the slot quiet for good, although the goroutine now
// in that slot is running Z, a callback handed to the pool before the Stop was called, not
// inside a Stop, on a goroutine that never ran a Stop. It reports whether a later Stop returned
// while Z ran.
func goexitRound45(t *testing.T) (hit bool) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(2), WithShards(1), WithTick(time.Millisecond),
		WithQueueSize(8*maxChunk))
	require.NoError(t, err)

	var (
		in       = make(chan struct{}, 2)
		release  = make(chan struct{})
		outs     = make(chan int, 2)
		zRunning atomic.Int32
		zRan     atomic.Int32
		hitZ     atomic.Bool
		hitV     atomic.Bool
		returned atomic.Int32
		kRan     atomic.Int32
		hRan     atomic.Int32
		gids     = make(chan int64, 2)
		zOnNew   atomic.Bool
	)
	v := func() {
		gids <- goid()
		in <- struct{}{}
		<-release
		r := w.Stop()
		if zRunning.Load() > 0 {
			hitV.Store(true)
		}
		returned.Add(1)
		outs <- r
	}
	for range 2 {
		_, err = w.AfterFunc(time.Millisecond, v)
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	waitFor(t, in, "V on a worker")
	waitFor(t, in, "V on the other worker")
	orig := [2]int64{<-gids, <-gids}
	_, err = w.AfterFunc(time.Millisecond, func() { // H
		hRan.Add(1)
		outs <- w.Stop() // nested: drains K
	})
	require.NoError(t, err)
	_, err = w.AfterFunc(2*time.Millisecond, func() { // K
		kRan.Add(1)
		runtime.Goexit()
	})
	require.NoError(t, err)
	_, err = w.AfterFunc(3*time.Millisecond, func() { // Z
		zRunning.Add(1)
		zRan.Add(1)
		g := goid()
		zOnNew.Store(g != orig[0] && g != orig[1] && w.workerIndex(g) >= 0)
		deadline := time.Now().Add(300 * time.Millisecond)
		for time.Now().Before(deadline) {
			if returned.Load() > 0 {
				hitZ.Store(true)
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		zRunning.Add(-1)
	})
	require.NoError(t, err)
	clk.Advance(3 * time.Millisecond)
	require.Equal(t, 3, len(w.pool.queue), "H, K and Z wait in the queue")

	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 10*time.Second,
		100*time.Microsecond, "the first Stop closed quit")
	close(release)

	require.Zero(t, waitFor(t, first, "the first Stop"))
	// Vp's or Vq's goroutine ended in K's Goexit: one V and, if it was H's runner's, no H
	// return; every Stop that did return returned 0.
	close(outs)
	for r := range outs {
		require.Zero(t, r)
	}
	require.Equal(t, int32(1), hRan.Load())
	require.Equal(t, int32(1), kRan.Load())
	require.Equal(t, int32(1), zRan.Load(), "Z ran once")
	require.Equal(t, int32(1), returned.Load(), "the V whose goroutine did not end in K returned")
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "%+v", st)
	require.Equal(t, st.Fired, st.Lateness.Count(), "%+v", st)
	require.Equal(t, uint64(5), st.Fired)
	hit = hitZ.Load() || hitV.Load()
	if hit {
		require.True(t, zOnNew.Load(), "Z ran on the replacement of a worker")
	}
	return hit
}

// TestReview45FixedLaterStopSkipsCallbackOfGoexitReplacement: see goexitRound45.
func TestReview45FixedLaterStopSkipsCallbackOfGoexitReplacement(t *testing.T) {
	defer goleak.VerifyNone(t)
	hits, rounds := 0, 0
	deadline := time.Now().Add(60 * time.Second)
	for rounds < 60 && time.Now().Before(deadline) {
		rounds++
		if goexitRound45(t) {
			hits++
		}
	}
	require.Zero(t, hits,
		"in %d of %d rounds a later Stop returned while Z (handed to the pool before it, not inside a Stop) ran on the replacement of a worker whose Stop ended in Goexit",
		hits, rounds)
}
