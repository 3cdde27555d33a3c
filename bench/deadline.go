package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	sw "github.com/shardwheel/shardwheel"
)

// deadliner is Wheel.WithTimeout. It is reached through an interface assertion so that the
// bench compiles against a library that does not have it yet; the workload is then skipped.
type deadliner interface {
	WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc)
}

// withTimeoutFunc is one way to make a deadline context.
type withTimeoutFunc func(parent context.Context, d time.Duration) (context.Context, context.CancelFunc)

// newDeadliner returns the WithTimeout of kind k (context.WithTimeout for Runtime, a fresh
// wheel's WithTimeout for Shardwheel) and a func that releases it. ok is false when k has no
// such method.
func newDeadliner(k Kind) (f withTimeoutFunc, closeFn func(), ok bool, err error) {
	switch k {
	case Runtime:
		return context.WithTimeout, func() {}, true, nil
	case Shardwheel:
		w, err := sw.New(swOptions()...)
		if err != nil {
			return nil, nil, false, err
		}
		d, ok := any(w).(deadliner)
		if !ok {
			w.Stop()
			return nil, nil, false, nil
		}
		return d.WithTimeout, func() { w.Stop() }, true, nil
	}
	return nil, nil, false, nil
}

// hasWheelWithTimeout reports whether the library has Wheel.WithTimeout.
func hasWheelWithTimeout() bool {
	_, ok := any((*sw.Wheel)(nil)).(deadliner)
	return ok
}

// runCtxPairs has procs goroutines create a deadline context (due 100 ms to 10 s out) and
// cancel it at once, for about dur: the life of an RPC that finishes in time.
func runCtxPairs(f withTimeoutFunc, procs int, dur time.Duration) PairResult {
	return runCtxLoop(f, procs, dur, false)
}

// runCtxRPC is runCtxPairs with the context used as an RPC uses it: the deadline context is
// made, its Done channel is asked for and polled (as a select in the RPC's I/O would), and it is
// canceled. With Done asked for, the wheel's context makes the standard cancelCtx that carries it
// (see the library's context.go), so this is the figure for code that watches its context.
func runCtxRPC(f withTimeoutFunc, procs int, dur time.Duration) PairResult {
	return runCtxLoop(f, procs, dur, true)
}

// runCtxLoop is the loop of runCtxPairs and, with watch, of runCtxRPC.
func runCtxLoop(f withTimeoutFunc, procs int, dur time.Duration, watch bool) PairResult {
	var (
		stop      atomic.Bool
		pairs     atomic.Int64
		ready, wg sync.WaitGroup
		start     = make(chan struct{})
	)
	parent := context.Background()
	for range procs {
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n int64
			ready.Done()
			<-start
			for i := 0; !stop.Load(); {
				for end := i + 64; i < end; i++ {
					ctx, cancel := f(parent, pairDelay(i))
					if watch {
						select {
						case <-ctx.Done():
							panic("deadline context done before its deadline")
						default:
						}
					}
					cancel()
				}
				n += 64
			}
			pairs.Add(n)
		}()
	}
	ready.Wait()
	settle()
	return measureWindow(&ready, &wg, start, &stop, &pairs, dur)
}

// runCtxCheck creates n deadline contexts due within spread and watches each with
// context.AfterFunc: its Done must close at or after its deadline, once, with
// context.DeadlineExceeded.
func runCtxCheck(k Kind, f withTimeoutFunc, n, procs int, spread, grace time.Duration, slab []Rec) Check {
	recs := slab[:n]
	for i := range recs {
		recs[i].reset()
	}
	var wrong atomic.Int64
	cancels := make([]context.CancelFunc, n)
	parallel(procs, n, func(g, lo, hi int) {
		rg := rng(3, g)
		for i := lo; i < hi; i++ {
			d := time.Duration(rg.Int64N(int64(spread) + 1))
			r := &recs[i]
			r.deadline.Store(mono() + int64(d))
			ctx, cancel := f(context.Background(), d)
			cancels[i] = cancel
			context.AfterFunc(ctx, func() {
				if ctx.Err() != context.DeadlineExceeded {
					wrong.Add(1)
				}
				fire(r)
			})
		}
	})
	for end := time.Now().Add(spread + grace); time.Now().Before(end); {
		done := 0
		for i := range recs {
			if recs[i].fires.Load() > 0 {
				done++
			}
		}
		if done == n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	c := Check{Impl: k.key(), Workload: "deadline ctx", Timers: int64(n), Wrong: wrong.Load()}
	for i := range recs {
		c.tally(&recs[i])
	}
	// Tallied before cancel: a context that never expired is lost, not "cancelled".
	stopWatch()
	for _, cancel := range cancels {
		cancel()
	}
	return c
}
