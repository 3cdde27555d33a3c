package shardwheel

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestGoexitInCallerRunsTaskKeepsRestOfBatch: with workers and a manual clock, dispatch cuts a
// batch into tasks and runs a task the queue has no room for on the Advance caller (CallerRuns).
// A callback in such a task that calls runtime.Goexit ends the caller; the tasks of the batch
// after it, taken from the wheel and no longer pending, must still run: dispatch's deferred call
// runs them as the goroutine unwinds. So every callback runs once, Queued drops to 0, and what
// Stop returns balances the books.
func TestGoexitInCallerRunsTaskKeepsRestOfBatch(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	// taskCap = 1 and room for one task in the queue.
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

	// Two timers with one deadline: one batch of two tasks, both run on the Advance caller. The
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
	requireStoppedBooks(t, w, n)
}

// TestGoexitInPanicHandlerEndsOnlyThatGoroutine: a panic handler that calls runtime.Goexit
// (t.FailNow in a handler) runs inside the deferred recover of the callback's call. The Goexit
// still ends only that goroutine: every callback of the batch runs once, each panic is counted, a
// worker takes the place of the one that ended (system clock), the Advance caller lets go of the
// clock (manual clock, WithWorkers(0)), and the books balance.
func TestGoexitInPanicHandlerEndsOnlyThatGoroutine(t *testing.T) {
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
		requireStoppedBooks(t, w, got)
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
		requireStoppedBooks(t, w, got)
	})
}

// TestGoexitUnderWorkersAdvanceFreesClock: a worker's callback calls Advance (the worker becomes
// the advancer), and a callback that this Advance runs on it (the queue is full, CallerRuns) calls
// runtime.Goexit. That ends the worker's goroutine in the middle of its own callback, as any
// Goexit on it would: the clock is let go of, the queued callback runs on the worker that took its
// place, the count of workers stays 1, and the books balance.
func TestGoexitUnderWorkersAdvanceFreesClock(t *testing.T) {
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
		clock.Advance(0) // into the queue: room for one task, and this worker is busy
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
	requireWorkersExited(t, w)
	requireStoppedBooks(t, w, got)
}

// TestGoexitAndPanicsDuringOutsideStop: on the system clock, callbacks (one-shot and Every) that
// call runtime.Goexit or panic while a Stop from another goroutine begins. When Stop returns no
// callback is in progress (each one's deferred call has run, also when it called Goexit) and none
// starts afterwards, the worker goroutines are gone (a goroutine may still be in its last
// instructions after it closed its done channel, or spawned the one that did, as on a plain
// exit), what Stop returned is Stats.Dropped, and the books balance.
func TestGoexitAndPanicsDuringOutsideStop(t *testing.T) {
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
		requireStoppedBooks(t, w, got)
	}
}

// TestGoexitTwiceInCallerRunsBatchRunsEachOnce: a batch of four tasks runs on the Advance caller
// (the only worker busy, the queue full, CallerRuns). The first task's callback calls Goexit:
// dispatch's deferred call runs the rest of the batch; in it the third calls Goexit too, and
// runFrom's deferred call runs the fourth. Each runs exactly once, none is lost, and the clock is
// free afterwards (advanceHeld's deferred call lets go of it).
func TestGoexitTwiceInCallerRunsBatchRunsEachOnce(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1), WithQueueSize(1), WithFullPolicy(CallerRuns))
	require.NoError(t, err)
	release, started := make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(0, func() { close(started); <-release })
	require.NoError(t, err)
	clock.Advance(0)
	<-started
	_, err = w.AfterFunc(0, func() { <-release })
	require.NoError(t, err)
	clock.Advance(0)
	require.Equal(t, 1, len(w.pool.queue))

	var runs [4]atomic.Int32
	var order atomic.Int32
	for i := range 4 {
		_, err = w.AfterFunc(time.Millisecond, func() {
			runs[i].Add(1)
			if k := order.Add(1); k == 1 || k == 3 {
				runtime.Goexit()
			}
		})
		require.NoError(t, err)
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		clock.Advance(time.Millisecond)
		t.Error("Advance returned: the Goexit did not end its goroutine")
	}()
	<-ended
	for i := range runs {
		require.Equal(t, int32(1), runs[i].Load(), "callback %d", i)
	}
	close(release)
	fired := make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() { close(fired) })
	require.NoError(t, err)
	clock.Advance(time.Millisecond)
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("the clock was not let go")
	}
	n := w.Stop()
	require.Zero(t, n)
	requireWorkersExited(t, w)
	requireStoppedBooks(t, w, n)
}

// TestTinyQueueFloodBalancesBooks: floods that fire together on the system clock with a queue of
// one callback (WithQueueSize(1): tasks of one, a channel of one), shares offered to idle workers
// while some of the flood is stopped from outside and from its own callbacks, and an Every that
// runs through it. Every timer runs once or has one Stop that reported true, and once quiet the
// books balance: Queued is 0, Fired + Stopped == Scheduled, Lateness counts every start.
func TestTinyQueueFloodBalancesBooks(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, workers := range []int{1, 3} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w, err := New(WithWorkers(workers), WithShards(2), WithQueueSize(1), WithTick(time.Millisecond))
				require.NoError(t, err)
				defer w.Stop()
				const n = 600
				var (
					runs  [n]atomic.Int32
					stops [n]atomic.Bool
					tmsMu sync.Mutex
					tms   [n]Timer
				)
				var everyRuns atomic.Int32
				ev, err := w.Every(time.Millisecond, func() { everyRuns.Add(1) })
				require.NoError(t, err)
				for i := range n {
					tm, err := w.AfterFunc(time.Duration(i%3)*time.Millisecond, func() {
						runs[i].Add(1)
						if i%11 != 0 {
							return
						}
						j := (i + 7) % n
						tmsMu.Lock()
						tj := tms[j]
						tmsMu.Unlock()
						if tj.Stop() { // a zero Timer (not armed yet) reports false
							stops[j].Store(true)
						}
					})
					require.NoError(t, err)
					tmsMu.Lock()
					tms[i] = tm
					tmsMu.Unlock()
				}
				for i := 0; i < n; i += 13 {
					tmsMu.Lock()
					tm := tms[i]
					tmsMu.Unlock()
					if tm.Stop() {
						stops[i].Store(true)
					}
				}
				time.Sleep(10 * time.Millisecond)
				require.True(t, ev.Stop())
				synctest.Wait()
				for i := range n {
					if stops[i].Load() {
						require.Zero(t, runs[i].Load(), "timer %d ran after its Stop reported true", i)
					} else {
						require.EqualValues(t, 1, runs[i].Load(), "runs of timer %d", i)
					}
				}
				require.NotZero(t, everyRuns.Load())
				st := w.Stats()
				require.Zero(t, st.Queued, "%+v", st)
				require.Zero(t, st.Pending, "%+v", st)
				require.Equal(t, st.Scheduled, st.Fired+st.Stopped, "%+v", st)
				require.Equal(t, st.Fired, st.Lateness.Count())
			})
		})
	}
}

// TestEveryPanicKeepsItsSeries: a panicking callback is recovered, counted in Stats.Panics and
// handed to the panic handler, and the wheel keeps working: an Every whose f panics on every run
// keeps its series, each panic counted and handed over once, and its Timer still stops it.
func TestEveryPanicKeepsItsSeries(t *testing.T) {
	var got []any
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1),
		WithPanicHandler(func(r any) { got = append(got, r) }))
	n := 0
	tm, err := w.Every(time.Millisecond, func() { n++; panic(n) })
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		clk.Advance(time.Millisecond)
	}
	require.Equal(t, 3, n)
	require.Equal(t, []any{1, 2, 3}, got)
	require.Equal(t, uint64(3), w.Stats().Panics)
	require.True(t, tm.Stop())
	requireBooks(t, w)
}
