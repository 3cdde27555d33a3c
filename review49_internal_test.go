package shardwheel

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 49: an attack on 4ffeb95 (the first Stop, called from a callback, waits for each other
// worker to exit or to be excused: awaitExcused) and on 21398ac (stopwait.go's frames).

// everyExcused49 runs one round: an Every's run E on one worker and a one-shot A on another.
// A calls the first Stop once E runs; E, once A's Stop began (closing is closed), calls a later
// Stop, which returns (A is inside a Stop, the queue is empty); then E waits, up to 3 s, for A's
// Stop to return (a barrier after Stop, as review 48's B) and only then returns, so its endRun
// re-arms after A's Stop returned. One timer an hour out is pending. It returns what A's and E's
// Stops returned and the Stats once every goroutine is done.
func everyExcused49(t *testing.T, clk *ManualClock) (aRet, eRet int, st Stats, eSawA bool) {
	t.Helper()
	opts := []Option{WithWorkers(2), WithShards(1), WithQueueSize(2 * maxChunk)}
	if clk != nil {
		opts = append(opts, WithClock(clk))
	}
	w, err := New(opts...)
	require.NoError(t, err)

	eIn, eOut, aOut := make(chan struct{}), make(chan struct{}), make(chan struct{})
	eDone, aDone := make(chan struct{}), make(chan struct{})
	var aR, eR atomic.Int64
	var eSaw atomic.Bool
	var runs atomic.Int32
	_, err = w.AfterFunc(time.Hour, func() {}) // pending at the first Stop
	require.NoError(t, err)
	_, err = w.Every(time.Millisecond, func() { // E
		if runs.Add(1) != 1 {
			return
		}
		defer close(eDone)
		close(eIn)
		for deadline := time.Now().Add(5 * time.Second); !isClosed(w.closing) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Microsecond)
		}
		eR.Store(int64(w.Stop())) // a later Stop: A is inside the first
		close(eOut)
		select {
		case <-aOut:
			eSaw.Store(true)
		case <-time.After(3 * time.Second):
		}
	})
	require.NoError(t, err)
	a := func() { // A
		defer close(aDone)
		waitFor(t, eIn, "E to run")
		aR.Store(int64(w.Stop()))
		close(aOut)
	}
	if clk != nil {
		_, err = w.AfterFunc(time.Millisecond, a)
		require.NoError(t, err)
		clk.Advance(time.Millisecond) // two chunks of one callback each, one for each worker
	} else {
		waitFor(t, eIn, "E's first run")
		// E's worker let go of the keeper role and of the shard: the other worker runs A.
		_, err = w.AfterFunc(0, a)
		require.NoError(t, err)
	}
	waitFor(t, aDone, "A")
	waitFor(t, eDone, "E")
	require.Zero(t, w.Stop()) // waits for every worker to exit
	require.True(t, frameless48(w), "every slot's stack is empty")
	require.LessOrEqual(t, runs.Load(), int32(1), "E ran once")
	return int(aR.Load()), int(eR.Load()), booksBalance(t, w), eSaw.Load()
}

// TestReview49FixedFirstStopMissesExcusedEveryNextRun: README's Limits: "What `Stop` returns is
// exact all the same"; Stats.Dropped is "the sum of what Stop returned"; every.go (runPeriodic):
// "A run in progress when Stop begins counts its next run in Stop's return: on another
// goroutine, which Stop waits for, its re-arm ... finds the ring closed". Since 4ffeb95 the first
// Stop from a callback no longer waits for a worker whose callback's later Stop returned
// (awaitExcused), so it no longer waits for that re-arm either:
//
//  1. E (an Every's run, worker 1) and A (worker 0) run. A calls the first Stop: it drops the
//     hour timer (n = 1) and waits in awaitExcused for worker 1.
//  2. E calls a later Stop: A is in a Stop, the queue is empty; it returns 0. Worker 1 is excused.
//  3. A's Stop returns dropped.Value() = 1 (E's next run is not counted yet).
//  4. E (barrier) returns after that; endRun finds the ring closed and counts its next run in
//     Dropped: 2. Every later Stop returns 0.
//
// So the Stops returned 1 in all and Dropped is 2. Deterministic on both clocks (E's barrier
// passes). Before 4ffeb95 A's Stop waited for worker 1 to exit (E's barrier timed out, 3 s) and
// returned 2.
func TestReview49FixedFirstStopMissesExcusedEveryNextRun(t *testing.T) {
	defer goleak.VerifyNone(t)
	var wrong []string
	for _, manual := range []bool{true, false} {
		var clk *ManualClock
		if manual {
			clk = NewManualClock(time.Unix(0, 0))
		}
		aRet, eRet, st, eSawA := everyExcused49(t, clk)
		require.True(t, eSawA, "manual %v: E's barrier: A's Stop returned while E ran", manual)
		require.Zero(t, eRet, "manual %v: E's Stop is a later one", manual)
		require.Equal(t, uint64(2), st.Dropped, "manual %v: the hour timer and E's next run", manual)
		if uint64(aRet+eRet) != st.Dropped {
			wrong = append(wrong, fmt.Sprintf("manual %v: the Stops returned %d in all, Stats.Dropped is %d",
				manual, aRet+eRet, st.Dropped))
		}
	}
	require.Empty(t, wrong,
		"E's next run, re-armed on an excused worker after the first Stop returned, is in no Stop's return")
}

// TestReview49PinOutsideStopWaitsForExcusedRest (pin): API.md: "Safe to call more than once and
// from several goroutines (later calls return 0)", and Stop's doc: "every goroutine the wheel
// started has exited" when it returns, but from a callback, not "those running the callbacks
// Stop does not wait for ... each exits once they return". After the first Stop (from callback A
// on worker 0) returned early, excusing worker 1, a Stop from a goroutine outside must still
// wait for worker 1 (stopped is closed, but it also waits for every done), and Len is 0 at once:
//
//  1. A (worker 0) calls the first Stop; B (worker 1), once closing is closed, a later one,
//     which returns; A's Stop returns 1 (awaitExcused: worker 1 is excused).
//  2. B waits for release (and, with goexit, then calls runtime.Goexit: its worker is replaced
//     after Stop returned, or exits: work's isClosed(stopped) case).
//  3. Outside: Len is 0; a Stop from a goroutine outside does not return while B waits; once B
//     is released it returns 0, every worker has exited and every stack is empty.
func TestReview49PinOutsideStopWaitsForExcusedRest(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, goexit := range []bool{false, true} {
		clk := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clk), WithWorkers(2), WithShards(1), WithQueueSize(2*maxChunk))
		require.NoError(t, err)
		in := make(chan struct{}, 2)
		goCh, aOut, bOut, release := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
		var aRet, bRet atomic.Int64
		var bRest atomic.Bool
		var n atomic.Int32
		f := func() {
			in <- struct{}{}
			<-goCh
			if n.Add(1) == 1 { // A
				aRet.Store(int64(w.Stop()))
				close(aOut)
				return
			}
			for deadline := time.Now().Add(5 * time.Second); !isClosed(w.closing) && time.Now().Before(deadline); {
				time.Sleep(50 * time.Microsecond)
			}
			bRet.Store(int64(w.Stop())) // B: a later Stop
			close(bOut)
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
			bRest.Store(true)
			if goexit {
				runtime.Goexit()
			}
		}
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
		for range 2 {
			_, err = w.AfterFunc(time.Millisecond, f)
			require.NoError(t, err)
		}
		clk.Advance(time.Millisecond)
		waitFor(t, in, "the first callback")
		waitFor(t, in, "the second callback")
		close(goCh)
		waitFor(t, aOut, "A's first Stop (B excused)")
		waitFor(t, bOut, "B's later Stop")
		require.EqualValues(t, 1, aRet.Load())
		require.Zero(t, bRet.Load())
		require.Zero(t, w.Len(), "goexit %v: Len after Stop", goexit)
		outside := make(chan int, 1)
		go func() { outside <- w.Stop() }()
		select {
		case <-outside:
			t.Fatalf("goexit %v: a Stop from outside returned while B, handed to the pool before it, still ran", goexit)
		case <-time.After(50 * time.Millisecond):
		}
		close(release)
		require.Zero(t, waitFor(t, outside, "the outside Stop"))
		require.True(t, bRest.Load())
		for i, d := range w.pool.done {
			require.True(t, isClosed(d), "goexit %v: worker %d", goexit, i)
		}
		require.True(t, frameless48(w), "goexit %v: every slot's stack is empty", goexit)
		st := booksBalance(t, w)
		require.Equal(t, uint64(1), st.Dropped)
		require.Equal(t, uint64(2), st.Fired)
	}
}
