package shardwheel_test

import (
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestStatsCountRejections: a scheduling call that returns an error counts in Rejected; Shards
// is the number of shards, and Workers is 0 for a manual wheel with WithWorkers(0), whose
// callbacks run inside Advance on no goroutine of the wheel's.
func TestStatsCountRejections(t *testing.T) {
	w, _ := manualWheel(t)
	_, err := w.AfterFunc(0, nil)
	require.True(t, errors.Is(err, sw.ErrNilFunc))
	require.Equal(t, uint64(1), w.Stats().Rejected)
	require.Equal(t, 3, w.Stats().Shards)
	require.Zero(t, w.Stats().Workers)
}

// expvarSeq makes each test's expvar name unique: expvar's registry outlives a test, also
// across -count runs.
var expvarSeq atomic.Int64

func expvarName(t *testing.T) string {
	return fmt.Sprintf("shardwheel_%s_%d", t.Name(), expvarSeq.Add(1))
}

// readExpvar decodes the published variable as a Stats.
func readExpvar(t *testing.T, name string) sw.Stats {
	t.Helper()
	v := expvar.Get(name)
	require.NotNil(t, v, "expvar %q is not published", name)
	var st sw.Stats
	require.NoError(t, json.Unmarshal([]byte(v.String()), &st), "expvar %q: %s", name, v.String())
	return st
}

// TestStatsVar: each read is a fresh Stats; the JSON carries every counter and the lateness
// buckets; after Stop it reads the final counters.
func TestStatsVar(t *testing.T) {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, err := sw.New(sw.WithClock(clk), sw.WithWorkers(0), sw.WithShards(3))
	require.NoError(t, err)
	defer w.Stop()
	name := expvarName(t)
	expvar.Publish(name, w.StatsVar())

	require.Equal(t, sw.Stats{Shards: 3}, withoutHeld(readExpvar(t, name)))

	ran := 0
	for i := 0; i < 5; i++ {
		_, err := w.AfterFunc(time.Duration(i)*time.Millisecond, func() { ran++ })
		require.NoError(t, err)
	}
	tm, err := w.AfterFunc(time.Hour, func() { t.Error("a stopped timer ran") })
	require.NoError(t, err)
	require.True(t, tm.Stop())
	_, err = w.AfterFunc(time.Second, nil)
	require.ErrorIs(t, err, sw.ErrNilFunc)

	st := readExpvar(t, name)
	require.Equal(t, uint64(6), st.Scheduled)
	require.Equal(t, uint64(1), st.Stopped)
	require.Equal(t, uint64(1), st.Rejected)
	require.Equal(t, 5, st.Pending)
	require.Positive(t, st.HeldBytes)

	clk.Advance(10 * time.Millisecond)
	require.Equal(t, 5, ran)
	st = readExpvar(t, name)
	require.Equal(t, uint64(5), st.Fired)
	require.Equal(t, 0, st.Pending)
	require.Equal(t, st.Fired, st.Lateness.Count())
	require.Equal(t, w.Stats(), st)

	_, err = w.AfterFunc(time.Hour, func() { t.Error("ran after Stop") })
	require.NoError(t, err)
	require.Equal(t, 1, w.Stop())
	st = readExpvar(t, name)
	require.Equal(t, uint64(1), st.Dropped)
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped)
}

func withoutHeld(st sw.Stats) sw.Stats { st.HeldBytes = 0; return st }

// TestStatsVarDuplicateName: publishing a name twice panics in expvar.Publish, as for any expvar;
// one wheel may be published under several names.
func TestStatsVarDuplicateName(t *testing.T) {
	w, err := sw.New(sw.WithWorkers(1), sw.WithShards(1))
	require.NoError(t, err)
	defer w.Stop()
	name, other := expvarName(t), expvarName(t)
	expvar.Publish(name, w.StatsVar())
	require.Panics(t, func() { expvar.Publish(name, w.StatsVar()) })
	expvar.Publish(other, w.StatsVar())
	require.Equal(t, readExpvar(t, name), readExpvar(t, other))
}

// TestStatsVarDoesNotKeepWheel: expvar's registry lives for the process, yet a published
// wheel, stopped and dropped, is collected; its variable then reads null.
func TestStatsVarDoesNotKeepWheel(t *testing.T) {
	name := expvarName(t)
	func() {
		w, err := sw.New(sw.WithWorkers(1), sw.WithShards(1))
		require.NoError(t, err)
		expvar.Publish(name, w.StatsVar())
		w.Stop()
	}()
	v := expvar.Get(name)
	for i := 0; i < 100 && v.String() != "null"; i++ {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, "null", v.String())
}

// TestHistogramBucketOf: the bucket of every boundary: Buckets[0] < 1µs (a negative lateness
// too), Buckets[i] in [2^(i-1), 2^i) µs, and the last bucket everything from 2^30 µs up, however
// long; BucketBound is each bucket's exclusive upper bound.
func TestHistogramBucketOf(t *testing.T) {
	require.Equal(t, 0, sw.BucketOf(math.MinInt64))
	require.Equal(t, 0, sw.BucketOf(-time.Second), "a start before the deadline counts as on time")
	require.Equal(t, 0, sw.BucketOf(0))
	require.Equal(t, 0, sw.BucketOf(999*time.Nanosecond))
	require.Equal(t, 1, sw.BucketOf(time.Microsecond))
	require.Equal(t, 1, sw.BucketOf(2*time.Microsecond-1))
	for i := 1; i < 31; i++ {
		lo := time.Duration(1<<(i-1)) * time.Microsecond
		hi := time.Duration(1<<i) * time.Microsecond
		require.Equal(t, i, sw.BucketOf(lo), "lower bound of bucket %d", i)
		require.Equal(t, i, sw.BucketOf(hi-1), "just under the upper bound of bucket %d", i)
		require.Equal(t, sw.BucketBound(i), hi)
		if i < 30 {
			require.Equal(t, i+1, sw.BucketOf(hi), "upper bound of bucket %d is exclusive", i)
		}
	}
	require.Equal(t, 31, sw.BucketOf(time.Duration(1<<30)*time.Microsecond))
	require.Equal(t, 31, sw.BucketOf(time.Hour))
	require.Equal(t, 31, sw.BucketOf(math.MaxInt64))
	require.Equal(t, time.Microsecond, sw.BucketBound(0))
	require.Equal(t, time.Duration(math.MaxInt64), sw.BucketBound(31))
	require.PanicsWithValue(t, "shardwheel: BucketBound: bucket index out of range", func() { sw.BucketBound(32) })
	require.Panics(t, func() { sw.BucketBound(-1) })
}

// TestHistogramQuantile: Count is the sum of the buckets; Quantile is the upper bound of the
// bucket holding the q-quantile, 0 when empty or for a NaN q, and q is clamped to [0, 1].
func TestHistogramQuantile(t *testing.T) {
	var h sw.Histogram
	require.Zero(t, h.Count())
	for _, q := range []float64{0, 0.5, 0.99, 1, math.NaN()} {
		require.Zero(t, h.Quantile(q), "empty, q=%v", q)
	}

	// 90 on time (< 1µs), 9 at 1.5ms (bucket [1024, 2048) µs), 1 at 3 hours (the last bucket).
	for i := 0; i < 90; i++ {
		h.Observe(time.Duration(i) * 10 * time.Nanosecond)
	}
	for i := 0; i < 9; i++ {
		h.Observe(1500 * time.Microsecond)
	}
	h.Observe(3 * time.Hour)
	require.Equal(t, uint64(100), h.Count())
	require.Equal(t, uint64(90), h.Buckets[0])
	require.Equal(t, uint64(9), h.Buckets[11])
	require.Equal(t, uint64(1), h.Buckets[31])

	require.Equal(t, time.Microsecond, h.Quantile(0))
	require.Equal(t, time.Microsecond, h.Quantile(0.5))
	require.Equal(t, time.Microsecond, h.Quantile(0.9))
	require.Equal(t, 2048*time.Microsecond, h.Quantile(0.91))
	require.Equal(t, 2048*time.Microsecond, h.Quantile(0.99))
	require.Equal(t, time.Duration(math.MaxInt64), h.Quantile(0.995))
	require.Equal(t, time.Duration(math.MaxInt64), h.Quantile(1))
	require.Equal(t, h.Quantile(0), h.Quantile(-3), "q below 0 is clamped")
	require.Equal(t, h.Quantile(1), h.Quantile(7), "q above 1 is clamped")
	require.Zero(t, h.Quantile(math.NaN()))

	// A single duration is every quantile.
	var one sw.Histogram
	one.Observe(5 * time.Microsecond) // [4, 8) µs
	require.Equal(t, uint64(1), one.Buckets[3])
	for _, q := range []float64{0, 0.01, 0.5, 1} {
		require.Equal(t, 8*time.Microsecond, one.Quantile(q))
	}
}

// TestHistogramAtomic: a worker's histogram, written by its owner while another goroutine takes
// snapshots, never loses a count and never shows more than were counted (run with -race).
func TestHistogramAtomic(t *testing.T) {
	var a sw.AtomicHistogram
	const n = 20_000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			a.Observe(time.Duration(i%40) * 100 * time.Microsecond)
		}
	}()
	var last uint64
	for i := 0; i < 200; i++ {
		c := a.Snapshot().Count()
		require.GreaterOrEqual(t, c, last, "a count went backwards")
		require.LessOrEqual(t, c, uint64(n))
		last = c
	}
	wg.Wait()
	h := a.Snapshot()
	require.Equal(t, uint64(n), h.Count())
	var want sw.Histogram
	for i := 0; i < n; i++ {
		want.Observe(time.Duration(i%40) * 100 * time.Microsecond)
	}
	require.Equal(t, want, h)
}

// BenchmarkHistogramObserve is the cost the firing path pays per callback to count its lateness.
func BenchmarkHistogramObserve(b *testing.B) {
	b.Run("local", func(b *testing.B) {
		var h sw.Histogram
		for i := 0; b.Loop(); i++ {
			h.Observe(time.Duration(i&0xffff) * time.Microsecond)
		}
	})
	b.Run("atomic", func(b *testing.B) {
		var h sw.AtomicHistogram
		for i := 0; b.Loop(); i++ {
			h.Observe(time.Duration(i&0xffff) * time.Microsecond)
		}
	})
}

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

// TestStatsQueued: callbacks due and taken from the wheel that wait in the queue for a worker
// (the only one is busy) count in Queued, and are still pending, until they start; then they
// count in Fired and in Lateness, and Queued is 0 again.
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
