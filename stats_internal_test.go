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
	"go.uber.org/goleak"
)

// TestMutation36LatenessAgainstTickRoundedDeadline: Stats.Lateness counts "how late each callback
// started, against its deadline rounded up to the tick" (API.md). A timer 300µs out on a 1ms tick
// that starts at 1ms started on time by that measure: its lateness is under 1µs (bucket 0), not
// 700µs. Kills: workers.go, lateness measured against the raw deadline.
func TestMutation36LatenessAgainstTickRoundedDeadline(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := newManualWheel(t, WithShards(1), WithWorkers(0), WithTick(time.Millisecond))
	ran := 0
	_, err := w.AfterFunc(300*time.Microsecond, func() { ran++ })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, ran)
	st := w.Stats()
	require.Equal(t, uint64(1), st.Lateness.Count())
	require.Equal(t, uint64(1), st.Lateness.Buckets[0],
		"a callback that started at its deadline rounded up to the tick was counted late: %v", st.Lateness.Buckets)
	require.LessOrEqual(t, st.Lateness.Quantile(1), time.Microsecond)
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

// TestReview33FixedLatenessReadOncePerBatch: Stats.Lateness is documented as "how late each
// callback started, against its deadline rounded up to the tick" (API.md, Stats' doc). runRefs
// (workers.go:200-207) reads the clock once for a whole batch, before its first callback, so a
// callback that starts after a slow one of its batch is counted as on time. Here the first of two
// callbacks due at 1ms takes a second (it moves the manual clock, as a slow callback would on the
// system clock); the second starts 1s late and Lateness says nobody was later than 1µs. This
// is the head-of-line delay that README's Limits ("a slow callback delays the callbacks of its
// own step (up to 256) that follow it") warns about, and Lateness is the metric meant to show
// it.
func TestReview33FixedLatenessReadOncePerBatch(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1))
	var startedAt []time.Duration
	for i := 0; i < 2; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			startedAt = append(startedAt, clk.Now().Sub(time.Unix(0, 0)))
			if len(startedAt) == 1 {
				clk.Advance(time.Second) // the first to start takes a second
			}
		})
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	require.Equal(t, []time.Duration{time.Millisecond, time.Second + time.Millisecond}, startedAt)
	st := balance33(t, w)
	require.GreaterOrEqual(t, st.Lateness.Quantile(1), time.Second/2,
		"the second callback started 1s after its deadline; Lateness buckets: %v", st.Lateness.Buckets)
}

// TestReview33FixedQueuedCountsOnlyUntaken: API.md defines Stats.Queued as "callbacks handed to the
// worker pool and not yet started". pool.totals (workers.go:103-117) computes it as pushed -
// taken, and a worker counts a whole chunk as taken when it takes it from the queue
// (runTask, expiry.go:209), before it starts the chunk's first callback. With one worker and
// four callbacks due together (one chunk), while the first blocks the three others have not
// started, Len counts them pending ("a timer whose callback waits in the worker queue is still
// pending"), and Queued says 0.
func TestReview33FixedQueuedCountsOnlyUntaken(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(1), WithShards(1))
	entered, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	started := 0
	for i := 0; i < 4; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			mu.Lock()
			started++
			first := started == 1
			mu.Unlock()
			if first {
				close(entered)
				<-release
			}
		})
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	wait26(t, entered, "the first callback never started")
	st := w.Stats()
	close(release)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return started == 4 }, 5*time.Second, time.Millisecond)
	require.Equal(t, uint64(1), st.Fired)
	require.Equal(t, 3, st.Pending, "three callbacks handed to the pool have not started")
	require.Equal(t, 3, st.Queued, "Stats.Queued: callbacks handed to the worker pool and not yet started")
}

// TestReview33FixedStatsWorkersWithZeroWorkers (minor): Stats.Workers is "number of worker
// goroutines", and New's doc says it starts "its workers (one with WithWorkers(0) on the system
// clock, which runs the callbacks...)". Stats reports w.opts.workers (shardwheel.go:308), 0,
// while the wheel runs one worker goroutine (pool.init, workers.go:66-69); so does the prom
// collector's shardwheel_workers gauge.
func TestReview33FixedStatsWorkersWithZeroWorkers(t *testing.T) {
	w, err := New(WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	require.Len(t, w.pool.done, 1, "one worker goroutine on the system clock")
	require.Equal(t, 1, w.Stats().Workers, "Stats.Workers: number of worker goroutines")
}

// TestReview34PinLatenessStrideBound (review 34 reported it as a bug; it is the documented bound
// of lateClock's stride): Stats.Lateness counts "how late each callback started", read "as
// callbacks start" so that the callbacks behind a slow one in a batch show how late they were.
// After a flood of quick callbacks the stride is 16 (lateClock), and up to 15 callbacks after a
// slow one share the reading taken before it started. Here 31 callbacks start at least 30 ms
// after their deadline, and all but those 15 at most are counted 16 ms late or more.
// The stride the slot's last batch ended with is set by hand to what a flood of quick callbacks
// leaves (lateStride; reached by runFrom without the race detector, whose overhead keeps each
// callback above lateQuick): without -race, 64 real timers on one worker show the same, 17 of 32.
func TestReview34PinLatenessStrideBound(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, err := New(WithShards(1), WithWorkers(1))
	require.NoError(t, err)
	defer w.Stop()
	s := w.shards[0]
	const n = 32
	var k atomic.Int32
	s.mu.Lock() // the keeper cannot fire them: this test does, as an advance step would
	for i := 0; i < n; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			if k.Add(1) == 1 {
				time.Sleep(30 * time.Millisecond) // the slow one, first of its batch
			}
		})
		require.NoError(t, err)
	}
	time.Sleep(2 * time.Millisecond)
	s.advanceLocked(w.nanos(), 0)
	refs := append([]ref(nil), s.fired...)
	clear(s.fired)
	s.fired = s.fired[:0]
	s.mu.Unlock()
	require.Len(t, refs, n)

	other := w.pool.advancerSlot() // used by no goroutine on the system clock (dispatch is manual's)
	other.stride = lateStride
	base := w.Stats().Lateness
	w.runBatch(refs, other)
	late := w.Stats().Lateness
	var slow uint64 // callbacks counted at least 16.384 ms late (buckets 15 and up)
	for i := 15; i < len(late.Buckets); i++ {
		slow += late.Buckets[i] - base.Buckets[i]
	}
	require.Equal(t, int32(n), k.Load())
	require.GreaterOrEqual(t, slow, uint64(n-1-(lateStride-1)),
		"callbacks that started >= 30 ms after their deadline, counted as >= 16 ms late")
}
