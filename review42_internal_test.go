package shardwheel

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 42: an attack on 37a3d00 (expire puts a wrapped firing word back) and 163e1c0 (a later
// Stop from a callback waits for the other callbacks; a later Stop from outside waits for every
// worker's exit).

// waitFor waits for c, failing the test after 10 s with what it waited for.
func waitFor[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("waited 10 s for %s", what)
		panic("unreachable")
	}
}

// TestReview42FixedLaterStopOnWorkerLeavesQueuedCallback: API.md, "Starting and stopping":
// "callbacks already running, or already handed to the worker pool, run to their end before
// Stop returns ... Called from inside a callback, Stop waits for every other callback but not for
// the one it is called from". Review 28 made the first Stop from a callback on the only worker
// run what waits in the queue (finishStop's drain). A later Stop, from a callback on that worker
// while a goroutine outside is in the first Stop, goes to laterStop: it waits for advOver and for
// the other workers (there are none) and returns, while callback C, handed to the pool by an
// Advance before either Stop, still waits in the queue; it runs only after the Stop returned and
// the callback with it (the worker drains the queue as it exits).
func TestReview42FixedLaterStopOnWorkerLeavesQueuedCallback(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(4))
	require.NoError(t, err)

	aIn, aGo, aOut := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var cRan, cRanAtA atomic.Bool
	var aRet atomic.Int64
	_, err = w.AfterFunc(time.Millisecond, func() { // on the only worker
		close(aIn)
		<-aGo
		aRet.Store(int64(w.Stop()))
		cRanAtA.Store(cRan.Load())
		close(aOut)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, aIn, "A to start on the worker")
	_, err = w.AfterFunc(time.Millisecond, func() { cRan.Store(true) })
	require.NoError(t, err)
	clk.Advance(time.Millisecond) // C is handed to the pool: it waits in the queue behind A
	require.Equal(t, 1, len(w.pool.queue), "C waits in the queue")

	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
		"the first Stop reached its wait for the worker")
	close(aGo)
	waitFor(t, aOut, "A's Stop to return")
	require.Equal(t, 0, waitFor(t, first, "the first Stop"))
	require.True(t, cRan.Load(), "C runs in the end")
	require.Zero(t, aRet.Load())
	require.True(t, cRanAtA.Load(),
		"a later Stop from a callback returned while callback C, handed to the pool before it, waited in the queue")
}

// TestReview42FixedLaterStopOnWorkerLeavesQueuedCallbackTwoWorkers: the same with two workers and
// the first Stop from a callback too. K (worker 0) calls Stop first and waits for worker 1; J
// (worker 1) then calls Stop: laterStop finds worker 0 inside a Stop and returns, while C waits
// in the queue, which worker 1 empties only after J returns (and K after every other worker
// exited). The first Stop, K's, runs C before it returns; J's does not.
func TestReview42FixedLaterStopOnWorkerLeavesQueuedCallbackTwoWorkers(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(2), WithShards(1), WithQueueSize(4))
	require.NoError(t, err)

	in := make(chan struct{}, 2)
	kGo, jGo := make(chan struct{}), make(chan struct{})
	kOut, jOut := make(chan struct{}), make(chan struct{})
	var cRan, cRanAtJ, cRanAtK atomic.Bool
	var n atomic.Int32
	var kRet, jRet atomic.Int64
	f := func() {
		in <- struct{}{}
		if n.Add(1) == 1 { // K
			<-kGo
			kRet.Store(int64(w.Stop()))
			cRanAtK.Store(cRan.Load())
			close(kOut)
			return
		}
		<-jGo // J
		jRet.Store(int64(w.Stop()))
		cRanAtJ.Store(cRan.Load())
		close(jOut)
	}
	_, err = w.AfterFunc(time.Millisecond, f)
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, in, "the first callback to start")
	_, err = w.AfterFunc(time.Millisecond, f)
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, in, "the second callback to start")
	_, err = w.AfterFunc(time.Millisecond, func() { cRan.Store(true) })
	require.NoError(t, err)
	clk.Advance(time.Millisecond) // both workers busy: C waits in the queue
	require.Equal(t, 1, len(w.pool.queue), "C waits in the queue")

	close(kGo)
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
		"K's Stop reached its wait for worker 1")
	close(jGo)
	waitFor(t, jOut, "J's Stop to return")
	waitFor(t, kOut, "K's Stop to return")
	require.True(t, cRanAtK.Load(), "the first Stop from a callback runs the queue before it returns (review 28)")
	require.Equal(t, int64(0), kRet.Load()+jRet.Load())
	require.True(t, cRanAtJ.Load(),
		"a later Stop from a callback returned while callback C, handed to the pool before it, waited in the queue")
}

// TestReview42FixedLaterStopFromOutsideMissesAdvancerCallback: API.md: "callbacks already
// running ... run to their end before Stop returns". With WithWorkers(0) on a manual clock, X and
// Y fire in one batch of an Advance and run on its goroutine; X calls Stop first (on the
// advancer), which returns, and Y starts after it (allowed: it fired with X). A goroutine outside
// then calls Stop while Y runs: a later Stop from outside waits for stopped and for every
// worker's done (shardwheel.go Stop), none of which covers the advancer's batch, so it returns 0
// at once while Y, already running when it was called, runs on. (On a worker the same batch is
// covered: that worker exits only after Y, and done is waited for.)
func TestReview42FixedLaterStopFromOutsideMissesAdvancerCallback(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)

	var n atomic.Int32
	firstRet := make(chan int, 1)
	yIn, yRelease := make(chan struct{}), make(chan struct{})
	var yDone atomic.Bool
	f := func() {
		if n.Add(1) == 1 {
			firstRet <- w.Stop()
			return
		}
		close(yIn)
		select {
		case <-yRelease:
		case <-time.After(10 * time.Second):
		}
		yDone.Store(true)
	}
	for range 2 {
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
	}
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(advanced) }()
	waitFor(t, yIn, "Y to start on the advancer")
	require.Equal(t, 1, waitFor(t, firstRet, "X's Stop"))

	time.AfterFunc(200*time.Millisecond, func() { close(yRelease) })
	later := make(chan int, 1)
	var yDoneAtStop atomic.Bool
	go func() {
		r := w.Stop()
		yDoneAtStop.Store(yDone.Load())
		later <- r
	}()
	require.Equal(t, 0, waitFor(t, later, "the later Stop from outside"))
	waitFor(t, advanced, "the Advance")
	require.True(t, yDone.Load())
	require.True(t, yDoneAtStop.Load(),
		"a later Stop from outside returned while callback Y, running when it was called, ran on")
}

// TestReview42PinWrapRevertStillDueKeepsOrder (pin, 37a3d00): the shard is paused between its
// reads of T's word and deadline and its CAS (testHookExpiring) while T is Reset 2^versionBits
// times: all but the last to later deadlines (no command), the last with d = 0, to the clock's
// time (2 ms), which sends a reset command and leaves T due in this very Advance, but in a later
// round than the one T was taken in (1 ms). The CAS succeeds on the wrapped word; expire sees the
// deadline moved, puts the word back and looks again: T goes down to its new tick and fires there,
// after Z (1.5 ms), as ManualClock.Advance promises (deadline order within one Advance), exactly
// once; the stale reset command does nothing; the books balance.
func TestReview42PinWrapRevertStillDueKeepsOrder(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := newWheel40(t, WithShards(1), WithWorkers(0), WithTick(100*time.Microsecond))
	defer w.Stop()

	var order []string
	var tAt int64
	tm, err := w.AfterFunc(time.Millisecond, func() {
		order = append(order, "T")
		tAt = clk.elapsed.Load()
	})
	require.NoError(t, err)
	clk.Advance(0) // the shard takes the add: T is linked
	_, err = w.AfterFunc(1500*time.Microsecond, func() { order = append(order, "Z") })
	require.NoError(t, err)

	te := tm.s.slab.at(tm.i)
	var resets int
	var hookCalls int
	testHookExpiring = func(e *entry) {
		if e != te {
			return
		}
		hookCalls++
		if resets > 0 {
			return
		}
		for resets < 1<<versionBits-1 {
			resets++
			require.True(t, tm.Reset(time.Second+time.Duration(resets)*time.Microsecond), "Reset %d", resets)
		}
		resets++
		require.True(t, tm.Reset(0), "the last Reset")
	}
	defer func() { testHookExpiring = nil }()

	clk.Advance(2 * time.Millisecond)
	require.Equal(t, 1<<versionBits, resets)
	require.Equal(t, []string{"Z", "T"}, order, "T fired at its old deadline's round, before Z")
	require.Equal(t, 2, hookCalls, "T was judged due twice: at 1 ms (put back) and at 2 ms")
	require.Equal(t, int64(2*time.Millisecond), tAt)
	require.False(t, tm.Stop())
	require.False(t, tm.Reset(time.Millisecond))
	clk.Advance(time.Second * 3)
	require.Equal(t, []string{"Z", "T"}, order, "fires once")
	require.Zero(t, w.Len())
	st := booksBalance(t, w)
	require.Equal(t, uint64(2), st.Fired)
}

// TestReview42PinLaterStopOnWorkerBesideAdvancerStop: on a manual clock with CallerRuns, the
// Advance runs X and Y (one batch) itself; a goroutine outside is in the first Stop, waiting for
// advMu. X calls Stop (a later one, on the advancer: laterStop closes quit and waits for the
// worker). A, on the worker, then calls Stop. Review 42 asked A's Stop to wait for Y; review 44
// showed that waiting deadlocks when Y waits for A's Stop, and Stop's doc excepts Y (what X's
// goroutine runs after X's Stop returned). So A's Stop may return before Y or after it; pinned
// here: nothing deadlocks, Y runs once, before the first Stop returns, which returns 0.
func TestReview42PinLaterStopOnWorkerBesideAdvancerStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1),
		WithFullPolicy(CallerRuns))
	require.NoError(t, err)

	aIn, aGo, aOut := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var yRan, yRanAtA atomic.Bool
	_, err = w.AfterFunc(time.Millisecond, func() { // A, on the only worker
		close(aIn)
		<-aGo
		if r := w.Stop(); r != 0 {
			t.Errorf("A's later Stop returned %d", r)
		}
		yRanAtA.Store(yRan.Load())
		close(aOut)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	waitFor(t, aIn, "A to start on the worker")
	_, err = w.AfterFunc(time.Millisecond, func() {}) // fills the queue
	require.NoError(t, err)
	clk.Advance(time.Millisecond)

	xIn, xGo := make(chan struct{}), make(chan struct{})
	var n atomic.Int32
	f := func() { // X, then Y, on the advancer (no room in the queue)
		if n.Add(1) == 1 {
			close(xIn)
			<-xGo
			if r := w.Stop(); r != 0 {
				t.Errorf("X's later Stop returned %d", r)
			}
			return
		}
		yRan.Store(true)
	}
	for range 2 {
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
	}
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(advanced) }()
	waitFor(t, xIn, "X to start on the advancer")
	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.closing) }, 5*time.Second, time.Millisecond,
		"the first Stop began")
	close(xGo)
	// X's later Stop closes quit (the first Stop waits for advMu, which X's advance holds).
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
		"X is inside its Stop")
	close(aGo)
	waitFor(t, aOut, "A's Stop to return")
	waitFor(t, advanced, "the Advance")
	require.Equal(t, 0, waitFor(t, first, "the first Stop"))
	require.True(t, yRan.Load(), "Y ran before the first Stop returned")
	_ = yRanAtA.Load() // either way: Stop's doc excepts Y for A
}
