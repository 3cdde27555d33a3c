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
// at once, while callbacks arm timers on the other wheels and call Advance themselves (review
// 33 found two such Advances waiting for each other's wheel for good). Everything finishes, each
// timer runs once, none early.
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

// ManualClock.Advance's rule for a d <= 0 timer armed by a callback (found by the third review:
// its doc said such a timer always waits for the next Advance). It is due at the clock's time,
// which is the end of this Advance: armed in a round at an earlier instant (a 5 ms timer's, in
// an Advance to 10 ms) it fires in the round at 10 ms of the same Advance; armed in that last
// round it waits for the next Advance, or a callback that re-arms itself would never let Advance
// return.
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

// TestManualCallbackArmedDueNowWaitsWithStaleShard (found by review): with a manual clock a
// d <= 0 timer armed by a callback fires at the next Advance, not in the same one. A producer's
// own drain on a shard idle since tick 0 used to note the start of a level-2 bucket (4096) in
// next, below the tick of the round that ran the callback (4106): Advance took a round at 4096,
// and then one at 4106 again, which ran the new timer.
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

// TestReview27EndOfTimeOnLateWheel (bug, huge delays): ManualClock.Advance says the clock
// "saturates at math.MaxInt64 nanoseconds past its start, the end of time, where every timer is
// due", and API.md that any d up to math.MaxInt64 fires at its time, never lost. A wheel attached
// to a clock that had already moved keeps time as the clock's elapsed minus manualBase
// (clock.go:113), which stops at math.MaxInt64-manualBase, but deadlineFrom saturates at
// math.MaxInt64 (clock.go:127): a timer whose deadline lands past the wheel's own end of time is
// never due, on a clock that can move no further. Its callback never runs, Len stays 1. (So does
// AfterFunc(1ns) armed at the end of time, which fires on a wheel made before the clock moved.)
func TestReview27EndOfTimeOnLateWheel(t *testing.T) {
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

// TestReview33FixedAdvanceOrderAcrossWheels: ManualClock.Advance "dispatches every timer of every
// wheel on this clock whose deadline is at or before the new time, in order of deadline rounded
// up to the tick (ties in any order). With WithWorkers(0) those callbacks have also run". With
// two wheels on one clock, Advance (clock.go:85-87) advances the first wheel to the new time
// and only then the second: a timer of the first wheel due at 5ms runs before one of the second
// due at 1ms.
func TestReview33FixedAdvanceOrderAcrossWheels(t *testing.T) {
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

// TestReview33FixedAdvanceLeavesDueTimerOnEarlierWheel: "When Advance returns, every timer whose
// deadline is at or before the new time has been dispatched" (API.md), and "A timer armed with
// d <= 0 by a callback of this Advance is due at the clock's new time: it fires in this Advance
// if the callback ran in a round at an earlier instant" (Advance's doc). A callback of the
// second wheel on the clock, running in the round at 1ms of an Advance to 10ms, arms a timer
// with d = 0 on the first wheel, which Advance has already finished with (clock.go:85-87): the
// timer is due at 10ms, Advance returns, and it has not run.
func TestReview33FixedAdvanceLeavesDueTimerOnEarlierWheel(t *testing.T) {
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

// TestReview33FixedAdvanceFromCallbacksTwoWheelsDeadlock: Advance from a callback is supported
// ("Called from a callback while another Advance of the wheel is in progress, it moves the clock
// and returns at once"), so are concurrent Advance calls and several wheels on one clock. Put
// together they deadlock: goroutine G2's Advance has finished wheel a and is running a callback
// of wheel b (holding b's advMu); goroutine G1's Advance holds a's advMu and runs a callback of
// a. Each callback calls Advance: G1's skips a (its own advance) and waits for b's advMu
// (clock.go:157-167: it is neither b's advancer nor b's worker), G2's waits for a's advMu. Neither
// Advance ever returns, and neither wheel can be stopped (Stop waits for advMu too). On failure
// the two goroutines stay blocked: the test reports the hang instead of hanging the package.
func TestReview33FixedAdvanceFromCallbacksTwoWheelsDeadlock(t *testing.T) {
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

// TestReview33PinConcurrentAdvances: Advance from several goroutines at once, over timers on
// several shards (and each callback arming another a little later): every timer runs exactly
// once, none before its deadline, and when the last Advance has returned, everything due ran.
func TestReview33PinConcurrentAdvances(t *testing.T) {
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
			wait26(t, done, "not every timer ran")
			mu.Lock()
			defer mu.Unlock()
			require.Empty(t, bad)
			for i, c := range ran {
				require.Equal(t, 1, c, "timer %d", i)
			}
			require.Eventually(t, func() bool { return w.Len() == 0 }, 5*time.Second, time.Millisecond)
			balance33(t, w)
		})
	}
}

// wheels35 returns one wheel per option list on clk, stopped at the end of the test.
func wheels35(t *testing.T, clk *ManualClock, optss ...[]Option) []*Wheel {
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

// within35 waits for ch for up to 5s and reports whether it was closed.
func within35(ch <-chan struct{}) bool { return waitFor35(ch, 5*time.Second) }

// waitFor35 waits for ch for up to d and reports whether it was closed.
func waitFor35(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// endOfTime35 arms a timer of math.MaxInt64 on the first of n WithWorkers(0) wheels on one clock,
// advances the clock to the end of time and returns how many times it fired.
func endOfTime35(t *testing.T, n int) int {
	clk := NewManualClock(time.Unix(0, 0))
	var optss [][]Option
	for range n {
		optss = append(optss, []Option{WithWorkers(0), WithShards(1)})
	}
	ws := wheels35(t, clk, optss...)
	fired := 0
	_, err := ws[0].AfterFunc(math.MaxInt64, func() { fired++ })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64)
	clk.Advance(0)
	return fired
}

// TestReview35FixedEndOfTimeTwoWheels: "The clock saturates at math.MaxInt64 nanoseconds past its
// start, the end of time, where every timer is due" (ManualClock.Advance's doc; `never`: "a timer
// at the end of time fires when a manual clock is advanced that far"). A timer whose deadline
// saturates at the end of time leaves its shard's next at never (noteDeadline lowers nothing), and
// nextRound (clock.go:140) reports a wheel whose minNext is never as having nothing due, so with
// two wheels on the clock rounds never gives that wheel a round: Advance(math.MaxInt64) returns
// with the timer unfired. With one wheel (the pin below: advance itself, limit never) it fires.
func TestReview35FixedEndOfTimeTwoWheels(t *testing.T) {
	require.Equal(t, 1, endOfTime35(t, 2), "two wheels: a timer at the end of time did not fire at Advance(math.MaxInt64)")
}

// TestReview35PinEndOfTimeOneWheel: the single-wheel path, unchanged.
func TestReview35PinEndOfTimeOneWheel(t *testing.T) {
	require.Equal(t, 1, endOfTime35(t, 1))
}

// TestReview35FixedEndOfTimeWheelMadeLater: the same through the door the doc names, "also of one
// made after the clock had moved (manualBase > 0)" (nanos): a wheel made at 1s, with a tick of
// 3ms, arms a timer of math.MaxInt64 (due at the end of time), next to a wheel made at 0 with a
// timer at 1h. The round at 1h fires a's; b's is never given a round.
func TestReview35FixedEndOfTimeWheelMadeLater(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a := wheels35(t, clk, []Option{WithWorkers(0)})[0]
	clk.Advance(time.Second)
	b := wheels35(t, clk, []Option{WithWorkers(0), WithTick(3 * time.Millisecond)})[0]
	var order []string
	_, err := a.AfterFunc(time.Hour, func() { order = append(order, "a") })
	require.NoError(t, err)
	_, err = b.AfterFunc(math.MaxInt64, func() { order = append(order, "b") })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64)
	require.Equal(t, []string{"a", "b"}, order, "every timer is due at the end of time")
}

// TestReview35FixedGoexitRerunOnlyToLimit: a worker's Advance that finds another wheel's advMu held
// sets rerun and returns, "counting on this holder" (advanceManual's doc: "What is still due fires
// at the next Advance, or now, on this goroutine as it unwinds, if a worker's Advance asked for a
// rerun meanwhile"). When the holder is in rounds and its callback calls runtime.Goexit, the
// deferred rerun (clock.go:259) advances only to the round's limit R, not to the clock's new
// time, and the rounds that would have gone on are gone with the goroutine. Here wheel a's
// callback at 1ms waits for b's worker to Advance the clock to 11ms (which sets a's rerun, a's
// advMu being held) and then calls Goexit: a's timer at 5ms is never dispatched, though the
// worker's Advance(10ms) returned and the holder has unwound. Before the change (limit never)
// the unwinding rerun went to 11ms.
func TestReview35FixedGoexitRerunOnlyToLimit(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	ws := wheels35(t, clk, []Option{WithWorkers(1), WithShards(1)}, []Option{WithWorkers(0), WithShards(1)})
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
	require.True(t, within35(ended), "the advancer did not end")
	require.Equal(t, 11*time.Millisecond, clk.Now().Sub(time.Unix(0, 0)))
	require.Equal(t, int32(1), late.Load(),
		"the clock is at 11ms, the worker's Advance returned counting on the holder, and the holder unwound: a's timer at 5ms was not dispatched")
}

// TestReview35FixedStoppedWheelCallbackAdvanceNests: "Called from a callback while another Advance
// of the wheel (or of another wheel on this clock) is in progress, it moves the clock and returns
// at once". A WithWorkers(0) callback that stops its own wheel and then calls Advance is not
// recognised: Advance looks for self among the advancers of the wheels still attached
// (clock.go:87-93), and Stop detached the wheel. So the inner Advance runs the other wheel's
// timers up to the new time nested in the callback, before the rest of the stopped wheel's batch,
// which "still run after Stop returns": b's timer at 2ms runs before a's second timer at 1ms
// ("in order of deadline rounded up to the tick ... across wheels too").
func TestReview35FixedStoppedWheelCallbackAdvanceNests(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	ws := wheels35(t, clk, []Option{WithWorkers(0), WithShards(1)}, []Option{WithWorkers(0), WithShards(1)})
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

// TestReview35FixedWheelMadeDuringAdvance: "before it returns, dispatches every timer of every wheel
// on this clock whose deadline is at or before the new time" and "A timer armed with d <= 0 by a
// callback of this Advance is due at the clock's new time: it fires in this Advance if the callback
// ran in a round at an earlier instant". A callback in the round at 1ms of an Advance to 3ms makes
// a wheel on the clock and arms a timer on it at once. Advance took its list of wheels once, before
// the rounds (clock.go:84-86), and never looks again: the timer waits for the next Advance.
func TestReview35FixedWheelMadeDuringAdvance(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	ws := wheels35(t, clk, []Option{WithWorkers(0), WithShards(1)}, []Option{WithWorkers(0), WithShards(1)})
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

// stoppingWorker35 is the scenario of TestReview35FixedWorkerOfStoppingWheelAdvanceWaits, with a
// being stopped or not, and reports whether b's callback gave up waiting for a's worker.
func stoppingWorker35(t *testing.T, stopping bool) (gaveUp bool) {
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
	require.True(t, within35(inA))
	stopped := make(chan struct{})
	if stopping {
		go func() { defer close(stopped); a.Stop() }()
		// finishStop has begun: a's Stop waits for its worker's callback.
		require.Eventually(t, func() bool { return isClosed(a.quit) }, 5*time.Second, time.Millisecond, "a's Stop did not begin")
	}
	_, err = b.AfterFunc(time.Millisecond, func() { // on the advancer below, holding b's advMu
		close(goA)
		gaveUp = !waitFor35(doneA, 3*time.Second)
	})
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { defer close(advanced); clk.Advance(time.Millisecond) }()
	// On failure b's callback gives up after 3s, and then everything finishes.
	require.True(t, waitFor35(advanced, 10*time.Second))
	require.True(t, waitFor35(doneA, 10*time.Second))
	if stopping {
		require.True(t, waitFor35(stopped, 10*time.Second))
	} else {
		a.Stop()
	}
	return gaveUp
}

// TestReview35FixedWorkerOfStoppingWheelAdvanceWaits: the change's promise, "a worker's Advance
// never waits for another wheel" (inCallback: "an Advance there must not wait for another wheel's
// advMu, whose holder may be waiting ... for g itself"). inCallback (clock.go:149-158) looks for g among
// the workers of the wheels attached to the clock, and Stop detaches its wheel (shardwheel.go:374)
// before it waits for that wheel's workers to finish their callbacks (finishStop). So a worker of
// wheel a while a is being stopped, still running its callback, is taken for an outsider: its
// Advance Locks b's advMu (clock.go:239), whose holder runs b's callback that waits for that
// worker's Advance to return. Each waits for the other (here for 3s, then b's callback gives up
// and the test fails); without the Stop (the pin below) the worker's Advance sets rerun and
// returns.
func TestReview35FixedWorkerOfStoppingWheelAdvanceWaits(t *testing.T) {
	defer goleak.VerifyNone(t)
	require.False(t, stoppingWorker35(t, true),
		"the Advance of a callback on a worker of a wheel being stopped waited for b's advMu, held by the Advance that waits for that callback")
}

// TestReview35PinWorkerAdvanceDoesNotWaitForHolder: the same without a's Stop: a's worker's
// Advance sets b's rerun and returns, and the holder's rounds go on to the new time.
func TestReview35PinWorkerAdvanceDoesNotWaitForHolder(t *testing.T) {
	defer goleak.VerifyNone(t)
	require.False(t, stoppingWorker35(t, false))
}

// TestReview35FixedWorkerAdvanceWaitsForOtherWheelsQueue: "a worker's Advance never waits for
// another wheel" (the change's title). When a's worker calls Advance and no one else holds b's
// advMu, its rounds take it and dispatch b's batch with Block, waiting for room in b's queue:
// advanceManual's onWorker is b.isWorker(self) (clock.go:262), false for a's worker, so dispatch
// waits (workers.go:152). b's worker, whose callback waits for a's callback, never makes room:
// the same cycle inCallback breaks when another goroutine holds b's advMu (b's queue, its worker,
// a's worker), closed here by a's worker holding advMu itself. b's callback gives up after 3s and
// the test fails.
func TestReview35FixedWorkerAdvanceWaitsForOtherWheelsQueue(t *testing.T) {
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
		gaveUp = !waitFor35(doneA, 3*time.Second)
	})
	require.NoError(t, err)
	var bRuns atomic.Int32
	for _, d := range []time.Duration{2 * time.Millisecond, 3 * time.Millisecond} {
		_, err = b.AfterFunc(d, func() { bRuns.Add(1) })
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	require.True(t, within35(inA))
	require.True(t, within35(inB))
	clk.Advance(time.Millisecond) // b's timer at 2ms fills b's queue (size 1): its worker is busy
	require.Eventually(t, func() bool { return len(b.pool.queue) == 1 }, 5*time.Second, time.Millisecond)
	close(goA)
	require.True(t, waitFor35(doneA, 10*time.Second))
	clk.Advance(0)
	require.Eventually(t, func() bool { return bRuns.Load() == 2 }, 5*time.Second, time.Millisecond)
	a.Stop()
	b.Stop()
	require.False(t, gaveUp, "a's worker's Advance waited for room in b's queue, which b's worker empties only after a's callback returns")
}

// concurrentReturn35 runs two Advances on a clock with n WithWorkers(0) wheels: the first is held
// up inside a callback of a batch of two due at 1ms; the second, Advance(0) from another
// goroutine, is let go 200ms after it began. It reports whether the other callback of that batch
// had run when the second Advance returned.
func concurrentReturn35(t *testing.T, n int) bool {
	clk := NewManualClock(time.Unix(0, 0))
	var optss [][]Option
	for range n {
		optss = append(optss, []Option{WithWorkers(0), WithShards(1)})
	}
	ws := wheels35(t, clk, optss...)
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
	require.True(t, within35(entered))
	var ranAtReturn atomic.Bool
	h2 := make(chan struct{})
	go func() {
		defer close(h2)
		clk.Advance(0)
		ranAtReturn.Store(other.Load())
	}()
	time.Sleep(200 * time.Millisecond)
	close(release)
	require.True(t, within35(h1))
	require.True(t, within35(h2))
	return ranAtReturn.Load()
}

// TestReview35FixedConcurrentAdvanceReturnsBeforeDue: API.md, "When Advance returns, every timer
// whose deadline is at or before the new time has been dispatched; with WithWorkers(0) it has also
// run". With one wheel an Advance concurrent with another waits for advMu (the pin below), so it
// returns once the other's batch has run. With two wheels, rounds decides from nextRound
// (clock.go:113-120), and a wheel whose due timers another Advance has already taken out of the
// shards (into its w.batch, running) looks idle: the second Advance returns at once while a timer
// due at 1ms has neither run nor, as far as anyone can tell, been dispatched.
func TestReview35FixedConcurrentAdvanceReturnsBeforeDue(t *testing.T) {
	require.True(t, concurrentReturn35(t, 2),
		"Advance(0) at 1ms returned while a WithWorkers(0) timer due at 1ms had not run (it waited in another Advance's batch)")
}

// TestReview35PinConcurrentAdvanceOneWheelWaits: the single-wheel path, unchanged: the second
// Advance waits for the first's advMu, and returns after the batch ran.
func TestReview35PinConcurrentAdvanceOneWheelWaits(t *testing.T) {
	require.True(t, concurrentReturn35(t, 1))
}

// TestReview35PinStopOtherWheelAndAdvanceFromCallback: WithWorkers(0) wheels of different ticks,
// one made after the clock moved. In the round at 1ms a's callback stops c (which drops c's two
// timers) and moves the clock on by 5ms; the rounds go on to 6ms, in order of deadline rounded
// up to each wheel's tick across a and b, none early, each once.
func TestReview35PinStopOtherWheelAndAdvanceFromCallback(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a := wheels35(t, clk, []Option{WithWorkers(0), WithShards(2)})[0]
	clk.Advance(700 * time.Microsecond)
	ws := wheels35(t, clk, []Option{WithWorkers(0), WithTick(3 * time.Millisecond)}, []Option{WithWorkers(0)})
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
