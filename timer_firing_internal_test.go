package shardwheel

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Timer.Stop of a timer that has fired but whose callback has not started: it waits for a worker,
// or behind another callback (firing -> letting go -> stopped, or passed: Timer.stopFiring).

// timerFiringPair is the argument of one of two timers due in the same tick: whichever runs first
// stops the other (which the shard has already moved to firing) and looks whether the other's
// argument is still kept reachable by the wheel.
type timerFiringPair struct {
	p      *ctxPayload
	other  Timer
	otherP weak.Pointer[ctxPayload]
	out    *timerFiringPairOut
}

// timerFiringPairOut is what the first of a timerFiringPair to run saw.
type timerFiringPairOut struct {
	runs      int
	stopped   bool
	collected bool
}

// TestStopOfFiringTimerLetsGoOfArg: README, "Prompt release": "When Timer.Stop (or a context's
// cancel, or Keyed.Remove) reports true, the wheel no longer keeps the callback or its argument
// reachable", also for a timer that the shard has fired (firing) but whose callback has not
// started: it waits behind the callbacks ahead of it in its batch, which may be slow or block, and
// its Stop lets go of the argument at once (Timer.stopFiring), not when the worker comes to the
// entry.
//
// Deterministic: one shard, a manual clock, WithWorkers(0); two timers due in the same tick; the
// first to run stops the other (true) and collects garbage: the other's argument is gone.
func TestStopOfFiringTimerLetsGoOfArg(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()

	out := &timerFiringPairOut{}
	f := func(arg any) {
		pr := arg.(*timerFiringPair)
		pr.out.runs++
		pr.out.stopped = pr.other.Stop()
		pr.out.collected = collected(pr.otherP)
	}
	func() { // the payloads are made in here so that no frame of the test keeps them
		a := &timerFiringPair{p: new(ctxPayload), out: out}
		b := &timerFiringPair{p: new(ctxPayload), out: out}
		ta, err := w.AfterFuncArg(time.Millisecond, f, a)
		require.NoError(t, err)
		tb, err := w.AfterFuncArg(time.Millisecond, f, b)
		require.NoError(t, err)
		a.other, a.otherP = tb, weak.Make(b.p)
		b.other, b.otherP = ta, weak.Make(a.p)
	}()
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, out.runs, "the first callback stops the other")
	require.True(t, out.stopped, "Stop of a fired, not yet started, timer reports true")
	require.True(t, out.collected, "Stop reported true, yet the wheel keeps the stopped timer's argument reachable")
}

// TestStopFiringPausedWorkerPasses: a Stop of a fired, not yet started timer has moved the entry to
// letting go and is paused there, before it lets go of the callback, when the worker comes to the
// entry (an interleaving a schedule rarely shows, driven here step by step). The worker does not
// start the callback, does not wait, and leaves the entry to the Stop, which then frees it: the
// slab hands the entry out again once, and nothing of the stopped timer is kept.
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
		rng := rand.New(rand.NewPCG(uint64(int64(round)), 0))
		seeds := make([]int64, n)
		for i := range seeds {
			seeds[i] = rng.Int64()
		}
		mu.Lock()
		for i := 0; i < n; i++ {
			i := i
			tms[i], err = w.AfterFunc(time.Duration(1+i%3)*time.Millisecond, func() {
				ran[i].Add(1)
				r := rand.New(rand.NewPCG(uint64(seeds[i]), 0))
				for k := 0; k < 3; k++ {
					j := r.IntN(n)
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
			r := rand.New(rand.NewPCG(uint64(int64(round)+100), 0))
			for k := 0; k < n/2; k++ {
				j := r.IntN(n)
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
		// The storm's last callbacks may still wait in a worker's task behind the fresh ones
		// (two workers; a fired timer counts as pending until its callback starts).
		require.Eventually(t, func() bool { return w.Len() == 0 }, 5*time.Second, time.Millisecond)
	}
}

// TestStopFiringStormWithEveryAndResets: Every and one-shot timers that come due together are
// stopped (from their own callbacks, from each other's, from outside), reset, and stopped again
// through handles that may be stale, while the manual clock advances on several workers. Each
// one-shot ran or had one Stop report true, never both; each Every's series was ended by exactly
// one Stop, after which no run starts but one already in progress; the books balance; and the slab
// then hands out each entry to one timer at a time.
func TestStopFiringStormWithEveryAndResets(t *testing.T) {
	defer goleak.VerifyNone(t)
	for round := 0; round < 3; round++ {
		clk := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clk), WithShards(2), WithWorkers(3))
		require.NoError(t, err)
		const n = 1500
		tms := make([]Timer, n)
		var ran, stopped, ranAtStop [n]atomic.Int32
		var armed atomic.Bool
		for i := 0; i < n; i++ {
			i := i
			stopOther := func() {
				if !armed.Load() {
					return
				}
				j := (i*7 + 3) % n
				if tms[j].Stop() {
					ranAtStop[j].Store(ran[j].Load())
					stopped[j].Add(1)
				}
			}
			if i%3 == 0 {
				tms[i], err = w.Every(time.Millisecond, func() {
					ran[i].Add(1)
					stopOther()
				})
			} else {
				tms[i], err = w.AfterFunc(time.Duration(1+i%2)*time.Millisecond, func() {
					ran[i].Add(1)
					stopOther()
				})
			}
			require.NoError(t, err)
		}
		armed.Store(true)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for k := 0; k < n; k++ {
				j := (k * 13) % n
				if k%5 == 0 {
					tms[j].Reset(time.Millisecond)
				}
				if tms[j].Stop() {
					ranAtStop[j].Store(ran[j].Load())
					stopped[j].Add(1)
				}
			}
		}()
		for k := 0; k < 6; k++ {
			clk.Advance(time.Millisecond)
		}
		<-done
		for i := 0; i < n; i += 3 { // end every series still going
			if tms[i].Stop() {
				ranAtStop[i].Store(ran[i].Load())
				stopped[i].Add(1)
			}
		}
		require.Eventually(t, func() bool { return w.Stats().Queued == 0 }, 5*time.Second, time.Millisecond)
		clk.Advance(time.Millisecond)
		require.Eventually(t, func() bool { return w.Stats().Queued == 0 }, 5*time.Second, time.Millisecond)
		// The slab after the storm: every new timer runs once.
		requireFreshTimersRunOnce(t, w, clk, n)
		require.Zero(t, w.Stop())
		for i := 0; i < n; i++ {
			r, s := ran[i].Load(), stopped[i].Load()
			require.LessOrEqual(t, s, int32(1), "timer %d stopped twice", i)
			if i%3 == 0 {
				require.Equal(t, int32(1), s, "series %d never stopped", i)
				// A run in progress at the Stop (started by the wheel, its count not yet
				// taken) may count after it; no other may start.
				require.LessOrEqual(t, ran[i].Load(), ranAtStop[i].Load()+1, "series %d ran after its Stop", i)
			} else {
				require.Equal(t, int32(1), r+s, "timer %d: ran %d, stopped %d", i, r, s)
			}
		}
		st := w.Stats()
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending))
		require.Equal(t, st.Fired, st.Lateness.Count())
		require.Zero(t, st.Queued)
	}
}
