package shardwheel_test

import (
	"math"
	"sync"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestHistogramBucketOf pins the bucket of every boundary: Buckets[0] < 1µs, Buckets[i] in
// [2^(i-1), 2^i) µs, and the last bucket everything from 2^30 µs up, however long.
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
// bucket holding the q-quantile, 0 when empty.
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
