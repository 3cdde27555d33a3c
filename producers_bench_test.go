package shardwheel_test

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
)

// BenchmarkProducers measures the server pattern on many goroutines: producers/2 goroutines arm
// timeouts and hand them, 64 at a time, to as many others that stop them (stop=foreign: a
// request's timeout is armed by the goroutine that sends it and stopped by the one that reads
// the reply), or every goroutine stops its own (stop=own), at GOMAXPROCS 2 and 16. The figure is
// wall time per arm+stop pair over all goroutines, as RunParallel reports; the runtime's
// time.AfterFunc runs the same pattern beside it. What to look for: the wheel's pair cost stays
// flat as producers grow and with foreign stops, where one shared line or lock would climb.
func BenchmarkProducers(b *testing.B) {
	for _, procs := range []int{2, 16} {
		for _, producers := range []int{8, 64, 256} {
			for _, mode := range []string{"foreign", "own"} {
				name := fmt.Sprintf("procs=%d/producers=%d/stop=%s", procs, producers, mode)
				b.Run(name+"/impl=wheel", func(b *testing.B) {
					defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
					w, err := sw.New()
					if err != nil {
						b.Fatal(err)
					}
					defer w.Stop()
					var x int
					arm := func() sw.Timer {
						t, err := w.AfterFuncArg(time.Minute, noopArg, &x)
						if err != nil {
							b.Error(err)
						}
						return t
					}
					runProducers(b, producers, mode == "foreign", arm, sw.Timer.Stop)
				})
				b.Run(name+"/impl=runtime", func(b *testing.B) {
					defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
					f := func() {}
					arm := func() *time.Timer { return time.AfterFunc(time.Minute, f) }
					runProducers(b, producers, mode == "foreign", arm, (*time.Timer).Stop)
				})
			}
		}
	}
}

// producerBatch is how many timers an arming goroutine hands over at once: the channel
// operations cost a few ns per pair, not one send per timer.
const producerBatch = 64

// runProducers runs b.N arm+stop pairs on producers goroutines. With foreign, goroutine 2k arms
// and goroutine 2k+1 stops; otherwise each arms and stops its own. A Stop that reports false (the
// timers are a minute out) fails the benchmark.
func runProducers[T any](b *testing.B, producers int, foreign bool, arm func() T, stop func(T) bool) {
	var stopFalse atomic.Int64
	var wg sync.WaitGroup
	var start sync.WaitGroup
	start.Add(1)
	armers := producers
	if foreign {
		armers = producers / 2
	}
	b.ReportAllocs()
	b.ResetTimer()
	for g := range armers {
		n := (g+1)*b.N/armers - g*b.N/armers
		if !foreign {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start.Wait()
				for range n {
					if !stop(arm()) {
						stopFalse.Add(1)
					}
				}
			}()
			continue
		}
		full, empty := make(chan []T, 2), make(chan []T, 2)
		empty <- make([]T, 0, producerBatch)
		empty <- make([]T, 0, producerBatch)
		wg.Add(2)
		go func() { // the arming half
			defer wg.Done()
			defer close(full)
			start.Wait()
			for n > 0 {
				batch := <-empty
				for k := min(n, producerBatch); k > 0; k-- {
					batch = append(batch, arm())
					n--
				}
				full <- batch
			}
		}()
		go func() { // the stopping half
			defer wg.Done()
			start.Wait()
			for batch := range full {
				for _, t := range batch {
					if !stop(t) {
						stopFalse.Add(1)
					}
				}
				empty <- batch[:0]
			}
		}()
	}
	start.Done()
	wg.Wait()
	b.StopTimer()
	if n := stopFalse.Load(); n > 0 {
		b.Fatalf("%d Stops of pending timers reported false", n)
	}
}

// BenchmarkPairMaxPending is BenchmarkPair's arm+stop from GOMAXPROCS goroutines on a wheel with
// WithMaxPending, whose bound every arm takes a place in and every Stop gives it back: what the
// bound costs a pair (limit=off is the same wheel without it). Run with -cpu 2,16.
func BenchmarkPairMaxPending(b *testing.B) {
	for _, limit := range []int{0, 1 << 20} {
		name := "limit=off"
		if limit > 0 {
			name = "limit=1M"
		}
		b.Run(name, func(b *testing.B) {
			w, err := sw.New(sw.WithMaxPending(limit))
			if err != nil {
				b.Fatal(err)
			}
			defer w.Stop()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var x int
				for pb.Next() {
					t, err := w.AfterFuncArg(time.Minute, noopArg, &x)
					if err != nil || !t.Stop() {
						b.Error("arm or Stop failed", err)
					}
				}
			})
		})
	}
}
