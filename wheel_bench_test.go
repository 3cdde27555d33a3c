package shardwheel_test

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
)

// Each benchmark runs the wheel and its baseline, the runtime's time.AfterFunc, side by side:
// compare them with benchstat on the impl= sub-benchmark names.

func noopArg(any) {}

// pendingSizes are the numbers of timers already pending (an hour out) while the pairs run.
var pendingSizes = []int{0, 100_000, 1_000_000}

// BenchmarkPair measures the RPC pattern: arm a timeout, stop it, from GOMAXPROCS goroutines.
func BenchmarkPair(b *testing.B) {
	for _, pending := range pendingSizes {
		b.Run(fmt.Sprintf("impl=wheel/pending=%s", count(pending)), func(b *testing.B) {
			w, err := sw.New()
			if err != nil {
				b.Fatal(err)
			}
			defer w.Stop()
			for i := 0; i < pending; i++ {
				if _, err := w.AfterFuncArg(time.Hour, noopArg, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var x int
				for pb.Next() {
					t, _ := w.AfterFuncArg(time.Minute, noopArg, &x)
					if !t.Stop() {
						b.Error("Stop of a pending timer reported false")
					}
				}
			})
		})
		b.Run(fmt.Sprintf("impl=runtime/pending=%s", count(pending)), func(b *testing.B) {
			ts := make([]*time.Timer, pending)
			for i := range ts {
				ts[i] = time.AfterFunc(time.Hour, func() {})
			}
			defer func() {
				for _, t := range ts {
					t.Stop()
				}
			}()
			f := func() {}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					t := time.AfterFunc(time.Minute, f)
					if !t.Stop() {
						b.Error("Stop of a pending timer reported false")
					}
				}
			})
		})
	}
}

// BenchmarkFire measures firing throughput: b.N timers due within 10ms, time until all ran,
// and the p99 lateness of their callbacks against their own deadlines.
func BenchmarkFire(b *testing.B) {
	run := func(b *testing.B, arm func(d time.Duration, f func()), stop func()) {
		defer stop()
		var wg sync.WaitGroup
		wg.Add(b.N)
		late := make([]int64, b.N)
		var idx atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			d := time.Duration(i%10) * time.Millisecond
			due := time.Now().Add(d)
			arm(d, func() {
				late[idx.Add(1)-1] = int64(time.Since(due))
				wg.Done()
			})
		}
		wg.Wait()
		b.StopTimer()
		slices.Sort(late)
		b.ReportMetric(float64(late[len(late)*99/100]), "p99-late-ns")
		if late[0] < 0 {
			b.Errorf("a callback ran %v early", time.Duration(-late[0]))
		}
	}
	b.Run("impl=wheel", func(b *testing.B) {
		w, err := sw.New()
		if err != nil {
			b.Fatal(err)
		}
		run(b, func(d time.Duration, f func()) { _, _ = w.AfterFunc(d, f) }, func() { w.Stop() })
	})
	b.Run("impl=runtime", func(b *testing.B) {
		run(b, func(d time.Duration, f func()) { time.AfterFunc(d, f) }, func() {})
	})
}

// BenchmarkGCWithPending measures what a million pending timers (an hour out) cost the garbage
// collector: each op is one forced runtime.GC, and gc-cpu-ms is the GC CPU it took minus the same
// forced GC before the timers were armed. Every timer has its own argument, as a server's
// timeouts do: the wheel gets it through AfterFuncArg, the runtime through a func per timer that
// is built before the baseline, so only the timers themselves are counted for both.
func BenchmarkGCWithPending(b *testing.B) {
	const n = 1_000_000
	type rec struct{ _ [2]int64 } // size only: a 16-byte argument per timer
	gcCPU := func() float64 {
		s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
		metrics.Read(s)
		return s[0].Value.Float64()
	}
	forced := func() float64 {
		c := gcCPU()
		runtime.GC()
		return gcCPU() - c
	}
	run := func(b *testing.B, arm, disarm func()) {
		runtime.GC()
		base := forced()
		arm()
		runtime.GC()
		b.ResetTimer()
		var sum float64
		for i := 0; i < b.N; i++ {
			sum += forced()
		}
		b.StopTimer()
		b.ReportMetric((sum/float64(b.N)-base)*1e3, "gc-cpu-ms")
		disarm()
	}
	noop := func(any) {}
	b.Run("impl=wheel", func(b *testing.B) {
		w, err := sw.New()
		if err != nil {
			b.Fatal(err)
		}
		recs := make([]rec, n)
		hs := make([]sw.Timer, n)
		run(b, func() {
			for i := range recs {
				hs[i], _ = w.AfterFuncArg(time.Hour, noop, &recs[i])
			}
		}, func() { w.Stop() })
	})
	b.Run("impl=runtime", func(b *testing.B) {
		recs := make([]rec, n)
		fns := make([]func(), n)
		for i := range fns {
			r := &recs[i]
			fns[i] = func() { noop(r) }
		}
		ts := make([]*time.Timer, n)
		run(b, func() {
			for i := range ts {
				ts[i] = time.AfterFunc(time.Hour, fns[i])
			}
		}, func() {
			for _, t := range ts {
				t.Stop()
			}
		})
	})
}

func count(n int) string {
	switch {
	case n >= 1_000_000:
		return fmt.Sprintf("%de6", n/1_000_000)
	case n >= 1000:
		return fmt.Sprintf("%de3", n/1000)
	}
	return fmt.Sprint(n)
}

var _ = runtime.GOMAXPROCS
