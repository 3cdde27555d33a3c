package shardwheel_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// A callback that calls runtime.Goexit (t.FailNow or a failed require inside a callback, in a
// user's test) ends only its own goroutine, as it ends a time.AfterFunc callback's: the callbacks
// that fired with it still run, once; the wheel keeps time with as many workers as before; an
// Advance that it ended lets go of the clock; an Every goes on. Before this, one such callback
// ended a worker and every callback of its batch after it, and with one worker time stopped.

// TestFaultGoexitCallbacks: on the system clock, every fifth callback calls runtime.Goexit. Every
// callback runs once, the wheel still fires a timer afterwards, it runs as many worker goroutines
// as before, and Stop accounts for everything.
func TestFaultGoexitCallbacks(t *testing.T) {
	for _, workers := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			w, err := sw.New(sw.WithWorkers(workers))
			require.NoError(t, err)
			defer w.Stop()
			want := max(workers, 1) // WithWorkers(0) on the system clock: one, which keeps time
			require.Eventually(t, func() bool { return sw.WorkerGoroutines(w) == want }, fltPatience, time.Millisecond)

			const n = 400
			book := newFltBook(n + 1)
			for i := range n {
				// Many share a deadline, so a batch holds several Goexits and the callbacks after them.
				_, err := w.AfterFunc(time.Duration(i%20)*100*time.Microsecond, func() {
					book.ran(i)
					if i%5 == 0 {
						runtime.Goexit()
					}
				})
				require.NoError(t, err)
			}
			fltWaitQuiet(t, w, func() bool { r, _ := book.totals(n); return r == n })

			done := make(chan struct{})
			_, err = w.AfterFunc(time.Millisecond, func() { book.ran(n); close(done) })
			require.NoError(t, err)
			select {
			case <-done:
			case <-time.After(fltPatience):
				t.Fatalf("the wheel stopped keeping time after its callbacks called runtime.Goexit: %+v", w.Stats())
			}
			require.Eventually(t, func() bool { return sw.WorkerGoroutines(w) == want }, fltPatience, time.Millisecond,
				"worker goroutines: want %d", want)

			require.Equal(t, 0, w.Stop())
			book.check(t, n+1, 0)
			fltBalance(t, w, n+1, n+1, 0, 0)
		})
	}
}

// TestFaultGoexitInAdvance: with a manual clock and WithWorkers(0), a callback that calls
// runtime.Goexit ends the goroutine that called Advance, as a Goexit anywhere in it would. The
// callbacks of that batch still run, once, on it, before it ends; the next Advance, from another
// goroutine, does not wait for the first and fires what is due then, and nothing runs twice.
func TestFaultGoexitInAdvance(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithWorkers(0), sw.WithClock(clock))
	require.NoError(t, err)
	defer w.Stop()
	const n = 10
	book := newFltBook(n + 1)
	var advancer atomic.Int64
	var elsewhere atomic.Int32 // callbacks that ran on another goroutine than the advancer
	for i := range n {
		_, err := w.AfterFunc(time.Millisecond, func() {
			book.ran(i)
			if fltGoid() != advancer.Load() {
				elsewhere.Add(1)
			}
			if i == 3 || i == 7 {
				runtime.Goexit()
			}
		})
		require.NoError(t, err)
	}
	ended, returned := make(chan struct{}), false
	go func() {
		defer close(ended)
		advancer.Store(fltGoid())
		clock.Advance(time.Millisecond)
		returned = true
	}()
	<-ended
	require.False(t, returned, "Advance returned although a callback on its goroutine called runtime.Goexit")
	ran, _ := book.totals(n)
	require.Equal(t, n, ran, "every callback of the batch runs before the goroutine ends")
	require.Zero(t, elsewhere.Load())

	// The clock is free: Advance from this goroutine fires the next timer, and what ran does
	// not run again.
	advancer.Store(fltGoid())
	_, err = w.AfterFunc(time.Millisecond, func() { book.ran(n) })
	require.NoError(t, err)
	clock.Advance(time.Millisecond)
	clock.Advance(time.Hour)
	require.Equal(t, int32(1), book.runs[n].Load())
	require.Equal(t, 0, w.Stop())
	book.check(t, n+1, 0)
	fltBalance(t, w, n+1, n+1, 0, 0)
}

// TestFaultGoexitAfterStopInAdvance: a callback run by Advance (WithWorkers(0), or WithWorkers(1)
// with the queue full and CallerRuns) stops the wheel and then calls runtime.Goexit. The Stop it
// began is finished: the Advance goroutine ends, a Stop from another goroutine returns, the
// timers that were pending count as dropped, and no worker goroutine is left.
func TestFaultGoexitAfterStopInAdvance(t *testing.T) {
	for _, workers := range []int{0, 1} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			clock := sw.NewManualClock(time.Unix(0, 0))
			opts := []sw.Option{sw.WithWorkers(workers), sw.WithClock(clock)}
			if workers > 0 {
				opts = append(opts, sw.WithQueueSize(1), sw.WithFullPolicy(sw.CallerRuns))
			}
			w, err := sw.New(opts...)
			require.NoError(t, err)
			defer w.Stop()
			release := make(chan struct{})
			if workers > 0 {
				// Occupy the worker, then fill the queue, so that the next callback runs on the
				// Advance caller.
				started := make(chan struct{})
				_, err := w.AfterFunc(0, func() { close(started); <-release })
				require.NoError(t, err)
				clock.Advance(0)
				<-started
				_, err = w.AfterFunc(0, func() { <-release })
				require.NoError(t, err)
				clock.Advance(0)
			}
			var advancer, stopped atomic.Int64
			stopped.Store(-1)
			stopping := make(chan struct{})
			_, err = w.AfterFunc(time.Millisecond, func() {
				if fltGoid() != advancer.Load() {
					return // not on the Advance caller: not the case under test (stopped stays -1)
				}
				close(stopping)
				stopped.Store(int64(w.Stop()))
				runtime.Goexit()
			})
			require.NoError(t, err)
			for range 5 {
				_, err := w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
				require.NoError(t, err)
			}
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				advancer.Store(fltGoid())
				clock.Advance(time.Millisecond)
			}()
			// The Stop waits for the worker, which waits for release.
			select {
			case <-stopping:
			case <-time.After(fltPatience):
				t.Fatal("the callback never ran on the Advance caller")
			}
			close(release)
			require.Eventually(t, func() bool { return stopped.Load() >= 0 }, fltPatience, time.Millisecond)
			require.Equal(t, int64(5), stopped.Load(), "the callback's Stop drops the five pending an hour out")
			select {
			case <-ended:
			case <-time.After(fltPatience):
				t.Fatal("the Advance goroutine did not end")
			}
			again := make(chan int)
			go func() { again <- w.Stop() }()
			select {
			case n := <-again:
				require.Equal(t, 0, n)
			case <-time.After(fltPatience):
				t.Fatal("Stop waits for an Advance that a runtime.Goexit ended")
			}
			require.Equal(t, 0, sw.WorkerGoroutines(w))
		})
	}
}

// TestFaultGoexitInEvery: an Every whose second run calls runtime.Goexit goes on with its third,
// on the manual clock and on the system clock.
func TestFaultGoexitInEvery(t *testing.T) {
	t.Run("manual", func(t *testing.T) {
		clock := sw.NewManualClock(time.Unix(0, 0))
		w, err := sw.New(sw.WithWorkers(0), sw.WithClock(clock))
		require.NoError(t, err)
		defer w.Stop()
		var runs atomic.Int32
		_, err = w.Every(10*time.Millisecond, func() {
			if runs.Add(1) == 2 {
				runtime.Goexit()
			}
		})
		require.NoError(t, err)
		clock.Advance(10 * time.Millisecond)
		require.Equal(t, int32(1), runs.Load())
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			clock.Advance(10 * time.Millisecond)
		}()
		<-ended
		require.Equal(t, int32(2), runs.Load())
		for k := int32(3); k <= 5; k++ {
			clock.Advance(10 * time.Millisecond)
			require.Equal(t, k, runs.Load(), "run %d", k)
		}
		require.Equal(t, 1, w.Stop(), "the series' next run is pending")
	})
	t.Run("system", func(t *testing.T) {
		w, err := sw.New(sw.WithWorkers(1))
		require.NoError(t, err)
		defer w.Stop()
		var runs atomic.Int32
		_, err = w.Every(time.Millisecond, func() {
			runs.Add(1)
			runtime.Goexit() // every run: each ends the worker's goroutine
		})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return runs.Load() >= 20 }, fltPatience, time.Millisecond)
		// A goroutine that is ending may still show beside the one that replaced it.
		require.Eventually(t, func() bool { return sw.WorkerGoroutines(w) == 1 }, fltPatience, time.Millisecond)
		// The next run is pending (1), or its run fired just before Stop and starts after it,
		// with no next run (0): either way Stop's count is the books'.
		n := w.Stop()
		require.LessOrEqual(t, n, 1)
		st := w.Stats()
		require.EqualValues(t, n, st.Dropped, "%+v", st)
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	})
}

// TestFaultGoexitKeepsRerun: while a callback on the Advance caller runs, a worker's callback
// calls Advance, which returns at once and leaves the new time to the holder (rerun); then the
// caller's callback calls runtime.Goexit. The timer due at the new time still fires, with no
// further Advance.
func TestFaultGoexitKeepsRerun(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(1), sw.WithQueueSize(1), sw.WithFullPolicy(sw.CallerRuns))
	require.NoError(t, err)
	defer w.Stop()
	started, release, asked := make(chan struct{}), make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(0, func() { // on the worker
		close(started)
		<-release
		clock.Advance(time.Millisecond) // the holder is busy: this asks it to advance again
		close(asked)
	})
	require.NoError(t, err)
	clock.Advance(0)
	<-started
	_, err = w.AfterFunc(0, func() {}) // fills the queue
	require.NoError(t, err)
	clock.Advance(0)
	var advancer atomic.Int64
	onCaller := make(chan bool, 1)
	_, err = w.AfterFunc(0, func() {
		onCaller <- fltGoid() == advancer.Load()
		close(release)
		<-asked
		runtime.Goexit()
	})
	require.NoError(t, err)
	late := make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() { close(late) })
	require.NoError(t, err)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		advancer.Store(fltGoid())
		clock.Advance(0)
	}()
	require.True(t, <-onCaller, "the queue was full: the callback runs on the Advance caller")
	<-ended
	select {
	case <-late:
	case <-time.After(fltPatience):
		t.Fatal("the worker's Advance was lost with the goroutine that held the clock")
	}
	require.Equal(t, 0, w.Stop())
}
