package shardwheel_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNewRejectsInvalidOptions: every invalid option value, alone or with another, fails New with a
// nil Wheel and an error that names the option and the value, in the form API.md gives.
func TestNewRejectsInvalidOptions(t *testing.T) {
	cases := []struct {
		opt  sw.Option
		want string
	}{
		{sw.WithTick(0), "shardwheel: WithTick(0): tick must be positive"},
		{sw.WithTick(-time.Millisecond), "shardwheel: WithTick(-1ms): tick must be positive"},
		{sw.WithShards(0), "shardwheel: WithShards(0): shards must be between 1 and 4096"},
		{sw.WithShards(4097), "shardwheel: WithShards(4097): shards must be between 1 and 4096"},
		{sw.WithShards(1 << 20), "shardwheel: WithShards(1048576): shards must be between 1 and 4096"},
		{sw.WithWorkers(-1), "shardwheel: WithWorkers(-1): workers must be between 0 and 65536"},
		{sw.WithQueueSize(0), "shardwheel: WithQueueSize(0): queue size must be between 1 and 67108864"},
		{sw.WithRingSize(0), "shardwheel: WithRingSize(0): ring size must be between 1 and 16777216"},
		{sw.WithRingSize(-4), "shardwheel: WithRingSize(-4): ring size must be between 1 and 16777216"},
		{sw.WithMaxPending(-1), "shardwheel: WithMaxPending(-1): max pending must be 0 (no limit) or positive"},
		{sw.WithFullPolicy(sw.FullPolicy(7)), "shardwheel: WithFullPolicy(FullPolicy(7)): policy must be Block or CallerRuns"},
		{sw.WithClock(nil), "shardwheel: WithClock(nil): clock must not be nil"},
		{sw.WithClock((*sw.ManualClock)(nil)), "shardwheel: WithClock((*ManualClock)(nil)): clock must not be nil"},
		{sw.WithPanicHandler(nil), "shardwheel: WithPanicHandler(nil): handler must not be nil"},
	}
	for _, c := range cases {
		w, err := sw.New(sw.WithWorkers(1), c.opt)
		assert.Nil(t, w)
		assert.EqualError(t, err, c.want)
	}
	// Valid alone, too much together: 4096 rings of 1<<24 slots (24 bytes each) would be 1.5 TiB.
	w, err := sw.New(sw.WithShards(4096), sw.WithRingSize(1<<24))
	assert.Nil(t, w)
	assert.EqualError(t, err, "shardwheel: WithShards(4096) with WithRingSize(16777216): 68719476736 ring slots in all, more than 67108864")
	// Just past the limit: a ring rounds its size up to a power of two (1<<15 here).
	w, err = sw.New(sw.WithShards(4096), sw.WithRingSize(1<<14+1))
	assert.Nil(t, w)
	assert.EqualError(t, err, "shardwheel: WithShards(4096) with WithRingSize(16385): 134217728 ring slots in all, more than 67108864")
}

// TestSlabFull: a shard whose slab cannot grow refuses new timers with an ErrTooManyTimers that
// names its limit, loses none of the timers it accepted, and accepts again once they end.
func TestSlabFull(t *testing.T) {
	t.Cleanup(sw.SetSlabCap(2 * sw.BlockLen)) // runs after the wheel's Stop: cleanups run last-in first-out
	const limit = 2*sw.BlockLen - 1           // slab index 0 is never used
	w, clk := manualWheel(t, sw.WithShards(1))
	fired := 0
	f := func(any) { fired++ }
	for i := 0; i < limit; i++ {
		_, err := w.AfterFuncArg(time.Millisecond, f, nil)
		require.NoError(t, err, "timer %d", i)
	}
	_, err := w.AfterFuncArg(time.Millisecond, f, nil)
	require.ErrorIs(t, err, sw.ErrTooManyTimers)
	require.EqualError(t, err, fmt.Sprintf("shardwheel: too many pending timers: a shard holds at most %d", limit))
	_, err = w.Every(time.Millisecond, func() {})
	require.ErrorIs(t, err, sw.ErrTooManyTimers)
	require.Equal(t, limit, w.Len())
	require.EqualValues(t, 2, w.Stats().Rejected)

	clk.Advance(time.Millisecond)
	require.Equal(t, limit, fired, "every accepted timer fires")
	_, err = w.AfterFuncArg(time.Millisecond, f, nil)
	require.NoError(t, err, "fired timers give their entries back")
	clk.Advance(time.Millisecond)
	require.Equal(t, limit+1, fired)
	requireBalance(t, w)
}

// TestSchedulingErrors: a nil func is ErrNilFunc and an interval of 0 or less an error naming it,
// and neither schedules anything; past WithMaxPending a timer is refused with ErrTooManyTimers
// until a pending one ends (stopped or fired); each refusal counts in Stats.Rejected.
func TestSchedulingErrors(t *testing.T) {
	w, clk := manualWheel(t, sw.WithMaxPending(2))
	_, err := w.AfterFunc(time.Second, nil)
	require.ErrorIs(t, err, sw.ErrNilFunc)
	_, err = w.AfterFuncArg(time.Second, nil, 1)
	require.ErrorIs(t, err, sw.ErrNilFunc)
	_, err = w.Every(time.Second, nil)
	require.ErrorIs(t, err, sw.ErrNilFunc)
	_, err = w.Every(0, func() {})
	require.EqualError(t, err, "shardwheel: Every(0): interval must be positive")
	_, err = w.Every(-time.Second, func() {})
	require.EqualError(t, err, "shardwheel: Every(-1s): interval must be positive")
	require.Zero(t, w.Len(), "a rejected call schedules nothing")

	// WithMaxPending: the third timer is refused until one of the first two ends.
	var fired atomic.Int32
	t1, err := w.AfterFunc(time.Second, func() { fired.Add(1) })
	require.NoError(t, err)
	_, err = w.AfterFunc(2*time.Second, func() { fired.Add(1) })
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Second, func() { fired.Add(1) })
	require.ErrorIs(t, err, sw.ErrTooManyTimers)
	require.True(t, t1.Stop())
	_, err = w.AfterFunc(time.Second, func() { fired.Add(1) })
	require.NoError(t, err)
	clk.Advance(2 * time.Second)
	require.EqualValues(t, 2, fired.Load())
	_, err = w.AfterFunc(time.Second, func() {})
	require.NoError(t, err, "fired timers give their place back")
	require.EqualValues(t, 6, w.Stats().Rejected)
	requireBalance(t, w)
}

// TestDelays: a negative or zero delay is due at once (Advance(0) fires it); deadlines are exact,
// not rounded to the tick (1ns fires 1ns later); math.MaxInt64 is not clamped and fires at the end
// of time.
func TestDelays(t *testing.T) {
	w, clk := manualWheel(t)
	var order []string
	add := func(name string, d time.Duration) {
		_, err := w.AfterFunc(d, func() { order = append(order, name) })
		require.NoError(t, err)
	}
	add("negative", -time.Hour)
	add("zero", 0)
	add("max", math.MaxInt64)
	add("ns", 1)
	require.Empty(t, order, "nothing fires while the manual clock stands still")
	clk.Advance(0)
	require.ElementsMatch(t, []string{"negative", "zero"}, order, "Advance(0) flushes what is already due")
	clk.Advance(1)
	require.Equal(t, []string{"negative", "zero", "ns"}, order[:3:3], "1ns is due 1ns later: deadlines are exact, not rounded to the tick")
	clk.Advance(100 * 365 * 24 * time.Hour)
	require.Len(t, order, 3, "MaxInt64 is not clamped to the top level")
	require.Equal(t, 1, w.Len())
	clk.Advance(math.MaxInt64)
	require.Equal(t, []string{"max"}, order[3:], "fires at the end of time")
	requireBalance(t, w)
}

// TestTimerHandle: the zero Timer never fires; Reset moves a pending timer's deadline and reports
// true; once a callback ran, Stop and Reset report false; a handle whose entry was reused never
// touches the new timer; only the first Stop of a timer prevents its callback.
func TestTimerHandle(t *testing.T) {
	w, clk := manualWheel(t)
	var zero sw.Timer
	require.False(t, zero.Stop(), "the zero Timer never fires")
	require.False(t, zero.Reset(time.Second))

	var fired atomic.Int32
	t1, err := w.AfterFunc(time.Second, func() { fired.Add(1) })
	require.NoError(t, err)
	t1copy := t1
	require.Equal(t, t1, t1copy, "a Timer is comparable")
	require.True(t, t1.Reset(3*time.Second))
	clk.Advance(2 * time.Second)
	require.Zero(t, fired.Load(), "Reset moved the deadline later")
	clk.Advance(time.Second)
	require.EqualValues(t, 1, fired.Load())
	require.False(t, t1.Stop(), "Stop after the callback ran")
	require.False(t, t1.Reset(time.Second), "Reset after the callback ran")

	// Stale handles: the entry behind t1 is reused; t1 must never touch the new timer.
	for i := 0; i < 100; i++ {
		t2, err := w.AfterFunc(time.Second, func() { fired.Add(1) })
		require.NoError(t, err)
		require.False(t, t1.Stop())
		require.False(t, t1.Reset(time.Hour))
		require.True(t, t2.Stop())
		require.False(t, t2.Stop(), "Stop twice: only the first prevents the callback")
		require.False(t, t2.Reset(time.Second), "Reset after Stop")
	}
	clk.Advance(time.Hour)
	require.EqualValues(t, 1, fired.Load())
	require.Equal(t, uint64(100), w.Stats().Stopped)
	requireBalance(t, w)
}

// TestResetEarlier: Reset to an earlier deadline fires the timer there, not at its old deadline.
func TestResetEarlier(t *testing.T) {
	w, clk := manualWheel(t)
	var fired atomic.Int32
	tm, err := w.AfterFunc(time.Hour, func() { fired.Add(1) })
	require.NoError(t, err)
	require.True(t, tm.Reset(time.Millisecond))
	clk.Advance(time.Millisecond)
	require.EqualValues(t, 1, fired.Load())
}

// TestCallbackReschedulesItself: inside its callback a timer's Stop and Reset report false (it
// has started), and the callback can arm the next timer of a chain.
func TestCallbackReschedulesItself(t *testing.T) {
	w, clk := manualWheel(t)
	var tm sw.Timer
	var n atomic.Int32
	var cb func()
	cb = func() {
		require.False(t, tm.Stop(), "a started callback cannot be stopped")
		require.False(t, tm.Reset(time.Second), "nor reset")
		if n.Add(1) < 5 {
			var err error
			tm, err = w.AfterFunc(time.Millisecond, cb)
			require.NoError(t, err)
		}
	}
	tm, err := w.AfterFunc(time.Millisecond, cb)
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		clk.Advance(time.Millisecond)
	}
	require.EqualValues(t, 5, n.Load())
	requireBalance(t, w)
}

// TestMaxPendingBound hammers a striped WithMaxPending from many goroutines on many shards, each
// arming timers an hour out and stopping some of them, and a keeper of the tally that counts a
// timer only while it is certainly pending (after AfterFuncArg returned, before Stop is called):
// that count must never pass the bound, which is exact (no slack). Every refusal is an
// ErrTooManyTimers that names the bound. Then, with every timer stopped, one goroutine must get
// the whole bound back (credits left in other shards' stocks are collected), and no more; and
// timers that fire give theirs back too.
func TestMaxPendingBound(t *testing.T) {
	const limit = 100
	w, clk := manualWheel(t, sw.WithMaxPending(limit), sw.WithShards(8))
	goroutines, rounds := 16, 2000
	if raceEnabled || testing.Short() {
		rounds = 400
	}
	var held, peak, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rg := rand.New(rand.NewPCG(uint64(g), 1))
			var mine []sw.Timer
			for range rounds {
				if len(mine) > 0 && rg.IntN(3) == 0 { // arms outnumber stops: every goroutine reaches the bound
					k := rg.IntN(len(mine))
					held.Add(-1)
					if !mine[k].Stop() {
						t.Error("Stop of a pending timer reported false")
					}
					mine[k] = mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					continue
				}
				tm, err := w.AfterFuncArg(time.Hour, noopArg, nil)
				if err != nil {
					if !errors.Is(err, sw.ErrTooManyTimers) || err.Error() != "shardwheel: too many pending timers: WithMaxPending(100) reached" {
						t.Errorf("refusal: %v", err)
					}
					refused.Add(1)
					continue
				}
				for h := held.Add(1); ; {
					p := peak.Load()
					if h <= p || peak.CompareAndSwap(p, h) {
						break
					}
				}
				mine = append(mine, tm)
			}
			for _, tm := range mine {
				held.Add(-1)
				if !tm.Stop() {
					t.Error("Stop of a pending timer reported false")
				}
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, peak.Load(), int64(limit), "more timers pending than WithMaxPending")
	require.Positive(t, refused.Load(), "the bound was reached")
	require.Zero(t, w.Len())

	// Quiet: the whole bound is available again, to one goroutine, and no more.
	var timers []sw.Timer
	for i := range limit {
		tm, err := w.AfterFuncArg(time.Millisecond, noopArg, nil)
		require.NoError(t, err, "timer %d of %d once every earlier one was stopped", i, limit)
		timers = append(timers, tm)
	}
	_, err := w.AfterFuncArg(time.Millisecond, noopArg, nil)
	require.EqualError(t, err, "shardwheel: too many pending timers: WithMaxPending(100) reached")
	require.ErrorIs(t, err, sw.ErrTooManyTimers)
	require.True(t, timers[0].Stop())
	_, err = w.AfterFuncArg(time.Millisecond, noopArg, nil)
	require.NoError(t, err, "a stopped timer gives its credit back")

	// Fired timers give theirs back: all of them fire, and the bound is free again.
	clk.Advance(time.Millisecond)
	require.Zero(t, w.Len())
	for i := range limit {
		_, err := w.AfterFuncArg(time.Hour, noopArg, nil)
		require.NoError(t, err, "timer %d of %d once every earlier one fired", i, limit)
	}
	_, err = w.AfterFuncArg(time.Hour, noopArg, nil)
	require.ErrorIs(t, err, sw.ErrTooManyTimers)
	require.Equal(t, limit, w.Stop(), "Stop drops the timers that hold the bound")
}

// TestMaxPendingNoLimit: a wheel without the option never refuses for the count of its timers.
func TestMaxPendingNoLimit(t *testing.T) {
	w, _ := manualWheel(t, sw.WithShards(4))
	for range 10_000 {
		_, err := w.AfterFuncArg(time.Hour, noopArg, nil)
		require.NoError(t, err)
	}
	require.Equal(t, 10_000, w.Len())
}
