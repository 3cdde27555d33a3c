package shardwheel_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keyedRig is a Keyed[string, int] on a manual clock, callbacks on the advancing goroutine, that
// records what fired.
type keyedRig struct {
	w     *sw.Wheel
	clock *sw.ManualClock
	k     *sw.Keyed[string, int]

	mu    sync.Mutex
	fired []string // "key=value", in order
}

func newKeyedRig(t *testing.T, opts ...sw.Option) *keyedRig {
	r := &keyedRig{clock: sw.NewManualClock(time.Now())}
	w, err := sw.New(append([]sw.Option{sw.WithClock(r.clock), sw.WithWorkers(0)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	r.w = w
	r.k = sw.NewKeyed(w, func(key string, value int) {
		r.mu.Lock()
		r.fired = append(r.fired, fmt.Sprintf("%s=%d", key, value))
		r.mu.Unlock()
	})
	return r
}

// takeFired returns what fired since the last call.
func (r *keyedRig) takeFired() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.fired
	r.fired = nil
	return f
}

// requireFiredAt advances by d and requires exactly want to have fired meanwhile.
func (r *keyedRig) requireFiredAt(t *testing.T, d time.Duration, want ...string) {
	t.Helper()
	r.clock.Advance(d)
	got := r.takeFired()
	if len(want) == 0 {
		require.Empty(t, got)
		return
	}
	require.Equal(t, want, got)
}

// TestKeyedSetFiresOnceThenAbsent: a Set key fires once, with its value, at its delay and not
// before, and is then absent (Move and Remove report false); a Set after the fire arms it again.
func TestKeyedSetFiresOnceThenAbsent(t *testing.T) {
	r := newKeyedRig(t)
	require.NoError(t, r.k.Set("a", 1, 10*time.Second))
	require.NoError(t, r.k.Set("b", 2, 20*time.Second))
	require.Equal(t, 2, r.k.Len())
	require.Equal(t, 2, r.w.Len())
	r.requireFiredAt(t, 10*time.Second-time.Millisecond)
	r.requireFiredAt(t, time.Millisecond, "a=1")
	require.Equal(t, 1, r.k.Len())
	require.False(t, r.k.Move("a", time.Second), "a fired: absent")
	require.False(t, r.k.Remove("a"))
	r.requireFiredAt(t, 10*time.Second, "b=2")
	r.requireFiredAt(t, time.Hour)
	require.Equal(t, 0, r.k.Len())
	require.Equal(t, 0, r.w.Len())

	// A new arming after the fire fires again.
	require.NoError(t, r.k.Set("a", 3, time.Second))
	r.requireFiredAt(t, time.Second, "a=3")
}

// TestKeyedSetDueNow: a delay of zero or less fires at the next Advance, as AfterFunc's does.
func TestKeyedSetDueNow(t *testing.T) {
	r := newKeyedRig(t)
	require.NoError(t, r.k.Set("a", 1, 0))
	require.NoError(t, r.k.Set("b", 2, -time.Second))
	r.clock.Advance(0)
	require.ElementsMatch(t, []string{"a=1", "b=2"}, r.takeFired())
	require.Equal(t, 0, r.k.Len())
}

// TestKeyedSetReArmsWithLatestValue: a Set of an armed key re-arms it, earlier or later, with the
// new value: the key fires once, at the latest Set's delay, with its value, and one timer stays.
func TestKeyedSetReArmsWithLatestValue(t *testing.T) {
	r := newKeyedRig(t)
	require.NoError(t, r.k.Set("a", 1, 10*time.Second))
	require.NoError(t, r.k.Set("a", 2, 5*time.Second)) // earlier
	require.Equal(t, 1, r.k.Len())
	require.Equal(t, 1, r.w.Len(), "the displaced arming's timer is stopped")
	r.requireFiredAt(t, 5*time.Second, "a=2")
	r.requireFiredAt(t, time.Hour)

	require.NoError(t, r.k.Set("a", 3, 5*time.Second))
	require.NoError(t, r.k.Set("a", 4, 10*time.Second)) // later
	r.requireFiredAt(t, 5*time.Second)
	r.requireFiredAt(t, 5*time.Second, "a=4")
	require.Equal(t, 0, r.w.Len())
}

// TestKeyedMove: Move re-arms an armed key, later or earlier, keeping its value, and reports
// true; it reports false for an absent key, also once the key has fired.
func TestKeyedMove(t *testing.T) {
	r := newKeyedRig(t)
	require.False(t, r.k.Move("a", time.Second), "absent")
	require.NoError(t, r.k.Set("a", 1, 10*time.Second))
	r.requireFiredAt(t, 5*time.Second)
	require.True(t, r.k.Move("a", 10*time.Second))
	r.requireFiredAt(t, 10*time.Second-time.Millisecond)
	require.True(t, r.k.Move("a", time.Second)) // earlier than before
	r.requireFiredAt(t, time.Second, "a=1")
	require.False(t, r.k.Move("a", time.Second))
	require.Equal(t, 0, r.w.Len())
}

// TestKeyedRemove: Remove disarms an armed key and reports true, stops its timer at once, and
// nothing fires; it reports false for an absent key.
func TestKeyedRemove(t *testing.T) {
	r := newKeyedRig(t)
	require.False(t, r.k.Remove("a"))
	require.NoError(t, r.k.Set("a", 1, time.Second))
	require.True(t, r.k.Remove("a"))
	require.False(t, r.k.Remove("a"))
	require.Equal(t, 0, r.k.Len())
	require.Equal(t, 0, r.w.Len(), "Remove stops the timer at once")
	r.requireFiredAt(t, time.Hour)
}

// TestKeyedDrain: Drain disarms every key, calls fn with each key and its latest value, reports
// how many, and stops every timer: nothing fires afterwards. A nil fn only disarms.
func TestKeyedDrain(t *testing.T) {
	r := newKeyedRig(t)
	require.Equal(t, 0, r.k.Drain(nil))
	for i, key := range []string{"a", "b", "c"} {
		require.NoError(t, r.k.Set(key, i, time.Duration(i+1)*time.Second))
	}
	require.NoError(t, r.k.Set("b", 10, time.Second))
	var drained []string
	n := r.k.Drain(func(key string, value int) { drained = append(drained, fmt.Sprintf("%s=%d", key, value)) })
	require.Equal(t, 3, n)
	require.ElementsMatch(t, []string{"a=0", "b=10", "c=2"}, drained)
	require.Equal(t, 0, r.k.Len())
	require.Equal(t, 0, r.w.Len())
	r.requireFiredAt(t, time.Hour)

	require.NoError(t, r.k.Set("d", 1, time.Second))
	require.Equal(t, 1, r.k.Drain(nil))
	r.requireFiredAt(t, time.Hour)
}

// TestKeyedDrainAfterWheelStop: a key whose timer Wheel.Stop dropped never fires but stays armed,
// and Drain collects it.
func TestKeyedDrainAfterWheelStop(t *testing.T) {
	r := newKeyedRig(t)
	require.NoError(t, r.k.Set("a", 1, time.Second))
	require.Equal(t, 1, r.w.Stop())
	r.requireFiredAt(t, time.Hour)
	var got []string
	require.Equal(t, 1, r.k.Drain(func(key string, value int) { got = append(got, key) }))
	require.Equal(t, []string{"a"}, got)
}

// TestKeyedErrors: past WithMaxPending, Set of a new key reports ErrTooManyTimers and changes
// nothing, while Move and Remove of armed keys still work; after Wheel.Stop, Set reports
// ErrClosed; NewKeyed panics on a nil func or a nil *Wheel.
func TestKeyedErrors(t *testing.T) {
	r := newKeyedRig(t, sw.WithMaxPending(2))
	require.NoError(t, r.k.Set("a", 1, time.Second))
	require.NoError(t, r.k.Set("b", 2, time.Second))
	require.ErrorIs(t, r.k.Set("c", 3, time.Second), sw.ErrTooManyTimers)
	require.Equal(t, 2, r.k.Len(), "a failed Set changes nothing")
	require.True(t, r.k.Move("a", 2*time.Second), "Move needs no new timer")
	require.True(t, r.k.Remove("b"))
	require.NoError(t, r.k.Set("c", 3, time.Second))

	r.w.Stop()
	require.ErrorIs(t, r.k.Set("d", 4, time.Second), sw.ErrClosed)
	require.Equal(t, 2, r.k.Len())

	require.PanicsWithValue(t, "shardwheel: NewKeyed: nil fire func", func() {
		sw.NewKeyed[string, int](r.w, nil)
	})
	require.PanicsWithValue(t, "shardwheel: NewKeyed: nil *Wheel", func() {
		sw.NewKeyed(nil, func(string, int) {})
	})
}

// TestKeyedMoveAllocatesNothing: Move of an armed key, the keep-alive's hot path, allocates
// nothing, and the key still fires once at the last Move's delay.
func TestKeyedMoveAllocatesNothing(t *testing.T) {
	r := newKeyedRig(t)
	require.NoError(t, r.k.Set("conn-1", 1, time.Minute))
	allocs := testing.AllocsPerRun(10_000, func() {
		if !r.k.Move("conn-1", time.Minute) {
			t.Fatal("Move of an armed key reported false")
		}
	})
	require.Zero(t, allocs)
	r.requireFiredAt(t, time.Minute, "conn-1=1")
}

// TestKeyedSetAllocatesNothing: Set of an armed key re-arms it in place, with its new value,
// and allocates nothing (an idle timeout re-armed with a new value on every packet); it needs no
// room under WithMaxPending either.
func TestKeyedSetAllocatesNothing(t *testing.T) {
	r := newKeyedRig(t, sw.WithMaxPending(1))
	require.NoError(t, r.k.Set("conn-1", 0, time.Minute))
	v := 0
	allocs := testing.AllocsPerRun(10_000, func() {
		v++
		if err := r.k.Set("conn-1", v, time.Minute); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
	require.Equal(t, 1, r.w.Len(), "one timer, re-armed in place")
	require.NoError(t, r.k.Set("conn-1", -1, 2*time.Minute), "an armed key needs no room at WithMaxPending")
	r.requireFiredAt(t, time.Minute)
	r.requireFiredAt(t, time.Minute, "conn-1=-1")
	require.Zero(t, r.k.Len())
	requireBalance(t, r.w)
}

// TestKeyedSetWhileQueuedReplacesValue: API.md: "A key fires at most once per arming, with the
// value of its latest Set". A Set that comes while the key's callback is due and waits in the
// queue (taken from the wheel, behind a blocker on the only worker) re-arms the key: the old
// arming never fires, and the new value fires once, at its own time. The key is then absent.
func TestKeyedSetWhileQueuedReplacesValue(t *testing.T) {
	r := newKeyedRig(t, sw.WithWorkers(1), sw.WithShards(1))
	in, release := make(chan struct{}), make(chan struct{})
	_, err := r.w.AfterFunc(time.Millisecond, func() { close(in); <-release })
	require.NoError(t, err)
	require.NoError(t, r.k.Set("k", 1, time.Millisecond))
	r.clock.Advance(time.Millisecond) // the blocker runs; the key's callback waits in the queue
	<-in
	require.NoError(t, r.k.Set("k", 2, 5*time.Millisecond))
	require.Equal(t, 1, r.k.Len())
	close(release)
	require.Eventually(t, func() bool { return r.w.Stats().Queued == 0 }, 5*time.Second, time.Millisecond)
	require.Empty(t, r.takeFired(), "the displaced arming fired")
	r.clock.Advance(5 * time.Millisecond)
	require.Eventually(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.fired) == 1 },
		5*time.Second, time.Millisecond)
	require.Zero(t, r.w.Stop())
	require.Equal(t, []string{"k=2"}, r.takeFired())
	require.Zero(t, r.k.Len())
	require.False(t, r.k.Move("k", time.Second))
	require.False(t, r.k.Remove("k"))
	requireBalance(t, r.w)
	require.Equal(t, r.w.Stats().Fired, r.w.Stats().Lateness.Count())
}

// firingWheel returns a wheel whose timers come due while a test runs: on a manual clock
// (clock "manual") that another goroutine advances by step, over and over, until stopAdvancing
// is called (which waits for it); or on the system clock (mc nil) with workers and tick, where
// stopAdvancing does nothing. The wheel is stopped when the test ends.
func firingWheel(t *testing.T, clock string, step time.Duration, workers int, tick time.Duration) (w *sw.Wheel, mc *sw.ManualClock, stopAdvancing func()) {
	t.Helper()
	var err error
	if clock == "manual" {
		mc = sw.NewManualClock(time.Now())
		w, err = sw.New(sw.WithClock(mc), sw.WithWorkers(0))
	} else {
		w, err = sw.New(sw.WithWorkers(workers), sw.WithTick(tick))
	}
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	if mc == nil {
		return w, nil, func() {}
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				mc.Advance(step)
			}
		}
	}()
	return w, mc, func() { close(stop); <-done }
}

// TestKeyedSetNeverLost: one goroutine Sets the same key over and over, due at once or soon,
// while its timer keeps firing (the manual clock advanced by another goroutine, or the system
// clock with workers). Each Set either re-arms the arming in place or arms a new one; either way
// none is lost: the value of the last Set fires, after every other, and no value fires twice.
func TestKeyedSetNeverLost(t *testing.T) {
	for _, clock := range []string{"manual", "system"} {
		t.Run("clock="+clock, func(t *testing.T) {
			// One worker on the system clock, so that callbacks run one at a time and the order
			// of the appends below is the order of the fire decisions. With more, a displaced
			// arming's callback that decided to fire can append after the next arming's callback.
			w, mc, stopAdvancing := firingWheel(t, clock, 50*time.Microsecond, 1, 50*time.Microsecond)
			var mu sync.Mutex
			var fired []int
			k := sw.NewKeyed(w, func(_ string, value int) {
				mu.Lock()
				fired = append(fired, value)
				mu.Unlock()
			})
			n := 20_000
			if testing.Short() {
				n = 2_000
			}
			for i := 1; i <= n; i++ {
				require.NoError(t, k.Set("k", i, time.Duration(i%3)*50*time.Microsecond))
			}
			stopAdvancing()
			if mc != nil {
				mc.Advance(time.Second)
			}
			require.Eventually(t, func() bool { return k.Len() == 0 && w.Len() == 0 }, time.Minute, time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			require.NotEmpty(t, fired)
			require.Equal(t, n, fired[len(fired)-1], "the last Set's value fires last")
			seen := map[int]bool{}
			for i, v := range fired {
				require.False(t, seen[v], "value %d fired twice", v)
				seen[v] = true
				if i > 0 {
					require.Greater(t, v, fired[i-1], "an older value fired after a newer one")
				}
			}
			t.Logf("%d Sets, %d fires", n, len(fired))
		})
	}
}

// TestKeyedStorm runs the keep-alive storm: goroutines Set, Move and Remove the same few keys at
// once while time stands still. Afterwards each key is absent or armed once: the wheel holds one
// timer per armed key (every displaced arming was stopped), and advancing fires each armed key
// exactly once, with a value that a Set gave it.
func TestKeyedStorm(t *testing.T) {
	r := newKeyedRig(t)
	const keys = 8
	ops := 20_000
	if testing.Short() {
		ops = 2_000
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range ops {
				key := fmt.Sprint("k", rng.IntN(keys))
				switch rng.IntN(4) {
				case 0, 1:
					assert.NoError(t, r.k.Set(key, g*ops+i, time.Duration(1+rng.IntN(60))*time.Second))
				case 2:
					r.k.Move(key, time.Duration(1+rng.IntN(60))*time.Second)
				case 3:
					if rng.IntN(8) == 0 {
						r.k.Remove(key)
					}
				}
			}
		}()
	}
	wg.Wait()
	armed := r.k.Len()
	require.Equal(t, armed, r.w.Len(), "one pending timer per armed key")
	r.clock.Advance(time.Minute)
	fired := r.takeFired()
	require.Len(t, fired, armed)
	seen := map[string]bool{}
	for _, f := range fired {
		var key string
		var value int
		_, err := fmt.Sscanf(f, "%2s=%d", &key, &value)
		require.NoError(t, err)
		require.False(t, seen[key], "key %s fired twice", key)
		seen[key] = true
	}
	require.Equal(t, 0, r.k.Len())
	require.Equal(t, 0, r.w.Len())
}

// TestKeyedStormWhileFiring races Set, Move and Remove with timers coming due, on the manual
// clock advanced by another goroutine and on the system clock with workers. Every Set carries a
// unique value: none may fire twice, and at the end nothing is armed and no timer is left.
func TestKeyedStormWhileFiring(t *testing.T) {
	for _, clock := range []string{"manual", "system"} {
		t.Run("clock="+clock, func(t *testing.T) {
			w, mc, stopAdvancing := firingWheel(t, clock, time.Millisecond, 2, 100*time.Microsecond)
			var mu sync.Mutex
			fired := map[int]int{}
			k := sw.NewKeyed(w, func(key string, value int) {
				mu.Lock()
				fired[value]++
				mu.Unlock()
			})
			ops := 5_000
			if testing.Short() {
				ops = 500
			}
			var sets atomic.Int64
			var storm sync.WaitGroup
			for g := range 4 {
				storm.Add(1)
				go func() {
					defer storm.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 2))
					for i := range ops {
						key := fmt.Sprint("k", rng.IntN(4))
						d := time.Duration(rng.IntN(3)) * time.Millisecond
						switch rng.IntN(3) {
						case 0:
							assert.NoError(t, k.Set(key, g*ops+i, d))
							sets.Add(1)
						case 1:
							k.Move(key, d)
						case 2:
							k.Remove(key)
						}
					}
				}()
			}
			storm.Wait()
			stopAdvancing()
			if mc != nil {
				mc.Advance(time.Hour)
			}
			for deadline := time.Now().Add(time.Minute); k.Len() != 0 || w.Len() != 0; {
				require.False(t, time.Now().After(deadline), "Len %d, wheel Len %d", k.Len(), w.Len())
				time.Sleep(time.Millisecond)
			}
			mu.Lock()
			defer mu.Unlock()
			for value, n := range fired {
				require.Equal(t, 1, n, "value %d fired %d times", value, n)
			}
			require.LessOrEqual(t, int64(len(fired)), sets.Load())
		})
	}
}
