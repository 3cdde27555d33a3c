package shardwheel

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Review 32: the submission path and memory (ring.go, pool.go, trim.go, pick.go, shard.go's
// drain and full-ring fallback, timer.go's Stop and Reset, options.go).

// r32Payload is what a callback keeps alive: large, so that a leak is plain.
type r32Payload [64 << 10]byte

// r32Gone collects garbage twice and reports whether p's object was collected.
func r32Gone(p weak.Pointer[r32Payload]) bool {
	runtime.GC()
	runtime.GC()
	return p.Value() == nil
}

// r32Pair is the argument of one of two timers due in the same tick: whichever runs first stops
// the other (which the shard has already moved to firing) and looks whether the other's
// argument is still kept reachable by the wheel.
type r32Pair struct {
	p      *r32Payload
	other  Timer
	otherP weak.Pointer[r32Payload]
	out    *r32PairOut
}

type r32PairOut struct {
	runs      int
	stopped   bool
	collected bool
}

// TestReview32FixedStopOfFiringTimerKeepsArg (bug, memory): README "Prompt release": "When
// Timer.Stop (or a context's cancel, or Keyed.Remove) reports true, the wheel no longer keeps
// the callback or its argument reachable." A timer that the shard has fired (state firing) but
// whose callback has not started is stopped with Stop reporting true, yet its entry keeps f and
// arg until the worker reaches it in its batch, which is after every callback ahead of it in
// that batch has returned (timer.go:196: "firing: dispatched, not started; the worker sees
// stopped and frees the entry"; no clearEntry on that path). A slow callback ahead of it, or a
// callback that blocks, keeps the stopped timer's argument alive for as long as it runs.
//
// Deterministic: one shard, a manual clock, WithWorkers(0); two timers due in the same tick; the
// first to run stops the other (true) and collects garbage: the other's argument is still live.
func TestReview32FixedStopOfFiringTimerKeepsArg(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()

	out := &r32PairOut{}
	f := func(arg any) {
		pr := arg.(*r32Pair)
		pr.out.runs++
		pr.out.stopped = pr.other.Stop()
		pr.out.collected = r32Gone(pr.otherP)
	}
	func() { // the payloads are made in here so that no frame of the test keeps them
		a := &r32Pair{p: new(r32Payload), out: out}
		b := &r32Pair{p: new(r32Payload), out: out}
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

type r32Key struct{}

// r32CtxRig is the argument of the callback that cancels a context whose deadline timer the
// shard fired in the same round, just before it.
type r32CtxRig struct {
	ctx       context.Context
	cancel    context.CancelFunc
	p         weak.Pointer[r32Payload]
	firing    bool // the context's timer was fired (not started) when the callback ran
	errBefore error
	collected bool
}

// TestReview32FixedCancelOfFiringContextKeepsIt (bug, memory; same root cause as
// TestReview32FixedStopOfFiringTimerKeepsArg): API.md, of the deadline contexts: "the cancel func
// releases it at once (Len drops); once cancelled, nothing of the context is kept reachable by the
// wheel." A context whose deadline timer the shard has just fired, behind a callback that runs
// first in the same batch, is cancelled by that callback: Err is context.Canceled, and yet the
// wheel's entry still holds the context (its arg) and through it the parent's values, until the
// worker reaches the entry.
func TestReview32FixedCancelOfFiringContextKeepsIt(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	// A tick of 10 ms: the callback (due at 1 ms) and the context's timer (5 ms) come due in
	// the same round of the Advance, the callback first.
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0), WithTick(10*time.Millisecond))
	require.NoError(t, err)
	defer w.Stop()

	rig := &r32CtxRig{}
	var ctxTimer Timer
	_, err = w.AfterFuncArg(time.Millisecond, func(arg any) {
		r := arg.(*r32CtxRig)
		e := ctxTimer.s.slab.at(ctxTimer.i)
		r.firing = isGen(e.state.Load(), ctxTimer.gen) && isState(e.state.Load(), stFiring)
		r.errBefore = r.ctx.Err()
		r.cancel()
		r.ctx, r.cancel = nil, nil
		r.collected = r32Gone(r.p)
	}, rig)
	require.NoError(t, err)
	func() {
		p := new(r32Payload)
		rig.p = weak.Make(p)
		parent := context.WithValue(context.Background(), r32Key{}, p)
		rig.ctx, rig.cancel = w.WithTimeout(parent, 5*time.Millisecond)
		ctxTimer = rig.ctx.(*deadlineCtx).timer
	}()
	require.NotZero(t, ctxTimer.s, "the context has a wheel timer")
	clk.Advance(10 * time.Millisecond)
	require.True(t, rig.firing, "the context's timer was fired before the callback ran")
	require.NoError(t, rig.errBefore)
	require.Zero(t, w.Len())
	require.True(t, rig.collected, "a cancelled context is kept reachable by the wheel")
}

// TestReview32FixedEveryEndOfTimeLeaksMaxPendingCredit (bug, WithMaxPending): an Every on a manual
// clock that reaches the end of time ends its series (every.go:94-105: "The series ends here, and
// its next run, counted as scheduled when this run began, is taken back"), and Len drops to 0,
// but the WithMaxPending credit the series held is never given back (no releasePending on that
// path, unlike every other end of a timer). WithMaxPending's doc: "once the wheel is quiet, n
// timers are always accepted"; here the quiet wheel, with nothing pending, refuses the n-th.
func TestReview32FixedEveryEndOfTimeLeaksMaxPendingCredit(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0), WithMaxPending(1))
	require.NoError(t, err)
	defer w.Stop()
	runs := 0
	_, err = w.Every(time.Hour, func() { runs++ })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64) // the end of time: one run, and the series ends
	require.Equal(t, 1, runs)
	require.Zero(t, w.Len(), "the series is over")
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "stats %+v", st)
	_, err = w.AfterFunc(time.Second, func() {})
	require.NoError(t, err, "WithMaxPending(1) refuses a timer on a wheel with nothing pending")
}

// r32Book is what one timer of the storm saw: the bound its callback must not start before (the
// arm's or the last successful Reset's reading of the clock plus its d), how often its callback
// ran and at which reading, and whether a Stop reported true.
type r32Book struct {
	bound   atomic.Int64
	ran     atomic.Int32
	ranAt   atomic.Int64
	stopped atomic.Int32
}

// TestReview32PinTinyRingStopResetFireStorm (pin): rings of two slots on two shards, producers
// that arm, Reset and Stop their timers (and Stop and Reset stale handles) while another goroutine
// advances the manual clock and trims, and two workers run callbacks. Every timer ends exactly
// once (ran once, or one Stop true, or counted by Wheel.Stop), never before the clock reached its
// bound, a stale handle never acts, and the books balance.
func TestReview32PinTinyRingStopResetFireStorm(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(2), WithWorkers(2), WithRingSize(1),
		WithTick(100*time.Microsecond))
	require.NoError(t, err)
	const producers = 4
	per := 5000
	if raceEnabled {
		per = 2000
	}
	books := make([]r32Book, producers*per)
	f := func(arg any) {
		b := arg.(*r32Book)
		b.ranAt.Store(clk.elapsed.Load())
		b.ran.Add(1)
	}
	var staleActed, stopsTrue atomic.Int64
	done := make(chan struct{})
	var adv sync.WaitGroup
	adv.Add(1)
	go func() { // the clock, and the trimmer
		defer adv.Done()
		for k := 0; ; k++ {
			select {
			case <-done:
				return
			default:
			}
			clk.Advance(50 * time.Microsecond)
			if k%64 == 0 {
				w.TrimNow()
			}
			runtime.Gosched()
		}
	}()
	var wg sync.WaitGroup
	for g := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 32))
			var ended []Timer // handles whose timers are over: stale from here on
			live := make([]Timer, 0, 8)
			liveB := make([]*r32Book, 0, 8)
			for k := range per {
				b := &books[g*per+k]
				d := time.Duration(rng.IntN(2000)) * time.Microsecond
				b.bound.Store(clk.elapsed.Load() + int64(d))
				tm, err := w.AfterFuncArg(d, f, b)
				if !assert.NoError(t, err) {
					return
				}
				live, liveB = append(live, tm), append(liveB, b)
				for j := 0; j < len(live); {
					h, hb := live[j], liveB[j]
					switch rng.IntN(4) {
					case 0:
						if h.Stop() {
							hb.stopped.Add(1)
							stopsTrue.Add(1)
						}
						ended = append(ended, h)
					case 1:
						d := time.Duration(rng.IntN(1500)) * time.Microsecond
						at := clk.elapsed.Load() + int64(d)
						if h.Reset(d) {
							hb.bound.Store(at)
						}
						j++
						continue
					default:
						j++
						continue
					}
					live[j], liveB[j] = live[len(live)-1], liveB[len(liveB)-1]
					live, liveB = live[:len(live)-1], liveB[:len(liveB)-1]
				}
				if len(ended) > 0 {
					h := ended[rng.IntN(len(ended))]
					if h.Stop() || h.Reset(time.Hour) {
						staleActed.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	adv.Wait()
	dropped := w.Stop()
	require.Zero(t, staleActed.Load(), "a stale handle acted")
	ran := 0
	for i := range books {
		b := &books[i]
		r, s := int(b.ran.Load()), int(b.stopped.Load())
		require.LessOrEqual(t, r+s, 1, "timer %d: ran %d times, stopped %d times", i, r, s)
		if r == 1 {
			ran++
			require.GreaterOrEqual(t, b.ranAt.Load(), b.bound.Load(), "timer %d ran early", i)
		}
	}
	require.Equal(t, len(books), ran+int(stopsTrue.Load())+dropped, "every timer ends exactly once")
	st := w.Stats()
	require.Equal(t, uint64(len(books)), st.Scheduled)
	require.Equal(t, uint64(ran), st.Fired)
	require.Equal(t, uint64(stopsTrue.Load()), st.Stopped)
	require.Equal(t, uint64(dropped), st.Dropped)
}

// TestReview32PinFullRingWaitsForPausedProducer (pin, and a remark on the docs): with the
// smallest ring (two slots), a producer paused between the claim of its slot and its publish
// (ArmHeld) holds up the head of the ring; once the ring is full, a further AfterFunc (or Stop,
// or Reset) on that shard cannot return until the paused producer publishes: it takes the
// shard's lock, drains nothing, yields and tries again (shard.send). AfterFunc's doc says "It
// does not block", and Stop's that a full ring "may wait for one advance step of the shard"; the
// wait is in fact for the paused producer, as long as its pause (README: "delays nobody's timer
// for longer than its pause"). Nothing is lost: all three fire once, at their deadlines.
func TestReview32PinFullRingWaitsForPausedProducer(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0), WithRingSize(1))
	require.NoError(t, err)
	defer w.Stop()
	var ran [3]int
	f := func(arg any) { ran[arg.(int)]++ }
	held := w.ArmHeld(time.Millisecond, f, 0)       // slot 0, paused before its publish
	_, err = w.AfterFuncArg(time.Millisecond, f, 1) // slot 1: the ring is full
	require.NoError(t, err)
	returned := make(chan error, 1)
	go func() {
		_, err := w.AfterFuncArg(time.Millisecond, f, 2)
		returned <- err
	}()
	select {
	case err := <-returned:
		t.Fatalf("AfterFunc returned (%v) while the head of its full ring was unpublished", err)
	case <-time.After(100 * time.Millisecond):
	}
	held.Publish()
	select {
	case err := <-returned:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("AfterFunc did not return once the paused producer published")
	}
	clk.Advance(time.Millisecond - 1)
	require.Equal(t, [3]int{}, ran, "nothing fires early")
	clk.Advance(1)
	require.Equal(t, [3]int{1, 1, 1}, ran)
	require.Zero(t, w.Len())
}
