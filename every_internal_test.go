package shardwheel

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// waitRuns waits (real time) until runs reaches n, advancing the manual clock by 0 so that a
// shard whose add arrived late is looked at; it reports whether it got there.
func waitRuns(clk *ManualClock, runs interface{ Load() int32 }, n int32) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if runs.Load() >= n {
			return true
		}
		time.Sleep(time.Millisecond)
		clk.Advance(0)
	}
	return runs.Load() >= n
}

// TestEveryRearmTwoResetsAheadOfAdd: while an Every's worker re-arms the entry for its next run,
// two Resets to earlier deadlines send their commands ahead of the worker's add, and each is
// ignored by an advance of the shard (the entry is not linked yet), which then publishes the
// wheel's own next. The run must still start at the second Reset's deadline (11ms), not before
// and not at the re-arm's own deadline.
func TestEveryRearmTwoResetsAheadOfAdd(t *testing.T) {
	w, clk, ev, runs := resetAheadOfAdd(t)
	defer w.Stop()
	s := ev.s
	require.True(t, ev.Reset(time.Millisecond)) // 11 ms
	s.advanceLocked(w.nanos(), 0)               // ignores it too
	require.NoError(t, strongVerifyLocked(s))
	s.mu.Unlock()
	waitAddSent(t, s)
	require.NoError(t, strongVerifyAll(w))
	clk.Advance(time.Millisecond - 1)
	time.Sleep(10 * time.Millisecond)
	require.Equal(t, int32(1), runs.Load(), "early")
	clk.Advance(1) // 11 ms
	require.True(t, waitRuns(clk, runs, 2), "the run Reset to 11 ms did not start at 11 ms (shard next %v)", time.Duration(s.next.Load()))
	require.True(t, ev.Stop())
}

// TestEveryRearmResetHeldAcrossAdd: a Reset to earlier, its command ahead of the re-arm's add and
// ignored; then a second Reset holds the entry (Timer.hold) and is paused before finishReset
// while the worker sends its add and notes its deadline; the shard takes the add (linking the
// held entry at 13ms); the second Reset then lowers the deadline to 11ms. The run starts at 11ms,
// not before.
func TestEveryRearmResetHeldAcrossAdd(t *testing.T) {
	w, clk, ev, runs := resetAheadOfAdd(t)
	defer w.Stop()
	s := ev.s
	ok, release := ev.ResetHeld(time.Millisecond) // 11 ms, the entry held only
	require.True(t, ok)
	s.mu.Unlock()
	waitAddSent(t, s)
	takeRing(s) // the shard takes the add: the held entry is linked at 13 ms
	if ev.Queued() {
		release()
		t.Fatal("the add was not taken")
	}
	release() // 11 ms: lower, so a reset command and a note
	require.NoError(t, strongVerifyAll(w))
	clk.Advance(time.Millisecond - 1)
	time.Sleep(10 * time.Millisecond)
	require.Equal(t, int32(1), runs.Load(), "early")
	clk.Advance(1)
	require.True(t, waitRuns(clk, runs, 2), "the run Reset to 11 ms did not start at 11 ms")
	require.True(t, ev.Stop())
}

// TestEveryRearmResetHeldRaiseAcrossAdd: the same with the second Reset raising the deadline (to
// 30ms) instead, which sends no command: the entry is linked at 13ms and re-inserted when it
// comes due there. The run must start at 30ms, not before.
func TestEveryRearmResetHeldRaiseAcrossAdd(t *testing.T) {
	w, clk, ev, runs := resetAheadOfAdd(t)
	defer w.Stop()
	s := ev.s
	ok, release := ev.ResetHeld(20 * time.Millisecond) // 30 ms
	require.True(t, ok)
	s.mu.Unlock()
	waitAddSent(t, s)
	takeRing(s)
	release()
	require.NoError(t, strongVerifyAll(w))
	clk.Advance(20*time.Millisecond - 1)
	time.Sleep(10 * time.Millisecond)
	require.Equal(t, int32(1), runs.Load(), "early")
	require.NoError(t, strongVerifyAll(w))
	clk.Advance(1)
	require.True(t, waitRuns(clk, runs, 2), "the run Reset to 30 ms did not start at 30 ms")
	require.True(t, ev.Stop())
}

// TestEveryStopResetRaceSystemClock races Every's Stop and Reset against its own runs (some slow,
// some panicking) on the system clock: at most the run in progress starts its f after a Stop
// reported true and none after it, runs never overlap, exactly one of the concurrent Stops
// reports true, no Reset that starts after that Stop reports true, the j-th run of a series
// never Reset never starts before j intervals after the call, and the books balance with every
// panic counted.
func TestEveryStopResetRaceSystemClock(t *testing.T) {
	var panics atomic.Int32
	w, err := New(WithWorkers(2), WithShards(2), WithTick(50*time.Microsecond),
		WithPanicHandler(func(any) { panics.Add(1) }))
	require.NoError(t, err)
	defer w.Stop()
	rounds := 20
	if testing.Short() {
		rounds = 5
	}
	for r := 0; r < rounds; r++ {
		interval := time.Duration(20+r*7) * time.Microsecond
		var stoppedTrue atomic.Bool
		var inRun, lateStarts, overlaps, runs, early atomic.Int32
		resetOK := r%2 == 0
		t0 := time.Now()
		ev, err := w.Every(interval, func() {
			if stoppedTrue.Load() {
				lateStarts.Add(1)
			}
			if inRun.Add(1) != 1 {
				overlaps.Add(1)
			}
			j := runs.Add(1)
			if !resetOK && time.Since(t0) < time.Duration(j)*interval {
				early.Add(1)
			}
			if j%3 == 0 {
				time.Sleep(interval) // a slow run now and then
			}
			if j%2 == 0 {
				inRun.Add(-1)
				panic("a panicking run")
			}
			inRun.Add(-1)
		})
		require.NoError(t, err)
		var wg sync.WaitGroup
		stopDone := make(chan struct{})
		var trues atomic.Int32
		var resetAfterStop atomic.Int32
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stopDone:
						if ev.Reset(interval) {
							resetAfterStop.Add(1)
						}
						return
					default:
					}
					if resetOK {
						ev.Reset(interval / 2)
					}
					time.Sleep(interval / 3)
				}
			}()
		}
		time.Sleep(time.Millisecond + time.Duration(r%7)*interval)
		var sg sync.WaitGroup
		for g := 0; g < 3; g++ {
			sg.Add(1)
			go func() {
				defer sg.Done()
				if ev.Stop() {
					stoppedTrue.Store(true)
					trues.Add(1)
				}
			}()
		}
		sg.Wait()
		close(stopDone)
		wg.Wait()
		time.Sleep(5 * interval)
		settled := runs.Load()
		time.Sleep(10 * interval)
		require.EqualValues(t, 1, trues.Load(), "round %d", r)
		// The run in progress at the Stop (its worker moved it to running, f has not begun yet)
		// may start its f after Stop returned: at most one, and none after that.
		require.LessOrEqual(t, lateStarts.Load(), int32(1), "round %d: runs started after Stop reported true", r)
		require.Equal(t, settled, runs.Load(), "round %d: the series went on after Stop", r)
		require.Zero(t, overlaps.Load(), "round %d", r)
		require.Zero(t, resetAfterStop.Load(), "round %d", r)
		require.Zero(t, early.Load(), "round %d: a run started early", r)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := w.Stats()
		if st.Scheduled == st.Fired+st.Stopped && st.Pending == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "counters never balanced: %+v", st)
		time.Sleep(time.Millisecond)
	}
	require.NotZero(t, panics.Load())
	require.EqualValues(t, panics.Load(), w.Stats().Panics)
}

// TestEveryOneRunPerAdvanceOverMissedRuns: over manual jumps big and small, each Advance that
// passes one or more due instants gives exactly one run, never before its due instant, and the
// series stays on its rate (the next run is the first due instant after the clock's time).
func TestEveryOneRunPerAdvanceOverMissedRuns(t *testing.T) {
	w, clk, now := parkWheel(t)
	const iv = 7 * time.Millisecond
	var at []time.Duration
	_, err := w.Every(iv, func() { at = append(at, now()) })
	require.NoError(t, err)
	steps := []time.Duration{3, 4, 50, 1, 1, 6, 700 * time.Millisecond / time.Millisecond, 2, 5}
	var want []time.Duration
	due := iv
	for _, s := range steps {
		clk.Advance(s * time.Millisecond)
		if now() >= due {
			want = append(want, now())
			for due <= now() {
				due += iv
			}
		}
		require.Equal(t, want, at, "after advancing to %v", now())
	}
	requireBalanced(t, w)
}

// TestEveryEndOfTimeGivesBackMaxPendingCredit: an Every whose run comes at the end of a manual
// clock's time ends its series there (endRun: the next run, counted as scheduled when this run
// began, is taken back), since every deadline is due there and re-arming would run it forever.
// Its WithMaxPending credit comes back with it, as at every other end of a timer: the wheel is
// quiet with Len() == 0 and the books balanced, and WithMaxPending(1) accepts the next timer
// ("once the wheel is quiet, n timers are always accepted"), which fires, and then another.
func TestEveryEndOfTimeGivesBackMaxPendingCredit(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1), WithMaxPending(1))
	runs := 0
	_, err := w.Every(time.Hour, func() { runs++ })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64) // the end of time: one run, and the series ends
	require.Equal(t, 1, runs)
	require.Zero(t, w.Len(), "the series ended at the end of time: nothing pending")
	requireQuietBooks(t, w)

	fired := 0
	_, err = w.AfterFunc(0, func() { fired++ })
	require.NoError(t, err, "a quiet wheel with Len() == 0 refuses a timer under WithMaxPending(1)")
	clk.Advance(0)
	require.Equal(t, 1, fired)
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err, "nothing is pending, yet WithMaxPending(1) refuses the only timer")
	_, err = w.AfterFunc(time.Second, func() {})
	require.ErrorIs(t, err, ErrTooManyTimers, "the limit still holds")
}

// TestEveryErrors: each bad input to Every (an interval <= 0, a nil f) and to AfterFunc and
// AfterFuncArg (a nil f) returns the documented error, and the error for a bad interval names
// it; after Stop each returns ErrClosed. Nothing is scheduled, and every error counts in
// Rejected.
func TestEveryErrors(t *testing.T) {
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

// durationArgString is how an error names a Duration argument.
func durationArgString(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}

// TestEveryBigJumpStaysOnGrid: one Advance over many intervals runs an Every once, and its next
// run is the first instant of the fixed-rate grid (k intervals after the call, here off the
// tick grid) after the clock's new time: never early against the grid, never a pile-up. Stop
// reports true once, and no run follows it.
func TestEveryBigJumpStaysOnGrid(t *testing.T) {
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
	st := requireBooks(t, w)
	require.EqualValues(t, 3, st.Fired)
	require.EqualValues(t, 1, st.Stopped)
}

// TestEveryMaxIntervalAccepted: an interval of math.MaxInt64 is accepted; the first run is due at
// the end of time, nothing runs before (the series is pending), and Stop reports true.
func TestEveryMaxIntervalAccepted(t *testing.T) {
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
	requireBooks(t, w)
}

// TestEverySlowRunsInBubble: on the system clock, in a synctest bubble, an Every of 10ms whose run
// takes 25ms runs at 10, 40, 70, 100ms (each next run is the first one due, on the grid of the
// call, after the previous run ended), never overlapping; a Stop during a run reports true, and
// no run starts after it.
func TestEverySlowRunsInBubble(t *testing.T) {
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

// TestEveryRearmResetEarlier: an Every's worker has re-armed the entry (pending and queued, its
// next run due at 20ms) and not yet sent the add; a Reset to 13ms then sends its reset command
// and notes 13ms; an advance of the shard takes that command, which finds the entry not linked
// (its add is still to come) and is ignored, and publishes the wheel's next (none), overwriting
// the 13ms. The worker's add must then note the deadline the entry is linked at, the Reset's
// 13ms, not the 20ms it computed before the Reset: the run starts at 13ms (were the shard's
// next left at 20ms, nothing would look at the shard at 13ms, and with Every(1h) and Reset(1ms)
// the run would be an hour late). The worker is held between its CAS and its ring slot here by a
// full ring and the shard's mutex; in a real program preemption there, or a full ring, does the
// same, and the advance is the keeper's (woken by another timer of the shard, or by a kick).
func TestEveryRearmResetEarlier(t *testing.T) {
	w, clk, ev, runs := resetAheadOfAdd(t)
	defer w.Stop()
	s := ev.s
	s.mu.Unlock()
	waitAddSent(t, s)
	t.Logf("after the worker's add: shard next %v, entry due %v", time.Duration(s.next.Load()), time.Duration(s.slab.at(ev.i).when.Load()))
	// What the checks see in that state: the strong one names the lost wake-up; Verify drains
	// the add into the wheel and finds nothing wrong (on a manual clock its drain notes nothing,
	// so the state is unchanged; on the system clock it would note the wheel's next and so
	// repair the wake-up it did not report).
	t.Logf("strongVerify: %v", strongVerifyAll(w))
	t.Logf("Verify: %v", w.Verify())
	clk.Advance(3 * time.Millisecond) // 13 ms: the Reset's deadline
	for deadline := time.Now().Add(2 * time.Second); runs.Load() != 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if runs.Load() != 2 {
		clk.Advance(7 * time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		t.Fatalf("the run Reset to 13 ms did not start at 13 ms; after an Advance to 20 ms runs = %d", runs.Load())
	}
	require.True(t, ev.Stop())
}
