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

// TestStatsLatenessAgainstTickRoundedDeadline: Stats.Lateness counts how late each callback
// started "against its deadline rounded up to the tick" (API.md), in the Histogram's buckets
// ([2^(i-1), 2^i) µs). A timer 300µs out on a 1ms tick that starts at 1ms is on time by that
// measure: under 1µs (bucket 0), not 700µs late. A timer due at 2ms that starts at 1001ms is
// 999ms late, in [2^19, 2^20) µs (bucket 20), and the quantiles report the bucket bounds.
func TestStatsLatenessAgainstTickRoundedDeadline(t *testing.T) {
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

	_, err = w.AfterFunc(time.Millisecond, func() { ran++ }) // due at 2ms, starts at 1001ms
	require.NoError(t, err)
	clk.Advance(time.Second)
	require.Equal(t, 2, ran)
	h := w.Stats().Lateness
	require.Equal(t, uint64(1), h.Buckets[20], "999ms late is in [2^19, 2^20) µs: %v", h.Buckets)
	require.Equal(t, uint64(2), h.Count())
	require.Equal(t, BucketBound(20), h.Quantile(1))
	require.Equal(t, time.Microsecond, h.Quantile(0.5))
	requireQuietBooks(t, w)
}

// TestStatsLatenessReadAsEachCallbackStarts: Lateness counts how late each callback started, so a
// callback that waits behind a slow one of its own batch shows the wait. Two timers are due at
// 1ms on a WithWorkers(0) manual wheel; whichever runs first moves the clock 100ms on (as a
// callback that takes 100ms would), so the second starts 100ms after its deadline and is counted
// in the bucket of 100ms ([2^16, 2^17) µs), not as on time. This is the head-of-line delay that
// README's Limits warn of ("A slow callback delays the callbacks of its own step (up to 256)
// that follow it"); Lateness is the metric that shows it.
func TestStatsLatenessReadAsEachCallbackStarts(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1))
	var startedAt []time.Duration
	var wheelAt []int64
	for range 2 {
		_, err := w.AfterFunc(time.Millisecond, func() {
			startedAt = append(startedAt, clk.Now().Sub(time.Unix(0, 0)))
			wheelAt = append(wheelAt, w.nanos())
			if len(startedAt) == 1 {
				clk.Advance(100 * time.Millisecond) // the clock moves while this callback runs
			}
		})
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	require.Equal(t, []time.Duration{time.Millisecond, 101 * time.Millisecond}, startedAt)
	require.Equal(t, int64(101*time.Millisecond), wheelAt[1], "the second started 100ms late on the wheel's time too")

	st := requireQuietBooks(t, w)
	require.Equal(t, uint64(2), st.Fired)
	require.Equal(t, uint64(1), st.Lateness.Buckets[bucketOf(100*time.Millisecond)],
		"the second callback started 100ms after its deadline; Lateness: %v", st.Lateness.Buckets)
	require.GreaterOrEqual(t, st.Lateness.Quantile(1), 50*time.Millisecond,
		"the second callback started 100ms after its deadline; Lateness: %v", st.Lateness.Buckets)
}

// TestStatsLatenessReadAsEachCallbackStartsSystemClock is the same on the system clock, with a
// callback that really sleeps: two timers fire in one advance step of the only worker; whichever
// runs first sleeps 60ms, so the other starts at least 60ms after its deadline, and exactly one
// start is counted 32ms late or more (buckets from 16 up). The worker's previous batch was a
// single slow callback, so this batch reads the clock before each start (lateClock's stride 1).
func TestStatsLatenessReadAsEachCallbackStartsSystemClock(t *testing.T) {
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
	waitUntil(t, "both callbacks ran", func() bool { return ran.Load() == 2 })
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

// TestStatsQueuedCountsCallbacksBehindRunningOne: Stats.Queued counts callbacks due and taken
// from the wheel but not started, "waiting for a worker, or behind a running callback on the
// goroutine that holds them" (API.md). One Advance fires four timers to the only worker in one
// task; the first blocks. The three behind it have not started: Fired is 1, Pending 3 (a callback
// that has not started is still pending) and Queued 3. Once they have run, Queued is 0 again.
func TestStatsQueuedCountsCallbacksBehindRunningOne(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(1), WithShards(1))
	started, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	var ran atomic.Int32
	const n = 4
	for range n {
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
	requireWithin(t, started, "the first callback never started")
	st, ranBefore := w.Stats(), ran.Load()
	close(release) // before any assertion: a failed one must not leave the worker blocked
	waitUntil(t, "all four ran", func() bool { return ran.Load() == n })
	waitUntil(t, "the books settle", func() bool { return w.Stats().Fired == n })
	requireQuietBooks(t, w)
	require.Zero(t, ranBefore, "no callback had finished while the first blocked")
	require.Equal(t, uint64(1), st.Fired)
	require.Equal(t, n-1, st.Pending, "three callbacks have not started: %+v", st)
	require.Equal(t, n-1, st.Queued, "three callbacks behind the running one had not started: %+v", st)
}

// TestStatsQueuedCallbackCanBeStopped: Timer.Stop of a timer whose callback is due and waits in
// the worker queue (the only worker is blocked) reports true, and the callback never runs: a
// callback that has not started can still be stopped. Until the Stop, Queued counts it and Len
// still counts it pending; from the Stop on, neither does (it will never start), although the
// worker has not come to it yet; the Stop is counted in Stopped.
func TestStatsQueuedCallbackCanBeStopped(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(1), WithShards(1), WithQueueSize(64))
	in, release := make(chan struct{}), make(chan struct{})
	_, err := w.AfterFunc(time.Millisecond, func() { close(in); <-release })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	<-in
	var ran atomic.Int32
	tm, err := w.AfterFunc(time.Millisecond, func() { ran.Add(1) })
	require.NoError(t, err)
	clk.Advance(time.Millisecond) // dispatched: in the queue behind the blocked worker
	queued, pending := w.Stats().Queued, w.Len()
	stopped, again := tm.Stop(), tm.Stop()
	after := w.Stats()
	close(release) // before any assertion: a failed one must not leave the worker blocked
	require.Equal(t, 1, queued)
	require.Equal(t, 1, pending, "a queued callback is pending until it starts")
	require.True(t, stopped, "Stop of a queued callback prevents it")
	require.False(t, again)
	require.Zero(t, after.Queued, "a stopped callback no longer waits: %+v", after)
	require.Zero(t, after.Pending, "nor is it pending: %+v", after)
	require.Zero(t, w.Stop())
	require.Zero(t, ran.Load())
	st := requireQuietBooks(t, w)
	require.Equal(t, uint64(1), st.Stopped)
	require.Equal(t, 0, st.Queued)
}

// TestStatsWorkersCountsGoroutineOfWorkers0: Stats.Workers is the number of worker goroutines,
// and with WithWorkers(0) on the system clock the wheel runs one, which keeps time and runs every
// callback (New's doc). Stats says 1, not the option's 0: a dashboard that reads Workers must not
// see a running wheel with no goroutine.
func TestStatsWorkersCountsGoroutineOfWorkers0(t *testing.T) {
	w, err := New(WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	require.Len(t, w.pool.done, 1, "one worker goroutine on the system clock")
	waitUntil(t, "the wheel's one goroutine runs", func() bool { return WorkerGoroutines(w) == 1 })
	require.Equal(t, WorkerGoroutines(w), w.Stats().Workers)
	require.Equal(t, 1, w.Stats().Workers, "Stats.Workers: number of worker goroutines")
}

// TestStatsBooksBalanceForEveryKindOfEnd: every way a timer can end (fire, Timer.Stop, Reset,
// Every run and stop, a Keyed fire, replace and remove, a context deadline and cancel, a
// panicking callback, a callback that calls runtime.Goexit on a worker, one that stops its own
// Every) keeps the books: Scheduled == Fired + Stopped + Pending while the wheel runs and once it
// is quiet, Lateness.Count() == Fired, Panics exact; then Wheel.Stop returns what was pending,
// Dropped is it, Pending is 0, the balance holds with Dropped, and every WithMaxPending credit
// has come back.
func TestStatsBooksBalanceForEveryKindOfEnd(t *testing.T) {
	for _, workers := range []int{0, 2} {
		t.Run(map[int]string{0: "workers=0", 2: "workers=2"}[workers], func(t *testing.T) {
			const limit = 40
			var panics atomic.Int64
			w, clk := newManualWheel(t, WithWorkers(workers), WithShards(3), WithMaxPending(limit),
				WithPanicHandler(func(any) { panics.Add(1) }))
			var ran atomic.Int64
			f := func() { ran.Add(1) }
			settle := func() {
				waitUntil(t, "every due callback starts", func() bool {
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
			_, err := w.AfterFunc(2*time.Millisecond, func() { panic("a panicking callback") })
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
			st := requireQuietBooks(t, w)
			require.Equal(t, uint64(1), st.Panics)
			// Pending: ts none (fired, stopped, or reset to 10ms and fired), ev2's next run, key 2,
			// ctx3.
			require.Equal(t, 3, st.Pending, "%+v", st)
			require.True(t, k.Move(2, time.Hour))

			n := w.Stop()
			require.Equal(t, 3, n)
			_ = ctx3 // its timer was dropped: a runtime timer ends it at its deadline (Wheel.Stop's doc)
			st = w.Stats()
			require.Zero(t, st.Pending)
			require.Equal(t, uint64(n), st.Dropped)
			require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
			require.Equal(t, st.Fired, st.Lateness.Count())
			require.False(t, ev2.Stop())
			require.Equal(t, int64(limit), freeCredits(w), "every credit back after Stop")
		})
	}
}

// TestStatsLatenessNeverNegativeAndBucketBounds: a callback that starts before its deadline's
// tick ends (deadlines are exact, lateness is measured against the tick) counts as on time
// (bucket 0, never a negative duration), one late by exactly a bucket bound lands in the bucket
// above it, and Quantile reports bucket bounds (0 for an empty Histogram or a NaN q).
func TestStatsLatenessNeverNegativeAndBucketBounds(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1), WithTick(time.Millisecond))
	_, err := w.AfterFunc(300*time.Microsecond, func() {}) // runs at 300µs, before its tick ends at 1ms
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

// TestStatsVarConcurrentAndAfterStop: StatsVar's String is valid JSON of Stats, with no negative
// count, safe to read while the wheel runs and while it stops, and reads the final counters
// after Stop.
func TestStatsVarConcurrentAndAfterStop(t *testing.T) {
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

// TestHistogramQuantileExactRank: Quantile is "the smallest bucket bound b such that at least a
// fraction q of them are under b". With 100 durations, 55 under 1µs and 45 in [16, 32) µs, a
// fraction 0.55 is under 1µs, so Quantile(0.55) is 1µs, although 0.55*100 is 55.00000000000001
// in float64 and its ceiling would be rank 56 (32µs). The same for q = 0.07, 0.14, 0.28 and 0.56
// of 100: a rank within float rounding of a whole number is that number.
func TestHistogramQuantileExactRank(t *testing.T) {
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

// TestStatsBooksSystemClockStopRace: on the system clock, producers arm one-shot timers (some
// panic, some call runtime.Goexit) and Every series, stop and reset some, while the wheel is
// stopped under them. After Stop: Pending and Queued are 0, Dropped is what Stop returned,
// Scheduled == Fired + Stopped + Dropped, Lateness.Count() == Fired, Fired is exactly the number
// of user callbacks that started and Panics the number that panicked; a second Stop returns 0.
func TestStatsBooksSystemClockStopRace(t *testing.T) {
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
						tm, err = w.AfterFunc(d, func() { starts.Add(1); panicked.Add(1); panic("a panicking callback") })
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

// TestStatsLatenessStrideBound: the documented bound of how Lateness reads the clock on the
// system clock (Stats.Lateness's doc, lateClock): a reading may serve up to 16 quick callbacks
// that start one after another, so the delay a slow callback causes may be missed in up to 15 of
// those after it, and no more. Here the first of 32 callbacks fired together sleeps 30ms, so the
// 31 after it start at least 30ms after their deadline: all but 15 at most are counted 16ms late
// or more. The stride the slot's last batch ended with is set by hand to what a flood of quick
// callbacks leaves (lateStride; the race detector's overhead keeps real callbacks above
// lateQuick, so a flood would not reach it under -race).
func TestStatsLatenessStrideBound(t *testing.T) {
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
