package shardwheel_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
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

// BenchmarkKeyedMove measures the keep-alive of an idle timeout: re-arming keys that are armed,
// from GOMAXPROCS goroutines, with Move and with Set of a new value (an idle timeout that
// re-arms with fresh state on every packet); neither allocates. The baseline is the hand-rolled
// table: an xsync map of *time.Timer, re-armed with Reset.
func BenchmarkKeyedMove(b *testing.B) {
	const keys = 100_000
	for _, op := range []string{"keyed", "keyed-set"} {
		b.Run("impl="+op+"/keys=1e5", func(b *testing.B) {
			w, err := sw.New()
			if err != nil {
				b.Fatal(err)
			}
			defer w.Stop()
			k := sw.NewKeyed(w, func(int, int) {})
			for i := range keys {
				if err := k.Set(i, 0, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			rearmKeys(b, keys, func(key, i int) {
				if op == "keyed-set" {
					if err := k.Set(key, i, time.Hour); err != nil {
						b.Error(err)
					}
				} else if !k.Move(key, time.Hour) {
					b.Error("Move of an armed key reported false")
				}
			})
		})
	}
	b.Run("impl=timers/keys=1e5", func(b *testing.B) {
		m := xsync.NewMapOf[int, *time.Timer]()
		for i := range keys {
			m.Store(i, time.AfterFunc(time.Hour, func() {}))
		}
		defer m.Range(func(_ int, t *time.Timer) bool { t.Stop(); return true })
		rearmKeys(b, keys, func(key, _ int) {
			if t, ok := m.Load(key); !ok || !t.Reset(time.Hour) {
				b.Error("Reset of an armed timer reported false")
			}
		})
	})
}

// rearmKeys runs the timed loop of BenchmarkKeyedMove: rearm(key, i) for i counting up from a
// start spread over the goroutines (so that they re-arm different keys), key = i mod keys.
func rearmKeys(b *testing.B, keys int, rearm func(key, i int)) {
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := int(next.Add(1)) * 7919; pb.Next(); i++ {
			rearm(i%keys, i)
		}
	})
}
