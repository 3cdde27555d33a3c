package shardwheel_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
)

// BenchmarkFirePhase measures the expiry side alone: a million callbacks are armed beforehand
// (from two goroutines), all due at one instant T, and fire-ms is the time from T to the last
// callback. Run at procs=1 and procs=2 (GOMAXPROCS while the wheel is built and fires), beside
// the runtime's time.AfterFunc: the wheel's figure should drop with the second P.
//
//	go test -run '^$' -bench BenchmarkFirePhase -benchtime 3x -count 6 .
func BenchmarkFirePhase(b *testing.B) {
	const n = 1_024_000
	lead := 1500 * time.Millisecond // time to arm them all before T (the runtime needs about 1 s at procs=1)
	for _, procs := range []int{1, 2} {
		for _, impl := range []string{"wheel", "runtime"} {
			b.Run(fmt.Sprintf("impl=%s/procs=%d", impl, procs), func(b *testing.B) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				var total time.Duration
				for it := 0; it < b.N; it++ {
					var w *sw.Wheel
					if impl == "wheel" {
						var err error
						if w, err = sw.New(); err != nil {
							b.Fatal(err)
						}
					}
					// Each callback touches its own request's state, as an RPC timeout does: it
					// counts down the stripe of 1024 consecutive timers it belongs to, and the
					// last of a stripe counts down the stripes. One global counter instead would
					// measure its own cache line bouncing between the cores, not the wheel.
					stripes := make([]stripe, n/stripeLen)
					var left atomic.Int64
					left.Store(int64(len(stripes)))
					var last atomic.Int64
					done := make(chan struct{})
					for i := range stripes {
						stripes[i].left.Store(stripeLen)
					}
					f := func(st *stripe) {
						if st.left.Add(-1) == 0 && left.Add(-1) == 0 {
							last.Store(time.Now().UnixNano())
							close(done)
						}
					}
					fa := func(a any) { f(a.(*stripe)) }
					t0 := time.Now().Add(lead)
					var wg sync.WaitGroup
					for g := 0; g < 2; g++ {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for i := g * n / 2; i < (g+1)*n/2; i++ {
								d := time.Until(t0)
								st := &stripes[i/stripeLen]
								if w != nil {
									if _, err := w.AfterFuncArg(d, fa, st); err != nil {
										panic(err)
									}
								} else {
									time.AfterFunc(d, func() { f(st) })
								}
							}
						}()
					}
					wg.Wait()
					// Collect before the instant, for both: a cycle that the arming's growth
					// started would otherwise run into the fire phase at random, and the
					// figure would measure when it did (2 Ps: 32 to 60 ms over 8 runs).
					runtime.GC()
					if time.Now().After(t0) {
						b.Fatalf("arming and a GC took longer than %v", lead)
					}
					<-done
					total += time.Duration(last.Load() - t0.UnixNano())
					if w != nil {
						w.Stop()
					}
					runtime.GC()
				}
				b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "fire-ms")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// stripe is the state a run of stripeLen consecutive timers of BenchmarkFirePhase shares.
type stripe struct {
	left atomic.Int64
	_    [56]byte
}

const stripeLen = 1024

// BenchmarkFirePhaseFloor is the machine's side of BenchmarkFirePhase: no wheel, only the memory
// walk that firing a million callbacks needs at least. Each of a million 48-byte entries (the
// size of the wheel's) is read, CASed and its func called with its stripe, which counts down, as
// the fire phase's callbacks do; GOMAXPROCS goroutines take equal halves. Where the walk does not
// get faster with the second P, the memory system, not the wheel, bounds the fire phase's
// speed-up on that machine.
//
//	go test -run '^$' -bench 'BenchmarkFirePhase' -benchtime 3x -count 6 .
func BenchmarkFirePhaseFloor(b *testing.B) {
	const n = 1_024_000
	type floorEntry struct { // shardwheel's entry: state, when, next, prev, f, arg
		state atomic.Uint64
		when  atomic.Int64
		_, _  uint32
		f     func(any)
		arg   any
	}
	es := make([]floorEntry, n)
	stripes := make([]stripe, n/stripeLen)
	f := func(a any) { a.(*stripe).left.Add(-1) }
	for i := range es {
		es[i].f, es[i].arg = f, &stripes[i/stripeLen]
	}
	for _, procs := range []int{1, 2} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			var total time.Duration
			for it := 0; it < b.N; it++ {
				for i := range es {
					es[i].state.Store(1)
				}
				for i := range stripes {
					stripes[i].left.Store(stripeLen)
				}
				runtime.GC()
				var wg sync.WaitGroup
				t0 := time.Now()
				for g := range procs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := g * n / procs; i < (g+1)*n/procs; i++ {
							if e := &es[i]; e.when.Load() <= 0 && e.state.CompareAndSwap(1, 2) {
								e.f(e.arg)
							}
						}
					}()
				}
				wg.Wait()
				total += time.Since(t0)
			}
			b.ReportMetric(float64(total.Microseconds())/1e3/float64(b.N), "fire-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkEveryCPU measures what one Every(1ms) costs in CPU per second of wall time, with 2
// shards and with 4096: the keeper looks at groups of shards, so the figure should barely grow.
// The runtime's time.Ticker is the baseline, and impl=floor the least a timer that sleeps until its
// next deadline pays. It also reports the runs a second that CPU bought.
//
//	go test -run '^$' -bench BenchmarkEveryCPU -count 6 .
func BenchmarkEveryCPU(b *testing.B) {
	const window = 500 * time.Millisecond
	run := func(b *testing.B, start func(f func()) (stop func())) {
		var (
			cpu   time.Duration
			total int64 // runs within the windows
		)
		for it := 0; it < b.N; it++ {
			// What the previous sub-benchmark left (4096 shards' slabs) is collected and given
			// back to the OS here, not by the scavenger during the window.
			debug.FreeOSMemory()
			var runs atomic.Int64
			stop := start(func() { runs.Add(1) })
			runtime.GC() // what New allocated is not the series' cost
			c0, r0 := cpuTime(), runs.Load()
			time.Sleep(window)
			cpu += cpuTime() - c0
			total += runs.Load() - r0
			stop()
			if runs.Load() == 0 {
				b.Fatal("no run")
			}
		}
		b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N)/window.Seconds(), "cpu-ms/s")
		// Runs a second: a series that wakes late skips the runs it missed, as a Ticker drops
		// ticks, and does less work for it; this shows whether a CPU figure is one of those.
		b.ReportMetric(float64(total)/float64(b.N)/window.Seconds(), "runs/s")
		b.ReportMetric(0, "ns/op")
	}
	for _, shards := range []int{2, 4096} {
		b.Run(fmt.Sprintf("impl=wheel/shards=%d", shards), func(b *testing.B) {
			run(b, func(f func()) func() {
				w, err := sw.New(sw.WithShards(shards))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := w.Every(time.Millisecond, f); err != nil {
					b.Fatal(err)
				}
				return func() { w.Stop() }
			})
		})
	}
	b.Run("impl=runtime", func(b *testing.B) {
		run(b, func(f func()) func() {
			t := time.NewTicker(time.Millisecond)
			return loopOn(t.C, f, func() {}, func() { t.Stop() })
		})
	})
	// The floor of any timer that sleeps until its next deadline on a runtime timer, as the
	// wheel's keeper does: one goroutine, one time.Timer re-armed for the next run's deadline
	// after each run. A Ticker is re-armed inside the runtime as it fires; a Reset from a
	// goroutine puts the timer back in a heap and wakes an idle thread to watch it.
	b.Run("impl=floor", func(b *testing.B) {
		run(b, func(f func()) func() {
			t := time.NewTimer(time.Millisecond)
			next := time.Now().Add(time.Millisecond)
			rearm := func() {
				next = next.Add(time.Millisecond)
				if now := time.Now(); next.Before(now) { // late: skip what was missed
					next = next.Add(now.Sub(next).Truncate(time.Millisecond) + time.Millisecond)
				}
				t.Reset(time.Until(next))
			}
			return loopOn(t.C, f, rearm, func() { t.Stop() })
		})
	})
}

// loopOn starts a goroutine that calls f and then rearm for each value from c, and returns what
// stops it: stopTimer, then the goroutine's exit.
func loopOn(c <-chan time.Time, f, rearm, stopTimer func()) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case <-c:
				f()
				rearm()
			case <-done:
				return
			}
		}
	}()
	return func() { stopTimer(); close(done); <-exited }
}

// cpuTime returns the CPU time (user and system) the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkNewStop: the cost of a Wheel's life without timers that fire: New, one timer an hour
// out, Stop (which returns that timer as dropped). With many shards it is dominated by the
// shards' rings (New) and by Stop's walk of every shard's wheel.
//
//	go test -run '^$' -bench BenchmarkNewStop -count 6 .
func BenchmarkNewStop(b *testing.B) {
	for _, shards := range []int{2, 4096} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			for it := 0; it < b.N; it++ {
				w, err := sw.New(sw.WithShards(shards))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := w.AfterFunc(time.Hour, func() {}); err != nil {
					b.Fatal(err)
				}
				if n := w.Stop(); n != 1 {
					b.Fatalf("Stop dropped %d timers, want 1", n)
				}
			}
		})
	}
}

// BenchmarkFloodAfterStops arms, from one goroutine, a million timers due within 100 ms, each
// with a closure of its own, right after a million others were armed an hour out and stopped,
// and reports the ms from the first arm to the last callback; the runtime beside it. The stopped
// timers leave the wheel's free stack spanning tens of megabytes, so each arm takes a cold entry:
// what the arm does about that (slab.touch) decides how long the flood takes to arm.
func BenchmarkFloodAfterStops(b *testing.B) {
	const n = 1_000_000
	for _, impl := range []string{"wheel", "runtime"} {
		b.Run("impl="+impl, func(b *testing.B) {
			var w *sw.Wheel
			if impl == "wheel" {
				var err error
				if w, err = sw.New(); err != nil {
					b.Fatal(err)
				}
				defer w.Stop()
			}
			afterFunc := func(d time.Duration, f func()) func() bool {
				if w == nil {
					return time.AfterFunc(d, f).Stop
				}
				t, err := w.AfterFunc(d, f)
				if err != nil {
					b.Fatal(err)
				}
				return t.Stop
			}
			var total time.Duration
			for it := range b.N {
				stops := make([]func() bool, n)
				for i := range stops {
					stops[i] = afterFunc(time.Hour, func() {})
				}
				for _, stop := range stops {
					stop()
				}
				stops = nil
				var left atomic.Int64
				left.Store(n)
				done := make(chan struct{})
				rng := rand.New(rand.NewPCG(uint64(it), 1))
				t0 := time.Now()
				for i := range n {
					afterFunc(time.Duration(rng.Int64N(int64(100*time.Millisecond))), func() {
						if left.Add(-1) == 0 {
							close(done)
						}
						_ = i // a closure of its own, as a callback that knows its request
					})
				}
				<-done
				total += time.Since(t0)
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "all-fired-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}
