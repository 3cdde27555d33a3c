package shardwheel

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 50: an attack on 6b69e93 (a later Stop drops its own goroutine's Every run at its
// start: dropOwnRuns + noteDropped) and its interaction with 4ffeb95 (awaitExcused) and 21398ac
// (stopwait.go's frames).

// twoOnTwo50 starts a wheel with two workers and one shard, arms one timer an hour out (pending
// at the first Stop) and two callbacks, one on each worker: on a manual clock both at 1 ms and an
// advance of 1 ms (one chunk of one callback for each worker); on the system clock the second
// once the first runs. a and b are called in the order the callbacks start (a first).
func twoOnTwo50(t *testing.T, manual bool, a, b func(w *Wheel)) *Wheel {
	t.Helper()
	opts := []Option{WithWorkers(2), WithShards(1), WithQueueSize(2 * maxChunk)}
	var clk *ManualClock
	if manual {
		clk = NewManualClock(time.Unix(0, 0))
		opts = append(opts, WithClock(clk))
	}
	w, err := New(opts...)
	require.NoError(t, err)
	in := make(chan struct{}, 2)
	goCh := make(chan struct{})
	var n atomic.Int32
	f := func() {
		i := n.Add(1)
		in <- struct{}{}
		<-goCh
		if i == 1 {
			a(w)
		} else {
			b(w)
		}
	}
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	if manual {
		for range 2 {
			_, err = w.AfterFunc(time.Millisecond, f)
			require.NoError(t, err)
		}
		clk.Advance(time.Millisecond)
		waitFor(t, in, "the first callback")
	} else {
		// The first callback's worker lets go of the keeper role and of the shard: the other
		// worker runs the second (as review 49's).
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
		waitFor(t, in, "the first callback")
		_, err = w.AfterFunc(0, f)
		require.NoError(t, err)
	}
	waitFor(t, in, "the second callback")
	close(goCh)
	return w
}

// awaitClosing50 waits (up to 5 s) until the first Stop has begun.
func awaitClosing50(w *Wheel) {
	for deadline := time.Now().Add(5 * time.Second); !isClosed(w.closing) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Microsecond)
	}
}

// TestReview50FixedSecondStopWaitsForExcusedRest: Stop's doc: called from inside a callback, Stop
// (the first call or a later one) waits for every other callback "but not ... for callbacks that
// are themselves inside a Stop ..., nor for the rest of them and of the callbacks that fired
// with them after that Stop returns"; README's Limits: "the rest of the other callback, and of
// those that fired with it, is not waited for after that". A later Stop only counts an excuse
// that came after it began (quietLocked: excusedAt > since), so a callback that calls Stop twice
// waits, in its second Stop, for the rest of a callback whose own Stop had returned before:
//
//  1. A (worker 0) calls the first Stop; B (worker 1), once closing is closed, a later one,
//     which returns (A is in a Stop, the queue is empty): worker 1 is excused.
//  2. A's Stop returns 1 (awaitExcused). A calls Stop again: a later Stop, since = now.
//  3. B, its Stop returned, waits for A's second Stop to return (a barrier after Stop, 3 s).
//  4. A's second Stop waits in awaitQuiet for worker 1: empty stack, excusedAt before since, so
//     not quiet; it waits for worker 1's exit, i.e. for B, which waits for it.
//
// Deterministic on both clocks: B's barrier times out (3 s) in every run; then both return and
// the books balance (no count is wrong: only the wait is).
func TestReview50FixedSecondStopWaitsForExcusedRest(t *testing.T) {
	defer goleak.VerifyNone(t)
	var stuck []bool
	for _, manual := range []bool{true, false} {
		stuck = append(stuck, !secondStopRound50(t, manual))
	}
	require.Equal(t, []bool{false, false}, stuck,
		"(manual, system clock): A's second Stop waited (3 s) for the rest of B, whose own Stop had returned, while B waited for it")
}

// secondStopRound50 runs one round of TestReview50FixedSecondStopWaitsForExcusedRest and reports
// whether B saw A's second Stop return.
func secondStopRound50(t *testing.T, manual bool) bool {
	aFirst, aSecond, bOut := make(chan struct{}), make(chan struct{}), make(chan struct{})
	aDone, bDone := make(chan struct{}), make(chan struct{})
	var aRet1, aRet2, bRet atomic.Int64
	var bSawA atomic.Bool
	w := twoOnTwo50(t, manual, func(w *Wheel) { // A
		defer close(aDone)
		aRet1.Store(int64(w.Stop()))
		close(aFirst)
		waitFor(t, bOut, "B's later Stop") // already returned: A's Stop excused worker 1
		aRet2.Store(int64(w.Stop()))       // a later Stop, from the same callback
		close(aSecond)
	}, func(w *Wheel) { // B
		defer close(bDone)
		awaitClosing50(w)
		bRet.Store(int64(w.Stop()))
		close(bOut)
		select { // a barrier after B's Stop: wait for A's second Stop to have returned
		case <-aSecond:
			bSawA.Store(true)
		case <-time.After(3 * time.Second):
		}
	})
	waitFor(t, aFirst, "A's first Stop")
	waitFor(t, aDone, "A")
	waitFor(t, bDone, "B")
	require.Zero(t, w.Stop())
	require.True(t, frameless48(w), "every slot's stack is empty")
	st := booksBalance(t, w)
	require.EqualValues(t, 1, aRet1.Load())
	require.Zero(t, aRet2.Load())
	require.Zero(t, bRet.Load())
	require.Equal(t, uint64(1), st.Dropped)
	return bSawA.Load()
}

// TestReview50PinEveryTimerStopThenWheelStop (pin): Every's doc: the Timer's Stop "reports true
// if it prevented a run that was still to come, also while a run is in progress"; Stop's doc and
// README: "an Every stopped from its own callback counts its next run there". An Every's f that
// stops its own Timer and then calls a later Stop (a goroutine outside is in the first) counts
// its next run once, as stopped: the later Stop's dropOwnRuns finds the entry stopped. In the
// other order the later Stop counts it as dropped and the Timer's Stop reports false; Reset of
// a running series reports false either way. With goexit the run ends in runtime.Goexit after
// the Stops (its worker is replaced and exits). The outside Stop's return is Stats.Dropped.
func TestReview50PinEveryTimerStopThenWheelStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, timerFirst := range []bool{true, false} {
		for _, goexit := range []bool{false, true} {
			clk := NewManualClock(time.Unix(0, 0))
			w, err := New(WithClock(clk), WithWorkers(2), WithShards(1))
			require.NoError(t, err)
			_, err = w.AfterFunc(time.Hour, func() {})
			require.NoError(t, err)
			in, done := make(chan struct{}), make(chan struct{})
			var tm Timer
			var tmStop, reset atomic.Bool
			var ret atomic.Int64
			var runs atomic.Int32
			tm, err = w.Every(time.Millisecond, func() {
				if runs.Add(1) != 1 {
					return
				}
				defer close(done)
				close(in)
				awaitClosing50(w)
				reset.Store(tm.Reset(time.Millisecond))
				if timerFirst {
					tmStop.Store(tm.Stop())
					ret.Store(int64(w.Stop()))
				} else {
					ret.Store(int64(w.Stop()))
					tmStop.Store(tm.Stop())
				}
				if goexit {
					runtime.Goexit()
				}
			})
			require.NoError(t, err)
			clk.Advance(time.Millisecond)
			waitFor(t, in, "the Every's run")
			outside := make(chan int, 1)
			go func() { outside <- w.Stop() }()
			waitFor(t, done, "the Every's f")
			got := waitFor(t, outside, "the outside Stop")
			require.Zero(t, w.Stop())
			require.True(t, frameless48(w))
			st := booksBalance(t, w)
			require.False(t, reset.Load())
			require.Zero(t, ret.Load(), "a later Stop returns 0")
			require.Equal(t, timerFirst, tmStop.Load())
			require.EqualValues(t, 1, runs.Load())
			require.Equal(t, st.Dropped, uint64(got), "timerFirst %v goexit %v", timerFirst, goexit)
			if timerFirst {
				require.Equal(t, uint64(1), st.Stopped)
				require.Equal(t, uint64(1), st.Dropped)
			} else {
				require.Zero(t, st.Stopped)
				require.Equal(t, uint64(2), st.Dropped)
			}
		}
	}
}

// TestReview50PinWorkersZeroAdvancerEveryLaterStopGoexit (pin): with WithWorkers(0) an Every's
// run is on the Advance caller (the shared slot). A Stop from another goroutine is the first
// and waits for the advance (advMu); the Every's f then calls a later Stop on the advancer, which
// drops its own run at its start (6b69e93: dropOwnRuns finds it in the shared slot) and returns
// 0; the run may then end in runtime.Goexit, which ends the Advance's goroutine. The first Stop
// returns 2 (the hour timer and the Every's next run), Stats.Dropped is 2, the books balance,
// no goroutine is left and every stack is empty.
func TestReview50PinWorkersZeroAdvancerEveryLaterStopGoexit(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, goexit := range []bool{false, true} {
		clk := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clk), WithWorkers(0), WithShards(2))
		require.NoError(t, err)
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
		in, done := make(chan struct{}), make(chan struct{})
		var ret atomic.Int64
		var runs atomic.Int32
		_, err = w.Every(time.Millisecond, func() {
			if runs.Add(1) != 1 {
				return
			}
			defer close(done)
			close(in)
			awaitClosing50(w)
			ret.Store(int64(w.Stop()))
			if goexit {
				runtime.Goexit()
			}
		})
		require.NoError(t, err)
		advDone := make(chan struct{})
		go func() {
			defer close(advDone)
			clk.Advance(time.Millisecond)
		}()
		waitFor(t, in, "the Every's run")
		outside := make(chan int, 1)
		go func() { outside <- w.Stop() }()
		waitFor(t, done, "the Every's f")
		waitFor(t, advDone, "the Advance")
		require.Equal(t, 2, waitFor(t, outside, "the first Stop"), "goexit %v", goexit)
		require.Zero(t, ret.Load())
		require.True(t, frameless48(w))
		st := booksBalance(t, w)
		require.Equal(t, uint64(2), st.Dropped)
		require.EqualValues(t, 1, runs.Load())
	}
}

// TestReview50PinWorkerAdvancerLaterStopDropsBothRuns (pin): an Every E1 runs on the one worker
// and calls Advance there (the worker is the advancer); the queue (one chunk of one callback)
// takes F, and the next chunk, an Every E2, runs on the worker in the shared slot (the queue is
// full). A Stop from outside is the first and waits for the advance; E2's f then calls a later
// Stop on a goroutine that is worker and advancer: it drops both runs in progress on it (its
// own slot's E1, the shared slot's E2), runs F from the queue, and returns 0. The outside Stop
// returns 3 (the hour timer and both next runs), equal to Stats.Dropped; F ran once, before the
// outside Stop returned; the books balance.
func TestReview50PinWorkerAdvancerLaterStopDropsBothRuns(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1))
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	var e1Runs, e2Runs, fRuns atomic.Int32
	e2In, e2Done, e1Done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var e2Ret atomic.Int64
	var sawWorkerAdvancer atomic.Bool
	_, err = w.Every(time.Millisecond, func() { // E1
		if e1Runs.Add(1) != 1 {
			return
		}
		defer close(e1Done)
		// Arm F and E2 due at 2 ms, fired in one round: chunks of one callback each.
		_, err := w.AfterFunc(time.Millisecond, func() { fRuns.Add(1) })
		if err != nil {
			panic(err)
		}
		_, err = w.Every(time.Millisecond, func() { // E2
			if e2Runs.Add(1) != 1 {
				return
			}
			defer close(e2Done)
			self := goid()
			sawWorkerAdvancer.Store(w.workerIndex(self) == 0 && w.advancer.Load() == self)
			close(e2In)
			awaitClosing50(w)
			e2Ret.Store(int64(w.Stop()))
		})
		if err != nil {
			panic(err)
		}
		clk.Advance(time.Millisecond)
	})
	require.NoError(t, err)
	advDone := make(chan struct{})
	go func() {
		defer close(advDone)
		clk.Advance(time.Millisecond)
	}()
	waitFor(t, advDone, "the first Advance")
	waitFor(t, e2In, "E2's run, on the worker inside E1's Advance")
	outside := make(chan int, 1)
	go func() { outside <- w.Stop() }()
	waitFor(t, e2Done, "E2's f")
	waitFor(t, e1Done, "E1's f")
	got := waitFor(t, outside, "the first Stop")
	require.True(t, sawWorkerAdvancer.Load(), "E2 ran on the worker, which was the advancer")
	require.Zero(t, e2Ret.Load())
	require.True(t, frameless48(w))
	st := booksBalance(t, w)
	require.Equal(t, 3, got)
	require.Equal(t, uint64(3), st.Dropped)
	require.EqualValues(t, 1, fRuns.Load(), "F, queued before Stop, ran once")
	require.EqualValues(t, 1, e1Runs.Load())
	require.EqualValues(t, 1, e2Runs.Load())
}

// TestReview50FixedLaterStopAfterFirstWaitsForExcusedRest: the same rule as above, with no
// callback that calls Stop twice: D fired with A in one chunk, after it on worker 0, and calls
// Stop after A's Stop returned. Stop's doc: a Stop from a callback does not wait "for callbacks
// that are themselves inside a Stop ..., nor for the rest of them and of the callbacks that
// fired with them after that Stop returns"; B's Stop returned before D's began, so D's Stop
// must not wait for the rest of B:
//
//  1. Four callbacks fire in one round at 1 ms, two chunks of two: [A, D] on worker 0, [B, B2]
//     on worker 1.
//  2. A calls the first Stop; B, once closing is closed, a later one, which returns; A's Stop
//     returns 1 (awaitExcused: worker 1 is excused). B waits for D's Stop (barrier, 3 s).
//  3. A returns; D starts on worker 0 and calls a later Stop (since = now), which finds worker 1's
//     stack empty and its excuse older than since: it waits for worker 1's exit, i.e. for B.
//
// Deterministic once the chunks are as in 1 (checked: A and D ran on one goroutine, B on another).
func TestReview50FixedLaterStopAfterFirstWaitsForExcusedRest(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(2), WithShards(1), WithQueueSize(2*maxChunk))
	require.NoError(t, err)
	in := make(chan struct{}, 2)
	goCh, aOut, bOut, dOut := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	bDone, dDone := make(chan struct{}), make(chan struct{})
	var aG, dG, bG atomic.Int64
	var aRet, bRet, dRet atomic.Int64
	var bSawD atomic.Bool
	a := func() {
		aG.Store(goid())
		in <- struct{}{}
		<-goCh
		aRet.Store(int64(w.Stop()))
		close(aOut)
	}
	d := func() {
		defer close(dDone)
		dG.Store(goid())
		dRet.Store(int64(w.Stop()))
		close(dOut)
	}
	b := func() {
		defer close(bDone)
		bG.Store(goid())
		in <- struct{}{}
		<-goCh
		awaitClosing50(w)
		bRet.Store(int64(w.Stop()))
		close(bOut)
		select { // a barrier after B's Stop: wait for D's Stop to have returned
		case <-dOut:
			bSawD.Store(true)
		case <-time.After(3 * time.Second):
		}
	}
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	for _, f := range []func(){a, d, b, func() {}} {
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	waitFor(t, in, "the first callback")
	waitFor(t, in, "the second callback")
	close(goCh)
	waitFor(t, aOut, "A's first Stop")
	waitFor(t, bDone, "B")
	waitFor(t, dDone, "D")
	require.Zero(t, w.Stop())
	require.True(t, frameless48(w), "every slot's stack is empty")
	st := booksBalance(t, w)
	require.Equal(t, aG.Load(), dG.Load(), "A and D ran in one chunk")
	require.NotEqual(t, aG.Load(), bG.Load())
	require.EqualValues(t, 1, aRet.Load())
	require.Zero(t, bRet.Load())
	require.Zero(t, dRet.Load())
	require.Equal(t, uint64(1), st.Dropped)
	require.True(t, bSawD.Load(),
		"D's Stop, begun after B's had returned, waited (3 s) for the rest of B while B waited for it")
}
