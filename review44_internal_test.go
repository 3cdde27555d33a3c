package shardwheel

import (
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 44: an attack on d5a8cc6 (drained counts; awaitQuiet waits for inStop > drained) and the
// Stop protocol for Stops from callbacks as a whole.

// advancerBatch44 sets up, on a manual clock with one worker, a queue of one chunk and
// CallerRuns: K runs on the worker and waits for kGo; Q waits in the queue (it fills it); then an
// Advance on a goroutine of its own (advanced is closed when it returns) runs X and then Y, one
// batch, itself (no room in the queue). X waits for xGo and calls Stop; Y, which runs on the
// advancer after X's Stop has returned, waits up to 3 s for kOut (K's Stop to return) and
// reports whether it came. kRet gets K's Stop's return.
type advancerBatch44 struct {
	w                 *Wheel
	kIn, kGo, kOut    chan struct{}
	xIn, xGo, xOut    chan struct{}
	advanced          chan struct{}
	kRet              chan int
	ySawK, yRan, qRan atomic.Bool
	xRet              atomic.Int64
	xStopReturnedAtY  atomic.Bool
	ySawKAfter        atomic.Int64 // ms Y waited
}

func newAdvancerBatch44(t *testing.T) *advancerBatch44 {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1),
		WithFullPolicy(CallerRuns))
	require.NoError(t, err)
	b := &advancerBatch44{
		w: w, kIn: make(chan struct{}), kGo: make(chan struct{}), kOut: make(chan struct{}),
		xIn: make(chan struct{}), xGo: make(chan struct{}), xOut: make(chan struct{}),
		advanced: make(chan struct{}), kRet: make(chan int, 1),
	}
	_, err = w.AfterFunc(time.Millisecond, func() { // K, on the only worker
		close(b.kIn)
		<-b.kGo
		b.kRet <- w.Stop()
		close(b.kOut)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, b.kIn, "K to start on the worker")
	_, err = w.AfterFunc(time.Millisecond, func() { b.qRan.Store(true) }) // Q fills the queue
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, len(w.pool.queue), "Q waits in the queue")

	var n atomic.Int32
	f := func() { // X, then Y, on the advancer (no room in the queue)
		if n.Add(1) == 1 {
			close(b.xIn)
			<-b.xGo
			b.xRet.Store(int64(w.Stop()))
			close(b.xOut)
			return
		}
		b.yRan.Store(true)
		b.xStopReturnedAtY.Store(isClosed(b.xOut))
		start := time.Now()
		select {
		case <-b.kOut:
			b.ySawK.Store(true)
		case <-time.After(3 * time.Second):
		}
		b.ySawKAfter.Store(time.Since(start).Milliseconds())
	}
	for range 2 {
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
	}
	_, err = w.AfterFunc(time.Hour, func() {}) // pending: the first Stop returns 1
	require.NoError(t, err)
	go func() { clk.Advance(time.Millisecond); close(b.advanced) }()
	waitFor(t, b.xIn, "X to start on the advancer")
	return b
}

// TestReview44FixedLaterStopOnWorkerWaitsForAdvancerCallbackAfterItsStop: the same with the first
// Stop from a goroutine outside (it waits for advMu) and K's Stop a later one: laterStop waits for
// advOver (step 2), which only the end of the advance (or the first Stop's advMu) closes, since a
// later Stop on the advancer does not mark the advancer's slot. So K's Stop waits for Y, run on
// the advancer after X's Stop returned, and Y waits for K's Stop: a deadlock the contract does not
// force. (Review 42 made worker Stops wait for the rest of the advancer's batch that runs while X
// is inside its Stop; Y here runs after X's Stop has returned.)
func TestReview44FixedLaterStopOnWorkerWaitsForAdvancerCallbackAfterItsStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	b := newAdvancerBatch44(t)
	w := b.w

	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.closing) }, 5*time.Second, time.Millisecond,
		"the first Stop began")
	close(b.xGo) // X's later Stop on the advancer: quit, waits for the worker (K, not in a Stop)
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
		"X is inside its Stop")
	close(b.kGo) // K's later Stop: marked, so X's goes on, runs Q and returns
	waitFor(t, b.xOut, "X's later Stop to return")
	waitFor(t, b.advanced, "the Advance")
	waitFor(t, b.kOut, "K's Stop")
	require.Equal(t, 1, waitFor(t, first, "the first Stop"))
	require.Zero(t, <-b.kRet)
	require.Zero(t, b.xRet.Load())
	require.True(t, b.qRan.Load())
	require.True(t, b.yRan.Load() && b.xStopReturnedAtY.Load(), "Y ran after X's Stop returned")
	st := booksBalance(t, w)
	require.Equal(t, uint64(1), st.Dropped)
	require.True(t, b.ySawK.Load(),
		"deadlock: Y (run on the advancer after X's Stop returned) waited %d ms for K's later Stop, which waited for advOver, closed only when Y's advance ended",
		b.ySawKAfter.Load())
}

// TestReview44PinNestedDrainGoexitAtDepth: on the only worker, A calls a later Stop (a goroutine
// outside is in the first) whose drain runs B; B calls Stop, whose drain runs C; C calls Stop,
// whose drain runs D, which calls runtime.Goexit. Every level unwinds (inStop and drained go back
// down in step), none of A's, B's or C's Stops returns, and E, still in the queue, is run by the
// worker's replacement before the first Stop returns, exactly once; the first Stop returns the
// pending count, and the books balance.
func TestReview44PinNestedDrainGoexitAtDepth(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(256)) // 4 chunks
	require.NoError(t, err)

	aIn, aGo := make(chan struct{}), make(chan struct{})
	var returned atomic.Int32 // Stops from A, B, C that returned
	var ran [4]atomic.Int32   // B, C, D, E
	var depthAtD atomic.Int64
	_, err = w.AfterFunc(time.Millisecond, func() {
		close(aIn)
		<-aGo
		w.Stop()
		returned.Add(1)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, aIn, "A to start")
	stopper := func(i int) func() {
		return func() { ran[i].Add(1); w.Stop(); returned.Add(1) }
	}
	fs := []func(){stopper(0), stopper(1), func() {
		ran[2].Add(1)
		w.stopMu.Lock()
		stops, drains := stopDepthLocked(w, 0)
		depthAtD.Store(int64(stops)*10 + int64(drains))
		w.stopMu.Unlock()
		runtime.Goexit()
	}, func() { ran[3].Add(1) }}
	for _, f := range fs {
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
		clk.Advance(time.Millisecond) // one chunk each, in order
	}
	require.Equal(t, 4, len(w.pool.queue))
	for range 2 {
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
	}
	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond)
	close(aGo)
	require.Equal(t, 2, waitFor(t, first, "the first Stop"))
	require.EqualValues(t, 33, depthAtD.Load(), "D ran three Stops and three drained chunks deep")
	for i := range ran {
		require.EqualValues(t, 1, ran[i].Load(), "callback %d", i)
	}
	require.Zero(t, returned.Load(), "D's Goexit ended every Stop on that goroutine")
	w.stopMu.Lock()
	for k := range w.frames {
		require.Empty(t, w.frames[k], "slot %d", k)
	}
	w.stopMu.Unlock()
	require.Zero(t, w.Stop())
	st := booksBalance(t, w)
	require.Equal(t, uint64(2), st.Dropped)
	require.Equal(t, uint64(5), st.Fired)
}

// TestReview44PinCallbackOfOneWheelStopsAnother: two wheels on one ManualClock. Wheel A has no
// workers (its callbacks run on the Advance caller); wheel B has one, running Y. A's callback X
// stops B: for B, X runs outside the wheel, so its Stop is B's first and waits for Y to end (and
// for B's worker to exit), returns B's pending count, and deadlocks nothing; A's Advance goes on.
func TestReview44PinCallbackOfOneWheelStopsAnother(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	b, err := New(WithClock(clk), WithWorkers(1), WithShards(1))
	require.NoError(t, err)

	yIn := make(chan struct{})
	var yDone, yDoneAtX atomic.Bool
	_, err = b.AfterFunc(time.Millisecond, func() {
		close(yIn)
		time.Sleep(200 * time.Millisecond)
		yDone.Store(true)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, yIn, "Y to start on B's worker")
	_, err = b.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	xRet := make(chan int, 1)
	var after atomic.Bool
	_, err = a.AfterFunc(time.Millisecond, func() {
		r := b.Stop()
		yDoneAtX.Store(yDone.Load())
		xRet <- r
	})
	require.NoError(t, err)
	_, err = a.AfterFunc(2*time.Millisecond, func() { after.Store(true) })
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(advanced) }()
	waitFor(t, advanced, "the Advance whose callback stops B")
	require.Equal(t, 1, waitFor(t, xRet, "X's Stop of B"))
	require.True(t, yDoneAtX.Load(), "B's Stop from A's callback returned before B's callback Y ended")
	require.True(t, isClosed(b.pool.done[0]))
	clk.Advance(time.Millisecond)
	require.True(t, after.Load(), "A goes on")
	require.Zero(t, b.Stop())
	require.Zero(t, a.Stop())
	stb := booksBalance(t, b)
	require.Equal(t, uint64(1), stb.Dropped)
	booksBalance(t, a)
}

// TestReview44FixedTwoLaterStopsWaitForEachOthersContinuation: the same hole without an advancer.
// On two workers, A and J call Stop at once (later Stops: a goroutine outside is in the first),
// and each then waits (up to 2 s) for the other's Stop to have returned, a barrier after Stop.
// Both Stops are called while the other callback is inside its Stop, so by Stop's doc neither
// waits for what the other's goroutine runs after its Stop returns. But laterStop's checks are
// snapshots of inStop: the Stop that comes second to a check finds the other's goroutine back in
// its callback (its Stop returned) and waits for that worker to exit, while that callback waits
// for it. Racy (whichever Stop returns first): the test runs 5 rounds and fails if any round
// deadlocked for the 2 s.
func TestReview44FixedTwoLaterStopsWaitForEachOthersContinuation(t *testing.T) {
	defer goleak.VerifyNone(t)
	const rounds = 5
	stuck, stuckFirst := 0, 0
	for round := 0; round < rounds; round++ {
		clk := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clk), WithWorkers(2), WithShards(1), WithQueueSize(4))
		require.NoError(t, err)
		in := make(chan struct{}, 2)
		goCh := make(chan struct{})
		outs := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
		var n atomic.Int32
		var saw [2]atomic.Bool
		f := func() {
			i := int(n.Add(1)) - 1
			in <- struct{}{}
			<-goCh
			w.Stop()
			close(outs[i])
			select { // a barrier: wait for the other's Stop to have returned
			case <-outs[1-i]:
				saw[i].Store(true)
			case <-time.After(2 * time.Second):
			}
		}
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
		clk.Advance(time.Millisecond)
		waitFor(t, in, "the first callback")
		waitFor(t, in, "the second callback")
		first := make(chan int, 1)
		go func() { first <- w.Stop() }()
		require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
			"the first Stop waits for the workers")
		close(goCh)
		require.Equal(t, 1, waitFor(t, first, "the first Stop"))
		booksBalance(t, w)
		if !saw[0].Load() || !saw[1].Load() {
			stuck++
			if !saw[0].Load() && !saw[1].Load() {
				stuckFirst++
			}
		}
	}
	require.Zero(t, stuck,
		"in %d of %d rounds a later Stop from a callback waited (2 s) for the other callback's code after that callback's own Stop returned, while that code waited for it (both stuck: %d)",
		stuck, rounds, stuckFirst)
}

// TestReview44PinSynctestFirstStopFromCallbackWaitsForSleeper: on the system clock inside a
// testing/synctest bubble with two workers, B (due at 1 s) sleeps 10 s of fake time on one
// worker; A (due at 2 s, run by the other) calls the first Stop, which waits for B (its worker's
// exit) on channels only, so the bubble's time moves on and Stop returns at 11 s with the one
// pending timer, B done; a later Stop from outside returns 0 and the books balance.
func TestReview44PinSynctestFirstStopFromCallbackWaitsForSleeper(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithWorkers(2), WithShards(1))
		require.NoError(t, err)
		start := time.Now()
		var bDone, bDoneAtA atomic.Bool
		var aRet, aAt atomic.Int64
		_, err = w.AfterFunc(time.Second, func() { time.Sleep(10 * time.Second); bDone.Store(true) })
		require.NoError(t, err)
		_, err = w.AfterFunc(2*time.Second, func() {
			aRet.Store(int64(w.Stop()))
			bDoneAtA.Store(bDone.Load())
			aAt.Store(int64(time.Since(start)))
		})
		require.NoError(t, err)
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		require.True(t, bDoneAtA.Load(), "A's Stop returned before B, on the other worker, ended")
		require.EqualValues(t, 1, aRet.Load())
		require.GreaterOrEqual(t, aAt.Load(), int64(11*time.Second), "A's Stop outlasted B's sleep")
		require.Less(t, aAt.Load(), int64(12*time.Second))
		require.Zero(t, w.Stop())
		for i, d := range w.pool.done {
			require.True(t, isClosed(d), "worker %d", i)
		}
		st := booksBalance(t, w)
		require.Equal(t, uint64(1), st.Dropped)
		require.Equal(t, uint64(2), st.Fired)
	})
}
