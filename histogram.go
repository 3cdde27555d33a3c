package shardwheel

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// histBuckets is the number of buckets of a Histogram: bucket 0 under 1µs, bucket i in
// [2^(i-1), 2^i) µs for 1 <= i < histBuckets-1, and the last bucket from 2^(histBuckets-2) µs
// (about 18 minutes) up, without bound.
const histBuckets = len(Histogram{}.Buckets)

// Histogram counts durations by powers of two of microseconds: Buckets[0] counts those under
// 1µs, Buckets[i] those in [2^(i-1), 2^i) µs, and the last bucket, Buckets[31], also everything
// longer (from 2^30 µs, about 18 minutes, up). A Histogram is a plain value: Stats returns a
// copy, and two snapshots can be subtracted bucket by bucket to get the counts of an interval.
type Histogram struct {
	Buckets [32]uint64 // the counts, by bucket as above; histBuckets is its length
}

// Count returns the number of durations counted: the sum of the buckets.
func (h Histogram) Count() uint64 {
	var n uint64
	for _, c := range h.Buckets {
		n += c
	}
	return n
}

// Quantile returns the upper bound of the bucket that holds the q-quantile of the counted
// durations: the smallest bucket bound b such that at least a fraction q of them are under b
// (1µs for bucket 0, 2^i µs for bucket i). q is clamped to [0, 1]; Quantile(0) is the bound of
// the lowest non-empty bucket, Quantile(1) that of the highest. The last bucket has no bound and
// reports math.MaxInt64 (about 292 years). Quantile returns 0 if the Histogram is empty, or if q
// is NaN.
func (h Histogram) Quantile(q float64) time.Duration {
	n := h.Count()
	if n == 0 || math.IsNaN(q) {
		return 0
	}
	q = min(max(q, 0), 1)
	// rank is the 1-based position of the quantile among the n sorted durations, ceil(q*n): at
	// least 1, so that Quantile(0) is the smallest counted duration's bucket. q*n is a product of
	// floats: 0.55*100 is 55.00000000000001, whose ceiling would be one rank too far,
	// so a product within rounding of a whole number is that number.
	x := q * float64(n)
	rank := uint64(math.Ceil(x))
	if r := math.Round(x); math.Abs(x-r) <= 1e-9*max(x, 1) {
		rank = uint64(r)
	}
	rank = min(max(rank, 1), n)
	var seen uint64
	for i, c := range h.Buckets {
		seen += c
		if seen >= rank {
			return BucketBound(i)
		}
	}
	return BucketBound(histBuckets - 1) // unreachable: seen reaches n
}

// BucketBound returns the upper bound of bucket i of a Histogram, exclusive: 1µs for bucket 0,
// 2^i µs for bucket i, and math.MaxInt64 for the last bucket, which has no bound. It panics if
// i is not in [0, 32).
func BucketBound(i int) time.Duration {
	if i < 0 || i >= histBuckets {
		panic("shardwheel: BucketBound: bucket index out of range")
	}
	if i == histBuckets-1 {
		return math.MaxInt64
	}
	return time.Duration(1<<i) * time.Microsecond
}

// bucketOf returns the bucket of a Histogram that counts d: 0 under 1µs (also for d <= 0, a
// callback that started on time), bits.Len64 of the whole microseconds otherwise, capped at the
// last bucket. It is branch-light and allocation-free, for the firing path: one division by a
// constant (a multiply), one LZCNT, one compare.
func bucketOf(d time.Duration) int {
	if d <= 0 {
		return 0
	}
	return min(bits.Len64(uint64(d)/uint64(time.Microsecond)), histBuckets-1)
}

// atomicHistogram is a Histogram that one goroutine writes and any goroutine reads: a worker's
// lateness counts, summed by Stats. Each bucket is atomic, so a reader never sees a torn count;
// a snapshot of several buckets taken while the writer counts may be off by those in flight, as
// every counter in Stats may. Writers: only the owner (observe). Readers: anyone (addTo).
type atomicHistogram struct {
	b [histBuckets]atomic.Uint64
}

// observe counts d. Called only by the owner.
func (h *atomicHistogram) observe(d time.Duration) { h.b[bucketOf(d)].Add(1) }

// addTo adds h's counts to out (Stats sums the owners' histograms this way). Any goroutine.
func (h *atomicHistogram) addTo(out *Histogram) {
	for i := range h.b {
		out.Buckets[i] += h.b[i].Load()
	}
}
