package shardwheel

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkFloodAtCascade is BenchmarkFirePhase's flood (a million callbacks armed from two
// goroutines, all due at one instant T about 1.5 s ahead) with T placed lead ticks after the
// start of the level-1 bucket that holds it. The wheel cascades that bucket into level 0 at its
// start, which takes about 20 ms for a million entries on one core: with T that close, the
// cascade is still running when T comes. It reports first-ms, T to the first callback, and
// fire-ms, T to the last.
//
//	go test -run '^$' -bench BenchmarkFloodAtCascade -benchtime 3x -count 3 .
func BenchmarkFloodAtCascade(b *testing.B) {
	const n = 1_024_000
	for _, procs := range []int{1, 2} {
		for _, lead := range []int64{2, 8, 40} {
			b.Run(fmt.Sprintf("procs=%d/lead=%d", procs, lead), func(b *testing.B) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				var first, fire time.Duration
				for it := 0; it < b.N; it++ {
					f, l := floodAtCascade(b, n, lead)
					first += f
					fire += l
				}
				b.ReportMetric(float64(first.Microseconds())/1e3/float64(b.N), "first-ms")
				b.ReportMetric(float64(fire.Microseconds())/1e3/float64(b.N), "fire-ms")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// floodAtCascade runs one flood and returns how long after T its first and last callbacks ran.
func floodAtCascade(b *testing.B, n int, lead int64) (first, last time.Duration) {
	w, err := New()
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	tick := w.tick
	_, t0 := floodMoment(w, 1, lead)
	// Each callback counts down its stripe of floodStripe timers, and the last of a stripe the
	// stripes (as BenchmarkFirePhase's do): one counter for all would measure its own cache
	// line moving between the cores. Only the stripe's first callback looks at the clock.
	stripes := make([]floodStripe, n/floodStripeLen)
	for i := range stripes {
		stripes[i].left.Store(floodStripeLen)
	}
	var left atomic.Int64
	left.Store(int64(len(stripes)))
	var firstAt, lastAt atomic.Int64
	done := make(chan struct{})
	fn := func(a any) {
		st := a.(*floodStripe)
		v := st.left.Add(-1)
		if v == floodStripeLen-1 && firstAt.Load() == 0 {
			firstAt.CompareAndSwap(0, time.Now().UnixNano())
		}
		if v == 0 && left.Add(-1) == 0 {
			lastAt.Store(time.Now().UnixNano())
			close(done)
		}
	}
	armFromTwo(n, func(i int) {
		if _, err := w.AfterFuncArg(time.Until(t0), fn, &stripes[i/floodStripeLen]); err != nil {
			panic(err)
		}
	})
	if time.Now().After(t0.Add(-time.Duration(lead*tick) - 50*time.Millisecond)) {
		b.Fatalf("arming and a GC ran too close to the cascade")
	}
	<-done
	return time.Duration(firstAt.Load() - t0.UnixNano()), time.Duration(lastAt.Load() - t0.UnixNano())
}

// floodMoment is when a flood on w falls due: lead ticks after the start of the first bucket of
// level lv at least 1.5 s ahead of w's clock, as ticks since w.base and as a time.
func floodMoment(w *Wheel, lv int, lead int64) (at int64, t0 time.Time) {
	span := int64(1) << (lv * slotBits)
	at = (w.nanos()+int64(1500*time.Millisecond))/w.tick/span*span + span + lead
	return at, w.base.Add(time.Duration(at * w.tick))
}

// armFromTwo calls arm(i) for i in [0, n) from two goroutines, each taking one half, as two
// cores of producers would, and runs a GC after both are done so that the garbage the arming
// left does not collect in the middle of the flood.
func armFromTwo(n int, arm func(i int)) {
	var wg sync.WaitGroup
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g * n / 2; i < (g+1)*n/2; i++ {
				arm(i)
			}
		}()
	}
	wg.Wait()
	runtime.GC()
}

// floodStripe is the state a run of floodStripeLen consecutive timers shares, on its own line.
type floodStripe struct {
	left atomic.Int64
	_    [cacheLineSize - 8]byte
}

const floodStripeLen = 1024

// BenchmarkShortTimerBehindCascade measures how late a short timer runs while its shard
// cascades a big bucket: a million timers armed about 1.5 s ahead, all due lead ticks after the
// start of the bucket of level lv that holds them (so the cascade of that bucket, at its start,
// has time to finish before they fire), and meanwhile "canaries", from 3 ms before that start to
// 30 ms after it, one every 100 µs (or as often as the sleep allows), each armed with a 2 ms
// delay, as an RPC timeout armed while the flood waits would be. The wheel takes buckets in the
// order of their start and a cascade runs in budgeted steps, so a canary due in a bucket after
// the cascading one would wait for the rest of the cascade if nothing let it go first. It
// reports the canaries' lateness against their exact deadlines (p50 and max, in ms) beside the
// same canaries on time.AfterFunc with the same flood armed there; both floods fire after the
// canaries' window.
//
// Two shapes: level=1 is a 64-tick bucket at the default 1 ms tick, due 40 ticks after its
// start, whose cascade (about 20 ms) ends within the bucket's first 64 ticks, so the canaries
// armed meanwhile land in level 0; level=2 is a 4096-tick bucket at a 100 µs tick, due 1000
// ticks (100 ms) after its start, whose cascade runs on past the first 64 ticks (6.4 ms), so
// the canaries armed after that land in level 1.
//
//	go test -run '^$' -bench BenchmarkShortTimerBehindCascade -benchtime 2x -count 3 .
func BenchmarkShortTimerBehindCascade(b *testing.B) {
	const n = 1_024_000
	shapes := []struct {
		lv   int
		tick time.Duration
		lead int64
	}{{1, time.Millisecond, 40}, {2, 100 * time.Microsecond, 1000}}
	for _, sh := range shapes {
		for _, procs := range []int{1, 2} {
			for _, impl := range []string{"wheel", "runtime"} {
				b.Run(fmt.Sprintf("level=%d/impl=%s/procs=%d", sh.lv, impl, procs), func(b *testing.B) {
					defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
					var p50, worst float64
					for it := 0; it < b.N; it++ {
						m, x := canariesBehindCascade(b, n, impl == "wheel", sh.lv, sh.tick, sh.lead)
						p50 += m
						worst = max(worst, x)
					}
					b.ReportMetric(p50/float64(b.N), "canary-p50-ms")
					b.ReportMetric(worst, "canary-max-ms")
					b.ReportMetric(0, "ns/op")
				})
			}
		}
	}
}

// canariesBehindCascade runs one flood with its canaries (see BenchmarkShortTimerBehindCascade)
// and returns the canaries' median and worst lateness in ms. The flood is armed on the wheel (a
// wheel with the given tick) or on the runtime's timers, and so are the canaries; it is due lead
// ticks after the start of its bucket of level lv.
func canariesBehindCascade(b *testing.B, n int, onWheel bool, lv int, tick time.Duration, lead int64) (p50, worst float64) {
	w, err := New(WithTick(tick))
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	at, t0 := floodMoment(w, lv, lead)
	start := w.base.Add(time.Duration((at - lead) * w.tick)) // the cascading bucket's start
	var left atomic.Int64
	left.Store(int64(n))
	done := make(chan struct{})
	count := func(any) {
		if left.Add(-1) == 0 {
			close(done)
		}
	}
	armFromTwo(n, func(int) {
		if !onWheel {
			time.AfterFunc(time.Until(t0), func() { count(nil) })
		} else if _, err := w.AfterFuncArg(time.Until(t0), count, nil); err != nil {
			panic(err)
		}
	})
	if time.Now().After(start.Add(-10 * time.Millisecond)) {
		b.Fatalf("arming and a GC ran too close to the cascade")
	}
	const delay = 2 * time.Millisecond
	var (
		mu   sync.Mutex
		late []float64
		cwg  sync.WaitGroup
	)
	time.Sleep(time.Until(start.Add(-3 * time.Millisecond)))
	// At least one canary, should the sleep overrun the window (a loaded machine).
	for i := 0; i == 0 || time.Now().Before(start.Add(30*time.Millisecond)); i++ {
		due := time.Now().Add(delay)
		cwg.Add(1)
		f := func() {
			l := float64(time.Since(due).Nanoseconds()) / 1e6
			mu.Lock()
			late = append(late, l)
			mu.Unlock()
			cwg.Done()
		}
		if !onWheel {
			time.AfterFunc(delay, f)
		} else if _, err := w.AfterFunc(delay, f); err != nil {
			b.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond)
	}
	cwg.Wait()
	<-done
	slices.Sort(late)
	return late[len(late)/2], late[len(late)-1]
}
