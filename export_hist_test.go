package shardwheel

import "time"

// Internals of histogram.go for the black-box tests in package shardwheel_test.

// BucketOf is the bucket index the firing path counts a lateness in.
var BucketOf = bucketOf

// Observe counts d in h, in the bucket the firing path would count it in: tests build the
// Histograms they expect with it.
func (h *Histogram) Observe(d time.Duration) { h.Buckets[bucketOf(d)]++ }

// AtomicHistogram is a worker's shared lateness histogram.
type AtomicHistogram struct{ h atomicHistogram }

func (a *AtomicHistogram) Observe(d time.Duration) { a.h.observe(d) }
func (a *AtomicHistogram) Snapshot() (h Histogram) { a.h.addTo(&h); return h }
