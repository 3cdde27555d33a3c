package shardwheel_test

import (
	"math"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// What Wheel.Stop returns is exact: every timer it counts never runs, every pending timer it does
// not count ran or was stopped, and Stats.Dropped is the sum of what Stop returned, also when
// Stop is called from a callback and an Every's run comes after it on the same goroutine.

// TestStopCountWithEveryAfterIt: one callback stops the wheel; an Every's first run fired in the
// same round, on the same goroutine, and runs before or after the Stop (in either order). The
// Every's run happens once, its series ends, and Stop's count equals Stats.Dropped with the
// books balanced; a second Stop returns 0.
func TestStopCountWithEveryAfterIt(t *testing.T) {
	for _, stopFirst := range []bool{true, false} {
		clock := sw.NewManualClock(time.Unix(0, 0))
		w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0), sw.WithShards(1))
		require.NoError(t, err)
		got, runs := -1, 0
		stopAt, everyAt := 900*time.Microsecond, time.Millisecond
		if !stopFirst {
			stopAt, everyAt = 1100*time.Microsecond, 900*time.Microsecond
		}
		_, err = w.AfterFunc(stopAt, func() { got = w.Stop() })
		require.NoError(t, err)
		_, err = w.Every(everyAt, func() { runs++ })
		require.NoError(t, err)
		for range 3 {
			_, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
			require.NoError(t, err)
		}
		clock.Advance(2 * time.Millisecond)
		require.Equal(t, 1, runs, "stopFirst=%v: the Every's fired run runs once, and no other", stopFirst)
		require.Zero(t, w.Stop())
		st := w.Stats()
		require.EqualValues(t, got, st.Dropped, "stopFirst=%v: %+v", stopFirst, st)
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "stopFirst=%v: %+v", stopFirst, st)
		want := 3 // the three an hour out
		if !stopFirst {
			want++ // the series' next run, re-armed before the Stop
		}
		require.Equal(t, want, got, "stopFirst=%v", stopFirst)
	}
}

// TestStopCountEveryAtEndOfTime: a series that ends at the end of a manual clock's time was not
// pending at any Stop: Dropped stays 0, the books balance, and Stop returns 0.
func TestStopCountEveryAtEndOfTime(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0))
	require.NoError(t, err)
	runs := 0
	_, err = w.Every(time.Hour, func() { runs++ })
	require.NoError(t, err)
	clock.Advance(math.MaxInt64)
	require.Equal(t, 1, runs)
	st := w.Stats()
	require.Zero(t, st.Pending)
	require.Zero(t, st.Dropped)
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped, "%+v", st)
	require.Zero(t, w.Stop())
}

// TestStopFromCallbackThenStopFiredTimer: a callback stops the wheel and then stops a timer that
// fired in the same batch and has not started. Wheel.Stop does not count it (it was no longer
// pending); Timer.Stop reports true and the callback never runs (Timer.Stop's doc): the timer
// ends in exactly one of the three ways, and the books balance.
func TestStopFromCallbackThenStopFiredTimer(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0), sw.WithShards(1))
	require.NoError(t, err)
	var second sw.Timer
	got, stopped, ran := -1, false, 0
	_, err = w.AfterFunc(500*time.Microsecond, func() {
		ran++
		got = w.Stop()
		stopped = second.Stop()
	})
	require.NoError(t, err)
	second, err = w.AfterFunc(900*time.Microsecond, func() { ran++ })
	require.NoError(t, err)
	clock.Advance(time.Millisecond)
	require.Zero(t, got, "the second timer had fired: Stop does not count it as pending")
	require.True(t, stopped, "the fired timer had not started: its Stop prevents it")
	require.Equal(t, 1, ran, "only the first callback ran")
	require.False(t, second.Stop())
	st := w.Stats()
	require.Equal(t, uint64(2), st.Scheduled)
	require.Equal(t, uint64(1), st.Fired)
	require.Equal(t, uint64(1), st.Stopped)
	require.Zero(t, st.Dropped)
}
