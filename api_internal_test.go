package shardwheel

import (
	"context"
	"errors"
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

// TestReview27WithClockWrappedManual (bug, bad input): WithClock accepts any Clock, but the wheel
// recognises a manual clock only by the dynamic type *ManualClock (shardwheel.go:160; WithClock,
// options.go:204-207). A Clock that embeds a *ManualClock is accepted without an error, and the
// wheel then keeps time on the system clock (nanos, clock.go:115) while its contexts read Now from
// the wrapper (context.go:62, 80, 478):
// Advance never fires its timers, timers fire on the real clock while the manual one stands still,
// and a context's Deadline is on the manual clock's scale while its timer runs on the real one.
// API.md: "A wheel built WithClock(manual) reads time only from it"; an option the wheel cannot
// honour must be an error naming it.
func TestReview27WithClockWrappedManual(t *testing.T) {
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

// TestReview27OptionErrors (pin): every invalid option value fails New with a nil Wheel and an
// error that names the option and the value, in API.md's form.
func TestReview27OptionErrors(t *testing.T) {
	for _, c := range []struct {
		opt  Option
		want string
	}{
		{WithTick(0), "shardwheel: WithTick(0): tick must be positive"},
		{WithTick(-time.Second), "shardwheel: WithTick(-1s): tick must be positive"},
		{WithShards(0), "shardwheel: WithShards(0): "},
		{WithShards(maxShards + 1), "shardwheel: WithShards(4097): "},
		{WithWorkers(-1), "shardwheel: WithWorkers(-1): "},
		{WithQueueSize(0), "shardwheel: WithQueueSize(0): "},
		{WithRingSize(0), "shardwheel: WithRingSize(0): "},
		{WithRingSize(-5), "shardwheel: WithRingSize(-5): "},
		{WithMaxPending(-1), "shardwheel: WithMaxPending(-1): "},
		{WithFullPolicy(FullPolicy(7)), "shardwheel: WithFullPolicy(FullPolicy(7)): "},
		{WithClock(nil), "shardwheel: WithClock(nil): "},
		{WithClock((*ManualClock)(nil)), "shardwheel: WithClock((*ManualClock)(nil)): "},
		{WithPanicHandler(nil), "shardwheel: WithPanicHandler(nil): "},
	} {
		w, err := New(WithShards(1), c.opt)
		require.Nil(t, w)
		require.ErrorContains(t, err, c.want)
	}
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

// TestReview33PinMaxPendingErrorNamesLimit: past WithMaxPending every scheduling call (Every
// included) returns an ErrTooManyTimers that names the limit; Stop of one frees a place.
func TestReview33PinMaxPendingErrorNamesLimit(t *testing.T) {
	w, _ := newManualWheel(t, WithWorkers(0), WithShards(2), WithMaxPending(3))
	var tms []Timer
	for i := 0; i < 3; i++ {
		tm, err := w.AfterFunc(time.Hour, func() {})
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
	require.True(t, tms[0].Stop())
	_, err := w.Every(time.Hour, func() {})
	require.NoError(t, err)
}
