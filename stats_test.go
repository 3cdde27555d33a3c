package shardwheel_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	sw "github.com/shardwheel/shardwheel"
)

// TestStatsLatenessCountsEveryStart: every kind of start (AfterFunc, AfterFuncArg, each run of
// an Every, a context deadline, a Keyed fire) counts once in Lateness, so that on a quiet wheel
// Lateness.Count() == Fired; and a callback's lateness lands in the bucket of how far the manual
// clock jumped past its deadline.
func TestStatsLatenessCountsEveryStart(t *testing.T) {
	w, mc := manualWheel(t, sw.WithTick(time.Millisecond))

	var runs atomic.Int64
	f := func() { runs.Add(1) }
	_, err := w.AfterFunc(5*time.Millisecond, f)
	require.NoError(t, err)
	_, err = w.AfterFuncArg(5*time.Millisecond, func(any) { runs.Add(1) }, nil)
	require.NoError(t, err)
	ctx, cancel := w.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	k := sw.NewKeyed(w, func(string, int) { runs.Add(1) })
	require.NoError(t, k.Set("a", 1, 5*time.Millisecond))

	// 20 ms in one step: each of the four started 15 ms late, in [2^13, 2^14) µs.
	mc.Advance(20 * time.Millisecond)
	require.Error(t, ctx.Err())
	st := w.Stats()
	require.Equal(t, uint64(4), st.Fired)
	require.Equal(t, st.Fired, st.Lateness.Count())
	require.Equal(t, uint64(4), st.Lateness.Buckets[14], "15ms late: %v", st.Lateness.Buckets)
	require.Equal(t, 16384*time.Microsecond, st.Lateness.Quantile(0.99))

	// An Every run on time, tick by tick: on time is under 1µs.
	ev, err := w.Every(time.Millisecond, f)
	require.NoError(t, err)
	for range 10 {
		mc.Advance(time.Millisecond)
	}
	ev.Stop()
	st = w.Stats()
	require.Equal(t, uint64(14), st.Fired)
	require.Equal(t, st.Fired, st.Lateness.Count())
	require.Equal(t, uint64(10), st.Lateness.Buckets[0], "on time: %v", st.Lateness.Buckets)
	require.Equal(t, int64(3+10), runs.Load()) // the context's deadline runs no user callback
}

// TestStatsQueued: callbacks handed to the workers and not yet started count in Queued until a
// worker takes them; then they count in Fired and in Lateness.
func TestStatsQueued(t *testing.T) {
	w, mc := manualWheel(t, sw.WithWorkers(1))

	started, release := armStuck(t, w, time.Millisecond, nil)
	mc.Advance(time.Millisecond)
	<-started // the one worker is busy now

	const n = 10
	var ran atomic.Int64
	for range n {
		_, err := w.AfterFunc(time.Millisecond, func() { ran.Add(1) })
		require.NoError(t, err)
	}
	mc.Advance(time.Millisecond) // dispatched: in the queue, behind the busy worker
	st := w.Stats()
	require.Equal(t, n, st.Queued)
	require.Equal(t, n, st.Pending, "a queued callback is still pending")
	require.Equal(t, uint64(1), st.Fired)

	close(release)
	require.Eventually(t, func() bool { return ran.Load() == n }, time.Minute, time.Millisecond)
	require.Eventually(t, func() bool {
		st = w.Stats()
		return st.Queued == 0 && st.Fired == n+1
	}, time.Minute, time.Millisecond)
	require.Equal(t, st.Fired, st.Lateness.Count())
}

// TestStatsLatenessSystemClock: on the system clock, with workers that advance and steal, every
// start counts once in Lateness, whichever worker ran it.
func TestStatsLatenessSystemClock(t *testing.T) {
	w, err := sw.New(sw.WithWorkers(2), sw.WithTick(100*time.Microsecond))
	require.NoError(t, err)
	defer w.Stop()
	const n = 5000
	var ran atomic.Int64
	for i := range n {
		_, err := w.AfterFunc(time.Duration(i%50)*100*time.Microsecond, func() { ran.Add(1) })
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return ran.Load() == n }, time.Minute, time.Millisecond)
	st := w.Stats()
	require.Equal(t, uint64(n), st.Fired)
	require.Equal(t, st.Fired, st.Lateness.Count())
	require.Zero(t, st.Queued)
}
