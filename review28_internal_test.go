package shardwheel

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Review 28: runtime.Goexit in callbacks (223771d), the end of a manual clock's time (8787e36),
// and Stop's count and finish from a callback (0b3e5ba).

// review28Balance asserts the quiet balance of a stopped wheel and that what Stop returned in
// total is Dropped.
func review28Balance(t *testing.T, w *Wheel, stopReturned int) {
	t.Helper()
	st := w.Stats()
	require.Equal(t, uint64(stopReturned), st.Dropped, "Dropped is the sum of what Stop returned")
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending),
		"Scheduled == Fired + Stopped + Dropped + Pending: %+v", st)
	require.Equal(t, st.Fired, st.Lateness.Count())
}

// TestReview28GoexitCallerRunsChunkLosesBatch (bug): with workers and a manual clock, dispatch
// (workers.go:150-169) cuts the batch into chunks and runs a chunk the queue has no room for on
// the Advance caller (CallerRuns, workers.go:157-158). A callback in such a chunk that calls
// runtime.Goexit ends the caller: runFrom (workers.go:207-218) runs the rest of that chunk only,
// then the goroutine unwinds through dispatch's loop, which never gets to the chunks after it,
// and advanceManual's deferred call (clock.go:176-184) clears w.batch, which still held them.
// Those entries were taken out of the wheel (firing): they never run, Stop does not count them,
// and Len stays 1 for good. The comment at clock.go:170-174 says the rest of the batch ran and
// what w.batch holds ran; only the rest of the chunk did. The same happens on every path where
// dispatch runs chunks on the caller: Advance from a worker's callback (onWorker, any policy,
// when the queue is full) and any policy once Stop has closed closing (workers.go:152-155).
func TestReview28GoexitCallerRunsChunkLosesBatch(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	// chunkCap = 1 and room for one chunk in the queue.
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1), WithQueueSize(1), WithFullPolicy(CallerRuns))
	require.NoError(t, err)
	defer w.Stop()

	// Occupy the worker, then fill the queue.
	release, started := make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(0, func() { close(started); <-release })
	require.NoError(t, err)
	clock.Advance(0)
	<-started
	_, err = w.AfterFunc(0, func() { <-release })
	require.NoError(t, err)
	clock.Advance(0)

	// Two timers with one deadline: one batch of two chunks, both run on the Advance caller. The
	// first of them to run calls runtime.Goexit.
	var first atomic.Bool
	var ran atomic.Int32
	for range 2 {
		_, err = w.AfterFunc(time.Millisecond, func() {
			ran.Add(1)
			if first.CompareAndSwap(false, true) {
				runtime.Goexit()
			}
		})
		require.NoError(t, err)
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		clock.Advance(time.Millisecond)
	}()
	<-ended
	close(release)
	clock.Advance(time.Hour)
	require.Eventually(t, func() bool { return w.Stats().Queued == 0 }, 5*time.Second, time.Millisecond)

	require.Equal(t, int32(2), ran.Load(), "the callback that fired with the one that called Goexit never ran (Len %d)", w.Len())
	n := w.Stop()
	review28Balance(t, w, n)
}

// TestStopOnOnlyWorkerQueuedCallbackStillRuns: with a manual clock and one worker, a callback on
// that worker calls Stop while another callback, taken from the wheel, waits in the queue. Stop
// returns at once; the queued callback still runs once, on that worker, after it.
func TestStopOnOnlyWorkerQueuedCallbackStillRuns(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	// taskCap = 1: the batch of two is two tasks; Block waits for room for the second.
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1), WithQueueSize(1))
	require.NoError(t, err)
	defer w.Stop()
	var first atomic.Bool
	var otherRan atomic.Int32
	stopped := make(chan struct{})
	cb := func() {
		if !first.CompareAndSwap(false, true) {
			otherRan.Add(1)
			return
		}
		// Wait until the other one is in the queue (the Advance queues it once this task was taken).
		for len(w.pool.queue) == 0 {
			time.Sleep(time.Millisecond)
		}
		require.Zero(t, w.Stop(), "nothing was pending: both had fired")
		require.Equal(t, 1, w.Stats().Queued, "the other callback waits in the queue")
		close(stopped)
	}
	for range 2 {
		_, err = w.AfterFunc(time.Millisecond, cb)
		require.NoError(t, err)
	}
	clock.Advance(time.Millisecond)
	<-stopped
	w.Stop()
	require.Equal(t, int32(1), otherRan.Load(), "the queued callback ran once before the outside Stop returned")
	review28Balance(t, w, 0)
}

// TestReview28GoexitInPanicHandler (pin): a panic handler that calls runtime.Goexit (t.FailNow
// in a handler) runs inside call's deferred recover (workers.go:264-281). The Goexit still ends
// only that goroutine: every callback of the batch runs once, each panic is counted, a worker
// takes the place of the one that ended (system clock), the Advance caller lets go of the clock
// (manual clock, WithWorkers(0)), and the books balance.
func TestReview28GoexitInPanicHandler(t *testing.T) {
	const n = 12
	t.Run("system", func(t *testing.T) {
		var handled atomic.Int32
		w, err := New(WithShards(1), WithWorkers(1), WithPanicHandler(func(any) {
			handled.Add(1)
			runtime.Goexit()
		}))
		require.NoError(t, err)
		defer w.Stop()
		var ran atomic.Int32
		for i := range n {
			_, err := w.AfterFunc(time.Millisecond, func() {
				ran.Add(1)
				if i%2 == 0 {
					panic(i)
				}
			})
			require.NoError(t, err)
		}
		require.Eventually(t, func() bool { return ran.Load() == n }, 5*time.Second, time.Millisecond)
		done := make(chan struct{})
		_, err = w.AfterFunc(time.Millisecond, func() { close(done) })
		require.NoError(t, err)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the wheel stopped keeping time")
		}
		require.Eventually(t, func() bool { return WorkerGoroutines(w) == 1 }, 5*time.Second, time.Millisecond)
		require.Equal(t, int32(n/2), handled.Load())
		require.Equal(t, uint64(n/2), w.Stats().Panics)
		got := w.Stop()
		require.Zero(t, got)
		require.Equal(t, int32(n), ran.Load(), "nothing ran twice")
		review28Balance(t, w, got)
	})
	t.Run("manual", func(t *testing.T) {
		clock := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clock), WithShards(2), WithWorkers(0), WithPanicHandler(func(any) { runtime.Goexit() }))
		require.NoError(t, err)
		defer w.Stop()
		var ran atomic.Int32
		for i := range n {
			_, err := w.AfterFunc(time.Millisecond, func() {
				ran.Add(1)
				if i == 3 || i == 8 {
					panic(i)
				}
			})
			require.NoError(t, err)
		}
		ended, returned := make(chan struct{}), false
		go func() {
			defer close(ended)
			clock.Advance(time.Millisecond)
			returned = true
		}()
		<-ended
		require.False(t, returned)
		require.Equal(t, int32(n), ran.Load(), "the batch ran to its end before the goroutine ended")
		require.Equal(t, uint64(2), w.Stats().Panics)
		fired := false
		_, err = w.AfterFunc(time.Millisecond, func() { fired = true })
		require.NoError(t, err)
		clock.Advance(time.Millisecond) // the clock is free
		require.True(t, fired)
		got := w.Stop()
		require.Zero(t, got)
		require.Equal(t, int32(n), ran.Load(), "nothing ran twice")
		review28Balance(t, w, got)
	})
}

// TestReview28GoexitUnderWorkersAdvance (pin): a worker's callback calls Advance (it becomes the
// advancer), and a callback that this Advance runs on it (the queue is full, CallerRuns) calls
// runtime.Goexit. That ends the worker's goroutine in the middle of its own callback, as any
// Goexit on it would: the clock is let go of, the queued callback runs on the worker that took
// its place, the count of workers stays 1, and the books balance.
func TestReview28GoexitUnderWorkersAdvance(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1), WithQueueSize(1), WithFullPolicy(CallerRuns))
	require.NoError(t, err)
	defer w.Stop()
	var queuedRan, goexitRan, afterAdvance atomic.Int32
	outerEnded, advanced := make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(0, func() {
		defer close(outerEnded) // runs as the Goexit unwinds
		// Once the test's Advance has let go of the clock: else this callback's Advance only
		// asks it to advance again (rerun) and returns, and nothing runs here.
		<-advanced
		_, err := w.AfterFunc(0, func() { queuedRan.Add(1) })
		if err != nil {
			panic(err)
		}
		clock.Advance(0) // into the queue: room for one chunk, and this worker is busy
		_, err = w.AfterFunc(0, func() { goexitRan.Add(1); runtime.Goexit() })
		if err != nil {
			panic(err)
		}
		clock.Advance(0) // the queue is full: it runs here, and ends this goroutine
		afterAdvance.Add(1)
	})
	require.NoError(t, err)
	clock.Advance(0)
	close(advanced)
	select {
	case <-outerEnded:
	case <-time.After(5 * time.Second):
		t.Fatal("the worker's callback never ended")
	}
	require.Eventually(t, func() bool { return queuedRan.Load() == 1 }, 5*time.Second, time.Millisecond,
		"the queued callback runs on the worker that took the place of the one that ended")
	require.Equal(t, int32(1), goexitRan.Load())
	require.Zero(t, afterAdvance.Load(), "the Goexit ended the goroutine of the callback that called Advance")
	require.Eventually(t, func() bool { return WorkerGoroutines(w) == 1 }, 5*time.Second, time.Millisecond)

	fired := make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() { close(fired) })
	require.NoError(t, err)
	clock.Advance(time.Millisecond) // the clock is free
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("a timer due at this Advance never ran")
	}
	got := w.Stop()
	require.Zero(t, got)
	require.Zero(t, WorkerGoroutines(w))
	review28Balance(t, w, got)
}

// TestReview28StopDropsRunsOfBothSlots (pin): an Every A runs on the only worker; its f calls
// Advance, which makes the worker the advancer, and the queue being full, a second Every B runs
// on it too, in the shared slot (dispatch, CallerRuns). B's f stops the wheel. Both series have
// a run in progress on Stop's own goroutine, in two slots: dropOwnRuns (shardwheel.go:390-406)
// drops the next run of each, so Stop returns them with the three pending timers, that is
// Stats.Dropped, and the books balance.
func TestReview28StopDropsRunsOfBothSlots(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1), WithQueueSize(1), WithFullPolicy(CallerRuns))
	require.NoError(t, err)
	defer w.Stop()
	for range 3 {
		_, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
		require.NoError(t, err)
	}
	goOn := make(chan struct{})
	got, bRuns, aRuns := -1, 0, 0
	var yRan atomic.Int32
	aDone := make(chan struct{})
	_, err = w.Every(10*time.Millisecond, func() {
		aRuns++
		defer close(aDone)
		<-goOn // the test's Advance has let go of the clock
		if _, err := w.AfterFunc(0, func() { yRan.Add(1) }); err != nil {
			panic(err)
		}
		clock.Advance(0) // into the queue, which is then full
		if _, err := w.Every(time.Millisecond, func() {
			bRuns++
			got = w.Stop()
		}); err != nil {
			panic(err)
		}
		clock.Advance(time.Millisecond) // B is due: it runs here
	})
	require.NoError(t, err)
	clock.Advance(10 * time.Millisecond)
	close(goOn)
	<-aDone
	require.Eventually(t, func() bool { return yRan.Load() == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 1, aRuns)
	require.Equal(t, 1, bRuns)
	require.Equal(t, 5, got, "three pending, and the next run of A and of B")
	require.Zero(t, w.Stop())
	review28Balance(t, w, got)
}

// TestReview28EveryRunAfterStopUncounted (pin): an Every's run fired before Stop and waiting in
// the queue starts once Stop has begun, on the other worker, which Stop waits for. It runs (it
// was handed to the pool), and its next run, which was never pending, is not in what Stop returns
// (runPeriodic, every.go:87-89): Stop returns the two pending timers, which is Stats.Dropped.
func TestReview28EveryRunAfterStopUncounted(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(2), WithQueueSize(1))
	require.NoError(t, err)
	defer w.Stop()
	for range 2 {
		_, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
		require.NoError(t, err)
	}
	// X holds one worker until Stop has begun.
	xStarted := make(chan struct{})
	_, err = w.AfterFunc(0, func() {
		close(xStarted)
		for !w.closed.Load() {
			time.Sleep(time.Millisecond)
		}
	})
	require.NoError(t, err)
	clock.Advance(0)
	<-xStarted

	var eRuns atomic.Int32
	got := -1
	stopped := make(chan struct{})
	_, err = w.AfterFunc(9*time.Millisecond, func() { // a round before E's
		for len(w.pool.queue) == 0 { // E's first run is queued behind this one
			time.Sleep(time.Millisecond)
		}
		got = w.Stop()
		close(stopped)
	})
	require.NoError(t, err)
	e, err := w.Every(10*time.Millisecond, func() { eRuns.Add(1) })
	require.NoError(t, err)
	clock.Advance(10 * time.Millisecond)
	<-stopped
	require.Equal(t, int32(1), eRuns.Load(), "the queued run ran before Stop returned")
	require.Equal(t, 2, got)
	require.False(t, e.Stop())
	review28Balance(t, w, got)
}

// TestReview28GoexitStopStorm (pin): on the system clock, callbacks (one-shot and Every) that
// call runtime.Goexit or panic while a Stop from another goroutine begins. When Stop returns no
// callback is in progress (each one's deferred call has run, also when it called Goexit) and
// none starts afterwards, the worker goroutines are gone (a goroutine may still be in its last
// instructions after it closed done[i] or spawned the one that did, as on a plain exit), what
// Stop returned is Stats.Dropped, and the books balance.
func TestReview28GoexitStopStorm(t *testing.T) {
	rounds := 20
	if testing.Short() {
		rounds = 5
	}
	for r := range rounds {
		w, err := New(WithShards(2), WithWorkers(2), WithPanicHandler(func(any) {}))
		require.NoError(t, err)
		var after atomic.Bool
		var late, inFlight atomic.Int32
		cb := func(i int) func() {
			return func() {
				inFlight.Add(1)
				defer inFlight.Add(-1)
				if after.Load() {
					late.Add(1)
				}
				switch i % 10 {
				case 0:
					runtime.Goexit()
				case 1:
					panic(i)
				}
			}
		}
		for i := range 600 {
			d := time.Duration(i%40) * 100 * time.Microsecond
			if i%50 == 7 {
				_, err = w.Every(200*time.Microsecond, cb(i))
			} else {
				_, err = w.AfterFunc(d, cb(i))
			}
			require.NoError(t, err)
		}
		time.Sleep(time.Duration(r%5) * 500 * time.Microsecond)
		got := w.Stop()
		after.Store(true)
		require.Zero(t, inFlight.Load(), "round %d: a callback was still running when Stop returned", r)
		require.Eventually(t, func() bool { return WorkerGoroutines(w) == 0 }, 5*time.Second, time.Millisecond,
			"round %d: a worker goroutine outlived Stop", r)
		require.Zero(t, late.Load(), "round %d: a callback started after Stop returned", r)
		review28Balance(t, w, got)
	}
}
