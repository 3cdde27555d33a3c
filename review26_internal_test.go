package shardwheel

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Review 26: Every, Timer.Stop/Reset on stale handles and from callbacks, Wheel.Stop's count
// and its waits, and Keyed under concurrency.
//
// Bugs it found, fixed since (each of these failed): StopInsideEveryCountsNextRun(System),
// LenAfterStopInsideCallback, CallerRunsStopDoesNotWaitForOtherCallbacks (rewritten: it asked
// Stop to return within a second while the callback it must wait for waited for the test),
// StopCountsEndOfTimeSeries; KeyedMoveFalseWhileArmed moved to the keyed tests. Pins:
// EveryStopResetRaceSystem, WheelStopUnderLoad, StaleHandles, EveryManualCounts.

// wait26 fails the test unless ch delivers within 5 s.
func wait26(t *testing.T, ch <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal(why)
	}
}

// TestReview26StopInsideEveryCountsNextRun: Wheel.Stop called from an Every's own callback
// returns n, the timers it dropped from the shards; the series' next run (counted in Scheduled
// when the run began, so pending in Len during the run) is dropped after Stop returned, when
// runPeriodic's re-arm finds the ring closed (every.go:113-118), and lands in Stats.Dropped only.
// Stats.Dropped is documented as "the sum of what Stop returned" and the exactly-once rule says
// every accepted timer is counted in what Stop returned if it neither ran nor was stopped.
// A Stop from outside the callback counts that same run (shardwheel.go:382).
func TestReview26StopInsideEveryCountsNextRun(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(1), WithTick(time.Millisecond))
	require.NoError(t, err)
	got, runs := -1, 0
	var pendingInRun int
	_, err = w.Every(time.Millisecond, func() {
		runs++
		pendingInRun = w.Len()
		got = w.Stop()
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, runs)
	require.Equal(t, 1, pendingInRun, "during the run, the next run is pending")
	require.Zero(t, w.Stop())
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	require.EqualValues(t, st.Dropped, got,
		"Wheel.Stop from inside the Every returned %d, but the series' next run was pending and was dropped (Stats %+v)", got, st)
}

// The same on the system clock: the callback runs on a worker, Stop (shardwheel.go:383) reads
// w.dropped before its own callback returns and runPeriodic counts the dropped next run.
func TestReview26StopInsideEveryCountsNextRunSystem(t *testing.T) {
	w, err := New(WithWorkers(1), WithShards(1))
	require.NoError(t, err)
	got := make(chan int, 1)
	var once sync.Once
	_, err = w.Every(time.Millisecond, func() { once.Do(func() { got <- w.Stop() }) })
	require.NoError(t, err)
	var n int
	select {
	case n = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the Every never ran")
	}
	w.Stop() // waits for the first Stop, which finished on the worker
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	require.EqualValues(t, st.Dropped, n, "Wheel.Stop's return misses the Every's dropped next run (Stats %+v)", st)
}

// TestReview26LenAfterStopInsideCallback: API.md says "After Stop ... Len is 0". Called from a
// callback that the manual advancer runs (WithWorkers(0)), Stop returns before finishStop closes
// w.stopped (shardwheel.go:377-379), so Stats (shardwheel.go:311) does not force Pending to 0,
// and a timer that fired with this one and has not started yet still counts as pending: Len is
// 1 right after Stop returned. (On a worker, finishStop closes stopped before Stop returns.)
func TestReview26LenAfterStopInsideCallback(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(1), WithTick(time.Millisecond))
	require.NoError(t, err)
	lenAfter, calls := -1, 0
	cb := func() {
		calls++
		if calls == 1 {
			w.Stop()
			lenAfter = w.Len()
		}
	}
	for range 2 {
		_, err = w.AfterFunc(time.Millisecond, cb)
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	require.Equal(t, 2, calls, "both had fired: the second runs after Stop, as documented")
	require.Zero(t, lenAfter, "Len right after Wheel.Stop returned, inside the callback")
}

// TestReview26StopCountsEndOfTimeSeries: an Every whose run came at the end of a manual clock's
// time ends there and counts its next run as dropped (every.go:85-93), so Len is 0 and the
// handle's Stop reports false. A later Wheel.Stop, which drops nothing, still returns 1: it
// returns w.dropped.Value() (shardwheel.go:383), the wheel's total, not "how many timers were
// pending" (API.md). On the advancer path (Stop from a callback) it returns n instead
// (shardwheel.go:379): the two paths disagree.
func TestReview26StopCountsEndOfTimeSeries(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(1), WithTick(time.Millisecond))
	require.NoError(t, err)
	runs := 0
	ev, err := w.Every(time.Hour, func() { runs++ })
	require.NoError(t, err)
	clk.Advance(time.Duration(1<<63 - 1))
	require.Equal(t, 1, runs)
	require.Zero(t, w.Len(), "the series ended at the end of time")
	require.False(t, ev.Stop())
	require.Zero(t, w.Stop(), "nothing was pending at Wheel.Stop")
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

// TestReview26WheelStopUnderLoad races Wheel.Stop (from outside any callback) with arms,
// Resets, Stops, Every series (some slow, some panicking) and Keyed Sets/Moves/Removes on the
// system clock (a pin): every accepted timer ends exactly once (Scheduled == Fired + Stopped +
// what Stop returned), no callback starts after Stop returned, calls after Stop report ErrClosed
// or false, and Len is 0.
func TestReview26WheelStopUnderLoad(t *testing.T) {
	rounds := 12
	if testing.Short() {
		rounds = 4
	}
	for r := 0; r < rounds; r++ {
		w, err := New(WithWorkers(2), WithShards(2), WithTick(100*time.Microsecond), WithRingSize(8),
			WithPanicHandler(func(any) {}))
		require.NoError(t, err)
		var after atomic.Bool
		var lateRuns atomic.Int32
		cb := func() {
			if after.Load() {
				lateRuns.Add(1)
			}
		}
		k := NewKeyed(w, func(string, int) { cb() })
		var wg sync.WaitGroup
		quit := make(chan struct{})
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var tms []Timer
				for i := 0; ; i++ {
					select {
					case <-quit:
						return
					default:
					}
					var tm Timer
					var err error
					switch i % 7 {
					case 0:
						tm, err = w.Every(time.Duration(50+i%200)*time.Microsecond, func() {
							cb()
							if i%3 == 0 {
								time.Sleep(200 * time.Microsecond)
							}
							if i%5 == 0 {
								panic("review26")
							}
						})
					case 1:
						err = k.Set(string(rune('a'+i%13)), i, time.Duration(i%300)*time.Microsecond)
					case 2:
						k.Move(string(rune('a'+i%13)), time.Duration(i%500)*time.Microsecond)
					case 3:
						k.Remove(string(rune('a' + i%13)))
					default:
						tm, err = w.AfterFunc(time.Duration(i%400)*time.Microsecond, cb)
					}
					if err != nil {
						require.ErrorIs(t, err, ErrClosed)
						return
					}
					if tm.s != nil {
						tms = append(tms, tm)
					}
					if len(tms) > 0 && i%2 == 0 {
						j := (i * 7) % len(tms)
						if i%4 == 0 {
							tms[j].Stop()
						} else {
							tms[j].Reset(time.Duration(i%300) * time.Microsecond)
						}
					}
				}
			}()
		}
		time.Sleep(time.Duration(2+r%5) * time.Millisecond)
		n := w.Stop()
		after.Store(true)
		close(quit)
		wg.Wait()
		time.Sleep(time.Millisecond)
		st := w.Stats()
		require.Zero(t, lateRuns.Load(), "round %d: a callback started after Wheel.Stop returned", r)
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+uint64(n), "round %d: Stop returned %d, %+v", r, n, st)
		require.EqualValues(t, n, st.Dropped, "round %d", r)
		require.Zero(t, w.Len())
		_, err = w.Every(time.Millisecond, func() {})
		require.ErrorIs(t, err, ErrClosed)
		require.ErrorIs(t, k.Set("x", 1, time.Millisecond), ErrClosed)
		require.Zero(t, w.Stop())
	}
}

// TestReview26StaleHandles pins Stop and Reset on stale handles (a pin): after the timer fired
// and its entry was taken by a new timer, from inside its own callback, and for an Every whose
// entry was reused after its series ended. A stale handle reports false and leaves the new
// timer alone.
func TestReview26StaleHandles(t *testing.T) {
	w, clk, _ := parkWheel(t)
	var fired []string
	var inside []bool
	var self Timer
	self, err := w.AfterFunc(time.Millisecond, func() {
		fired = append(fired, "one")
		inside = append(inside, self.Stop(), self.Reset(time.Millisecond))
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"one"}, fired)
	require.Equal(t, []bool{false, false}, inside, "Stop and Reset from inside a one-shot's callback")

	next, err := w.AfterFunc(time.Hour, func() { fired = append(fired, "next") })
	require.NoError(t, err)
	require.Equal(t, self.i, next.i, "the fired entry is reused")
	require.Equal(t, self.gen+1, next.gen)
	require.False(t, self.Reset(0))
	require.False(t, self.Stop())
	clk.Advance(time.Minute)
	require.Equal(t, []string{"one"}, fired, "the stale Reset(0) moved nothing")
	require.Equal(t, 1, w.Len())

	// An Every: Reset from inside its run reports false (the series is running, not waiting),
	// Stop reports true once; its entry then serves a new timer.
	inside = nil
	var ev Timer
	ev, err = w.Every(time.Millisecond, func() {
		fired = append(fired, "every")
		inside = append(inside, ev.Reset(time.Millisecond), ev.Stop(), ev.Stop())
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"one", "every"}, fired)
	require.Equal(t, []bool{false, true, false}, inside)
	again, err := w.AfterFunc(time.Millisecond, func() { fired = append(fired, "again") })
	require.NoError(t, err)
	require.Equal(t, ev.i, again.i)
	require.False(t, ev.Reset(time.Hour), "a stale Every handle")
	require.False(t, ev.Stop())
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"one", "every", "again"}, fired)
	require.True(t, next.Stop())
	require.Zero(t, w.Len())
	requireBalanced(t, w)
	require.NoError(t, w.Verify())
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
