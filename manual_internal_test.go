package shardwheel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestClockRoundsAcrossWheels: several WithWorkers(0) wheels on one manual clock, with different
// ticks, one made after the clock had moved, whose callbacks arm timers on each other (some with
// d <= 0). Within each Advance, the callbacks of all the wheels run in order of their deadlines
// rounded up to their wheel's tick, or the Advance's time if that is sooner (ManualClock.Advance's
// doc), none early; when Advance returns,
// every timer that was due at the new time when it began has run; and each timer runs once.
func TestClockRoundsAcrossWheels(t *testing.T) {
	defer goleak.VerifyNone(t)
	for seed := int64(0); seed < 30; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 0))
			clk := NewManualClock(time.Unix(0, 0))
			ticks := []time.Duration{time.Millisecond, 3 * time.Millisecond, 500 * time.Microsecond}
			var ws []*Wheel
			for k, tick := range ticks {
				if k == 2 {
					clk.Advance(time.Duration(rng.IntN(5000)) * time.Microsecond) // a wheel made later
				}
				w, err := New(WithClock(clk), WithWorkers(0), WithShards(1+k), WithTick(tick))
				require.NoError(t, err)
				ws = append(ws, w)
			}
			defer func() {
				for _, w := range ws {
					w.Stop()
				}
			}()
			type timer struct {
				due  int64 // its deadline rounded up to its wheel's tick, on the clock's scale
				when int64 // its deadline on the clock's scale
				runs int
			}
			var all []*timer
			var order []int64 // the due of each callback, in the order they ran
			var arm func(k int, d time.Duration, spawn int)
			arm = func(k int, d time.Duration, spawn int) {
				w := ws[k]
				now := clk.elapsed.Load()
				when := now + max(int64(d), 0)
				due := w.ceil(when-w.manualBase) + w.manualBase
				tm := &timer{due: due, when: when}
				all = append(all, tm)
				_, err := w.AfterFunc(d, func() {
					tm.runs++
					require.LessOrEqual(t, tm.when, clk.elapsed.Load(), "early")
					// The last round of an Advance is at its time, which may come before a
					// deadline's tick ends: a timer due by then fires in it.
					order = append(order, min(tm.due, clk.elapsed.Load()))
					for i := 0; i < spawn; i++ {
						arm(rng.IntN(len(ws)), time.Duration(rng.IntN(6000)-1000)*time.Microsecond, spawn-1)
					}
				})
				require.NoError(t, err)
			}
			for i := 0; i < 200; i++ {
				arm(rng.IntN(len(ws)), time.Duration(rng.IntN(40000))*time.Microsecond, rng.IntN(3))
			}
			for step := 0; step < 30; step++ {
				before := clk.elapsed.Load()
				d := time.Duration(rng.IntN(5000)) * time.Microsecond
				target := before + int64(d)
				var dueAtStart []*timer
				for _, tm := range all {
					if tm.when <= target && tm.runs == 0 {
						dueAtStart = append(dueAtStart, tm)
					}
				}
				order = order[:0]
				clk.Advance(d)
				for i := 1; i < len(order); i++ {
					require.LessOrEqual(t, order[i-1], order[i], "step %d: out of deadline order: %v", step, order)
				}
				for _, tm := range dueAtStart {
					require.Equal(t, 1, tm.runs, "step %d: a timer due at the Advance's time did not run", step)
				}
			}
			clk.Advance(time.Hour)
			clk.Advance(0)
			for _, tm := range all {
				require.Equal(t, 1, tm.runs)
			}
		})
	}
}

// TestClockRoundsConcurrentAdvancesNoDeadlock: wheels on one manual clock, with workers and a
// small queue under the Block policy and one with WithWorkers(0), advanced by several goroutines
// at once, while callbacks arm timers on the other wheels and call Advance themselves. No two
// Advances wait for each other's wheel: everything finishes, each timer runs once, none early.
func TestClockRoundsConcurrentAdvancesNoDeadlock(t *testing.T) {
	defer goleak.VerifyNone(t)
	for seed := int64(0); seed < 6; seed++ {
		clk := NewManualClock(time.Unix(0, 0))
		var ws []*Wheel
		for _, opts := range [][]Option{
			{WithWorkers(2), WithQueueSize(2), WithFullPolicy(Block)},
			{WithWorkers(0)},
			{WithWorkers(1), WithQueueSize(1), WithFullPolicy(Block), WithShards(2)},
		} {
			w, err := New(append([]Option{WithClock(clk)}, opts...)...)
			require.NoError(t, err)
			ws = append(ws, w)
		}
		const n = 600
		var runs [n]atomic.Int32
		var early atomic.Int32
		armed := make(chan struct{})
		var arm func(i int, depth int)
		arm = func(i int, depth int) {
			r := rand.New(rand.NewPCG(uint64(seed*n+int64(i)+int64(depth)*7919), 0))
			d := time.Duration(r.IntN(3000)) * time.Microsecond
			when := clk.elapsed.Load() + int64(d)
			_, err := ws[r.IntN(len(ws))].AfterFunc(d, func() {
				if clk.elapsed.Load() < when {
					early.Add(1)
				}
				if depth == 0 {
					runs[i].Add(1)
				}
				if r.IntN(4) == 0 {
					clk.Advance(time.Duration(r.IntN(200)) * time.Microsecond)
				}
				if depth < 2 && r.IntN(3) == 0 {
					arm(i, depth+1) // uncounted: only the first arming of i is checked
				}
			})
			if err != nil {
				panic(err)
			}
		}
		for i := 0; i < n; i++ {
			arm(i, 0)
		}
		close(armed)
		var wg sync.WaitGroup
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-armed
				for k := 0; k < 20; k++ {
					clk.Advance(200 * time.Microsecond)
				}
			}()
		}
		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(30 * time.Second):
			t.Fatalf("seed %d: the Advances did not finish", seed)
		}
		// A callback that the last Advance runs (or a worker runs after it returned) may arm its
		// next timer up to 3 ms past the clock: legitimately pending, so advance again until
		// nothing is (the chains end at depth 2). A timer lost for good stays pending here.
		require.Eventually(t, func() bool {
			clk.Advance(time.Hour)
			for _, w := range ws {
				if w.Len() != 0 || w.Stats().Queued != 0 {
					return false
				}
			}
			return true
		}, 10*time.Second, time.Millisecond, "seed %d", seed)
		for _, w := range ws {
			w.Stop()
		}
		for i := range runs {
			require.Equal(t, int32(1), runs[i].Load(), "seed %d: timer %d", seed, i)
		}
		require.Zero(t, early.Load())
	}
}

// TestManualCallbackDueNowByRound: ManualClock.Advance's rule for a d <= 0 timer armed by a
// callback. It is due at the clock's time, which is the end of this Advance: armed in a round at
// an earlier instant (a 5ms timer's, in an Advance to 10ms) it fires in the round at 10ms of the
// same Advance; armed in that last round it waits for the next Advance, or a callback that
// re-arms itself would never let Advance return.
func TestManualCallbackDueNowByRound(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0), WithTick(time.Millisecond))
	require.NoError(t, err)
	defer w.Stop()
	var fired []string
	arm := func(name string) func() {
		return func() {
			_, err := w.AfterFunc(0, func() { fired = append(fired, name) })
			require.NoError(t, err)
		}
	}
	_, err = w.AfterFunc(5*time.Millisecond, arm("from 5 ms"))
	require.NoError(t, err)
	_, err = w.AfterFunc(10*time.Millisecond, arm("from 10 ms"))
	require.NoError(t, err)
	clk.Advance(10 * time.Millisecond)
	require.Equal(t, []string{"from 5 ms"}, fired, "armed in an earlier round: this Advance; in the last: the next")
	clk.Advance(0)
	require.Equal(t, []string{"from 5 ms", "from 10 ms"}, fired)
}

// TestManualCallbackArmedDueNowWaitsWithStaleShard: a d <= 0 timer armed by a callback in the last
// round of an Advance fires at the next Advance, not in the same one, also when the callback
// fills another shard's ring so that its producer drains the ring itself, on a shard idle since
// tick 0. That drain must not leave the shard's next below the round that ran the callback (the
// start of a level-2 bucket, 4096ms, against 4106ms): Advance would take a round there and then
// one at 4106ms again, which would run the new timer in this Advance.
func TestManualCallbackArmedDueNowWaitsWithStaleShard(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(2), WithRingSize(8), WithWorkers(0))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	fired := false
	armOn(t, w, 0, 4106*time.Millisecond, func(any) {
		armOn(t, w, 1, 0, func(any) { fired = true }, nil)
		for i := 0; i < 20; i++ { // fill shard 1's ring: its producer drains it
			armOn(t, w, 1, 100*time.Millisecond, func(any) {}, nil)
		}
	}, nil)
	clock.Advance(4106 * time.Millisecond)
	if fired {
		t.Errorf("a d=0 timer armed by a callback of this Advance fired in the same Advance")
	}
	clock.Advance(0)
	if !fired {
		t.Errorf("the d=0 timer did not fire at the next Advance")
	}
}

// TestManualEndOfTimeOnWheelMadeLate: the manual clock "saturates at math.MaxInt64 nanoseconds
// past its start, the end of time, where every timer is due" (Advance's doc), and any d up to
// math.MaxInt64 fires at its time, never lost (API.md). A wheel made after its clock had moved
// keeps time from its own start (manualBase), and its deadlines saturate at the end of time:
// the clock's end of time is the wheel's too. AfterFunc(math.MaxInt64) fires when the clock gets
// there, and so does AfterFunc(1ns) armed there; nothing is left pending.
func TestManualEndOfTimeOnWheelMadeLate(t *testing.T) {
	m := NewManualClock(time.Unix(0, 0))
	m.Advance(time.Hour) // the clock served another wheel first
	w, err := New(WithClock(m), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	fired := 0
	_, err = w.AfterFunc(math.MaxInt64, func() { fired++ })
	require.NoError(t, err)
	m.Advance(math.MaxInt64) // the end of time
	require.Equal(t, 1, fired, "a timer is not due at the end of time (Len %d)", w.Len())
	// Armed at the end of time, a timer of 1 ns is due there too.
	_, err = w.AfterFunc(time.Nanosecond, func() { fired++ })
	require.NoError(t, err)
	m.Advance(0)
	require.Equal(t, 2, fired, "a timer armed at the end of time is not due there (Len %d)", w.Len())
	require.Zero(t, w.Len())
}

// TestManualAdvanceOrderAcrossWheels: ManualClock.Advance "dispatches every timer of every wheel
// on this clock whose deadline is at or before the new time, in order of deadline rounded up to
// the tick (ties in any order), across wheels too". With two WithWorkers(0) wheels on one clock,
// a timer of the second wheel due at 1ms runs before one of the first due at 5ms: Advance goes
// in rounds over all the wheels, not one wheel to the new time and then the next.
func TestManualAdvanceOrderAcrossWheels(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	defer a.Stop()
	b, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	defer b.Stop()
	var order []string
	_, err = a.AfterFunc(5*time.Millisecond, func() { order = append(order, "a@5ms") })
	require.NoError(t, err)
	_, err = b.AfterFunc(time.Millisecond, func() { order = append(order, "b@1ms") })
	require.NoError(t, err)
	clk.Advance(10 * time.Millisecond)
	require.Equal(t, []string{"b@1ms", "a@5ms"}, order, "timers of one Advance ran out of deadline order")
}

// TestManualAdvanceOrderAcrossShardsWithResets: "with WithWorkers(0) ... timers due within one
// Advance ran in the order of their deadlines (rounded to the tick; ties in any order)" (API.md),
// with timers armed from several goroutines onto every shard, spread over several levels, half
// of them Reset (earlier or later) and some stopped before the Advance, and the clock moved in a
// few uneven jumps. After each Advance: what it ran is in deadline order, none early, and every
// timer not stopped whose deadline has come has run; in the end each such timer ran once.
func TestManualAdvanceOrderAcrossShardsWithResets(t *testing.T) {
	const tick = time.Millisecond
	for seed := int64(1); seed <= 3; seed++ {
		w, clk := newManualWheel(t, WithWorkers(0), WithShards(4), WithTick(tick))
		type rec struct{ id, when int64 }
		var fired []rec
		want := map[int64]int64{} // the deadline of each timer not stopped, by id
		var mu sync.Mutex
		var wg sync.WaitGroup
		for g := int64(0); g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				x := uint64(seed*7919 + g*104729)
				rnd := func(n int64) int64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return int64(x % uint64(n)) }
				for i := int64(0); i < 300; i++ {
					id := g*1000 + i
					d := rnd(int64(20 * time.Second))
					var when atomic.Int64
					when.Store(d)
					tm, err := w.AfterFunc(time.Duration(d), func() {
						fired = append(fired, rec{id, when.Load()})
					})
					if err != nil {
						t.Error(err)
						return
					}
					switch rnd(4) {
					case 0, 1:
						d2 := rnd(int64(20 * time.Second))
						when.Store(d2)
						if !tm.Reset(time.Duration(d2)) {
							t.Error("Reset of a pending timer reported false")
						}
						d = d2
					case 2:
						if rnd(3) == 0 {
							if !tm.Stop() {
								t.Error("Stop of a pending timer reported false")
							}
							continue
						}
					}
					mu.Lock()
					want[id] = d
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		for _, step := range []time.Duration{3 * time.Millisecond, 777 * time.Millisecond, 5 * time.Second, 15 * time.Second} {
			before := len(fired)
			clk.Advance(step)
			now := int64(clk.Now().Sub(time.Unix(0, 0)))
			batch := fired[before:]
			for i := 1; i < len(batch); i++ {
				a, b := w.ceil(batch[i-1].when), w.ceil(batch[i].when)
				require.LessOrEqual(t, a, b, "seed %d: %v fired before %v", seed, batch[i-1], batch[i])
			}
			for _, r := range batch {
				require.LessOrEqual(t, r.when, now, "fired early")
			}
			ran := map[int64]bool{}
			for _, r := range fired {
				ran[r.id] = true
			}
			for id, d := range want {
				if d <= now {
					require.True(t, ran[id], "seed %d: timer %d due at %d not run by %d", seed, id, d, now)
				}
			}
		}
		require.Len(t, fired, len(want))
		requireQuietBooks(t, w)
	}
}

// TestManualCallbackDueNowOnOtherWheelFiresInSameAdvance: "When Advance returns, every timer whose
// deadline is at or before the new time has been dispatched" (API.md), and "A timer armed with
// d <= 0 by a callback of this Advance is due at the clock's new time: it fires in this Advance
// if the callback ran in a round at an earlier instant" (Advance's doc), across wheels too. A
// callback of the second wheel on the clock, running in the round at 1ms of an Advance to 10ms,
// arms a timer with d = 0 on the first wheel: when that Advance returns the timer is no longer
// pending, and it has run.
func TestManualCallbackDueNowOnOtherWheelFiresInSameAdvance(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	defer a.Stop()
	b, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	defer b.Stop()
	ran := false
	_, err = b.AfterFunc(time.Millisecond, func() {
		_, err := a.AfterFunc(0, func() { ran = true })
		require.NoError(t, err)
	})
	require.NoError(t, err)
	clk.Advance(10 * time.Millisecond)
	pending := a.Len()
	clk.Advance(0)
	require.True(t, ran)
	require.Zero(t, pending, "Advance returned with a timer due at its new time still pending on another wheel of the clock")
}

// TestManualAdvanceFromCallbacksOnTwoWheelsNoDeadlock: Advance from a callback is supported
// ("Called from a callback while another Advance of the wheel (or of another wheel on this
// clock) is in progress, it moves the clock and returns at once"), and so are concurrent Advance
// calls and several wheels on one clock, also together. Goroutine G2's Advance runs a callback of
// wheel b (holding b's advMu) while goroutine G1's Advance runs a callback of wheel a (holding
// a's); each callback calls Advance. Each such call is on a goroutine already inside an Advance,
// so it moves the clock and returns at once: neither waits for the other's wheel, both Advances
// return and both wheels stop. On failure the two goroutines stay blocked: the test reports the
// hang instead of hanging the package.
func TestManualAdvanceFromCallbacksOnTwoWheelsNoDeadlock(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	b, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	aIn, bIn := make(chan struct{}), make(chan struct{})
	_, err = b.AfterFunc(time.Millisecond, func() { // on G2, in its Advance to 1ms
		close(bIn)
		<-aIn
		clk.Advance(0)
	})
	require.NoError(t, err)
	_, err = a.AfterFunc(2*time.Millisecond, func() { // on G1, in its Advance to 2ms
		close(aIn)
		clk.Advance(0)
	})
	require.NoError(t, err)
	g1, g2 := make(chan struct{}), make(chan struct{})
	go func() { defer close(g2); clk.Advance(time.Millisecond) }()
	<-bIn
	go func() { defer close(g1); clk.Advance(time.Millisecond) }()
	for _, ch := range []chan struct{}{g1, g2} {
		select {
		case <-ch:
		case <-time.After(3 * time.Second):
			t.Fatal("two Advance calls whose callbacks call Advance deadlocked on two wheels of one clock")
		}
	}
	a.Stop()
	b.Stop()
}

// TestManualConcurrentAdvancesRunEachTimerOnce: Advance from several goroutines at once, over
// timers on several shards (and each callback arming another a little later), with callbacks
// inside Advance or on workers: every timer runs exactly once, none before its deadline, and
// once the last Advance has returned everything due runs; the books balance.
func TestManualConcurrentAdvancesRunEachTimerOnce(t *testing.T) {
	for _, workers := range []int{0, 2} {
		t.Run(strings.Repeat("w", workers+1), func(t *testing.T) {
			w, clk := newManualWheel(t, WithWorkers(workers), WithShards(4))
			const n = 400
			var mu sync.Mutex
			ran := make([]int, 2*n)
			var bad []string
			var wg sync.WaitGroup
			cb := func(arg any) {
				i := arg.(int)
				now := clk.Now().Sub(time.Unix(0, 0))
				mu.Lock()
				ran[i]++
				if due := time.Duration(i%n) * 37 * time.Microsecond; now < due {
					bad = append(bad, "early")
				}
				mu.Unlock()
				wg.Done()
			}
			chain := func(arg any) {
				i := arg.(int)
				cb(i)
				if i < n {
					// A second timer, due 37µs·i after the start, armed now: due at once if
					// the clock is past that.
					due := time.Duration(i) * 37 * time.Microsecond
					_, err := w.AfterFuncArg(due-clk.Now().Sub(time.Unix(0, 0)), cb, i+n)
					if err != nil {
						t.Error(err)
						wg.Done()
					}
				}
			}
			wg.Add(2 * n)
			for i := 0; i < n; i++ {
				_, err := w.AfterFuncArg(time.Duration(i)*37*time.Microsecond, chain, i)
				require.NoError(t, err)
			}
			var adv sync.WaitGroup
			for g := 0; g < 4; g++ {
				adv.Add(1)
				go func() {
					defer adv.Done()
					for k := 0; k < 10; k++ {
						clk.Advance(time.Duration(g+1) * 100 * time.Microsecond)
					}
				}()
			}
			adv.Wait() // 10ms of the 15ms the timers span
			clk.Advance(5 * time.Millisecond)
			clk.Advance(0) // what the last round's callbacks armed due now
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			if workers > 0 {
				// Callbacks on the workers may arm their second timer after the last Advance
				// returned: due now, it waits for the next Advance.
				require.Eventually(t, func() bool { clk.Advance(0); return isClosed(done) }, 5*time.Second, time.Millisecond)
			}
			requireWithin(t, done, "not every timer ran")
			mu.Lock()
			defer mu.Unlock()
			require.Empty(t, bad)
			for i, c := range ran {
				require.Equal(t, 1, c, "timer %d", i)
			}
			require.Eventually(t, func() bool { return w.Len() == 0 }, 5*time.Second, time.Millisecond)
			requireBooks(t, w)
		})
	}
}

// manualWheelsOn returns one wheel per option list on clk, stopped at the end of the test.
func manualWheelsOn(t *testing.T, clk *ManualClock, optss ...[]Option) []*Wheel {
	t.Helper()
	var ws []*Wheel
	for _, opts := range optss {
		w, err := New(append([]Option{WithClock(clk)}, opts...)...)
		require.NoError(t, err)
		t.Cleanup(func() { w.Stop() })
		ws = append(ws, w)
	}
	return ws
}

// manualWithin waits for ch for up to 5s and reports whether it was closed.
func manualWithin(ch <-chan struct{}) bool { return manualWaitFor(ch, 5*time.Second) }

// manualWaitFor waits for ch for up to d and reports whether it was closed.
func manualWaitFor(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// manualEndOfTimeFires arms a timer of math.MaxInt64 on the first of n WithWorkers(0) wheels on
// one clock, advances the clock to the end of time and returns how many times it fired.
func manualEndOfTimeFires(t *testing.T, n int) int {
	clk := NewManualClock(time.Unix(0, 0))
	var optss [][]Option
	for range n {
		optss = append(optss, []Option{WithWorkers(0), WithShards(1)})
	}
	ws := manualWheelsOn(t, clk, optss...)
	fired := 0
	_, err := ws[0].AfterFunc(math.MaxInt64, func() { fired++ })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64)
	clk.Advance(0)
	return fired
}

// TestManualEndOfTimeFiresWithOneOrMoreWheels: "The clock saturates at math.MaxInt64
// nanoseconds past its start, the end of time, where every timer is due" (Advance's doc). A
// timer whose deadline saturates there leaves its shard's next at never, the end of time itself;
// Advance(math.MaxInt64) fires it once, whether its wheel is alone on the clock or one of two
// (where Advance goes in rounds, which must count such a wheel as due at the end of time).
func TestManualEndOfTimeFiresWithOneOrMoreWheels(t *testing.T) {
	require.Equal(t, 1, manualEndOfTimeFires(t, 1), "one wheel: a timer at the end of time did not fire at Advance(math.MaxInt64)")
	require.Equal(t, 1, manualEndOfTimeFires(t, 2), "two wheels: a timer at the end of time did not fire at Advance(math.MaxInt64)")
}

// TestManualEndOfTimeWheelMadeLaterBesideAnother: the same for a wheel made after the clock had
// moved ("The clock's end of time is every wheel's, also of one made after the clock had
// moved", nanos): a wheel made at 1s, with a tick of 3ms, arms a timer of math.MaxInt64 (due at
// the end of time), next to a wheel made at 0 with a timer at 1h. Advance(math.MaxInt64) fires
// both, in deadline order.
func TestManualEndOfTimeWheelMadeLaterBesideAnother(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a := manualWheelsOn(t, clk, []Option{WithWorkers(0)})[0]
	clk.Advance(time.Second)
	b := manualWheelsOn(t, clk, []Option{WithWorkers(0), WithTick(3 * time.Millisecond)})[0]
	var order []string
	_, err := a.AfterFunc(time.Hour, func() { order = append(order, "a") })
	require.NoError(t, err)
	_, err = b.AfterFunc(math.MaxInt64, func() { order = append(order, "b") })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64)
	require.Equal(t, []string{"a", "b"}, order, "every timer is due at the end of time")
}

// TestManualGoexitInCallbackStillAdvancesToClock: a worker's Advance that finds another wheel's
// advMu held sets rerun and returns, counting on the holder (manualAdvance); and a callback that
// calls runtime.Goexit on the advancing goroutine ends it inside the advance, whose deferred call
// then runs what a worker's Advance asked for meanwhile, to the clock's time (advanceHeld), not
// only to the limit of the round it was in. Here wheel a's callback at 1ms waits for b's worker
// to Advance the clock to 11ms (which sets a's rerun, a's advMu being held) and then calls
// Goexit: a's timer at 5ms must still be dispatched once the holder has unwound, since the
// worker's Advance(10ms) returned counting on it.
func TestManualGoexitInCallbackStillAdvancesToClock(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	ws := manualWheelsOn(t, clk, []Option{WithWorkers(1), WithShards(1)}, []Option{WithWorkers(0), WithShards(1)})
	b, a := ws[0], ws[1]
	inB, advanced := make(chan struct{}), make(chan struct{})
	_, err := b.AfterFunc(time.Millisecond, func() { // on b's worker
		<-inB
		clk.Advance(10 * time.Millisecond)
		close(advanced)
	})
	require.NoError(t, err)
	_, err = a.AfterFunc(time.Millisecond, func() { // on the advancer, after b's round at 1ms
		close(inB)
		<-advanced
		runtime.Goexit()
	})
	require.NoError(t, err)
	var late atomic.Int32
	_, err = a.AfterFunc(5*time.Millisecond, func() { late.Add(1) })
	require.NoError(t, err)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		clk.Advance(time.Millisecond)
	}()
	require.True(t, manualWithin(ended), "the advancer did not end")
	require.Equal(t, 11*time.Millisecond, clk.Now().Sub(time.Unix(0, 0)))
	require.Equal(t, int32(1), late.Load(),
		"the clock is at 11ms, the worker's Advance returned counting on the holder, and the holder unwound: a's timer at 5ms was not dispatched")
}

// TestManualAdvanceFromCallbackOfStoppedWheelReturnsAtOnce: "Called from a callback while another
// Advance of the wheel (or of another wheel on this clock) is in progress, it moves the clock and
// returns at once", also when the callback has just stopped its own wheel (which takes it off the
// clock). The inner Advance must not run the other wheel's timers nested in the callback, ahead
// of the rest of the stopped wheel's batch, which was taken from the wheel before Stop and still
// runs: a's second timer at 1ms runs before b's timer at 2ms ("in order of deadline rounded up to
// the tick ... across wheels too").
func TestManualAdvanceFromCallbackOfStoppedWheelReturnsAtOnce(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	ws := manualWheelsOn(t, clk, []Option{WithWorkers(0), WithShards(1)}, []Option{WithWorkers(0), WithShards(1)})
	a, b := ws[0], ws[1]
	var order []string
	nested := false
	for i := 0; i < 2; i++ {
		_, err := a.AfterFunc(time.Millisecond, func() {
			order = append(order, "a@1ms")
			if len(order) == 1 {
				a.Stop()
				clk.Advance(time.Millisecond) // from a callback of an Advance in progress: returns at once
				nested = len(order) > 1
			}
		})
		require.NoError(t, err)
	}
	_, err := b.AfterFunc(2*time.Millisecond, func() { order = append(order, "b@2ms") })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.False(t, nested, "the Advance called from a's callback ran b's timers before it returned: %v", order)
	require.Equal(t, []string{"a@1ms", "a@1ms", "b@2ms"}, order)
}

// TestManualWheelMadeDuringAdvanceGetsItsRounds: "before it returns, dispatches every timer of
// every wheel on this clock whose deadline is at or before the new time" and "A timer armed with
// d <= 0 by a callback of this Advance is due at the clock's new time: it fires in this Advance if
// the callback ran in a round at an earlier instant". A callback in the round at 1ms of an
// Advance to 3ms makes a wheel on the clock and arms a timer on it at once: Advance looks the
// wheels up afresh each round, and the timer fires in this Advance.
func TestManualWheelMadeDuringAdvanceGetsItsRounds(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	ws := manualWheelsOn(t, clk, []Option{WithWorkers(0), WithShards(1)}, []Option{WithWorkers(0), WithShards(1)})
	var c *Wheel
	fired := 0
	_, err := ws[0].AfterFunc(time.Millisecond, func() {
		var err error
		c, err = New(WithClock(clk), WithWorkers(0))
		require.NoError(t, err)
		_, err = c.AfterFunc(0, func() { fired++ })
		require.NoError(t, err)
	})
	require.NoError(t, err)
	clk.Advance(3 * time.Millisecond)
	require.NotNil(t, c)
	defer c.Stop()
	require.Equal(t, 1, fired, "a timer armed at once in the round at 1ms, due at 3ms, on a wheel of this clock, did not fire in the Advance to 3ms")
}

// manualWorkerAdvanceGaveUp runs TestManualWorkerAdvanceDoesNotWaitForHolder's scenario, with a
// being stopped or not, and reports whether b's callback gave up waiting for a's worker.
func manualWorkerAdvanceGaveUp(t *testing.T, stopping bool) (gaveUp bool) {
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(1), WithShards(1))
	require.NoError(t, err)
	b, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	defer b.Stop()
	inA, goA, doneA := make(chan struct{}), make(chan struct{}), make(chan struct{})
	_, err = a.AfterFunc(time.Millisecond, func() { // on a's worker
		close(inA)
		<-goA
		clk.Advance(time.Millisecond)
		close(doneA)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.True(t, manualWithin(inA))
	stopped := make(chan struct{})
	if stopping {
		go func() { defer close(stopped); a.Stop() }()
		// a's Stop has dropped its timers and closed quit; it waits for its worker's callback.
		require.Eventually(t, func() bool { return isClosed(a.quit) }, 5*time.Second, time.Millisecond, "a's Stop did not begin")
	}
	_, err = b.AfterFunc(time.Millisecond, func() { // on the advancer below, holding b's advMu
		close(goA)
		gaveUp = !manualWaitFor(doneA, 3*time.Second)
	})
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { defer close(advanced); clk.Advance(time.Millisecond) }()
	// On failure b's callback gives up after 3s, and then everything finishes.
	require.True(t, manualWaitFor(advanced, 10*time.Second))
	require.True(t, manualWaitFor(doneA, 10*time.Second))
	if stopping {
		require.True(t, manualWaitFor(stopped, 10*time.Second))
	} else {
		a.Stop()
	}
	return gaveUp
}

// TestManualWorkerAdvanceDoesNotWaitForHolder: a worker's Advance never waits for another
// goroutine's advance ("an Advance there must not wait for another goroutine's advance, which may
// be waiting ... for g itself", inCallback), also while the worker's own wheel is being stopped.
// a's worker runs a callback that calls Advance while the Advance on another goroutine holds
// b's advMu and runs b's callback, which waits for that worker's Advance to return. The worker's
// Advance sets b's rerun and returns, and the holder's rounds go on to the new time. The worker
// stays a callback's goroutine from its start to its exit, also after its wheel's Stop took the
// wheel off the clock (here a's Stop, from outside, waits for that callback meanwhile); were it
// taken for an outsider, its Advance would wait for b's advMu and each would wait for the other
// (here for 3s, then b's callback gives up and the test fails).
func TestManualWorkerAdvanceDoesNotWaitForHolder(t *testing.T) {
	defer goleak.VerifyNone(t)
	require.False(t, manualWorkerAdvanceGaveUp(t, false),
		"the Advance of a callback on a's worker waited for b's advMu, held by the Advance that waits for that callback")
	require.False(t, manualWorkerAdvanceGaveUp(t, true),
		"the Advance of a callback on a worker of a wheel being stopped waited for b's advMu, held by the Advance that waits for that callback")
}

// TestManualWorkerAdvanceNeverWaitsForOtherWheelsQueue: a worker's Advance never waits for
// another wheel, also for room in its queue. When a's worker calls Advance and no one else holds
// b's advMu, its rounds take it and dispatch b's batch; b's queue is full and b's worker, whose
// callback waits for a's callback, never makes room. Advance from a callback of any wheel on the
// clock is a worker's (inCallback), so dispatch runs the task on a's worker (as CallerRuns would)
// rather than wait under Block: the cycle b's queue, b's worker, a's worker never closes. On
// failure b's callback gives up after 3s and the test fails.
func TestManualWorkerAdvanceNeverWaitsForOtherWheelsQueue(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(1), WithShards(1))
	require.NoError(t, err)
	b, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1), WithFullPolicy(Block))
	require.NoError(t, err)
	inA, goA, doneA, inB := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	_, err = a.AfterFunc(time.Millisecond, func() { // on a's worker
		close(inA)
		<-goA
		clk.Advance(time.Millisecond) // to 3ms, where b has a timer and its queue is full
		close(doneA)
	})
	require.NoError(t, err)
	gaveUp := false
	_, err = b.AfterFunc(time.Millisecond, func() { // on b's worker: waits for a's callback
		close(inB)
		gaveUp = !manualWaitFor(doneA, 3*time.Second)
	})
	require.NoError(t, err)
	var bRuns atomic.Int32
	for _, d := range []time.Duration{2 * time.Millisecond, 3 * time.Millisecond} {
		_, err = b.AfterFunc(d, func() { bRuns.Add(1) })
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	require.True(t, manualWithin(inA))
	require.True(t, manualWithin(inB))
	clk.Advance(time.Millisecond) // b's timer at 2ms fills b's queue (size 1): its worker is busy
	require.Eventually(t, func() bool { return len(b.pool.queue) == 1 }, 5*time.Second, time.Millisecond)
	close(goA)
	require.True(t, manualWaitFor(doneA, 10*time.Second))
	clk.Advance(0)
	require.Eventually(t, func() bool { return bRuns.Load() == 2 }, 5*time.Second, time.Millisecond)
	a.Stop()
	b.Stop()
	require.False(t, gaveUp, "a's worker's Advance waited for room in b's queue, which b's worker empties only after a's callback returns")
}

// manualConcurrentAdvanceSawRun runs two Advances on a clock with n WithWorkers(0) wheels: the
// first is held up inside a callback of a batch of two due at 1ms; the second, Advance(0) from
// another goroutine, is let go 200ms after it began. It reports whether the other callback of that
// batch had run when the second Advance returned.
func manualConcurrentAdvanceSawRun(t *testing.T, n int) bool {
	clk := NewManualClock(time.Unix(0, 0))
	var optss [][]Option
	for range n {
		optss = append(optss, []Option{WithWorkers(0), WithShards(1)})
	}
	ws := manualWheelsOn(t, clk, optss...)
	var first, other atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	for i := 0; i < 2; i++ {
		_, err := ws[0].AfterFunc(time.Millisecond, func() {
			if first.CompareAndSwap(false, true) {
				close(entered)
				<-release
				return
			}
			other.Store(true)
		})
		require.NoError(t, err)
	}
	h1 := make(chan struct{})
	go func() { defer close(h1); clk.Advance(time.Millisecond) }()
	require.True(t, manualWithin(entered))
	var ranAtReturn atomic.Bool
	h2 := make(chan struct{})
	go func() {
		defer close(h2)
		clk.Advance(0)
		ranAtReturn.Store(other.Load())
	}()
	time.Sleep(200 * time.Millisecond)
	close(release)
	require.True(t, manualWithin(h1))
	require.True(t, manualWithin(h2))
	return ranAtReturn.Load()
}

// TestManualConcurrentAdvanceReturnsAfterDueRan: "When Advance returns, every timer whose
// deadline is at or before the new time has been dispatched; with WithWorkers(0) it has also run"
// (API.md), also when another goroutine's Advance has already taken that timer from the wheel and
// is running its batch. With one wheel the second Advance waits for advMu; with two, a wheel whose
// due timers are in another Advance's batch looks idle to the rounds, and the second Advance
// takes each wheel's advMu once more before it returns (rounds). Either way, Advance(0) at 1ms
// returns only once the other timer due at 1ms has run.
func TestManualConcurrentAdvanceReturnsAfterDueRan(t *testing.T) {
	require.True(t, manualConcurrentAdvanceSawRun(t, 1),
		"one wheel: Advance(0) at 1ms returned while a timer due at 1ms had not run (it waited in another Advance's batch)")
	require.True(t, manualConcurrentAdvanceSawRun(t, 2),
		"two wheels: Advance(0) at 1ms returned while a timer due at 1ms had not run (it waited in another Advance's batch)")
}

// TestManualCallbackStopsOtherWheelAndAdvances: WithWorkers(0) wheels of different ticks, one made
// after the clock moved. In the round at 1ms a's callback stops c (which drops c's two timers,
// and returns their count) and moves the clock on by 5ms; the rounds go on to 6ms, in order of
// deadline rounded up to each wheel's tick across a and b, none early, each once.
func TestManualCallbackStopsOtherWheelAndAdvances(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a := manualWheelsOn(t, clk, []Option{WithWorkers(0), WithShards(2)})[0]
	clk.Advance(700 * time.Microsecond)
	ws := manualWheelsOn(t, clk, []Option{WithWorkers(0), WithTick(3 * time.Millisecond)}, []Option{WithWorkers(0)})
	b, c := ws[0], ws[1]
	var order []string
	arm := func(w *Wheel, name string, d time.Duration, f func()) {
		when := clk.elapsed.Load() + int64(d)
		_, err := w.AfterFunc(d, func() {
			require.LessOrEqual(t, when, clk.elapsed.Load(), "%s ran early", name)
			order = append(order, name)
			if f != nil {
				f()
			}
		})
		require.NoError(t, err)
	}
	dropped := -1
	arm(a, "a@1ms", 300*time.Microsecond, func() {
		dropped = c.Stop()
		clk.Advance(5 * time.Millisecond)
	})
	arm(c, "c@2ms", 1300*time.Microsecond, nil)
	arm(c, "c@4ms", 3300*time.Microsecond, nil)
	arm(b, "b@1.7ms→3.7ms", time.Millisecond, nil) // b's ticks start at 0.7ms
	arm(a, "a@2ms", 1300*time.Microsecond, nil)
	arm(a, "a@5ms", 4300*time.Microsecond, nil)
	arm(b, "b@4ms→6.7ms→6ms", 3300*time.Microsecond, nil) // rounded up to 6.7ms, the Advance's 6ms is sooner
	arm(a, "a@7ms", 6300*time.Microsecond, nil)
	clk.Advance(300 * time.Microsecond)
	require.Equal(t, 2, dropped)
	require.Equal(t, []string{"a@1ms", "a@2ms", "b@1.7ms→3.7ms", "a@5ms", "b@4ms→6.7ms→6ms"}, order)
	clk.Advance(time.Millisecond)
	require.Equal(t, "a@7ms", order[len(order)-1])
	require.Len(t, order, 6)
}
