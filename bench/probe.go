package main

import (
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
)

// epoch is the origin of the bench's monotonic clock. time.Since reads the monotonic reading
// that time.Now carries, so mono never goes backwards and never jumps with the wall clock.
var epoch = time.Now()

// mono returns nanoseconds since epoch on the monotonic clock.
func mono() int64 { return int64(time.Since(epoch)) }

// Rec is the record of one timer, shared by every implementation. The harness owns it; the
// callback (fire) only touches its atomic fields. A slab of Recs is allocated once, before any
// implementation is created, so its memory never counts against an implementation.
type Rec struct {
	deadline atomic.Int64 // ns on mono: moment of the schedule call + d; written by the harness
	firedAt  atomic.Int64 // ns on mono when fire first ran for this arming
	fires    atomic.Int32 // how many times fire ran for this Rec since the last reset
	stopped  atomic.Bool  // a Stop (or Remove) reported true for it
	fn       func()       // fire(r) as a func(), built once, for APIs that take a func()
}

// reset prepares r for a new arming.
func (r *Rec) reset() {
	r.deadline.Store(0)
	r.firedAt.Store(0)
	r.fires.Store(0)
	r.stopped.Store(false)
}

// newSlab returns n Recs with their fn closures built.
func newSlab(n int) []Rec {
	s := make([]Rec, n)
	for i := range s {
		r := &s[i]
		r.fn = func() { fire(r) }
	}
	return s
}

// fire is the one callback every implementation runs: it notes the moment and counts the run.
func fire(r *Rec) {
	now := mono()
	if r.fires.Add(1) == 1 {
		r.firedAt.Store(now)
	}
	if w := watch.Load(); w != nil {
		w.count.Inc()
	}
}

// watcher lets a workload wait until target callbacks have run. Its count is striped
// (xsync.Counter): a single atomic counter bumped by every callback was a contended cache line
// that cost each implementation ~100 ns per fire in the flood, measuring the harness, not the timers.
type watcher struct {
	target int64
	count  *xsync.Counter
}

var watch atomic.Pointer[watcher]

// startWatch arms a watcher for target callbacks and returns it; stopWatch disarms it.
func startWatch(target int64) *watcher {
	w := &watcher{target: target, count: xsync.NewCounter()}
	watch.Store(w)
	return w
}

func stopWatch() { watch.Store(nil) }

// waitDone waits for w to reach its target or for the timeout, and reports whether it did. It
// polls every millisecond; figures never come from the moment it returns (each callback notes its
// own time), so the polling only decides how soon the workload goes on.
func (w *watcher) waitDone(timeout time.Duration) bool {
	end := time.Now().Add(timeout)
	for w.count.Value() < w.target {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}
