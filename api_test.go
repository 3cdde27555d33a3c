package shardwheel_test

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// manualWheel returns a wheel on a manual clock that runs callbacks inside Advance, and stops it
// when the test ends.
func manualWheel(t *testing.T, opts ...sw.Option) (*sw.Wheel, *sw.ManualClock) {
	t.Helper()
	clk := sw.NewManualClock(epoch)
	w, err := sw.New(append([]sw.Option{sw.WithClock(clk), sw.WithWorkers(0), sw.WithShards(3)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	return w, clk
}

// armStuck arms a callback due after d that blocks its worker until release is closed, then calls
// then (if not nil); started is closed when the callback begins.
func armStuck(t *testing.T, w *sw.Wheel, d time.Duration, then func()) (started, release chan struct{}) {
	t.Helper()
	started, release = make(chan struct{}), make(chan struct{})
	_, err := w.AfterFunc(d, func() {
		close(started)
		<-release
		if then != nil {
			then()
		}
	})
	require.NoError(t, err)
	return started, release
}

// requireBalance checks the exactly-once accounting of a quiet wheel.
func requireBalance(t *testing.T, w *sw.Wheel) {
	t.Helper()
	s := w.Stats()
	require.Equal(t, s.Scheduled, s.Fired+s.Stopped+s.Dropped+uint64(s.Pending), "stats %+v", s)
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	cases := []struct {
		opt  sw.Option
		want string
	}{
		{sw.WithTick(0), "shardwheel: WithTick(0): tick must be positive"},
		{sw.WithTick(-time.Millisecond), "shardwheel: WithTick(-1ms): tick must be positive"},
		{sw.WithShards(0), "shardwheel: WithShards(0): shards must be between 1 and 4096"},
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
	t.Cleanup(sw.SetSlabCap(2 * sw.SlabChunkLen)) // runs after the wheel's Stop: cleanups run last-in first-out
	const limit = 2*sw.SlabChunkLen - 1           // slab index 0 is never used
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

func TestManualClockPanicsOnNegativeAdvance(t *testing.T) {
	clk := sw.NewManualClock(epoch)
	require.PanicsWithValue(t, "shardwheel: ManualClock.Advance(-1s): duration must not be negative", func() { clk.Advance(-time.Second) })
	clk.Advance(time.Hour)
	require.Equal(t, epoch.Add(time.Hour), clk.Now())
}

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

func TestResetEarlier(t *testing.T) {
	w, clk := manualWheel(t)
	var fired atomic.Int32
	tm, err := w.AfterFunc(time.Hour, func() { fired.Add(1) })
	require.NoError(t, err)
	require.True(t, tm.Reset(time.Millisecond))
	clk.Advance(time.Millisecond)
	require.EqualValues(t, 1, fired.Load())
}

func TestUseAfterStop(t *testing.T) {
	w, clk := manualWheel(t)
	var fired atomic.Int32
	tm, err := w.AfterFunc(time.Second, func() { fired.Add(1) })
	require.NoError(t, err)
	_, err = w.Every(time.Second, func() { fired.Add(1) })
	require.NoError(t, err)
	require.Equal(t, 2, w.Len())
	require.Equal(t, 2, w.Stop())
	require.Zero(t, w.Stop(), "later calls return 0")
	require.Zero(t, w.Len())
	_, err = w.AfterFunc(time.Second, func() {})
	require.ErrorIs(t, err, sw.ErrClosed)
	_, err = w.AfterFuncArg(time.Second, func(any) {}, nil)
	require.ErrorIs(t, err, sw.ErrClosed)
	_, err = w.Every(time.Second, func() {})
	require.ErrorIs(t, err, sw.ErrClosed)
	require.False(t, tm.Stop(), "a timer counted by Wheel.Stop cannot also be stopped")
	require.False(t, tm.Reset(time.Second))
	clk.Advance(time.Hour)
	require.Zero(t, fired.Load(), "pending timers never fire after Stop")
	s := w.Stats()
	require.Equal(t, uint64(2), s.Dropped)
	require.Equal(t, uint64(3), s.Rejected)
	requireBalance(t, w)
}

func TestConcurrentStop(t *testing.T) {
	w, err := sw.New()
	require.NoError(t, err)
	for i := 0; i < 1000; i++ {
		_, err := w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			total.Add(int64(w.Stop()))
		}()
	}
	wg.Wait()
	require.EqualValues(t, 1000, total.Load(), "exactly one Stop reports the pending timers")
}

// TestFullRing uses a ring of two slots with many producers: producers drain the ring themselves
// and nothing is lost.
func TestFullRing(t *testing.T) {
	w, err := sw.New(sw.WithRingSize(2), sw.WithShards(2))
	require.NoError(t, err)
	defer w.Stop()
	const producers, each = 16, 500
	var fired, stopped atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				tm, err := w.AfterFunc(time.Duration(i%3)*time.Millisecond, func() {
					if fired.Add(1)+stopped.Load() == producers*each {
						close(done)
					}
				})
				if err != nil {
					t.Error(err)
					return
				}
				if i%4 == 0 && tm.Stop() {
					if stopped.Add(1)+fired.Load() == producers*each {
						close(done)
					}
				}
			}
		}(p)
	}
	wg.Wait()
	<-done
	require.EqualValues(t, producers*each, fired.Load()+stopped.Load())
}

// TestFullQueue blocks one of two workers, with a queue of one callback, under both policies:
// the other worker keeps time and runs what the queue has no room for, so every other callback
// runs while the first is stuck, and every callback runs once.
func TestFullQueue(t *testing.T) {
	for _, policy := range []sw.FullPolicy{sw.Block, sw.CallerRuns} {
		t.Run(policy.String(), func(t *testing.T) {
			w, err := sw.New(sw.WithWorkers(2), sw.WithQueueSize(1), sw.WithFullPolicy(policy))
			require.NoError(t, err)
			var ran atomic.Int64
			started, release := armStuck(t, w, 0, func() { ran.Add(1) })
			<-started
			const n = 200
			var wg sync.WaitGroup
			wg.Add(n)
			for i := 0; i < n; i++ {
				_, err := w.AfterFunc(time.Duration(i%5)*time.Millisecond, func() { ran.Add(1); wg.Done() })
				require.NoError(t, err)
			}
			// The free worker runs what does not fit while the other is stuck; at most the one
			// callback the queue holds could wait for the stuck one.
			for ran.Load() < n-1 {
				time.Sleep(time.Millisecond)
			}
			close(release)
			wg.Wait()
			require.Zero(t, w.Stop())
			require.EqualValues(t, n+1, ran.Load())
			requireBalance(t, w)
		})
	}
}

func TestPanickingCallback(t *testing.T) {
	var got []any
	var mu sync.Mutex
	w, clk := manualWheel(t, sw.WithPanicHandler(func(r any) { mu.Lock(); got = append(got, r); mu.Unlock() }))
	var ran atomic.Int32
	_, err := w.AfterFunc(time.Millisecond, func() { panic("boom") })
	require.NoError(t, err)
	_, err = w.AfterFunc(2*time.Millisecond, func() { ran.Add(1) })
	require.NoError(t, err)
	clk.Advance(time.Second)
	require.Equal(t, []any{"boom"}, got)
	require.EqualValues(t, 1, ran.Load(), "the wheel keeps working after a panic")
	require.Equal(t, uint64(1), w.Stats().Panics)
	require.Equal(t, uint64(2), w.Stats().Fired)
}

func TestStopFromCallback(t *testing.T) {
	for _, workers := range []int{1, 3} {
		w, err := sw.New(sw.WithWorkers(workers))
		require.NoError(t, err)
		res := make(chan int, 1)
		// The hour-long timer is armed first, so that it is pending whenever the callback runs.
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
		_, err = w.AfterFunc(time.Millisecond, func() { res <- w.Stop() })
		require.NoError(t, err)
		require.Equal(t, 1, <-res, "Stop inside a callback does not wait for itself")
		require.Zero(t, w.Stop(), "a later Stop waits for the first and returns 0")
	}
}

func TestEvery(t *testing.T) {
	w, clk := manualWheel(t)
	var runs atomic.Int32
	var tm sw.Timer
	tm, err := w.Every(10*time.Millisecond, func() {
		if runs.Add(1) == 3 {
			require.True(t, tm.Stop(), "Stop during a run prevents the runs still to come")
		}
	})
	require.NoError(t, err)
	clk.Advance(9 * time.Millisecond)
	require.Zero(t, runs.Load(), "the first run is one interval from now")
	for i := 0; i < 10; i++ {
		clk.Advance(10 * time.Millisecond)
	}
	require.EqualValues(t, 3, runs.Load())
	require.False(t, tm.Stop())
	s := w.Stats()
	require.Equal(t, uint64(3), s.Fired)
	require.Equal(t, uint64(1), s.Stopped)
	requireBalance(t, w)
}

func TestEveryNeverOverlaps(t *testing.T) {
	w, err := sw.New(sw.WithWorkers(4))
	require.NoError(t, err)
	var running, overlaps, runs atomic.Int32
	tm, err := w.Every(time.Millisecond, func() {
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		time.Sleep(3 * time.Millisecond) // slower than the interval
		running.Add(-1)
		runs.Add(1)
	})
	require.NoError(t, err)
	for runs.Load() < 5 {
		time.Sleep(time.Millisecond)
	}
	tm.Stop()
	require.Zero(t, w.Stop())
	require.Zero(t, overlaps.Load())
	requireBalance(t, w)
}

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

func TestStatsCountRejections(t *testing.T) {
	w, _ := manualWheel(t)
	_, err := w.AfterFunc(0, nil)
	require.True(t, errors.Is(err, sw.ErrNilFunc))
	require.Equal(t, uint64(1), w.Stats().Rejected)
	require.Equal(t, 3, w.Stats().Shards)
	require.Zero(t, w.Stats().Workers)
}
