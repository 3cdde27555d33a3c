package shardwheel_test

import (
	"context"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestClockSystemNeverEarly runs several hundred timers with small delays on the system clock and
// requires that none starts before the moment of its AfterFunc (or Reset) call plus its delay, as
// the monotonic clock reads it. No upper bound is asserted: the machine is shared.
func TestClockSystemNeverEarly(t *testing.T) {
	for _, tick := range []time.Duration{time.Millisecond, 300 * time.Microsecond, 7 * time.Millisecond} {
		t.Run(tick.String(), func(t *testing.T) {
			w, err := sw.New(sw.WithTick(tick))
			require.NoError(t, err)
			defer w.Stop()
			const n = 400
			var early, ran atomic.Int64
			var wg sync.WaitGroup
			deadlines := make([]time.Time, n)
			rng := rand.New(rand.NewPCG(7, uint64(tick)))
			cb := func(a any) {
				now := time.Now()
				if now.Before(deadlines[a.(int)]) {
					early.Add(1)
					t.Errorf("timer %d started %v early", a.(int), deadlines[a.(int)].Sub(now))
				}
				ran.Add(1)
				wg.Done()
			}
			var resets []sw.Timer
			for i := 0; i < n; i++ {
				d := time.Duration(rng.Int64N(int64(5 * time.Millisecond)))
				switch i % 7 {
				case 0:
					d = 0
				case 1:
					d = tick
				case 2:
					d = tick + 1
				case 3:
					d = time.Microsecond
				}
				wg.Add(1)
				if i%5 == 4 {
					// Armed an hour out, then Reset to a small delay: Reset measures from its call.
					deadlines[i] = time.Now().Add(time.Hour)
					tm, err := w.AfterFuncArg(time.Hour, cb, i)
					require.NoError(t, err)
					resets = append(resets, tm)
					start := time.Now()
					deadlines[i] = start.Add(d)
					require.True(t, tm.Reset(d))
					continue
				}
				start := time.Now()
				deadlines[i] = start.Add(d)
				_, err := w.AfterFuncArg(d, cb, i)
				require.NoError(t, err)
			}
			wg.Wait()
			require.Zero(t, early.Load())
			require.Equal(t, int64(n), ran.Load())
			for _, tm := range resets {
				require.False(t, tm.Stop())
			}
		})
	}
}

// TestExpirySlowCallbackHoldsNothing: a callback that blocks its worker must not hold up the
// timers that come due after it, on its own shard or another: the worker let go of the keeper
// role before it advanced the shard, and the shard can be taken over while its callbacks run, so
// the other worker keeps time and fires them.
func TestExpirySlowCallbackHoldsNothing(t *testing.T) {
	w, err := sw.New(sw.WithWorkers(2), sw.WithShards(1))
	require.NoError(t, err)
	started, release := armStuck(t, w, 0, nil)
	<-started
	const n = 100
	var wg sync.WaitGroup
	wg.Add(n)
	for i := 0; i < n; i++ {
		_, err := w.AfterFunc(time.Duration(i%7)*time.Millisecond, wg.Done)
		require.NoError(t, err)
	}
	wg.Wait() // all ran while the first callback still blocks its worker
	close(release)
	require.Zero(t, w.Stop())
	requireBalance(t, w)
}

// TestExpiryFloodWithStopsAndStop: floods due at one instant on every shard while other
// goroutines stop half of them and Wheel.Stop comes in the middle: workers advance shards in
// bounded steps and hand shares of what fired to each other through the queue while Stops race
// both. Every timer is counted exactly once (ran, stopped, or returned by Stop), none runs twice,
// and none runs after Stop (called from outside the wheel) returned.
func TestExpiryFloodWithStopsAndStop(t *testing.T) {
	for _, procs := range []int{1, 2, 4} {
		func() {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			w, err := sw.New(sw.WithShards(3), sw.WithWorkers(3), sw.WithQueueSize(64))
			require.NoError(t, err)
			const per = 20_000
			runs := make([]atomic.Int32, 3*per)
			var stopped, scheduled atomic.Int64
			var after atomic.Bool
			var late atomic.Int64
			f := func(a any) {
				if after.Load() {
					late.Add(1)
				}
				runs[a.(int)].Add(1)
			}
			due := 20 * time.Millisecond
			var wg sync.WaitGroup
			for g := 0; g < 3; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ts := make([]sw.Timer, 0, per)
					for i := 0; i < per; i++ {
						tm, err := w.AfterFuncArg(due, f, g*per+i)
						if err != nil {
							break // ErrClosed: Stop came first
						}
						scheduled.Add(1)
						ts = append(ts, tm)
					}
					for i := 0; i < len(ts); i += 2 {
						if ts[i].Stop() {
							stopped.Add(1)
						}
					}
				}()
			}
			time.Sleep(due + time.Duration(procs)*time.Millisecond)
			dropped := w.Stop()
			after.Store(true)
			wg.Wait()
			var ran int64
			for i := range runs {
				c := runs[i].Load()
				require.LessOrEqual(t, c, int32(1), "timer %d ran %d times", i, c)
				ran += int64(c)
			}
			require.Zero(t, late.Load(), "callbacks ran after Stop returned")
			require.Equal(t, scheduled.Load(), ran+stopped.Load()+int64(dropped),
				"procs %d: scheduled %d = ran %d + stopped %d + dropped %d", procs, scheduled.Load(), ran, stopped.Load(), dropped)
			requireBalance(t, w)
		}()
	}
}

// TestScaleFlood fires 100k timers (1M with SHARDWHEEL_SCALE=1M and without -short) through the
// worker pool, with callbacks that spin briefly, and requires that the live goroutines never
// exceed the test's baseline plus one watchdog goroutine (expiry.go) plus the workers: a flood
// runs on the pool, never on a goroutine per timer. Every timer fires once and none early. The
// same flood on time.AfterFunc (a goroutine per expiry) is run beside it; the time, peak
// goroutines and peak heap of both are logged, not asserted.
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

// TestSynctestBubble runs a Wheel on its default (system) clock inside a testing/synctest bubble:
// its workers (one of which keeps time) sleep on the bubble's fake time, so timers, deadlines and
// Every fire exactly as fake time passes, never early, and synctest.Wait returns once the wheel
// is idle.
func TestSynctestBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := sw.New()
		require.NoError(t, err)
		defer w.Stop()
		start := time.Now()

		var fired atomic.Int64
		var firedAt atomic.Int64 // fake nanoseconds since start
		_, err = w.AfterFunc(10*time.Second, func() {
			firedAt.Store(int64(time.Since(start)))
			fired.Add(1)
		})
		require.NoError(t, err)
		stopped, err := w.AfterFunc(20*time.Second, func() { t.Error("stopped timer fired") })
		require.NoError(t, err)

		ctx, cancel := w.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		dl, ok := ctx.Deadline()
		require.True(t, ok)
		require.Equal(t, start.Add(15*time.Second), dl)

		var ticks atomic.Int64
		every, err := w.Every(time.Second, func() { ticks.Add(1) })
		require.NoError(t, err)

		synctest.Wait() // the wheel is idle: nothing is due yet
		require.Zero(t, fired.Load())
		require.Zero(t, ticks.Load())

		time.Sleep(10*time.Second - time.Nanosecond)
		synctest.Wait()
		require.Zero(t, fired.Load(), "never early")
		require.EqualValues(t, 9, ticks.Load())

		time.Sleep(time.Nanosecond)
		synctest.Wait()
		require.EqualValues(t, 1, fired.Load())
		require.GreaterOrEqual(t, firedAt.Load(), int64(10*time.Second))
		require.NoError(t, ctx.Err())

		time.Sleep(5 * time.Second)
		synctest.Wait()
		select {
		case <-ctx.Done():
		default:
			t.Fatal("deadline passed in fake time, context not done")
		}
		require.Equal(t, context.DeadlineExceeded, ctx.Err())
		require.EqualValues(t, 15, ticks.Load())

		require.True(t, every.Stop())
		require.True(t, stopped.Stop())
		time.Sleep(time.Minute)
		synctest.Wait()
		require.EqualValues(t, 15, ticks.Load())
		require.Equal(t, 0, w.Len())
		require.Equal(t, 0, w.Stop())
	})
}

// TestSynctestKeyed shows idle timeouts in a bubble: a key kept alive by Move does not fire; one
// left alone fires at its deadline in fake time.
func TestSynctestKeyed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := sw.New()
		require.NoError(t, err)
		defer w.Stop()
		closed := make(chan string, 2)
		k := sw.NewKeyed(w, func(key string, _ int) { closed <- key })
		require.NoError(t, k.Set("busy", 1, 30*time.Second))
		require.NoError(t, k.Set("idle", 2, 30*time.Second))
		for range 5 {
			time.Sleep(20 * time.Second)
			require.True(t, k.Move("busy", 30*time.Second))
		}
		synctest.Wait()
		require.Equal(t, "idle", <-closed)
		require.Equal(t, 1, k.Len())
		time.Sleep(30 * time.Second)
		synctest.Wait()
		require.Equal(t, "busy", <-closed)
		require.Equal(t, 0, k.Len())
	})
}

// TestSynctestDueNowWhileCallbackBlocks: while a callback blocks the worker that was keeping time
// (it let go of the role without waking another worker, expecting to be done within the tick), a
// timer armed with d = 0 runs at once on the other worker, before fake time moves, not at the
// watchdog a tick later: the producer signals and the signal wakes an idle worker to keep time.
func TestSynctestDueNowWhileCallbackBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := sw.New(sw.WithWorkers(2))
		require.NoError(t, err)
		defer w.Stop()
		entered, release := armStuck(t, w, time.Second, nil)
		time.Sleep(time.Second)
		<-entered
		synctest.Wait()
		start := time.Now()
		var fired atomic.Int32
		_, err = w.AfterFunc(0, func() { fired.Add(1) })
		require.NoError(t, err)
		synctest.Wait()
		got := fired.Load()
		close(release)
		require.EqualValues(t, 1, got, "the d = 0 timer waited while a callback blocked a worker")
		require.Zero(t, time.Since(start), "fake time moved before it ran")
	})
}
