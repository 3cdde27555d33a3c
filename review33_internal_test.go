package shardwheel

import (
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// Review 33: the contract to the letter (API.md, README's guarantees, options and limits, the
// exported doc comments), with Every, ManualClock and Stats in particular.

// newManualWheel returns a wheel on a fresh manual clock at the Unix epoch, stopped at the end of the
// test.
func newManualWheel(t *testing.T, opts ...Option) (*Wheel, *ManualClock) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(append([]Option{WithClock(clk)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	return w, clk
}

// balance33 requires Scheduled == Fired + Stopped + Dropped + Pending and Lateness.Count() ==
// Fired on a quiet wheel.
func balance33(t *testing.T, w *Wheel) Stats {
	t.Helper()
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "%+v", st)
	require.Equal(t, st.Fired, st.Lateness.Count(), "%+v", st)
	return st
}

// TestReview33FixedEveryEndOfTimeLeaksMaxPending: an Every whose series ends at the end of time
// (endRun's drop, every.go:106-116) takes its next run back from Scheduled but never gives its
// WithMaxPending credit back (no releasePending there, unlike every other way a timer ends). The
// wheel is quiet with Len() == 0, yet a WithMaxPending(1) wheel refuses the next timer forever.
// WithMaxPending's doc: "once the wheel is quiet, n timers are always accepted".
func TestReview33FixedEveryEndOfTimeLeaksMaxPending(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1), WithMaxPending(1))
	runs := 0
	_, err := w.Every(time.Hour, func() { runs++ })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64) // the end of time: one run, and the series ends
	require.Equal(t, 1, runs)
	require.Equal(t, 0, w.Len(), "the series ended: nothing pending")
	balance33(t, w)

	fired := 0
	_, err = w.AfterFunc(0, func() { fired++ })
	require.NoError(t, err, "a quiet wheel with Len() == 0 refuses a timer under WithMaxPending(1)")
	clk.Advance(0)
	require.Equal(t, 1, fired)
}

// TestReview33FixedLatenessReadOncePerBatch: Stats.Lateness is documented as "how late each
// callback started, against its deadline rounded up to the tick" (API.md, Stats' doc). runRefs
// (workers.go:200-207) reads the clock once for a whole batch, before its first callback, so a
// callback that starts after a slow one of its batch is counted as on time. Here the first of two
// callbacks due at 1ms takes a second (it moves the manual clock, as a slow callback would on the
// system clock); the second starts 1s late and Lateness says nobody was later than 1µs. This
// is the head-of-line delay that README's Limits ("a slow callback delays the callbacks of its
// own step (up to 256) that follow it") warns about, and Lateness is the metric meant to show
// it.
func TestReview33FixedLatenessReadOncePerBatch(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1))
	var startedAt []time.Duration
	for i := 0; i < 2; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			startedAt = append(startedAt, clk.Now().Sub(time.Unix(0, 0)))
			if len(startedAt) == 1 {
				clk.Advance(time.Second) // the first to start takes a second
			}
		})
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	require.Equal(t, []time.Duration{time.Millisecond, time.Second + time.Millisecond}, startedAt)
	st := balance33(t, w)
	require.GreaterOrEqual(t, st.Lateness.Quantile(1), time.Second/2,
		"the second callback started 1s after its deadline; Lateness buckets: %v", st.Lateness.Buckets)
}

// TestReview33FixedQueuedCountsOnlyUntaken: API.md defines Stats.Queued as "callbacks handed to the
// worker pool and not yet started". pool.totals (workers.go:103-117) computes it as pushed -
// taken, and a worker counts a whole chunk as taken when it takes it from the queue
// (runTask, expiry.go:209), before it starts the chunk's first callback. With one worker and
// four callbacks due together (one chunk), while the first blocks the three others have not
// started, Len counts them pending ("a timer whose callback waits in the worker queue is still
// pending"), and Queued says 0.
func TestReview33FixedQueuedCountsOnlyUntaken(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(1), WithShards(1))
	entered, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	started := 0
	for i := 0; i < 4; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			mu.Lock()
			started++
			first := started == 1
			mu.Unlock()
			if first {
				close(entered)
				<-release
			}
		})
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	wait26(t, entered, "the first callback never started")
	st := w.Stats()
	close(release)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return started == 4 }, 5*time.Second, time.Millisecond)
	require.Equal(t, uint64(1), st.Fired)
	require.Equal(t, 3, st.Pending, "three callbacks handed to the pool have not started")
	require.Equal(t, 3, st.Queued, "Stats.Queued: callbacks handed to the worker pool and not yet started")
}

// TestReview33FixedAdvanceOrderAcrossWheels: ManualClock.Advance "dispatches every timer of every
// wheel on this clock whose deadline is at or before the new time, in order of deadline rounded
// up to the tick (ties in any order). With WithWorkers(0) those callbacks have also run". With
// two wheels on one clock, Advance (clock.go:85-87) advances the first wheel to the new time
// and only then the second: a timer of the first wheel due at 5ms runs before one of the second
// due at 1ms.
func TestReview33FixedAdvanceOrderAcrossWheels(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	defer a.Stop()
	b, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	defer b.Stop()
	var order []string
	_, err = a.AfterFunc(5*time.Millisecond, func() { order = append(order, "a@5ms") })
	require.NoError(t, err)
	_, err = b.AfterFunc(time.Millisecond, func() { order = append(order, "b@1ms") })
	require.NoError(t, err)
	clk.Advance(10 * time.Millisecond)
	require.Equal(t, []string{"b@1ms", "a@5ms"}, order, "timers of one Advance ran out of deadline order")
}

// TestReview33FixedAdvanceLeavesDueTimerOnEarlierWheel: "When Advance returns, every timer whose
// deadline is at or before the new time has been dispatched" (API.md), and "A timer armed with
// d <= 0 by a callback of this Advance is due at the clock's new time: it fires in this Advance
// if the callback ran in a round at an earlier instant" (Advance's doc). A callback of the
// second wheel on the clock, running in the round at 1ms of an Advance to 10ms, arms a timer
// with d = 0 on the first wheel, which Advance has already finished with (clock.go:85-87): the
// timer is due at 10ms, Advance returns, and it has not run.
func TestReview33FixedAdvanceLeavesDueTimerOnEarlierWheel(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	defer a.Stop()
	b, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	defer b.Stop()
	ran := false
	_, err = b.AfterFunc(time.Millisecond, func() {
		_, err := a.AfterFunc(0, func() { ran = true })
		require.NoError(t, err)
	})
	require.NoError(t, err)
	clk.Advance(10 * time.Millisecond)
	pending := a.Len()
	clk.Advance(0)
	require.True(t, ran)
	require.Zero(t, pending, "Advance returned with a timer due at its new time still pending on another wheel of the clock")
}

// TestReview33PinEveryErrors: each bad input to Every returns the documented error, names the
// value, schedules nothing and counts in Rejected.
func TestReview33PinEveryErrors(t *testing.T) {
	w, _ := newManualWheel(t, WithWorkers(0))
	for _, iv := range []time.Duration{0, -1, math.MinInt64} {
		_, err := w.Every(iv, func() {})
		require.Error(t, err)
		require.Contains(t, err.Error(), "Every("+durationArgString(iv)+")", "%v", err)
	}
	_, err := w.Every(time.Second, nil)
	require.ErrorIs(t, err, ErrNilFunc)
	_, err = w.AfterFunc(time.Second, nil)
	require.ErrorIs(t, err, ErrNilFunc)
	_, err = w.AfterFuncArg(time.Second, nil, 1)
	require.ErrorIs(t, err, ErrNilFunc)
	require.Equal(t, 0, w.Len())
	st := w.Stats()
	require.EqualValues(t, 6, st.Rejected)
	require.Zero(t, st.Scheduled)

	w.Stop()
	_, err = w.Every(time.Second, func() {})
	require.ErrorIs(t, err, ErrClosed)
	_, err = w.AfterFunc(-time.Second, func() {})
	require.ErrorIs(t, err, ErrClosed)
	_, err = w.AfterFuncArg(math.MaxInt64, func(any) {}, nil)
	require.ErrorIs(t, err, ErrClosed)
	require.EqualValues(t, 9, w.Stats().Rejected)
}

func durationArgString(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}

// TestReview33PinMaxPendingErrorNamesLimit: past WithMaxPending every scheduling call (Every
// included) returns an ErrTooManyTimers that names the limit; Stop of one frees a place.
func TestReview33PinMaxPendingErrorNamesLimit(t *testing.T) {
	w, _ := newManualWheel(t, WithWorkers(0), WithShards(2), WithMaxPending(3))
	var tms []Timer
	for i := 0; i < 3; i++ {
		tm, err := w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
		tms = append(tms, tm)
	}
	for _, f := range []func() error{
		func() error { _, err := w.AfterFunc(time.Hour, func() {}); return err },
		func() error { _, err := w.AfterFuncArg(time.Hour, func(any) {}, nil); return err },
		func() error { _, err := w.Every(time.Hour, func() {}); return err },
	} {
		err := f()
		require.ErrorIs(t, err, ErrTooManyTimers)
		require.True(t, strings.Contains(err.Error(), "WithMaxPending(3)"), "%v", err)
	}
	require.True(t, tms[0].Stop())
	_, err := w.Every(time.Hour, func() {})
	require.NoError(t, err)
}

// TestReview33PinEveryBigJumpOnTheGrid: one Advance over many intervals runs an Every once, and
// its next run is the first instant of the fixed-rate grid (k intervals after the call) after
// the clock's new time: never early against the grid, never a pile-up.
func TestReview33PinEveryBigJumpOnTheGrid(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(3))
	clk.Advance(700 * time.Microsecond) // the call is off the tick grid
	const iv = 3*time.Millisecond + 100*time.Microsecond
	call := clk.Now()
	var at []time.Duration
	tm, err := w.Every(iv, func() { at = append(at, clk.Now().Sub(call)) })
	require.NoError(t, err)
	clk.Advance(100*iv + iv/2) // 100.5 intervals
	require.Equal(t, []time.Duration{100*iv + iv/2}, at, "one run for the jump")
	clk.Advance(iv/2 - 1) // one ns before the 101st grid instant
	require.Len(t, at, 1, "early against the fixed-rate grid")
	clk.Advance(1)
	require.Equal(t, 101*iv, at[1])
	clk.Advance(iv)
	require.Equal(t, 102*iv, at[2])
	require.True(t, tm.Stop())
	require.False(t, tm.Stop())
	clk.Advance(10 * iv)
	require.Len(t, at, 3)
	st := balance33(t, w)
	require.EqualValues(t, 3, st.Fired)
	require.EqualValues(t, 1, st.Stopped)
}

// TestReview33PinEveryHugeInterval: an interval of math.MaxInt64 is accepted; the first run is
// due at the end of time, nothing runs before, and Stop reports true.
func TestReview33PinEveryHugeInterval(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1))
	runs := 0
	tm, err := w.Every(math.MaxInt64, func() { runs++ })
	require.NoError(t, err)
	clk.Advance(200 * 365 * 24 * time.Hour)
	require.Zero(t, runs)
	require.Equal(t, 1, w.Len())
	require.True(t, tm.Stop())
	clk.Advance(math.MaxInt64)
	require.Zero(t, runs)
	balance33(t, w)
}

// TestReview33PinConcurrentStops: Stop from many goroutines at once: one returns how many were
// pending, the others 0, each only once the wheel is stopped (its workers gone, Len 0).
func TestReview33PinConcurrentStops(t *testing.T) {
	w, err := New(WithWorkers(2), WithShards(2))
	require.NoError(t, err)
	for i := 0; i < 50; i++ {
		_, err := w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	res := make([]int, 8)
	for g := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[g] = w.Stop()
			if !isClosed(w.stopped) {
				t.Error("a Stop returned before the wheel was stopped")
			}
			if w.Len() != 0 {
				t.Error("Len after Stop")
			}
		}()
	}
	wg.Wait()
	total, nonzero := 0, 0
	for _, n := range res {
		total += n
		if n != 0 {
			nonzero++
		}
	}
	require.Equal(t, 50, total, "%v", res)
	require.Equal(t, 1, nonzero, "%v", res)
	_, err = w.Every(time.Second, func() {})
	require.True(t, errors.Is(err, ErrClosed))
}

// TestReview33FixedAdvanceFromCallbacksTwoWheelsDeadlock: Advance from a callback is supported
// ("Called from a callback while another Advance of the wheel is in progress, it moves the clock
// and returns at once"), so are concurrent Advance calls and several wheels on one clock. Put
// together they deadlock: goroutine G2's Advance has finished wheel a and is running a callback
// of wheel b (holding b's advMu); goroutine G1's Advance holds a's advMu and runs a callback of
// a. Each callback calls Advance: G1's skips a (its own advance) and waits for b's advMu
// (clock.go:157-167: it is neither b's advancer nor b's worker), G2's waits for a's advMu. Neither
// Advance ever returns, and neither wheel can be stopped (Stop waits for advMu too). On failure
// the two goroutines stay blocked: the test reports the hang instead of hanging the package.
func TestReview33FixedAdvanceFromCallbacksTwoWheelsDeadlock(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	b, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	aIn, bIn := make(chan struct{}), make(chan struct{})
	_, err = b.AfterFunc(time.Millisecond, func() { // on G2, in its Advance to 1ms
		close(bIn)
		<-aIn
		clk.Advance(0)
	})
	require.NoError(t, err)
	_, err = a.AfterFunc(2*time.Millisecond, func() { // on G1, in its Advance to 2ms
		close(aIn)
		clk.Advance(0)
	})
	require.NoError(t, err)
	g1, g2 := make(chan struct{}), make(chan struct{})
	go func() { defer close(g2); clk.Advance(time.Millisecond) }()
	<-bIn
	go func() { defer close(g1); clk.Advance(time.Millisecond) }()
	for _, ch := range []chan struct{}{g1, g2} {
		select {
		case <-ch:
		case <-time.After(3 * time.Second):
			t.Fatal("two Advance calls whose callbacks call Advance deadlocked on two wheels of one clock")
		}
	}
	a.Stop()
	b.Stop()
}

// TestReview33PinEverySlowRunsInBubble: on the system clock, in a synctest bubble, an Every of
// 10ms whose run takes 25ms runs at 10, 40, 70, 100ms (each next run is the first one due, on the
// grid of the call, after the previous run ended), never overlapping; a Stop during a run reports
// true, and no run starts after it.
func TestReview33PinEverySlowRunsInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithWorkers(2), WithShards(2))
		require.NoError(t, err)
		defer w.Stop()
		start := time.Now()
		var mu sync.Mutex
		var at []time.Duration
		running := 0
		tm, err := w.Every(10*time.Millisecond, func() {
			mu.Lock()
			running++
			require.Equal(t, 1, running, "runs overlapped")
			at = append(at, time.Since(start))
			mu.Unlock()
			time.Sleep(25 * time.Millisecond)
			mu.Lock()
			running--
			mu.Unlock()
		})
		require.NoError(t, err)
		time.Sleep(105 * time.Millisecond) // the run at 100ms is in progress
		synctest.Wait()
		require.True(t, tm.Stop(), "Stop during a run prevents the runs to come")
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []time.Duration{10 * time.Millisecond, 40 * time.Millisecond, 70 * time.Millisecond, 100 * time.Millisecond}, at)
		require.Equal(t, 0, w.Stop())
		st := w.Stats()
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	})
}

// TestReview33PinConcurrentAdvances: Advance from several goroutines at once, over timers on
// several shards (and each callback arming another a little later): every timer runs exactly
// once, none before its deadline, and when the last Advance has returned, everything due ran.
func TestReview33PinConcurrentAdvances(t *testing.T) {
	for _, workers := range []int{0, 2} {
		t.Run(strings.Repeat("w", workers+1), func(t *testing.T) {
			w, clk := newManualWheel(t, WithWorkers(workers), WithShards(4))
			const n = 400
			var mu sync.Mutex
			ran := make([]int, 2*n)
			var bad []string
			var wg sync.WaitGroup
			cb := func(arg any) {
				i := arg.(int)
				now := clk.Now().Sub(time.Unix(0, 0))
				mu.Lock()
				ran[i]++
				if due := time.Duration(i%n) * 37 * time.Microsecond; now < due {
					bad = append(bad, "early")
				}
				mu.Unlock()
				wg.Done()
			}
			chain := func(arg any) {
				i := arg.(int)
				cb(i)
				if i < n {
					// A second timer, due 37µs·i after the start, armed now: due at once if
					// the clock is past that.
					due := time.Duration(i) * 37 * time.Microsecond
					_, err := w.AfterFuncArg(due-clk.Now().Sub(time.Unix(0, 0)), cb, i+n)
					if err != nil {
						t.Error(err)
						wg.Done()
					}
				}
			}
			wg.Add(2 * n)
			for i := 0; i < n; i++ {
				_, err := w.AfterFuncArg(time.Duration(i)*37*time.Microsecond, chain, i)
				require.NoError(t, err)
			}
			var adv sync.WaitGroup
			for g := 0; g < 4; g++ {
				adv.Add(1)
				go func() {
					defer adv.Done()
					for k := 0; k < 10; k++ {
						clk.Advance(time.Duration(g+1) * 100 * time.Microsecond)
					}
				}()
			}
			adv.Wait() // 10ms of the 15ms the timers span
			clk.Advance(5 * time.Millisecond)
			clk.Advance(0) // what the last round's callbacks armed due now
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			if workers > 0 {
				// Callbacks on the workers may arm their second timer after the last Advance
				// returned: due now, it waits for the next Advance.
				require.Eventually(t, func() bool { clk.Advance(0); return isClosed(done) }, 5*time.Second, time.Millisecond)
			}
			wait26(t, done, "not every timer ran")
			mu.Lock()
			defer mu.Unlock()
			require.Empty(t, bad)
			for i, c := range ran {
				require.Equal(t, 1, c, "timer %d", i)
			}
			require.Eventually(t, func() bool { return w.Len() == 0 }, 5*time.Second, time.Millisecond)
			balance33(t, w)
		})
	}
}

// TestReview33FixedStatsWorkersWithZeroWorkers (minor): Stats.Workers is "number of worker
// goroutines", and New's doc says it starts "its workers (one with WithWorkers(0) on the system
// clock, which runs the callbacks...)". Stats reports w.opts.workers (shardwheel.go:308), 0,
// while the wheel runs one worker goroutine (pool.init, workers.go:66-69); so does the prom
// collector's shardwheel_workers gauge.
func TestReview33FixedStatsWorkersWithZeroWorkers(t *testing.T) {
	w, err := New(WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	require.Len(t, w.pool.done, 1, "one worker goroutine on the system clock")
	require.Equal(t, 1, w.Stats().Workers, "Stats.Workers: number of worker goroutines")
}
