package shardwheel_test

import (
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestScaleFlood fires 100k timers (1M with SHARDWHEEL_SCALE=1M and without -short) through the
// worker pool, with callbacks that spin briefly, and requires that the live goroutines never
// exceed the test's baseline plus one watchdog goroutine (expiry.go) plus the workers: a flood
// runs on the pool, never on a goroutine per timer. Every timer fires once and none early. The same flood on
// time.AfterFunc (a goroutine per expiry) is run beside it; the time, peak goroutines and peak
// heap of both are logged, not asserted.
func TestScaleFlood(t *testing.T) {
	n := 100_000
	if !testing.Short() && os.Getenv("SHARDWHEEL_SCALE") == "1M" {
		n = 1_000_000
	}
	const workers = 2
	spread := 200 * time.Millisecond
	spin := 10 * time.Microsecond

	sampler := newScaleSampler()
	baseline := runtime.NumGoroutine() // includes the sampler
	w, err := sw.New(sw.WithWorkers(workers))
	require.NoError(t, err)
	defer w.Stop()

	base := time.Now()
	deadlines := make([]int64, n) // monotonic ns since base; written before the AfterFuncArg call
	var ran, early atomic.Int64
	done := make(chan struct{})
	cb := func(a any) {
		now := int64(time.Since(base))
		if now < deadlines[a.(int)] {
			early.Add(1)
		}
		fltSpin(spin)
		if ran.Add(1) == int64(n) {
			close(done)
		}
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		d := spread * time.Duration(i) / time.Duration(n)
		deadlines[i] = int64(time.Since(base)) + int64(d)
		_, err := w.AfterFuncArg(d, cb, i)
		require.NoError(t, err)
	}
	armed := time.Since(start)
	<-done
	wheelTime := time.Since(start)
	peakG, peakHeap := sampler.stop()
	require.Equal(t, 0, w.Stop())

	require.Zero(t, early.Load(), "timers started before their deadline")
	require.Equal(t, int64(n), ran.Load())
	st := w.Stats()
	require.Equal(t, uint64(n), st.Fired)
	require.Equal(t, st.Scheduled, st.Fired)
	limit := baseline + 1 + workers
	require.LessOrEqual(t, peakG, limit, "peak goroutines %d, baseline %d + watchdog + %d workers", peakG, baseline, workers)
	t.Logf("wheel:          %d timers, armed in %v, all fired after %v; peak goroutines %d (limit %d), peak heap %.1f MiB",
		n, armed, wheelTime, peakG, limit, float64(peakHeap)/(1<<20))

	// The baseline: the same flood on time.AfterFunc.
	sampler = newScaleSampler()
	var ran2 atomic.Int64
	done2 := make(chan struct{})
	start = time.Now()
	for i := 0; i < n; i++ {
		d := spread * time.Duration(i) / time.Duration(n)
		time.AfterFunc(d, func() {
			fltSpin(spin)
			if ran2.Add(1) == int64(n) {
				close(done2)
			}
		})
	}
	armed = time.Since(start)
	<-done2
	stdTime := time.Since(start)
	peakG, peakHeap = sampler.stop()
	t.Logf("time.AfterFunc: %d timers, armed in %v, all fired after %v; peak goroutines %d, peak heap %.1f MiB",
		n, armed, stdTime, peakG, float64(peakHeap)/(1<<20))
	// Let the last time.AfterFunc goroutines exit before goleak looks (a plain loop: Eventually
	// would add a goroutine of its own).
	for i := 0; i < 10_000 && runtime.NumGoroutine() > baseline-1; i++ {
		time.Sleep(time.Millisecond)
	}
}

// scaleSampler samples the goroutine count and the live heap until stopped.
type scaleSampler struct {
	quit     chan struct{}
	wg       sync.WaitGroup
	peakG    int
	peakHeap uint64
}

func newScaleSampler() *scaleSampler {
	s := &scaleSampler{quit: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for i := 0; ; i++ {
			if g := runtime.NumGoroutine(); g > s.peakG {
				s.peakG = g
			}
			if i%10 == 0 {
				metrics.Read(sample)
				if h := sample[0].Value.Uint64(); h > s.peakHeap {
					s.peakHeap = h
				}
			}
			select {
			case <-s.quit:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	return s
}

// stop ends the sampling and returns the peaks.
func (s *scaleSampler) stop() (goroutines int, heap uint64) {
	close(s.quit)
	s.wg.Wait()
	return s.peakG, s.peakHeap
}
