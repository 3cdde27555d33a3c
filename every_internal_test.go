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

// Two Resets to earlier deadlines, both commands ahead of the worker's add, each ignored by an
// advance that then publishes the wheel's own next: the run must start at the second one.
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

// A Reset to earlier, its command ahead of the add and ignored; then a second Reset claims the
// entry and is paused (held) while the worker sends its add and notes its deadline; the shard
// takes the add (linking the held entry at 13 ms); the second Reset then lowers to 11 ms.
func TestEveryRearmResetHeldAcrossAdd(t *testing.T) {
	w, clk, ev, runs := resetAheadOfAdd(t)
	defer w.Stop()
	s := ev.s
	ok, release := ev.ResetHeld(time.Millisecond) // 11 ms, claimed only
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

// The same with the second Reset raising (to 30 ms) instead: no command; the entry is linked at
// 13 ms and re-inserted there. The run must start at 30 ms, not before.
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

// TestReview26EveryStopResetRaceSystem races Every's Stop and Reset against its own runs on the
// system clock (a pin): at most the run in progress starts its f after a Stop reported true
// and none after it, runs never overlap, exactly one
// of the concurrent Stops reports true, no Reset that starts after that Stop reports true, and
// the j-th run of a series never Reset never starts before j intervals after the call.
func TestReview26EveryStopResetRaceSystem(t *testing.T) {
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
				panic("review26: a panicking run")
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

// TestReview26EveryManualCounts pins Every's count over big manual jumps (a pin): each Advance
// that passes one or more due instants gives exactly one run, never before its due instant, and
// the series stays on its rate (the next run is the first due instant after the clock's time).
func TestReview26EveryManualCounts(t *testing.T) {
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

// TestReview31FixedEveryEndOfTimeLeaksMaxPendingCredit: an Every whose run comes at the end of a
// manual clock's time ends its series there (every.go, endRun: "The series ends here, and its
// next run ... is taken back"). It takes back the next run's count in Scheduled, so Stats and
// Len say nothing is pending, but not the WithMaxPending credit that the series held since
// Every accepted it: endRun (every.go:106-116) calls dropFrom and s.scheduled.Dec but no
// s.returnCredit(). The credit is lost for the life of the wheel: with WithMaxPending(1) the
// wheel now refuses every timer while Len() == 0, against pending.go's "once the wheel is quiet,
// maxPending timers are always accepted" and API.md's "Past WithMaxPending: ErrTooManyTimers"
// (nothing is past it).
func TestReview31FixedEveryEndOfTimeLeaksMaxPendingCredit(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1), WithMaxPending(1))
	runs := 0
	_, err := w.Every(time.Hour, func() { runs++ })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64)
	require.Equal(t, 1, runs)
	require.Zero(t, w.Len(), "the series ended at the end of time")
	r31Balance(t, w)

	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err, "nothing is pending, yet WithMaxPending(1) refuses the only timer")
}

// TestReview32FixedEveryEndOfTimeLeaksMaxPendingCredit (bug, WithMaxPending): an Every on a manual
// clock that reaches the end of time ends its series (every.go:94-105: "The series ends here, and
// its next run, counted as scheduled when this run began, is taken back"), and Len drops to 0,
// but the WithMaxPending credit the series held is never given back (no releasePending on that
// path, unlike every other end of a timer). WithMaxPending's doc: "once the wheel is quiet, n
// timers are always accepted"; here the quiet wheel, with nothing pending, refuses the n-th.
func TestReview32FixedEveryEndOfTimeLeaksMaxPendingCredit(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0), WithMaxPending(1))
	require.NoError(t, err)
	defer w.Stop()
	runs := 0
	_, err = w.Every(time.Hour, func() { runs++ })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64) // the end of time: one run, and the series ends
	require.Equal(t, 1, runs)
	require.Zero(t, w.Len(), "the series is over")
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "stats %+v", st)
	_, err = w.AfterFunc(time.Second, func() {})
	require.NoError(t, err, "WithMaxPending(1) refuses a timer on a wheel with nothing pending")
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

// TestEveryRearmResetEarlier: an Every's worker has re-armed the entry (pending and
// queued, its next run due at 20 ms) and not yet sent the add; a Reset to 13 ms then sends its
// reset command and notes 13 ms; an advance of the shard takes that command, which finds the
// entry not linked (its add is still to come) and is ignored, and publishes the wheel's next
// (none), overwriting the 13 ms; the worker's add then notes the 20 ms it computed before the
// Reset. The entry is linked at 13 ms, but the shard's next says 20 ms: at 13 ms nothing
// looks at the shard, and the run starts at 20 ms, late by the difference (with Every(1h) and a
// Reset(1ms), an hour). The worker is held between its CAS and its claim here by a full ring
// and the shard's mutex; in a real program preemption there, or a full ring, does the same,
// and the advance is the keeper's (woken by another timer of the shard, or by a kick).
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
