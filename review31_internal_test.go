package shardwheel

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Review 31: Stats and limits accounting (shardwheel.go Stats, pending.go, histogram.go,
// expvar.go, and where the counters are bumped). Tests named TestReview31Fixed* fail on the code
// they were written against (4304c13); TestReview31Pin* are things checked that hold.

// r31Wait waits for cond, failing after a while.
func r31Wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(100 * time.Microsecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("timed out waiting: %s", what)
		}
	}
}

// r31Balance checks the books of a quiet wheel (API.md, Introspection).
func r31Balance(t *testing.T, w *Wheel) Stats {
	t.Helper()
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "%+v", st)
	require.Equal(t, st.Fired, st.Lateness.Count(), "%+v", st)
	require.Zero(t, st.Queued, "%+v", st)
	return st
}

// TestReview31FixedEveryEndOfTimeLeaksMaxPendingCredit: an Every whose run comes at the end of a
// manual clock's time ends its series there (every.go, endRun: "The series ends here, and its
// next run ... is taken back"). It takes back the next run's count in Scheduled, so Stats and
// Len say nothing is pending, but not the WithMaxPending credit that the series held since
// Every accepted it: endRun (every.go:106-116) calls dropFrom and s.scheduled.Dec but no
// s.returnCredit(). The credit is lost for the life of the wheel: with WithMaxPending(1) the
// wheel now refuses every timer while Len() == 0, against pending.go's "once the wheel is quiet,
// maxPending timers are always accepted" and API.md's "Past WithMaxPending: ErrTooManyTimers"
// (nothing is past it).
func TestReview31FixedEveryEndOfTimeLeaksMaxPendingCredit(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1), WithMaxPending(1))
	runs := 0
	_, err := w.Every(time.Hour, func() { runs++ })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64)
	require.Equal(t, 1, runs)
	require.Zero(t, w.Len(), "the series ended at the end of time")
	r31Balance(t, w)

	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err, "nothing is pending, yet WithMaxPending(1) refuses the only timer")
}

// TestReview31FixedLatenessStaleWithinBatch: API.md defines Stats.Lateness as "how late each
// callback started, against its deadline rounded up to the tick". runRefs (workers.go:200-206)
// reads the clock once for a whole batch or chunk and runFrom/runEntry observe every callback of
// it against that one reading (workers.go:254, 263), so a callback that starts after a slow
// callback of its batch is counted as starting when the batch began. Here two timers are due at
// 1 ms on a WithWorkers(0) manual wheel; whichever runs first moves the clock 100 ms on (the
// stand-in for a callback that takes 100 ms), so the second starts 100 ms after its deadline.
// Lateness counts both as on time (bucket 0). The README's Limits warn of exactly this delay ("A
// slow callback delays the callbacks of its own step (up to 256) that follow it"), which the
// histogram then never shows.
func TestReview31FixedLatenessStaleWithinBatch(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1))
	var first atomic.Bool
	var startedAt []int64
	f := func() {
		startedAt = append(startedAt, w.nanos())
		if first.CompareAndSwap(false, true) {
			clk.Advance(100 * time.Millisecond) // the clock moves while this callback runs
		}
	}
	for range 2 {
		_, err := w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	require.Len(t, startedAt, 2)
	require.Equal(t, int64(101*time.Millisecond), startedAt[1], "the second started 100 ms late")

	st := r31Balance(t, w)
	require.Equal(t, uint64(2), st.Fired)
	// 100 ms = 100000 µs, in [2^16, 2^17) µs: bucket 17.
	require.Equal(t, uint64(1), st.Lateness.Buckets[bucketOf(100*time.Millisecond)],
		"the second callback started 100 ms after its deadline; Lateness: %v", st.Lateness.Buckets)
}

// TestReview31FixedLatenessStaleWithinBatchSystem is the same on the system clock, with a callback
// that really sleeps: two timers fire in one advance step of the only worker; whichever runs
// first sleeps 60 ms, so the other starts at least 60 ms after its deadline. Lateness has no
// count of 32 ms or more (buckets from 16 up): both are counted at the step's one reading.
func TestReview31FixedLatenessStaleWithinBatchSystem(t *testing.T) {
	w, err := New(WithWorkers(1), WithShards(1), WithTick(time.Millisecond))
	require.NoError(t, err)
	defer w.Stop()

	// Hold the only worker, so that the two timers below are taken in one step once it is free.
	started, release := make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(0, func() { close(started); <-release })
	require.NoError(t, err)
	<-started
	var first atomic.Bool
	var ran atomic.Int32
	var mu sync.Mutex
	var starts []time.Time
	var deadlines [2]time.Time
	for i := range 2 {
		deadlines[i] = time.Now()
		_, err := w.AfterFunc(0, func() {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			if first.CompareAndSwap(false, true) {
				time.Sleep(60 * time.Millisecond)
			}
			ran.Add(1)
		})
		require.NoError(t, err)
	}
	close(release)
	r31Wait(t, "both callbacks ran", func() bool { return ran.Load() == 2 })
	mu.Lock()
	late := starts[1].Sub(deadlines[1])
	mu.Unlock()
	require.GreaterOrEqual(t, late, 60*time.Millisecond, "the second started after the first's sleep")

	st := w.Stats()
	require.Equal(t, uint64(3), st.Fired)
	require.Equal(t, st.Fired, st.Lateness.Count())
	var over32ms uint64
	for i := 16; i < histBuckets; i++ { // bucket 16 is [32.768, 65.536) ms
		over32ms += st.Lateness.Buckets[i]
	}
	require.Equal(t, uint64(1), over32ms,
		"a callback started %v after its deadline; Lateness: %v", late, st.Lateness.Buckets)
}

// TestReview31FixedQueuedDropsWhileChunkWaits: API.md: "Queued int // callbacks handed to the
// worker pool and not yet started". The pool counts a chunk as taken (wk.taken, runTask
// expiry.go:209, finishStop shardwheel.go:464) as soon as a worker receives it, before any of
// its callbacks starts, and Queued is pushed - taken (workers.go:103-115). A chunk carries up to 64 callbacks, run one after the
// other: while its first callback runs, the others are handed to the pool and not yet started,
// yet Queued reads 0. Here one Advance fires three timers to the only worker in one chunk; the
// first blocks. Fired is 1, Pending 2 (neither started nor stopped), Queued 0 instead of 2.
func TestReview31FixedQueuedDropsWhileChunkWaits(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(1), WithShards(1))
	started, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	var ran atomic.Int32
	for range 3 {
		_, err := w.AfterFunc(time.Millisecond, func() {
			if first.CompareAndSwap(false, true) {
				close(started)
				<-release
			}
			ran.Add(1)
		})
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	<-started
	st := w.Stats()
	require.Equal(t, uint64(1), st.Fired)
	require.Equal(t, 2, st.Pending, "two callbacks have not started")
	require.Zero(t, ran.Load())
	queued := st.Queued
	close(release)
	r31Wait(t, "all three ran", func() bool { return ran.Load() == 3 })
	r31Wait(t, "the books settle", func() bool { return w.Stats().Fired == 3 })
	r31Balance(t, w)
	require.Equal(t, 2, queued, "two callbacks handed to the worker pool had not started: %+v", st)
}

// TestReview31FixedWorkersCountOnSystemClockWithWorkers0: Stats.Workers is documented as "number of
// worker goroutines" (shardwheel.go:294), and with WithWorkers(0) on the system clock the wheel
// runs one goroutine, worker 0 of its pool (pool.init; README: "one with WithWorkers(0) on the
// system clock"), which keeps time and runs every callback. Stats reports w.opts.workers, 0
// (shardwheel.go:308).
// (Minor: a dashboard that reads Workers sees a wheel with no goroutine.)
func TestReview31FixedWorkersCountOnSystemClockWithWorkers0(t *testing.T) {
	w, err := New(WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	r31Wait(t, "the wheel's one goroutine runs", func() bool { return WorkerGoroutines(w) == 1 })
	require.Equal(t, WorkerGoroutines(w), w.Stats().Workers)
}

// TestReview31PinMaxPendingExactUnderChurn (pin): producers on every P arm timers that never fire
// and stop them, Reset them, arm and stop Every series, Keyed keys and deadline contexts, under
// WithMaxPending(limit). live counts what the test holds: it rises only after an arm returned
// (the timer is then pending) and falls just before its Stop, so it is never above what is
// pending: it must never pass limit. Once quiet, nothing is pending, and exactly limit arms are
// accepted again (no credit lost, none made), then one refused with ErrTooManyTimers.
func TestReview31PinMaxPendingExactUnderChurn(t *testing.T) {
	const limit = 50
	w, err := New(WithMaxPending(limit), WithShards(4), WithWorkers(2), WithRingSize(8))
	require.NoError(t, err)
	defer w.Stop()
	k := NewKeyed(w, func(int, int) { t.Error("a key an hour out fired") })
	var live, maxLive atomic.Int64
	note := func(d int64) {
		v := live.Add(d)
		for m := maxLive.Load(); v > m && !maxLive.CompareAndSwap(m, v); m = maxLive.Load() {
		}
	}
	iters := 3000
	if testing.Short() {
		iters = 500
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 31))
			var held []Timer
			var cancels []context.CancelFunc
			keys := map[int]bool{}
			for range iters {
				switch op := rng.IntN(10); {
				case op < 4:
					tm, err := w.AfterFunc(time.Hour, func() { t.Error("an hour-out timer fired") })
					if err == nil {
						note(1)
						held = append(held, tm)
					} else if !errors.Is(err, ErrTooManyTimers) {
						t.Error(err)
					}
				case op < 5:
					tm, err := w.Every(time.Hour, func() { t.Error("an hour-out series ran") })
					if err == nil {
						note(1)
						held = append(held, tm)
					}
				case op < 6:
					ctx, cancel := w.WithTimeout(context.Background(), time.Hour)
					_ = ctx
					cancels = append(cancels, cancel) // may be a std fallback: not counted
				case op < 7:
					key := g*1000 + rng.IntN(5)
					if !keys[key] {
						if k.Set(key, 1, time.Hour) == nil {
							note(1)
							keys[key] = true
						}
					} else {
						require.True(t, k.Move(key, time.Hour))
					}
				case op < 8 && len(held) > 0:
					held[rng.IntN(len(held))].Reset(2 * time.Hour)
				default:
					if len(keys) > 0 && rng.IntN(3) == 0 {
						for key := range keys {
							note(-1)
							require.True(t, k.Remove(key))
							delete(keys, key)
							break
						}
					} else if len(held) > 0 {
						j := rng.IntN(len(held))
						note(-1)
						require.True(t, held[j].Stop())
						held[j] = held[len(held)-1]
						held = held[:len(held)-1]
					} else if len(cancels) > 0 {
						cancels[len(cancels)-1]()
						cancels = cancels[:len(cancels)-1]
					}
				}
			}
			for _, tm := range held {
				note(-1)
				require.True(t, tm.Stop())
			}
			for key := range keys {
				note(-1)
				require.True(t, k.Remove(key))
			}
			for _, c := range cancels {
				c()
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, maxLive.Load(), int64(limit), "more than WithMaxPending pending at once")
	require.Zero(t, w.Len())
	st := r31Balance(t, w)
	require.Zero(t, st.Fired)

	var last []Timer
	for i := range limit {
		tm, err := w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err, "arm %d of %d on a quiet wheel", i+1, limit)
		last = append(last, tm)
	}
	_, err = w.AfterFunc(time.Hour, func() {})
	require.ErrorIs(t, err, ErrTooManyTimers)
	for _, tm := range last {
		require.True(t, tm.Stop())
	}
	require.Equal(t, 0, w.Stop())
}

// TestReview31PinBooksEveryKind (pin): every kind of timer end (fire, Timer.Stop, Reset, Every
// run and stop, a Keyed fire, replace and remove, a context deadline and cancel, a panicking
// callback, a callback that calls runtime.Goexit on a worker, one that stops its own Every)
// keeps the books: Scheduled == Fired + Stopped + Pending while the wheel runs and quiet,
// Lateness.Count() == Fired, Panics exact; then Wheel.Stop returns what was pending, Dropped is
// it, Pending is 0, the balance holds with Dropped, and WithMaxPending's credits all came back.
func TestReview31PinBooksEveryKind(t *testing.T) {
	for _, workers := range []int{0, 2} {
		t.Run(map[int]string{0: "workers=0", 2: "workers=2"}[workers], func(t *testing.T) {
			const limit = 40
			var panics atomic.Int64
			w, clk := newManualWheel(t, WithWorkers(workers), WithShards(3), WithMaxPending(limit),
				WithPanicHandler(func(any) { panics.Add(1) }))
			var ran atomic.Int64
			f := func() { ran.Add(1) }
			settle := func() {
				r31Wait(t, "callbacks handed to workers start", func() bool {
					st := w.Stats()
					return st.Queued == 0 && st.Scheduled == st.Fired+st.Stopped+uint64(st.Pending) &&
						st.Fired == st.Lateness.Count()
				})
			}

			var ts []Timer
			for i := range 6 {
				tm, err := w.AfterFunc(time.Duration(i)*time.Millisecond, f)
				require.NoError(t, err)
				ts = append(ts, tm)
			}
			require.True(t, ts[5].Stop())
			require.True(t, ts[4].Reset(10*time.Millisecond))
			_, err := w.AfterFunc(2*time.Millisecond, func() { panic("r31") })
			require.NoError(t, err)
			if workers > 0 {
				_, err = w.AfterFunc(2*time.Millisecond, func() { runtime.Goexit() })
				require.NoError(t, err)
			}
			var ev Timer
			evRuns := 0
			ev, err = w.Every(time.Millisecond, func() {
				evRuns++
				if evRuns == 3 {
					ev.Stop() // from its own run: no further run
				}
			})
			require.NoError(t, err)
			ev2, err := w.Every(3*time.Millisecond, f)
			require.NoError(t, err)
			k := NewKeyed(w, func(int, int) { ran.Add(1) })
			require.NoError(t, k.Set(1, 1, time.Millisecond))
			require.NoError(t, k.Set(2, 1, time.Hour))
			require.NoError(t, k.Set(2, 2, time.Hour)) // in place
			require.NoError(t, k.Set(3, 1, time.Hour))
			require.True(t, k.Remove(3))
			ctx1, cancel1 := w.WithTimeout(context.Background(), 2*time.Millisecond)
			defer cancel1()
			_, cancel2 := w.WithTimeout(context.Background(), time.Hour)
			cancel2()
			ctx3, cancel3 := w.WithTimeout(context.Background(), time.Hour) // dropped by Stop
			defer cancel3()

			for range 12 {
				clk.Advance(time.Millisecond)
				settle()
			}
			require.Error(t, ctx1.Err())
			require.Equal(t, 3, evRuns)
			require.Equal(t, int64(1), panics.Load())
			st := r31Balance(t, w)
			require.Equal(t, uint64(1), st.Panics)
			// Pending: ts none (fired, stopped, or reset to 10ms and fired), ev2's next run, key 2,
			// ctx3.
			require.Equal(t, 3, st.Pending, "%+v", st)
			require.True(t, k.Move(2, time.Hour))

			n := w.Stop()
			require.Equal(t, 3, n)
			_ = ctx3 // its timer was dropped: a runtime timer ends it now (see the report)
			st = w.Stats()
			require.Zero(t, st.Pending)
			require.Equal(t, uint64(n), st.Dropped)
			require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
			require.Equal(t, st.Fired, st.Lateness.Count())
			require.False(t, ev2.Stop())
			require.Equal(t, int64(limit), r31Credits(w), "every credit back after Stop")
		})
	}
}

// r31Credits sums WithMaxPending's free credits: the reserve and every shard's stock.
func r31Credits(w *Wheel) int64 {
	n := w.credit.Load()
	for _, s := range w.shards {
		n += s.credit.Load()
	}
	return n
}

// TestReview31PinCreditsBackAfterFiresAndStops (pin): after fires (one-shot, Every runs, Keyed,
// contexts), stops, panics and Goexits, the free credits plus what is pending is the bound,
// exactly; on a quiet wheel with nothing pending, every credit is free.
func TestReview31PinCreditsBackAfterFiresAndStops(t *testing.T) {
	const limit = 100
	w, clk := newManualWheel(t, WithWorkers(2), WithShards(4), WithMaxPending(limit),
		WithPanicHandler(func(any) {}))
	var ran atomic.Int64
	var evs []Timer
	for i := range 30 {
		switch i % 5 {
		case 0:
			_, err := w.AfterFunc(time.Duration(i)*100*time.Microsecond, func() { ran.Add(1) })
			require.NoError(t, err)
		case 1:
			_, err := w.AfterFunc(time.Millisecond, func() { ran.Add(1); panic("x") })
			require.NoError(t, err)
		case 2:
			_, err := w.AfterFunc(time.Millisecond, func() { ran.Add(1); runtime.Goexit() })
			require.NoError(t, err)
		case 3:
			ev, err := w.Every(700*time.Microsecond, func() { ran.Add(1) })
			require.NoError(t, err)
			evs = append(evs, ev)
		case 4:
			_, cancel := w.WithTimeout(context.Background(), time.Millisecond)
			defer cancel()
		}
	}
	for range 5 {
		clk.Advance(time.Millisecond)
		r31Wait(t, "the books settle", func() bool {
			st := w.Stats()
			return st.Queued == 0 && st.Scheduled == st.Fired+st.Stopped+uint64(st.Pending)
		})
		require.Equal(t, int64(limit), r31Credits(w)+int64(w.Len()), "%+v", w.Stats())
	}
	for _, ev := range evs {
		require.True(t, ev.Stop())
	}
	require.Zero(t, w.Len())
	require.Equal(t, int64(limit), r31Credits(w))
	r31Balance(t, w)
}

// TestReview31PinHeldBytesBackAfterTrim (pin): a burst grows HeldBytes by whole chunks; once its
// timers are over (fired or stopped) and the shard has been quiet for trimQuiet of the manual
// clock, an Advance trims and HeldBytes is back to 0; it never goes negative.
func TestReview31PinHeldBytesBackAfterTrim(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1))
	require.Zero(t, w.Stats().HeldBytes)
	var ts []Timer
	for i := range 3000 {
		tm, err := w.AfterFunc(time.Duration(i%2+1)*time.Millisecond, func() {})
		require.NoError(t, err)
		ts = append(ts, tm)
	}
	held := w.Stats().HeldBytes
	require.Equal(t, int64(3)*blockBytes, held, "3000 entries take three chunks (index 0 unused)")
	for _, tm := range ts[:1500] {
		tm.Stop()
	}
	clk.Advance(2 * time.Millisecond)
	require.Zero(t, w.Len())
	require.Equal(t, held, w.Stats().HeldBytes, "kept for reuse until a quiet spell")
	clk.Advance(trimQuiet + trimLook)
	clk.Advance(trimLook)
	require.Zero(t, w.Stats().HeldBytes)
	r31Balance(t, w)
}

// TestReview31PinLatenessNeverNegativeAndBuckets (pin): a callback that starts before its
// deadline's tick ends counts as on time (bucket 0, never a negative duration), one late by
// exactly a bucket bound lands in the bucket above it, and Quantile reports bucket bounds.
func TestReview31PinLatenessNeverNegativeAndBuckets(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1), WithTick(time.Millisecond))
	_, err := w.AfterFunc(300*time.Microsecond, func() {}) // due inside tick 0, runs at 1 ms
	require.NoError(t, err)
	clk.Advance(300 * time.Microsecond)
	_, err = w.AfterFunc(700*time.Microsecond, func() {}) // ceil: 1 ms; runs at 1 ms + 2 µs
	require.NoError(t, err)
	clk.Advance(702 * time.Microsecond)
	st := w.Stats()
	require.Equal(t, uint64(2), st.Fired)
	require.Equal(t, uint64(1), st.Lateness.Buckets[0], "%v", st.Lateness.Buckets)
	require.Equal(t, uint64(1), st.Lateness.Buckets[2], "2µs is in [2, 4) µs: %v", st.Lateness.Buckets)
	require.Equal(t, 4*time.Microsecond, st.Lateness.Quantile(1))
	require.Equal(t, time.Microsecond, st.Lateness.Quantile(0))
	require.Equal(t, time.Duration(0), Histogram{}.Quantile(0.5))
	require.Equal(t, time.Duration(0), st.Lateness.Quantile(math.NaN()))
}

// TestReview31PinStatsVarConcurrentAndAfterStop (pin): StatsVar's String is valid JSON of Stats,
// safe while the wheel runs and while it stops, and reads the final counters after Stop.
func TestReview31PinStatsVarConcurrentAndAfterStop(t *testing.T) {
	w, err := New(WithWorkers(2), WithShards(2), WithTick(100*time.Microsecond))
	require.NoError(t, err)
	v := w.StatsVar()
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				var st Stats
				if err := json.Unmarshal([]byte(v.String()), &st); err != nil {
					t.Error(err)
					return
				}
				if st.Pending < 0 || st.Queued < 0 || st.HeldBytes < 0 {
					t.Errorf("negative: %+v", st)
				}
			}
		}()
	}
	for i := range 2000 {
		tm, err := w.AfterFunc(time.Duration(i%20)*50*time.Microsecond, func() {})
		require.NoError(t, err)
		if i%3 == 0 {
			tm.Stop()
		}
	}
	n := w.Stop()
	close(done)
	wg.Wait()
	var st Stats
	require.NoError(t, json.Unmarshal([]byte(v.String()), &st))
	require.Equal(t, w.Stats(), st)
	require.Equal(t, uint64(n), st.Dropped)
	require.Zero(t, st.Pending)
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped)
	require.Equal(t, st.Fired, st.Lateness.Count())
}

// TestReview31FixedQuantileFloatRank: Histogram.Quantile documents "the smallest bucket bound b such
// that at least a fraction q of them are under b". With 100 durations, 55 under 1µs and 45 in
// [16, 32) µs, a fraction 0.55 is under 1µs, so Quantile(0.55) is 1µs. histogram.go:49 computes
// the rank as math.Ceil(q * float64(n)), and 0.55*100 is 55.00000000000001 in float64: the rank
// becomes 56 and Quantile answers 32µs. The same for q = 0.07, 0.14, 0.28, 0.56 at n = 100 (and
// their multiples), e.g. 7 of 100 under 1µs and Quantile(0.07) = 32µs.
func TestReview31FixedQuantileFloatRank(t *testing.T) {
	for _, c := range []struct {
		q     float64
		under uint64
	}{{0.55, 55}, {0.07, 7}, {0.14, 14}, {0.28, 28}, {0.56, 56}} {
		var h Histogram
		h.Buckets[0] = c.under
		h.Buckets[5] = 100 - c.under
		require.Equal(t, time.Microsecond, h.Quantile(c.q),
			"%d of 100 are under 1µs, a fraction %v: Quantile(%v)", c.under, c.q, c.q)
	}
}

// TestReview31PinBooksSystemStopRace (pin): on the system clock, producers arm one-shot timers
// (some panic, some call runtime.Goexit) and Every series, stop and reset some, while the wheel
// is stopped under them. After Stop: Pending is 0, Dropped is what Stop returned, Scheduled ==
// Fired + Stopped + Dropped, Lateness.Count() == Fired, and Fired is exactly the number of user
// callbacks that started; Panics is exactly the number that panicked.
func TestReview31PinBooksSystemStopRace(t *testing.T) {
	for round := range 3 {
		w, err := New(WithWorkers(2), WithShards(2), WithTick(50*time.Microsecond),
			WithRingSize(16), WithPanicHandler(func(any) {}))
		require.NoError(t, err)
		var starts, panicked atomic.Int64
		var wg sync.WaitGroup
		stopAt := make(chan struct{})
		for g := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(round), uint64(g)))
				var held []Timer
				for i := 0; ; i++ {
					if i == 300 && g == 0 {
						close(stopAt)
					}
					var tm Timer
					var err error
					d := time.Duration(rng.IntN(400)) * time.Microsecond
					switch rng.IntN(8) {
					case 0:
						tm, err = w.AfterFunc(d, func() { starts.Add(1); panicked.Add(1); panic("r31") })
					case 1:
						tm, err = w.AfterFunc(d, func() { starts.Add(1); runtime.Goexit() })
					case 2:
						tm, err = w.Every(d+time.Microsecond, func() { starts.Add(1) })
					default:
						tm, err = w.AfterFunc(d, func() { starts.Add(1) })
					}
					if errors.Is(err, ErrClosed) {
						for _, tm := range held {
							tm.Stop()
						}
						return
					}
					require.NoError(t, err)
					held = append(held, tm)
					if rng.IntN(3) == 0 {
						held[rng.IntN(len(held))].Stop()
					}
					if rng.IntN(4) == 0 {
						held[rng.IntN(len(held))].Reset(d)
					}
				}
			}()
		}
		<-stopAt
		n := w.Stop()
		wg.Wait()
		st := w.Stats()
		require.Zero(t, st.Pending)
		require.Zero(t, st.Queued)
		require.Equal(t, uint64(n), st.Dropped, "%+v", st)
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
		require.Equal(t, st.Fired, st.Lateness.Count())
		require.Equal(t, uint64(starts.Load()), st.Fired)
		require.Equal(t, uint64(panicked.Load()), st.Panics)
		require.Zero(t, w.Stop())
	}
}
