package shardwheel

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 46 asked that a later Stop wait for the callback that called ManualClock.Advance (C1,
// on a worker) when a callback of that advance (X, run on C1's goroutine) calls Stop: C1 is not
// the callback that Stop is called from. But C1 is inside X's Stop, further up its own stack, as
// a callback that calls Stop itself is: Stop's doc excuses callbacks inside a Stop and what their
// goroutine runs after that Stop returns, since two callbacks that each waited for the other
// would never return. Waiting for C1 brings that deadlock back: the tests below are the two
// shapes it takes, and both deadlocked on the attempt that waited for C1 (branch review46).

// TestReview46PinBarrierAfterAdvanceWhoseCallbackStopped: X's Stop is a later one (a goroutine
// outside runs the first). P, on the other worker, calls Stop; C1, once its Advance returned,
// waits for P's Stop to return, a barrier after Stop, as review 44's two callbacks do. P's Stop
// must not wait for C1.
//
//  1. Advance(1ms) hands C1 and P to the two workers (they wait for each other to start).
//  2. C1 calls clk.Advance(2ms): the round at 2ms queues Z1, Z2 (queue full, cap 2); the round
//     at 3ms cannot queue Y, X, so they run on C1's worker (the advancer). Y starts the first
//     Stop from a goroutine outside (T) and returns once closing is closed.
//  3. P calls Stop, a later one; X calls Stop once P's is marked. Both return.
//  4. C1's Advance returns; C1 waits for P's Stop to have returned.
func TestReview46PinBarrierAfterAdvanceWhoseCallbackStopped(t *testing.T) {
	defer goleak.VerifyNone(t)
	for r := 0; r < 3; r++ {
		round46(t, false)
	}
}

// TestReview46PinFirstStopInCallbackOfAdvanceOnWorker: the same with X's Stop the first one. It
// waits for the other worker to exit, so for P's Stop to return, which must not wait for C1:
// C1 ends only after X's Stop returns.
func TestReview46PinFirstStopInCallbackOfAdvanceOnWorker(t *testing.T) {
	defer goleak.VerifyNone(t)
	for r := 0; r < 3; r++ {
		round46(t, true)
	}
}

func round46(t *testing.T, xFirst bool) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(2), WithShards(1), WithTick(time.Millisecond),
		WithQueueSize(2*maxChunk))
	require.NoError(t, err)
	require.Equal(t, 2, cap(w.pool.queue))

	var (
		c1In, pIn   = make(chan struct{}), make(chan struct{})
		c1Out, pOut = make(chan struct{}), make(chan struct{})
		xOut        = make(chan struct{})
		first       = make(chan int, 1)
		c1SawP      atomic.Bool // C1's barrier: P's Stop returned while C1 waited for it
		xOnAdv      atomic.Bool
		pRet, xRet  atomic.Int64
		zRan        atomic.Int32
	)
	inStopOf := func(k int) bool {
		w.stopMu.Lock()
		defer w.stopMu.Unlock()
		stops, _ := stopDepthLocked(w, k)
		return stops > 0
	}
	spin := func(cond func() bool) bool {
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(50 * time.Microsecond)
		}
		return true
	}
	// Z1, Z2 at 2 ms; Y, X at 3 ms.
	for i := 0; i < 2; i++ {
		_, err = w.AfterFunc(2*time.Millisecond, func() { zRan.Add(1) })
		require.NoError(t, err)
	}
	_, err = w.AfterFunc(3*time.Millisecond, func() { // Y
		if xFirst {
			return
		}
		go func() { first <- w.Stop() }()
		spin(func() bool { return isClosed(w.closing) })
	})
	require.NoError(t, err)
	_, err = w.AfterFunc(3*time.Millisecond, func() { // X
		defer close(xOut)
		xOnAdv.Store(w.advancer.Load() == goid())
		if !xFirst {
			mine := w.workerIndex(goid())
			spin(func() bool { return inStopOf(1 - mine) })
		}
		xRet.Store(int64(w.Stop()))
	})
	require.NoError(t, err)
	// C1 and P at 1 ms.
	_, err = w.AfterFunc(time.Millisecond, func() { // C1
		close(c1In)
		defer close(c1Out)
		if !spin(func() bool { return isClosed(pIn) }) {
			return
		}
		clk.Advance(2 * time.Millisecond) // to 3 ms
		select {
		case <-pOut:
			c1SawP.Store(true)
		case <-time.After(2 * time.Second):
		}
	})
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Millisecond, func() { // P
		close(pIn)
		defer close(pOut)
		if !spin(func() bool { return isClosed(c1In) }) {
			return
		}
		spin(func() bool { return isClosed(w.closing) })
		pRet.Store(int64(w.Stop()))
	})
	require.NoError(t, err)

	clk.Advance(time.Millisecond)
	waitFor(t, c1Out, "C1 to end")
	waitFor(t, pOut, "P's Stop to return")
	waitFor(t, xOut, "X's Stop to return")
	require.True(t, c1SawP.Load(), "P's Stop waited for C1, which waited for it: deadlocked for 2 s")
	if !xFirst {
		require.Zero(t, waitFor(t, first, "the first Stop (T) to return"))
		require.Zero(t, xRet.Load())
	}
	require.Zero(t, w.Stop())
	require.True(t, xOnAdv.Load(), "X ran on the advancer")
	require.Zero(t, pRet.Load())
	require.EqualValues(t, 2, zRan.Load(), "Z1 and Z2 ran")
	st := booksBalance(t, w)
	require.EqualValues(t, 6, st.Fired)
}
