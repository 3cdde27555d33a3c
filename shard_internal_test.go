package shardwheel

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ringOfOne starts a one-shard wheel with WithRingSize(1), the smallest size the option accepts,
// and arms two timers due in 1 ms on it. A Vyukov ring of one slot cannot tell "published at pos"
// (seq == pos+1) from "free for pos+1" (the same seq): a second push would claim the slot before
// the consumer took the first, overwrite its command, and publish a seq the consumer never
// accepts. So the ring has two slots at least, whatever the option says.
func ringOfOne(t *testing.T) (*Wheel, *ManualClock, *atomic.Int32) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	// WithWorkers(0) on a manual clock starts no goroutine: nothing leaks if Stop is not called.
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(1), WithRingSize(1))
	require.NoError(t, err)
	var fired atomic.Int32
	for range 2 {
		_, err := w.AfterFunc(time.Millisecond, func() { fired.Add(1) })
		require.NoError(t, err)
	}
	return w, clk, &fired
}

// TestRingOfOneLosesNoTimers: two timers armed on a ring sized 1 both fire.
func TestRingOfOneLosesNoTimers(t *testing.T) {
	w, clk, fired := ringOfOne(t)
	clk.Advance(time.Hour)
	require.Equal(t, int32(2), fired.Load(), "timers armed on a ring of one slot never fired (Len %d)", w.Len())
	w.Stop()
}

// TestRingOfOneWheelStopReturns: Wheel.Stop of a wheel whose ring was sized 1, with two adds in
// it, returns: its drop takes both commands (in a ring of one slot it would wait forever for the
// sequence number of a command that was overwritten).
func TestRingOfOneWheelStopReturns(t *testing.T) {
	w, _, _ := ringOfOne(t)
	done := make(chan int)
	go func() { done <- w.Stop() }()
	select {
	case <-done:
		return
	case <-time.After(5 * time.Second):
	}
	// Unstick the drop loop so the goroutine exits (goleak): hand the consumer the sequence
	// numbers it waits for (1 at pos 0, then 2 at pos 1), alternately, until Stop returns.
	s := w.shards[0]
	_ = s.ring.slots[0].seq.Load() // orders the producer's slot writes before our stores
	for k := uint64(0); ; k++ {
		s.ring.slots[0].seq.Store(1 + k%2)
		select {
		case <-done:
			t.Fatal("Wheel.Stop hung on a ring of one slot (released by hand after 5 s)")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// shardStormBook is what one timer of TestShardTinyRingStormEndsEachTimerOnce saw: the bound its
// callback must not start before (the arm's or the last successful Reset's reading of the clock
// plus its d), how often its callback ran and at which reading, and whether a Stop reported true.
type shardStormBook struct {
	bound   atomic.Int64
	ran     atomic.Int32
	ranAt   atomic.Int64
	stopped atomic.Int32
}

// TestShardTinyRingStormEndsEachTimerOnce: rings of two slots on two shards (full at almost every
// push, so producers drain them themselves), producers that arm, Reset and Stop their timers (and
// Stop and Reset stale handles) while another goroutine advances the manual clock and trims, and
// two workers run callbacks. Every timer ends exactly once (ran once, or one Stop reported true,
// or Wheel.Stop counted it), never runs before the clock reached its bound (never early), a stale
// handle never acts, and the books balance.
func TestShardTinyRingStormEndsEachTimerOnce(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(2), WithWorkers(2), WithRingSize(1),
		WithTick(100*time.Microsecond))
	require.NoError(t, err)
	const producers = 4
	per := 5000
	if raceEnabled {
		per = 2000
	}
	books := make([]shardStormBook, producers*per)
	f := func(arg any) {
		b := arg.(*shardStormBook)
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
			liveB := make([]*shardStormBook, 0, 8)
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

// TestShardFullRingWaitsForPausedProducer: with the smallest ring (two slots), a producer paused
// between the claim of its slot and its publish (ArmHeld) holds up the head of the ring; once the
// ring is full, a further AfterFunc (or Stop, or Reset) on that shard returns only once the paused
// producer publishes: it takes the shard's lock, drains nothing, yields and tries again
// (shard.send), as AfterFunc's doc says ("it yields until that producer does"). Nothing is lost:
// all three timers fire once, at their deadline, not before.
func TestShardFullRingWaitsForPausedProducer(t *testing.T) {
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
