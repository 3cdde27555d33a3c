package shardwheel

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// manualWrapper is a Clock that is a *ManualClock to its user: a struct embedding one satisfies
// the Clock interface (its unexported method is promoted), so WithClock accepts it.
type manualWrapper struct{ *ManualClock }

// TestWithClockRejectsWrappedManualClock: WithClock accepts any Clock, but the wheel keeps time on
// a manual clock only when the Clock is a *ManualClock itself. A Clock that embeds a *ManualClock
// would be read by the wheel's contexts while its timers ran on the system clock (Advance would
// fire nothing). API.md: "A wheel built WithClock(manual) reads time only from it"; an option the
// wheel cannot honour is an error that names the option and the value's type.
func TestWithClockRejectsWrappedManualClock(t *testing.T) {
	m := NewManualClock(time.Unix(0, 0))
	_, err := New(WithClock(manualWrapper{m}), WithShards(1), WithWorkers(0))
	require.Error(t, err)
	require.Contains(t, err.Error(), "WithClock", "the error names the option")
	require.Contains(t, err.Error(), "manualWrapper", "the error names the value's type")
	// The package's own clocks are still accepted.
	w, err := New(WithClock(m), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	w.Stop()
}

// TestMaxPendingExactUnderChurn: producers on every P arm timers that never fire and stop them,
// Reset them, arm and stop Every series, Keyed keys and deadline contexts, under
// WithMaxPending(limit). live counts what the test holds: it rises only after an arm returned (the
// timer is then pending) and falls just before its Stop, so it is never above what is pending: it
// must never pass limit. Once quiet, nothing is pending, and exactly limit arms are accepted again
// (no credit lost, none made), then one refused with ErrTooManyTimers.
func TestMaxPendingExactUnderChurn(t *testing.T) {
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
	st := requireQuietBooks(t, w)
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

// TestMaxPendingCreditsBackAfterFiresAndStops: after fires (one-shot, Every runs, Keyed,
// contexts), stops, panics and Goexits, the free credits of WithMaxPending plus what is pending is
// the bound, exactly; on a quiet wheel with nothing pending, every credit is free.
func TestMaxPendingCreditsBackAfterFiresAndStops(t *testing.T) {
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
		waitUntil(t, "the books settle", func() bool {
			st := w.Stats()
			return st.Queued == 0 && st.Scheduled == st.Fired+st.Stopped+uint64(st.Pending)
		})
		require.Equal(t, int64(limit), freeCredits(w)+int64(w.Len()), "%+v", w.Stats())
	}
	for _, ev := range evs {
		require.True(t, ev.Stop())
	}
	require.Zero(t, w.Len())
	require.Equal(t, int64(limit), freeCredits(w))
	requireQuietBooks(t, w)
}

// TestMaxPendingErrorNamesLimit: WithMaxPending(n): n timers are accepted; past that every
// scheduling call (Every included) returns an ErrTooManyTimers that names the limit, schedules
// nothing and counts in Rejected. A stopped timer frees its place, and so does one whose callback
// has started: that callback may schedule in its place.
func TestMaxPendingErrorNamesLimit(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(3), WithMaxPending(3))
	var inner []error
	ran := 0
	var tms []Timer
	for i := 0; i < 3; i++ {
		tm, err := w.AfterFunc(time.Millisecond, func() {
			ran++
			_, err := w.AfterFunc(time.Hour, func() {})
			inner = append(inner, err)
		})
		require.NoError(t, err)
		tms = append(tms, tm)
	}
	for _, f := range []func() error{
		func() error { _, err := w.AfterFunc(time.Hour, func() {}); return err },
		func() error { _, err := w.AfterFuncArg(time.Hour, func(any) {}, nil); return err },
		func() error { _, err := w.Every(time.Hour, func() {}); return err },
	} {
		err := f()
		require.ErrorIs(t, err, ErrTooManyTimers)
		require.True(t, strings.Contains(err.Error(), "WithMaxPending(3)"), "%v", err)
	}
	require.Equal(t, 3, w.Len(), "a refused call schedules nothing")
	require.EqualValues(t, 3, w.Stats().Rejected)
	require.True(t, tms[0].Stop())
	_, err := w.Every(time.Hour, func() {})
	require.NoError(t, err, "a stopped timer frees its place")
	clk.Advance(time.Millisecond)
	require.Equal(t, 2, ran)
	require.Equal(t, []error{nil, nil}, inner, "a callback that started schedules in its own place")
	require.Equal(t, 3, w.Len())
	requireBooks(t, w)
}

// TestHugeTickFiresAtExactDeadline: WithTick is the width of a bucket, and a timer never starts
// before the call plus d: with a one-hour tick, a 1ms timer fires at 1ms, not before, and is not
// late against its deadline rounded up to the tick.
func TestHugeTickFiresAtExactDeadline(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1), WithTick(time.Hour))
	ran := 0
	_, err := w.AfterFunc(time.Millisecond, func() { ran++ })
	require.NoError(t, err)
	clk.Advance(time.Millisecond - 1)
	require.Zero(t, ran)
	clk.Advance(1)
	require.Equal(t, 1, ran)
	require.Equal(t, uint64(1), w.Stats().Lateness.Buckets[0])
}

// TestMaxDelayFiresAtEndOfTimeNotBefore: "Any d up to math.MaxInt64 is accepted and fires at its
// time": with the clock already moved, AfterFunc(math.MaxInt64) does not fire one nanosecond
// before the end of time, and fires there.
func TestMaxDelayFiresAtEndOfTimeNotBefore(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(2))
	clk.Advance(time.Hour)
	ran := 0
	_, err := w.AfterFunc(math.MaxInt64, func() { ran++ })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64 - time.Hour - 1)
	require.Zero(t, ran)
	require.Equal(t, 1, w.Len())
	clk.Advance(1)
	require.Equal(t, 1, ran)
	requireBooks(t, w)
}

// TestArmStopResetAllocateNothing: API.md, "Scheduling": in steady state, AfterFuncArg followed by
// Stop allocates nothing, on any goroutine (with a pointer as arg and one func value), and neither
// does Timer.Reset; on the system clock and on a manual one. Each goroutine warms its shard up
// first (steady state), then measures.
func TestArmStopResetAllocateNothing(t *testing.T) {
	for _, manual := range []bool{false, true} {
		var w *Wheel
		if manual {
			w, _ = newManualWheel(t, WithShards(4), WithWorkers(2))
		} else {
			var err error
			w, err = New(WithShards(4), WithWorkers(2))
			require.NoError(t, err)
		}
		type payload struct{ n int }
		p := &payload{}
		f := func(arg any) { arg.(*payload).n++ }
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20000; i++ { // warm up this goroutine's shard
					tm, _ := w.AfterFuncArg(time.Hour, f, p)
					tm.Stop()
				}
				pair := testing.AllocsPerRun(2000, func() {
					tm, err := w.AfterFuncArg(time.Hour, f, p)
					if err != nil {
						panic(err)
					}
					if !tm.Stop() {
						panic("Stop reported false")
					}
				})
				tm, _ := w.AfterFuncArg(time.Hour, f, p)
				reset := testing.AllocsPerRun(2000, func() {
					if !tm.Reset(time.Hour) {
						panic("Reset reported false")
					}
				})
				tm.Stop()
				if pair != 0 || reset != 0 {
					t.Errorf("manual=%v: AfterFuncArg+Stop %.2f allocs, Reset %.2f allocs", manual, pair, reset)
				}
			}()
		}
		wg.Wait()
		require.Zero(t, w.Stop())
		require.Zero(t, p.n)
	}
}
