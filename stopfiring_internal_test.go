package shardwheel

import (
	"math/rand"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// A Stop of a fired timer whose callback has not started (Timer.stopFiring): it lets go of the
// callback at once (review 32), and the worker that holds the entry never waits for it.

// TestStopFiringPausedWorkerPasses drives the one interleaving a schedule rarely shows: the Stop
// has moved the entry to letting go and is paused there (before it lets go of the callback),
// and the worker comes to the entry. The worker must not start the callback, must not wait,
// and must leave the entry to the Stop, which then frees it: the slab hands the entry out again
// once, and nothing of the stopped timer is kept.
func TestStopFiringPausedWorkerPasses(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	s := w.shards[0]

	ran := false
	tm := func() Timer {
		p := new(ctxPayload)
		tm, err := w.AfterFuncArg(time.Millisecond, func(any) { ran = true }, p)
		require.NoError(t, err)
		return tm
	}()
	e := s.slab.at(tm.i)
	wp := weak.Make(e.arg.(*ctxPayload))

	// The shard fires the entry into a batch, as an advance does, without running it.
	s.mu.Lock()
	s.advanceLocked(int64(time.Millisecond), 0)
	refs := append([]ref(nil), s.fired...)
	clear(s.fired)
	s.fired = s.fired[:0]
	s.mu.Unlock()
	require.Len(t, refs, 1)
	word := e.state.Load()
	require.True(t, isState(word, stFiring))

	// Stop's first step (its CAS and its counts), then the pause.
	require.True(t, e.state.CompareAndSwap(word, withState(word, stLetGo)))
	s.stopped.Inc()
	s.returnCredit()

	// The worker comes to the entry meanwhile: it passes, without starting the callback.
	var fb freeBatch
	lc := lateClock{w: w}
	w.runEntry(refs[0], w.pool.advancerSlot(), &lc, &fb)
	fb.flush()
	require.False(t, ran, "a stopped timer's callback started")
	require.True(t, isState(e.state.Load(), stPassed), "the worker left the entry to the Stop")
	require.False(t, tm.Stop(), "a second Stop reports false while the first lets go")
	require.False(t, tm.Reset(time.Second), "Reset of a stopped timer")

	// The Stop goes on: it lets go of the callback, finds the worker passed, and frees the entry.
	tm.stopFiring(e, word)
	require.True(t, isState(e.state.Load(), stStopped))
	require.Nil(t, e.f)
	require.Nil(t, e.arg)
	runtime.GC()
	runtime.GC()
	require.Nil(t, wp.Value(), "the stopped timer's argument is kept")
	require.False(t, tm.Stop())

	// The entry went back to the slab once: the next arming takes it (last in, first out), the
	// one after takes another.
	t1, err := w.AfterFunc(time.Millisecond, func() {})
	require.NoError(t, err)
	t2, err := w.AfterFunc(time.Millisecond, func() {})
	require.NoError(t, err)
	require.Equal(t, tm.i, t1.i)
	require.NotEqual(t, t1.i, t2.i)
	clk.Advance(2 * time.Millisecond)
	st := w.Stats()
	require.Equal(t, uint64(3), st.Scheduled)
	require.Equal(t, uint64(2), st.Fired)
	require.Equal(t, uint64(1), st.Stopped)
	require.Zero(t, st.Pending)
	require.False(t, ran)
}

// TestStopFiringStorm: timers that come due together stop one another from their callbacks, and a
// goroutine outside stops them too, on several workers. Each timer either ran or had exactly one
// Stop report true, never both; the books balance; and the slab, whose entries the Stops and the
// workers freed, hands out each entry to one timer at a time afterwards (every later timer runs
// once).
func TestStopFiringStorm(t *testing.T) {
	defer goleak.VerifyNone(t)
	for round := 0; round < 4; round++ {
		clk := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clk), WithShards(2), WithWorkers(3))
		require.NoError(t, err)
		const n = 3000
		tms := make([]Timer, n)
		var ran, stopped [n]atomic.Int32
		var mu sync.Mutex // guards tms while they are armed
		rng := rand.New(rand.NewSource(int64(round)))
		seeds := make([]int64, n)
		for i := range seeds {
			seeds[i] = rng.Int63()
		}
		mu.Lock()
		for i := 0; i < n; i++ {
			i := i
			tms[i], err = w.AfterFunc(time.Duration(1+i%3)*time.Millisecond, func() {
				ran[i].Add(1)
				r := rand.New(rand.NewSource(seeds[i]))
				for k := 0; k < 3; k++ {
					j := r.Intn(n)
					if tms[j].Stop() {
						stopped[j].Add(1)
					}
				}
			})
			require.NoError(t, err)
		}
		mu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			r := rand.New(rand.NewSource(int64(round) + 100))
			for k := 0; k < n/2; k++ {
				j := r.Intn(n)
				if tms[j].Stop() {
					stopped[j].Add(1)
				}
			}
		}()
		clk.Advance(3 * time.Millisecond)
		<-done
		require.Eventually(t, func() bool { return w.Stats().Queued == 0 }, 5*time.Second, time.Millisecond)
		w.Stop() // waits for the callbacks
		var fired, stops int
		for i := 0; i < n; i++ {
			r, s := ran[i].Load(), stopped[i].Load()
			require.True(t, r+s == 1, "timer %d: ran %d times, stopped %d times", i, r, s)
			fired += int(r)
			stops += int(s)
		}
		st := w.Stats()
		require.Equal(t, uint64(fired), st.Fired)
		require.Equal(t, uint64(stops), st.Stopped)
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending))
	}
}

// TestStopFiringSlabAfterStorm: after a storm of Stops of fired timers (freed by the Stops or by
// the workers), a wheel that goes on arming reuses the freed entries one owner at a time: every
// timer armed afterwards runs exactly once.
func TestStopFiringSlabAfterStorm(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(2))
	require.NoError(t, err)
	defer w.Stop()
	for round := 0; round < 20; round++ {
		const n = 500
		tms := make([]Timer, n)
		ready := make(chan struct{})
		for i := 0; i < n; i++ {
			i := i
			tms[i], err = w.AfterFunc(time.Millisecond, func() {
				<-ready
				tms[(i+1)%n].Stop()
			})
			require.NoError(t, err)
		}
		close(ready)
		clk.Advance(time.Millisecond)
		// What the storm freed is armed again at once: a doubly freed entry would be handed to
		// two of these, and one of them would be lost or run twice.
		requireFreshTimersRunOnce(t, w, clk, n)
		// The storm's last callbacks may still wait in a worker's chunk behind the fresh ones
		// (two workers; a fired timer counts as pending until its callback starts).
		require.Eventually(t, func() bool { return w.Len() == 0 }, 5*time.Second, time.Millisecond)
	}
}

// requireFreshTimersRunOnce arms n timers due in 1ms on w, advances clk past them and requires
// that each runs exactly once: after a storm of Stops and frees, a doubly freed entry would be
// handed to two of them, and one would be lost or run twice.
func requireFreshTimersRunOnce(t *testing.T, w *Wheel, clk *ManualClock, n int) {
	t.Helper()
	runs := make([]atomic.Int32, n)
	for i := range runs {
		_, err := w.AfterFunc(time.Millisecond, func() { runs[i].Add(1) })
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	require.Eventually(t, func() bool {
		for i := range runs {
			if runs[i].Load() != 1 {
				return false
			}
		}
		return true
	}, 5*time.Second, time.Millisecond)
}
