package shardwheel

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 43: an attack on ab152f2 (later Stops drain the queue; advOver).

// inStop43 reports whether worker slot k is marked inside a Stop.
func inStop43(w *Wheel, k int) bool {
	w.stopMu.Lock()
	defer w.stopMu.Unlock()
	stops, _ := stopDepthLocked(w, k)
	return stops > 0
}

// TestReview43FixedLaterStopSkipsCallbackDrainedByOtherLaterStop: API.md: callbacks "already
// handed to the worker pool, run to their end before Stop returns"; Stop's doc excepts only
// "callbacks that are themselves inside a Stop" and "what their goroutine runs after that Stop
// returns". A goroutine outside is in the first Stop. K (one worker) and J (the other) then
// call Stop: both go to laterStop, each finds the other marked inside a Stop, and both drain the
// queue, where C (handed to the pool before either Stop) waits. One of them takes C and runs it
// inside its Stop; the other finds the queue empty and returns while C runs. C is not inside a
// Stop, and it is not run after that Stop returned: nothing excuses the other from waiting for it
// (and waiting deadlocks nothing: the Stop running C no longer waits for it).
func TestReview43FixedLaterStopSkipsCallbackDrainedByOtherLaterStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(2), WithShards(1), WithQueueSize(4))
	require.NoError(t, err)

	in := make(chan struct{}, 2)
	kGo, jGo := make(chan struct{}), make(chan struct{})
	kOut, jOut := make(chan struct{}), make(chan struct{})
	cIn, cRelease := make(chan struct{}), make(chan struct{})
	var cDone, cDoneAtK, cDoneAtJ atomic.Bool
	var n atomic.Int32
	var kRet, jRet atomic.Int64
	f := func() {
		in <- struct{}{}
		if n.Add(1) == 1 { // K
			<-kGo
			kRet.Store(int64(w.Stop()))
			cDoneAtK.Store(cDone.Load())
			close(kOut)
			return
		}
		<-jGo // J
		jRet.Store(int64(w.Stop()))
		cDoneAtJ.Store(cDone.Load())
		close(jOut)
	}
	_, err = w.AfterFunc(time.Millisecond, f)
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, in, "K to start")
	_, err = w.AfterFunc(time.Millisecond, f)
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, in, "J to start")
	_, err = w.AfterFunc(time.Millisecond, func() {
		close(cIn)
		select {
		case <-cRelease:
		case <-time.After(10 * time.Second):
		}
		cDone.Store(true)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond) // both workers busy: C waits in the queue
	require.Equal(t, 1, len(w.pool.queue), "C waits in the queue")
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)

	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
		"the first Stop reached its wait for the workers")
	close(kGo)
	require.Eventually(t, func() bool { return inStop43(w, 0) || inStop43(w, 1) }, 5*time.Second,
		time.Millisecond, "K inside its Stop")
	close(jGo)
	waitFor(t, cIn, "C to start in a later Stop's drain")
	// One of K's and J's Stops runs C; give the other a second to return (it should not).
	select {
	case <-kOut:
	case <-jOut:
	case <-time.After(time.Second):
	}
	close(cRelease)
	waitFor(t, kOut, "K's Stop")
	waitFor(t, jOut, "J's Stop")
	require.Equal(t, 1, waitFor(t, first, "the first Stop"))
	require.Zero(t, kRet.Load()+jRet.Load())
	st := booksBalance(t, w)
	require.Equal(t, uint64(1), st.Dropped)
	require.True(t, cDoneAtK.Load() && cDoneAtJ.Load(),
		"a later Stop from a callback returned while callback C, handed to the pool before it, ran in the other later Stop's drain (C done at K's return: %v, at J's: %v)",
		cDoneAtK.Load(), cDoneAtJ.Load())
}

// TestReview43PinGoexitInLaterStopDrainRunsRestOfQueue: a later Stop from callback J on the only
// worker (a goroutine outside is in the first Stop) drains the queue; the first callback it takes,
// C1, calls runtime.Goexit. J's Stop never returns (its goroutine ends), but nothing handed to the
// pool is lost: the worker's replacement (work) runs C2, still in the queue, and only then exits,
// and the first Stop returns after that with the pending count; no goroutine is left, the books
// balance.
func TestReview43PinGoexitInLaterStopDrainRunsRestOfQueue(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(128))
	require.NoError(t, err)

	jIn, jGo, jOut := make(chan struct{}), make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() {
		close(jIn)
		<-jGo
		w.Stop()
		close(jOut) // never: C1's Goexit ends this goroutine inside the Stop
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, jIn, "J to start")
	var c1In, c2Ran atomic.Bool
	_, err = w.AfterFunc(time.Millisecond, func() { c1In.Store(true); runtime.Goexit() })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	_, err = w.AfterFunc(time.Millisecond, func() { c2Ran.Store(true) })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 2, len(w.pool.queue), "C1 and C2 wait in the queue")
	for range 3 {
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
	}

	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
		"the first Stop reached its wait for the worker")
	close(jGo)
	require.Equal(t, 3, waitFor(t, first, "the first Stop"))
	require.True(t, c1In.Load())
	require.True(t, c2Ran.Load(), "C2, handed to the pool, ran before the first Stop returned")
	require.False(t, isClosed(jOut), "J's Stop ended with its goroutine")
	require.Zero(t, w.Stop())
	st := booksBalance(t, w)
	require.Equal(t, uint64(3), st.Dropped)
	require.Equal(t, uint64(3), st.Fired)
}

// TestReview43PinEveryLaterStopCountsNextRunOnce: an Every's f calls Stop on the only worker while
// a goroutine outside is in the first Stop, past its drop (the rings are closed). The later Stop
// returns 0; the run's re-arm then finds the ring closed and counts the next run as dropped
// (endRun), before the worker exits, so the first Stop, which waits for that exit, returns it
// with the other pending timer: one non-zero return, equal to Stats.Dropped; the series never
// runs again.
func TestReview43PinEveryLaterStopCountsNextRunOnce(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1))
	require.NoError(t, err)

	eIn, eGo := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	later := make(chan int, 1)
	_, err = w.Every(time.Millisecond, func() {
		if runs.Add(1) > 1 {
			return
		}
		close(eIn)
		<-eGo
		later <- w.Stop()
	})
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, eIn, "the Every's first run")

	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
		"the first Stop dropped what was pending and waits for the worker")
	close(eGo)
	require.Zero(t, waitFor(t, later, "the Every's later Stop"))
	require.Equal(t, 2, waitFor(t, first, "the first Stop"), "the 1 h timer and the Every's next run")
	clk.Advance(time.Hour)
	require.EqualValues(t, 1, runs.Load())
	st := booksBalance(t, w)
	require.Equal(t, uint64(2), st.Dropped)
	require.Equal(t, uint64(1), st.Fired)
}
