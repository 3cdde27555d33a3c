package shardwheel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
)

// BenchmarkWithTimeout measures the RPC deadline: WithTimeout(parent, 1 minute) and its cancel,
// from GOMAXPROCS goroutines, with live contexts already waiting. The baseline beside it is the
// standard library's context.WithTimeout; compare them with benchstat on the impl= names
// (benchstat -col /impl). cpu-ns/op is the process's CPU time per op, the steadier figure on a
// busy machine.
func BenchmarkWithTimeout(b *testing.B) {
	type withTimeout func(context.Context, time.Duration) (context.Context, context.CancelFunc)
	impls := []struct {
		name string
		make func(b *testing.B) withTimeout
	}{
		{"wheel", func(b *testing.B) withTimeout {
			w, err := sw.New()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { w.Stop() })
			return w.WithTimeout
		}},
		{"context", func(*testing.B) withTimeout { return context.WithTimeout }},
	}
	for _, live := range []struct {
		name string
		n    int
	}{{"0", 0}, {"1e6", 1_000_000}} {
		for _, impl := range impls {
			b.Run(fmt.Sprintf("impl=%s/live=%s", impl.name, live.name), func(b *testing.B) {
				withTimeout := impl.make(b)
				parent := context.Background()
				cancels := make([]context.CancelFunc, live.n)
				for i := range cancels {
					_, cancels[i] = withTimeout(parent, time.Hour)
				}
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := cpuTime()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						_, cancel := withTimeout(parent, time.Minute)
						cancel()
					}
				})
				b.StopTimer()
				// The process's CPU per op (GC and the wheel's own goroutines included): on a
				// shared machine, wall time per op mostly measures the neighbours.
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
				for _, cancel := range cancels {
					cancel()
				}
			})
		}
	}
}
