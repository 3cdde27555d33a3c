package shardwheel

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// A Timer's life as a whole: handles that outlive their timer, and storms of arms, Stops and
// Resets after which every entry of the slab serves one timer at a time. The helpers here serve
// the timer_*_internal_test.go files too.

// timerManualWheel starts a wheel on a fresh manual clock; the caller stops it (before goleak
// looks).
func timerManualWheel(t *testing.T, opts ...Option) (*Wheel, *ManualClock) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(append([]Option{WithClock(clk)}, opts...)...)
	require.NoError(t, err)
	return w, clk
}

// requireFreed checks that tm's entry went back to the slab: the next arm on its shard takes it
// (the free stack is last in, first out) with the next gen.
func requireFreed(t *testing.T, w *Wheel, tm Timer) {
	t.Helper()
	next, err := w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	require.Equal(t, tm.i, next.i, "the stopped timer's entry is the next one armed")
	require.Equal(t, tm.gen+1, next.gen)
	require.True(t, next.Stop())
}

// freeStackAudit walks every shard's free stack of a quiet wheel and fails the test on a
// duplicate (an entry freed twice) or a count that does not match the slab's capacity (a leak).
func freeStackAudit(t *testing.T, w *Wheel) {
	t.Helper()
	for k, s := range w.shards {
		p := s.slab.blocks.Load()
		if p == nil {
			continue
		}
		live := 0
		for _, c := range *p {
			if c != &deadBlock {
				live++
			}
		}
		want := live*blockLen - 1
		if (*p)[0] == &deadBlock {
			want++
		}
		seen := map[uint32]bool{}
		for i := uint32(s.slab.free.Load()); i != 0; i = uint32(s.slab.at(i).when.Load()) {
			require.False(t, seen[i], "shard %d: entry %d is on the free stack twice (freed twice)", k, i)
			seen[i] = true
			st := s.slab.at(i).state.Load()
			require.False(t, isState(st, stPending) || isHeld(st) || isState(st, stStopping) || isState(st, stFiring) || isState(st, stRunning),
				"shard %d: free entry %d in state %#x", k, i, st)
			require.LessOrEqual(t, len(seen), want+1)
		}
		require.Equal(t, want, len(seen), "shard %d: free entries vs capacity (a leak if fewer)", k)
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

// TestTimerStaleHandlesDoNothing: a stale handle reports false from Stop and Reset and leaves the
// entry's next timer alone: after the timer fired and its entry went to a new timer, from inside
// its own callback, and for an Every whose entry was reused after its series ended. Inside its own
// run an Every's Reset reports false (the series is running, not waiting for a run), and its first
// Stop true.
func TestTimerStaleHandlesDoNothing(t *testing.T) {
	w, clk, _ := parkWheel(t)
	var fired []string
	var inside []bool
	var self Timer
	self, err := w.AfterFunc(time.Millisecond, func() {
		fired = append(fired, "one")
		inside = append(inside, self.Stop(), self.Reset(time.Millisecond))
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"one"}, fired)
	require.Equal(t, []bool{false, false}, inside, "Stop and Reset from inside a one-shot's callback")

	next, err := w.AfterFunc(time.Hour, func() { fired = append(fired, "next") })
	require.NoError(t, err)
	require.Equal(t, self.i, next.i, "the fired entry is reused")
	require.Equal(t, self.gen+1, next.gen)
	require.False(t, self.Reset(0))
	require.False(t, self.Stop())
	clk.Advance(time.Minute)
	require.Equal(t, []string{"one"}, fired, "the stale Reset(0) moved nothing")
	require.Equal(t, 1, w.Len())

	// An Every: Reset from inside its run reports false (the series is running, not waiting),
	// Stop reports true once; its entry then serves a new timer.
	inside = nil
	var ev Timer
	ev, err = w.Every(time.Millisecond, func() {
		fired = append(fired, "every")
		inside = append(inside, ev.Reset(time.Millisecond), ev.Stop(), ev.Stop())
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"one", "every"}, fired)
	require.Equal(t, []bool{false, true, false}, inside)
	again, err := w.AfterFunc(time.Millisecond, func() { fired = append(fired, "again") })
	require.NoError(t, err)
	require.Equal(t, ev.i, again.i)
	require.False(t, ev.Reset(time.Hour), "a stale Every handle")
	require.False(t, ev.Stop())
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"one", "every", "again"}, fired)
	require.True(t, next.Stop())
	require.Zero(t, w.Len())
	requireBalanced(t, w)
	require.NoError(t, w.Verify())
}

// TestResetStaleCommandOnRegrownBlockDoesNothing: a Reset paused after its final CAS and before its
// send (finishReset's step 4) publishes its command late. Meanwhile its timer fired, and its slab
// block was trimmed away and grown again in the same place, where the free entries start at
// genFloor: the very gen the late command carries. The command finds the entry free and does
// nothing; the stale handle's Stop and Reset do nothing either; and the entry's next owner fires
// once, at its own deadline. The late command is sent with send, as finishReset's step 4 sends it
// (no hook pauses Reset there).
func TestResetStaleCommandOnRegrownBlockDoesNothing(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := timerManualWheel(t, WithShards(1), WithWorkers(0))
	defer w.Stop()
	s := w.shards[0]

	noop := func(any) {}
	old1, err := w.AfterFuncArg(time.Millisecond, noop, nil)
	require.NoError(t, err)
	old2, err := w.AfterFuncArg(time.Millisecond, noop, nil)
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Zero(t, w.Len())
	require.Equal(t, blockBytes, w.TrimNow(), "the only block, all free, is given back")
	i1, g1 := old1.Slot()
	i2, g2 := old2.Slot()
	require.Equal(t, g1, g2)
	require.Equal(t, g1, s.slab.genFloor, "genFloor is the highest gen of the released block")

	// Re-grow: the first new timer takes i1 (grow hands out the block's first entry) with a gen
	// above the floor; i2 is free in the new block at gen genFloor == the stale handle's gen.
	var fired []string
	n1, err := w.AfterFuncArg(5*time.Millisecond, func(any) { fired = append(fired, "n1") }, nil)
	require.NoError(t, err)
	ni1, ng1 := n1.Slot()
	require.Equal(t, i1, ni1)
	require.Greater(t, ng1, g1)
	e2 := s.slab.at(i2)
	require.True(t, isGen(e2.state.Load(), g2), "the free entry sits at the floor: the stale gen")
	require.True(t, isState(e2.state.Load(), stFree))

	require.False(t, old2.Stop(), "a stale Stop on a free entry of its own gen")
	require.False(t, old2.Reset(time.Millisecond), "a stale Reset on a free entry of its own gen")
	require.False(t, old1.Stop())
	require.False(t, old1.Reset(time.Millisecond))

	// The late reset command of old2, and of old1 (whose index now serves n1), taken by the shard.
	ok, _ := s.send(i2, g2, opReset)
	require.True(t, ok)
	ok, _ = s.send(i1, g1, opReset)
	require.True(t, ok)
	takeRing(s)
	require.True(t, isState(e2.state.Load(), stFree), "the stale command moved a free entry")
	require.False(t, e2.linked(), "the stale command linked a free entry")

	// The next owner of i2 fires once at its own deadline, as does n1.
	n2, err := w.AfterFuncArg(7*time.Millisecond, func(any) { fired = append(fired, "n2") }, nil)
	require.NoError(t, err)
	ni2, ng2 := n2.Slot()
	require.Equal(t, i2, ni2, "the free entry at the floor is reused")
	require.Greater(t, ng2, g2)
	ok, _ = s.send(i2, g2, opReset) // once more, now that i2 has a pending owner
	require.True(t, ok)
	clk.Advance(4 * time.Millisecond)
	require.Empty(t, fired, "nothing is due yet")
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"n1"}, fired)
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"n1"}, fired, "n2 fired early")
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"n1", "n2"}, fired)
	require.Zero(t, w.Len())
	requireBooks(t, w)
	require.NoError(t, w.Verify())
	require.Zero(t, w.Stop())
}

// TestQueuedStressFreeStack: for three seconds, four goroutines on one shard with a ring of four
// slots arm timers and stop them at once (the queued path: a Stop before the shard took the add,
// some after a Reset), arm timers and Everys that any of them stops or resets, and stop and reset
// stale handles. No callback runs after its Stop reported true, no stale handle acts, nothing is
// left pending, the books balance, and every entry then sits on the free stack exactly once: none
// freed twice, none leaked.
func TestQueuedStressFreeStack(t *testing.T) {
	restore := SetTrimDelays(time.Hour, time.Hour)
	defer restore()
	w, err := New(WithShards(1), WithRingSize(4), WithWorkers(2), WithTick(100*time.Microsecond))
	require.NoError(t, err)
	defer w.Stop()

	const goroutines = 4
	dur := 3 * time.Second
	var oneFired, oneStopped, oneArmed atomic.Int64
	var wrong atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mu sync.Mutex
	var shared []Timer // Everys and one-shots any goroutine may stop or reset
	type rec struct {
		fired   atomic.Int32
		stopped atomic.Int32
	}
	var everies []Timer
	var evMu sync.Mutex
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 99))
			var stale []Timer
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch x := r.IntN(100); {
				case x < 40: // arm and stop at once: the queued path
					rc := &rec{}
					tm, err := w.AfterFunc(time.Duration(r.IntN(300))*time.Microsecond, func() {
						if rc.stopped.Load() != 0 {
							wrong.Add(1)
						}
						rc.fired.Add(1)
						oneFired.Add(1)
					})
					if err != nil {
						return
					}
					oneArmed.Add(1)
					if r.IntN(4) == 0 {
						tm.Reset(time.Duration(r.IntN(300)) * time.Microsecond)
					}
					if tm.Stop() {
						if rc.fired.Load() != 0 {
							wrong.Add(1)
						}
						rc.stopped.Add(1)
						oneStopped.Add(1)
					}
					stale = append(stale, tm)
				case x < 55:
					rc := &rec{}
					tm, err := w.AfterFunc(time.Duration(r.IntN(500))*time.Microsecond, func() {
						rc.fired.Add(1)
						oneFired.Add(1)
					})
					if err != nil {
						return
					}
					oneArmed.Add(1)
					mu.Lock()
					shared = append(shared, tm)
					mu.Unlock()
				case x < 60:
					tm, err := w.Every(time.Duration(50+r.IntN(300))*time.Microsecond, func() {})
					if err != nil {
						return
					}
					evMu.Lock()
					everies = append(everies, tm)
					evMu.Unlock()
				case x < 80:
					evMu.Lock()
					var tm Timer
					if len(everies) > 0 {
						tm = everies[r.IntN(len(everies))]
					}
					evMu.Unlock()
					if r.IntN(3) == 0 {
						tm.Stop()
					} else {
						tm.Reset(time.Duration(r.IntN(300)) * time.Microsecond)
					}
				case x < 95:
					mu.Lock()
					var tm Timer
					if len(shared) > 0 {
						tm = shared[r.IntN(len(shared))]
					}
					mu.Unlock()
					if r.IntN(2) == 0 {
						if tm.Stop() {
							oneStopped.Add(1)
						}
					} else {
						tm.Reset(time.Duration(r.IntN(300)) * time.Microsecond)
					}
				default:
					if len(stale) > 0 {
						tm := stale[r.IntN(len(stale))]
						if tm.Stop() {
							wrong.Add(1000)
						}
						if tm.Reset(time.Millisecond) {
							wrong.Add(1000)
						}
					}
				}
				if len(stale) > 512 {
					stale = stale[256:]
				}
			}
		}()
	}
	time.Sleep(dur)
	close(stop)
	wg.Wait()
	for _, tm := range everies {
		tm.Stop()
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	require.Zero(t, w.Len())
	require.Zero(t, wrong.Load())
	require.NoError(t, w.Verify())
	requireBalanced(t, w)
	// Let the shard take whatever is left in its ring (adds of stopped timers).
	for _, s := range w.shards {
		s.mu.Lock()
		s.drainNoteLocked()
		s.mu.Unlock()
	}
	freeStackAudit(t, w)
	t.Logf("armed %d fired %d stopped %d everies %d", oneArmed.Load(), oneFired.Load(), oneStopped.Load(), len(everies))
}
