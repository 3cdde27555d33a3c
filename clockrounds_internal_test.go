package shardwheel

import (
	"fmt"
	"math/rand"
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
			rng := rand.New(rand.NewSource(seed))
			clk := NewManualClock(time.Unix(0, 0))
			ticks := []time.Duration{time.Millisecond, 3 * time.Millisecond, 500 * time.Microsecond}
			var ws []*Wheel
			for k, tick := range ticks {
				if k == 2 {
					clk.Advance(time.Duration(rng.Intn(5000)) * time.Microsecond) // a wheel made later
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
						arm(rng.Intn(len(ws)), time.Duration(rng.Intn(6000)-1000)*time.Microsecond, spawn-1)
					}
				})
				require.NoError(t, err)
			}
			for i := 0; i < 200; i++ {
				arm(rng.Intn(len(ws)), time.Duration(rng.Intn(40000))*time.Microsecond, rng.Intn(3))
			}
			for step := 0; step < 30; step++ {
				before := clk.elapsed.Load()
				d := time.Duration(rng.Intn(5000)) * time.Microsecond
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
			r := rand.New(rand.NewSource(seed*n + int64(i) + int64(depth)*7919))
			d := time.Duration(r.Intn(3000)) * time.Microsecond
			when := clk.elapsed.Load() + int64(d)
			_, err := ws[r.Intn(len(ws))].AfterFunc(d, func() {
				if clk.elapsed.Load() < when {
					early.Add(1)
				}
				if depth == 0 {
					runs[i].Add(1)
				}
				if r.Intn(4) == 0 {
					clk.Advance(time.Duration(r.Intn(200)) * time.Microsecond)
				}
				if depth < 2 && r.Intn(3) == 0 {
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
