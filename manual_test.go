package shardwheel_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestManualClockOrderAcrossShards: with WithWorkers(0), timers on several shards that come due
// within one Advance run in the order of their deadlines, whatever order they were armed in, and
// the wheel's invariants hold afterwards.
func TestManualClockOrderAcrossShards(t *testing.T) {
	w, clk := manualWheel(t, sw.WithShards(4))
	var got []int
	for i := 500; i > 0; i-- {
		i := i
		_, err := w.AfterFunc(time.Duration(i)*time.Millisecond, func() { got = append(got, i) })
		require.NoError(t, err)
	}
	clk.Advance(time.Second)
	require.Len(t, got, 500)
	for i := range got {
		require.Equal(t, i+1, got[i], "timers within one Advance run in deadline order")
	}
	require.NoError(t, w.Verify())
}

// TestManualClockZeroValue: a ManualClock that was declared, not made by NewManualClock, is a
// clock at the zero time: a wheel on it fires at its Advance, and Stop returns.
func TestManualClockZeroValue(t *testing.T) {
	var clk sw.ManualClock
	require.True(t, clk.Now().IsZero())
	w, err := sw.New(sw.WithClock(&clk), sw.WithWorkers(0))
	require.NoError(t, err)
	var ran int
	_, err = w.AfterFunc(time.Millisecond, func() { ran++ })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, ran)
	require.Equal(t, time.Time{}.Add(time.Millisecond), clk.Now())
	require.Zero(t, w.Stop())
}

// TestManualClockPanicsOnNegativeAdvance: time does not go backwards: Advance of a negative
// duration panics with a message naming it and leaves the clock usable.
func TestManualClockPanicsOnNegativeAdvance(t *testing.T) {
	clk := sw.NewManualClock(epoch)
	require.PanicsWithValue(t, "shardwheel: ManualClock.Advance(-1s): duration must not be negative", func() { clk.Advance(-time.Second) })
	clk.Advance(time.Hour)
	require.Equal(t, epoch.Add(time.Hour), clk.Now())
}

// clkFiring is a callback's record: which timer, and the manual clock's reading when it ran.
type clkFiring struct {
	id  int
	now time.Duration // since the clock's start
}

// TestClockHugeAdvance schedules timers at a handful of far deadlines (the top level's edge,
// years, centuries, the end of time) and walks the manual clock to each: one nanosecond before its
// deadline nothing fires, at the deadline exactly the timers due there fire. A handful of
// Advance calls cover the whole range, so a jump of years costs no per-tick work that the test
// would have to wait for.
func TestClockHugeAdvance(t *testing.T) {
	for _, tick := range []time.Duration{time.Millisecond, 1_000_003} {
		t.Run(tick.String(), func(t *testing.T) {
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			clock := sw.NewManualClock(start)
			w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0), sw.WithTick(tick), sw.WithShards(3))
			require.NoError(t, err)
			defer w.Stop()

			year := 365 * 24 * time.Hour
			top := time.Duration(1<<36) * tick
			delays := []time.Duration{
				3 * year, 3*year + 1, top - 1, top, top + 1, 2 * top, 10 * year, 100 * year,
				200 * year, math.MaxInt64 / 2, math.MaxInt64 - time.Duration(tick), math.MaxInt64 - 1, math.MaxInt64,
			}
			slices.Sort(delays)
			var fired []clkFiring
			for i, d := range delays {
				_, err := w.AfterFunc(d, func() { fired = append(fired, clkFiring{i, clock.Now().Sub(start)}) })
				require.NoError(t, err)
			}
			// The instants the timers are due at, in order: exactly their delays (deadlines are
			// exact at every tick; the end of time is math.MaxInt64 itself).
			type due struct {
				at  time.Duration
				ids []int
			}
			var dues []due
			for i, d := range delays {
				at := d
				if n := len(dues); n > 0 && dues[n-1].at == at {
					dues[n-1].ids = append(dues[n-1].ids, i)
				} else {
					dues = append(dues, due{at, []int{i}})
				}
			}

			var now time.Duration
			advances := 0
			for _, d := range dues {
				if d.at-1 > now {
					clock.Advance(d.at - 1 - now)
					advances++
					now = d.at - 1
					require.Empty(t, fired, "fired before %v", d.at)
				}
				clock.Advance(d.at - now)
				advances++
				now = d.at
				var ids []int
				for _, f := range fired {
					require.Equal(t, d.at, f.now, "timer %d ran at %v, due at %v", f.id, f.now, d.at)
					ids = append(ids, f.id)
				}
				require.ElementsMatch(t, d.ids, ids, "at %v", d.at)
				fired = fired[:0]
			}
			require.Equal(t, 0, w.Len())
			require.LessOrEqual(t, advances, 2*len(delays))
			st := w.Stats()
			require.Equal(t, uint64(len(delays)), st.Fired)
		})
	}
}

// TestClockJumpToEndOfTime makes one Advance(math.MaxInt64) over timers spread from one tick to
// the end of time: all fire in that one call, each once, in deadline order.
func TestClockJumpToEndOfTime(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0), sw.WithShards(4))
	require.NoError(t, err)
	defer w.Stop()
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 2000
	delays := make([]time.Duration, n)
	var order []int
	for i := range delays {
		delays[i] = time.Duration(rng.Int64N(math.MaxInt64)) >> rng.IntN(63)
		if i%100 == 0 {
			delays[i] = math.MaxInt64
		}
		_, err := w.AfterFuncArg(delays[i], func(a any) { order = append(order, a.(int)) }, i)
		require.NoError(t, err)
	}
	clock.Advance(math.MaxInt64)
	require.Len(t, order, n)
	clkExactlyOnce(t, n, order)
	tick := time.Millisecond
	keyOf := func(i int) time.Duration {
		d := delays[i]
		if d > math.MaxInt64-tick {
			return math.MaxInt64 / tick
		}
		return (d + tick - 1) / tick
	}
	for i := 1; i < n; i++ {
		require.LessOrEqual(t, keyOf(order[i-1]), keyOf(order[i]), "timer %d (%v) ran before timer %d (%v)",
			order[i-1], delays[order[i-1]], order[i], delays[order[i]])
	}
	clock.Advance(math.MaxInt64) // saturated: a no-op
	require.Len(t, order, n)
	require.Equal(t, 0, w.Stop())
}

// clkExactlyOnce requires that ids holds each of 0..n-1 exactly once (ElementsMatch is quadratic).
func clkExactlyOnce(t testing.TB, n int, ids []int) {
	t.Helper()
	seen := make([]int, n)
	for _, id := range ids {
		require.True(t, id >= 0 && id < n, "unknown id %d", id)
		seen[id]++
	}
	for id, c := range seen {
		require.Equal(t, 1, c, "timer %d ran %d times", id, c)
	}
}

// TestClockHeldUp holds the clock up while many timers spread over 1000 ticks come due, then lets
// it go in one Advance: the burst fires in deadline order by tick, none skipped, none twice. Then the same
// with the burst split by an Advance that stops in the middle of a tick: what is due by then has
// fired, the rest of that tick has not.
func TestClockHeldUp(t *testing.T) {
	for _, split := range []bool{false, true} {
		clock := sw.NewManualClock(time.Unix(0, 0))
		w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0), sw.WithShards(4))
		require.NoError(t, err)
		const n = 5000
		tick := time.Millisecond
		due := make([]int64, n) // exact deadlines
		key := make([]int64, n) // rounded up to the tick: the order Advance keeps
		var order []int
		var wg sync.WaitGroup
		// Scheduled from several goroutines, so that the timers spread over the shards.
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < n; i += 4 {
					d := time.Duration(rng2(g, i).Int64N(int64(1000 * tick)))
					due[i] = int64(d)
					key[i] = int64((d + tick - 1) / tick)
					_, err := w.AfterFuncArg(d, func(a any) { order = append(order, a.(int)) }, i)
					assert.NoError(t, err)
				}
			}()
		}
		wg.Wait()
		if split {
			clock.Advance(500*tick + tick/2)
			fired := map[int]bool{}
			for _, i := range order {
				require.LessOrEqual(t, due[i], int64(500*tick+tick/2), "timer %d fired early", i)
				fired[i] = true
			}
			for i := range due {
				require.Equal(t, due[i] <= int64(500*tick+tick/2), fired[i], "timer %d due at %d", i, due[i])
			}
		}
		clock.Advance(1000 * tick)
		require.Len(t, order, n)
		clkExactlyOnce(t, n, order)
		for k := 1; k < n; k++ {
			require.LessOrEqual(t, key[order[k-1]], key[order[k]], "out of order at %d", k)
		}
		require.Equal(t, 0, w.Stop())
	}
}

func rng2(g, i int) *rand.Rand { return rand.New(rand.NewPCG(uint64(g), uint64(i))) }

// TestClockEveryAtEndOfTime: once the manual clock is saturated at math.MaxInt64 (the end of
// time), an Every's next run is due the moment it re-arms. One Advance must still return, having
// run the series a bounded number of times (the contract's "a timer already due fires at the next
// Advance"), not loop forever inside Advance. The callback stops the wheel after 1000 runs so
// that a failure is reported instead of hanging the test.
func TestClockEveryAtEndOfTime(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	runs := 0
	_, err = w.Every(time.Hour, func() {
		runs++
		if runs == 1000 {
			w.Stop() // the livelock's escape hatch
		}
	})
	require.NoError(t, err)
	clock.Advance(math.MaxInt64)
	assert.Equal(t, 1, runs, "one Advance to the end of time ran the Every %d times", runs)
	clock.Advance(0)
	assert.LessOrEqual(t, runs, 2)
}

// TestClockEndOfTimeOneNanosecondTick: with WithTick(1ns) the tick of the end of time is
// math.MaxInt64 itself. An Advance to the end of time must still return, and fire what is due
// there. (If Advance loops, Wheel.Stop from here breaks the loop, so that the failure is
// reported rather than hanging the package.)
func TestClockEndOfTimeOneNanosecondTick(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0), sw.WithTick(1), sw.WithShards(2))
	require.NoError(t, err)
	defer w.Stop()
	var fired []int
	for i, d := range []time.Duration{1, time.Hour, 100 * 365 * 24 * time.Hour, math.MaxInt64 - 1, math.MaxInt64} {
		_, err := w.AfterFuncArg(d, func(a any) { fired = append(fired, a.(int)) }, i)
		require.NoError(t, err)
	}
	clock.Advance(time.Hour)
	require.Equal(t, []int{0, 1}, fired)
	advanced := make(chan struct{})
	go func() {
		clock.Advance(math.MaxInt64)
		close(advanced)
	}()
	select {
	case <-advanced:
	case <-time.After(10 * time.Second): // a liveness cap: the Advance is a handful of steps
		w.Stop()
		<-advanced
		t.Fatalf("ManualClock.Advance(math.MaxInt64) with a 1ns tick did not return (fired %v)", fired)
	}
	require.Equal(t, []int{0, 1, 2, 3, 4}, fired)
}

// TestManualClockAdvanceFromWorkerCallbackReturns: Advance called from a callback while another
// Advance of the wheel is in progress moves the clock and returns at once (Advance's doc), also
// on a worker. Here the callback runs on the only worker while the Advance that dispatched it
// waits (Block policy) for room in the one-slot queue that only this worker empties: an Advance
// that waited for the one in progress would deadlock. The Advance in progress goes on to the
// clock's new time before it returns: the timer due at 2ms runs too.
func TestManualClockAdvanceFromWorkerCallbackReturns(t *testing.T) {
	w, clk := blockingManualWheel(t)
	first := true
	ran := make(chan struct{}, 8)
	for i := 0; i < 4; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			if first {
				first = false
				clk.Advance(time.Millisecond)
			}
			ran <- struct{}{}
		})
		require.NoError(t, err)
	}
	// Due at 2ms: the callback's Advance moves the clock there, and the running Advance (or
	// the rerun it asked for) dispatches it before it lets go.
	_, err := w.AfterFunc(2*time.Millisecond, func() { ran <- struct{}{} })
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(done) }()
	within(t, done, "deadlock: Advance waits for room in the full queue, the only worker waits in its callback's Advance")
	for i := 0; i < 5; i++ {
		within(t, ran, fmt.Sprintf("only %d of 5 callbacks ran", i))
	}
	require.Zero(t, w.Stop())
}

// TestManualClockSelfRearmZero: "a timer already due (d <= 0) fires at the next Advance" (API.md).
// A callback that re-arms itself with d = 0 inside Advance is not fired again by the same
// Advance, or a self re-arming callback would keep Advance from returning: one run per Advance.
func TestManualClockSelfRearmZero(t *testing.T) {
	w, clk := manualWheel(t, sw.WithShards(1))
	runs := 0
	var f func()
	f = func() {
		runs++
		if runs < 1000 { // bounded here so that the test ends; unbounded, Advance would spin
			_, err := w.AfterFunc(0, f)
			require.NoError(t, err)
		}
	}
	_, err := w.AfterFunc(0, f)
	require.NoError(t, err)
	clk.Advance(0)
	require.Equal(t, 1, runs, "one Advance ran the self re-arming d=0 callback %d times", runs)
	clk.Advance(0) // the re-armed one fires at the next Advance
	require.Equal(t, 2, runs)
	require.Equal(t, 1, w.Len())
}
