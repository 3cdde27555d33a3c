package shardwheel_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestLeakArmStopCycles runs millions of AfterFuncArg+Stop cycles (10 million; 1 million under
// -race or -short, fewer with both) and requires the heap, after a GC, to be back near where it
// started: stopped entries are freed promptly, not kept until their bucket comes round.
func TestLeakArmStopCycles(t *testing.T) {
	cycles := 10_000_000
	switch {
	case raceEnabled && testing.Short():
		cycles = 200_000
	case raceEnabled || testing.Short():
		cycles = 1_000_000
	}
	w, err := sw.New()
	require.NoError(t, err)
	defer w.Stop()
	type payload struct{ _ [64]byte } // size only: a 64-byte callback argument
	f := func(any) { t.Error("a stopped timer fired") }

	run := func(n int) {
		var wg sync.WaitGroup
		procs := 2
		for g := 0; g < procs; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := &payload{}
				for i := 0; i < n/procs; i++ {
					tm, err := w.AfterFuncArg(time.Hour, f, p)
					if err != nil {
						t.Error(err)
						return
					}
					if !tm.Stop() {
						t.Error("Stop of a pending timer reported false")
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	run(100_000) // warm the pools up
	before := leakHeap()
	start := time.Now()
	run(cycles)
	elapsed := time.Since(start)
	after := leakHeap()
	growth := int64(after) - int64(before)
	t.Logf("%d cycles in %v (%.0f ns/cycle): heap %d -> %d bytes after GC (%+d)",
		cycles, elapsed, float64(elapsed.Nanoseconds())/float64(cycles), before, after, growth)
	require.Less(t, growth, int64(16<<20), "heap grew by %d bytes over %d arm+stop cycles", growth, cycles)
	require.Equal(t, 0, w.Len())
	require.Equal(t, 0, w.Stop())
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Stopped)
	require.Equal(t, uint64(cycles+100_000), st.Stopped)
}

func leakHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// leakBlob is a callback argument big enough that keeping it alive by mistake would show.
type leakBlob struct{ _ [4096]byte }

// TestLeakWheelCollectedAfterStop: after Wheel.Stop, with no handle kept, the Wheel and every
// callback argument it held (pending, stopped, fired, periodic) are garbage. Checked with weak
// pointers, looping runtime.GC until they are collected (or a generous cap).
func TestLeakWheelCollectedAfterStop(t *testing.T) {
	for _, manual := range []bool{false, true} {
		clock := sw.NewManualClock(time.Unix(0, 0)) // kept alive: it must not keep the wheel
		wps := leakSetUp(t, manual, clock)
		collected := func() bool {
			for _, p := range wps {
				if p() {
					return false
				}
			}
			return true
		}
		for i := 0; i < 100 && !collected(); i++ {
			runtime.GC()
			time.Sleep(time.Millisecond)
		}
		for name, p := range wps {
			require.False(t, p(), "manual=%v: %s still reachable after Wheel.Stop", manual, name)
		}
		runtime.KeepAlive(clock)
	}
}

// leakSetUp builds and stops a wheel and returns, by name, functions that report whether each
// object is still alive. Nothing else it made stays reachable from the caller.
func leakSetUp(t *testing.T, manual bool, clock *sw.ManualClock) map[string]func() bool {
	opts := []sw.Option{sw.WithShards(2), sw.WithWorkers(2)}
	if manual {
		opts = append(opts, sw.WithClock(clock))
	}
	w, err := sw.New(opts...)
	require.NoError(t, err)
	alive := map[string]func() bool{}
	track := func(name string, p *leakBlob) {
		wp := weak.Make(p)
		alive[name] = func() bool { return wp.Value() != nil }
	}
	wwp := weak.Make(w)
	alive["the *Wheel"] = func() bool { return wwp.Value() != nil }
	keep := func(any) {}

	pending, stopped, fired := &leakBlob{}, &leakBlob{}, &leakBlob{}
	track("a pending timer's argument", pending)
	track("a stopped timer's argument", stopped)
	track("a fired timer's argument", fired)
	_, err = w.AfterFuncArg(time.Hour, keep, pending)
	require.NoError(t, err)
	tm, err := w.AfterFuncArg(time.Hour, keep, stopped)
	require.NoError(t, err)
	require.True(t, tm.Stop())
	done := make(chan struct{})
	_, err = w.AfterFuncArg(0, func(a any) { keep(a); close(done) }, fired)
	require.NoError(t, err)
	if manual {
		clock.Advance(0)
	}
	<-done
	periodic := &leakBlob{}
	track("an Every's closure", periodic)
	_, err = w.Every(time.Hour, func() { keep(periodic) })
	require.NoError(t, err)
	require.Equal(t, 2, w.Stop())
	return alive
}

// TestLeakSlabReusedAcrossBursts: the slab keeps its high-water mark and nothing more. Bursts of
// timers that fire, and bursts that are stopped, reuse the entries of the first burst: the slabs
// do not grow after it.
func TestLeakSlabReusedAcrossBursts(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	// WithWorkers(0): callbacks run inside Advance, so every entry is back in its slab when
	// Advance returns. One shard: with two, a burst splits between them as the test goroutine
	// moves between Ps, differently each round, and each shard's slab grows by whole blocks, so
	// the sum of their capacities would move with the split.
	w, err := sw.New(sw.WithClock(clock), sw.WithShards(1), sw.WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	const burst = 5000
	fired := 0
	f := func(any) { fired++ }
	hs := make([]sw.Timer, burst)
	high := 0
	for round := 0; round < 6; round++ {
		for i := range hs {
			hs[i], err = w.AfterFuncArg(time.Duration(1+i%50)*time.Millisecond, f, nil)
			require.NoError(t, err)
		}
		if round%2 == 0 {
			clock.Advance(time.Second)
			require.Equal(t, burst*(round/2+1), fired)
		} else {
			for _, h := range hs {
				require.True(t, h.Stop())
			}
			clock.Advance(time.Second) // the advance drains the rings: the stopped entries are freed
			require.Equal(t, burst*(round/2+1), fired, "a stopped timer fired")
		}
		require.Equal(t, 0, w.Len())
		if round == 0 {
			high = w.SlabCapacity()
			require.GreaterOrEqual(t, high, burst)
		}
		require.Equal(t, high, w.SlabCapacity(), "round %d: the slabs grew instead of reusing entries", round)
	}
}

// TestStopReleasesCallback stops timers on an idle wheel (a manual clock that never moves, so
// no shard drains its ring) and checks that nothing they captured is kept: before Stop the
// wheel keeps every payload, after Stop none.
func TestStopReleasesCallback(t *testing.T) {
	const n = 8
	// arm arms one timer whose callback keeps a fresh payload; the payload is made in here so
	// that no stack frame of the test keeps it. closure makes one for AfterFunc and Every.
	type armFunc = func(w *sw.Wheel) (weak.Pointer[payload], func() bool)
	closure := func(schedule func(*sw.Wheel, time.Duration, func()) (sw.Timer, error)) armFunc {
		return func(w *sw.Wheel) (weak.Pointer[payload], func() bool) {
			p := new(payload)
			tm, err := schedule(w, time.Hour, func() { p[0]++ })
			require.NoError(t, err)
			return weak.Make(p), tm.Stop
		}
	}
	kinds := map[string]armFunc{
		"AfterFunc": closure((*sw.Wheel).AfterFunc),
		"AfterFuncArg": func(w *sw.Wheel) (weak.Pointer[payload], func() bool) {
			p := new(payload)
			tm, err := w.AfterFuncArg(time.Hour, func(any) {}, p)
			require.NoError(t, err)
			return weak.Make(p), tm.Stop
		},
		"Every": closure((*sw.Wheel).Every),
		"WithTimeout": func(w *sw.Wheel) (weak.Pointer[payload], func() bool) {
			p := new(payload)
			type key struct{}
			parent := context.WithValue(context.Background(), key{}, p)
			ctx, cancel := w.WithTimeout(parent, time.Hour)
			return weak.Make(p), func() bool {
				cancel()
				return ctx.Err() == context.Canceled
			}
		},
		"Keyed": func(w *sw.Wheel) (weak.Pointer[payload], func() bool) {
			k := sw.NewKeyed(w, func(int, *payload) {})
			p := new(payload)
			require.NoError(t, k.Set(1, p, time.Hour))
			return weak.Make(p), func() bool { return k.Remove(1) }
		},
	}
	for name, arm := range kinds {
		t.Run(name, func(t *testing.T) {
			w, _ := manualWheel(t)
			ws := make([]weak.Pointer[payload], n)
			stops := make([]func() bool, n)
			for i := range ws {
				ws[i], stops[i] = arm(w)
			}
			require.True(t, alive(ws), "the wheel keeps what a pending timer needs")
			for i, stop := range stops {
				require.True(t, stop(), "stop %d", i)
			}
			stops = nil
			require.Equal(t, 0, w.Len())
			require.True(t, gone(ws), "a stopped timer's callback and argument are still reachable")
		})
	}
}

// TestStopOfRunningEveryReleasesAfterRun stops an Every during its run: the Stop reports true,
// the run completes, and then nothing of the series is kept.
func TestStopOfRunningEveryReleasesAfterRun(t *testing.T) {
	w, clk := manualWheel(t)
	var tm sw.Timer
	stopped := false
	ws := make([]weak.Pointer[payload], 1)
	func() {
		p := new(payload)
		ws[0] = weak.Make(p)
		var err error
		tm, err = w.Every(time.Second, func() {
			p[0]++
			stopped = tm.Stop() // during the run: the worker frees the entry when it ends
		})
		require.NoError(t, err)
	}()
	clk.Advance(time.Second)
	require.True(t, stopped)
	tm = sw.Timer{}
	require.True(t, gone(ws), "a stopped Every keeps its func after its last run")
}

// burstN is the size of the burst: two million, fewer under the race detector or -short.
func burstN() int {
	if raceEnabled || testing.Short() {
		return 200_000
	}
	return 2_000_000
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestBurstGivesBlocksBack arms a burst of timers an hour out, stops them all, lets the wheel be
// quiet for trimQuiet (on a manual clock) and checks what the heap still holds for them: at most
// 4 bytes per burst timer: its blocks went back. Stale handles into the released blocks stay
// inert, also once new timers reuse their indices.
func TestBurstGivesBlocksBack(t *testing.T) {
	n := burstN()
	w, clk := manualWheel(t, sw.WithShards(1)) // one shard: the new timers below reuse its indices
	noop := func(any) {}
	base := liveHeap()

	hs := make([]sw.Timer, n)
	for i := range hs {
		var err error
		hs[i], err = w.AfterFuncArg(time.Hour, noop, nil)
		require.NoError(t, err)
	}
	require.GreaterOrEqual(t, w.Stats().HeldBytes, int64(n)*int64(sw.EntrySize), "the burst's entries are held")
	for i, h := range hs {
		if !h.Stop() {
			t.Fatalf("Stop of pending timer %d reported false", i)
		}
	}
	stale := append([]sw.Timer(nil), hs[:3]...)
	stale = append(stale, hs[n-3:]...)
	hs = nil

	clk.Advance(0)                // the trimmer sees the burst...
	clk.Advance(sw.TrimQuiet / 2) // ...and that it is not over for long enough,
	require.NotZero(t, w.Stats().HeldBytes)
	clk.Advance(sw.TrimQuiet) // ...then that it has been quiet: it gives the blocks back.
	require.Zero(t, w.Stats().HeldBytes)
	per := (float64(liveHeap()) - float64(base)) / float64(n)
	t.Logf("kept %.2f bytes per burst timer after %d timers armed and stopped", per, n)
	require.LessOrEqual(t, per, 4.0, "bytes kept per burst timer")

	for _, h := range stale {
		require.False(t, h.Stop(), "a stale handle into a released block stops nothing")
		require.False(t, h.Reset(time.Minute), "a stale handle into a released block resets nothing")
	}
	// New timers take the released indices again, with generations above the stale ones.
	type slot struct {
		shard uintptr
		i     uint32
	}
	staleGen := map[slot]uint64{}
	for _, h := range stale {
		i, gen := h.Slot()
		staleGen[slot{h.ShardID(), i}] = gen
	}
	fresh := make([]sw.Timer, 4*sw.BlockLen)
	reused := 0
	for i := range fresh {
		var err error
		fresh[i], err = w.AfterFuncArg(time.Hour, noop, nil)
		require.NoError(t, err)
		j, gen := fresh[i].Slot()
		if old := staleGen[slot{fresh[i].ShardID(), j}]; old != 0 {
			reused++
			require.Greater(t, gen, old, "a new arming at index %d repeats a stale gen", j)
		}
	}
	require.NotZero(t, reused, "no stale index was reused: the test proves nothing")
	for _, h := range stale {
		require.False(t, h.Stop())
		require.False(t, h.Reset(time.Minute))
	}
	require.Equal(t, len(fresh), w.Len(), "a stale handle touched a new timer")
	for _, h := range fresh {
		require.True(t, h.Stop())
	}
	requireBalance(t, w)
}

// TestTrimOnSystemClock checks that the clock goroutine gives a burst's blocks back on its own,
// although nothing is due for an hour, and then holds them no more.
func TestTrimOnSystemClock(t *testing.T) {
	defer sw.SetTrimDelays(20*time.Millisecond, 5*time.Millisecond)()
	w, err := sw.New(sw.WithShards(2))
	require.NoError(t, err)
	defer w.Stop()
	hs := make([]sw.Timer, 10*sw.BlockLen)
	for i := range hs {
		hs[i], err = w.AfterFuncArg(time.Hour, func(any) {}, nil)
		require.NoError(t, err)
	}
	require.NotZero(t, w.Stats().HeldBytes)
	for _, h := range hs {
		require.True(t, h.Stop())
	}
	deadline := time.Now().Add(20 * time.Second)
	for w.Stats().HeldBytes != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("20 s after the burst the wheel still holds %d bytes", w.Stats().HeldBytes)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// And it grows again when needed.
	tm, err := w.AfterFuncArg(time.Hour, func(any) {}, nil)
	require.NoError(t, err)
	require.Equal(t, sw.BlockBytes, w.Stats().HeldBytes)
	require.True(t, tm.Stop())
}

// TestTrimRacesTimers trims over and over while producers arm, stop, reset and fire timers and
// use stale handles: the accounting stays exact, a stale handle never acts, and the race
// detector sees no unordered access to a released or reused entry.
func TestTrimRacesTimers(t *testing.T) {
	w, err := sw.New(sw.WithShards(2), sw.WithTick(100*time.Microsecond))
	require.NoError(t, err)
	rounds, batch := 40, 3000
	if raceEnabled {
		rounds, batch = 10, 1000
	}
	var fired atomic.Int64
	fire := func(any) { fired.Add(1) }
	var stopsTrue, released atomic.Int64
	done := make(chan struct{})
	var trims sync.WaitGroup
	trims.Add(1)
	go func() {
		defer trims.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if w.TrimNow() > 0 {
				released.Add(1)
			}
			runtime.Gosched()
		}
	}()
	var wg sync.WaitGroup
	var staleActed atomic.Int64
	for p := 0; p < 2; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var old []sw.Timer
			for r := 0; r < rounds; r++ {
				hs := make([]sw.Timer, batch)
				for i := range hs {
					d := time.Hour
					if i%10 == 0 {
						d = time.Duration(i%7) * 100 * time.Microsecond // some fire
					}
					hs[i], _ = w.AfterFuncArg(d, fire, nil)
				}
				for i, h := range hs {
					if i%3 == 0 {
						h.Reset(time.Hour)
					}
					if h.Stop() {
						stopsTrue.Add(1)
					}
					if h.Stop() {
						staleActed.Add(1) // a second Stop never reports true
					}
				}
				for _, h := range old {
					if h.Stop() || h.Reset(time.Minute) {
						staleActed.Add(1)
					}
				}
				old = hs
			}
		}()
	}
	wg.Wait()
	close(done)
	trims.Wait()
	require.Zero(t, staleActed.Load(), "a stale handle acted")
	deadline := time.Now().Add(10 * time.Second)
	for w.Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	require.Zero(t, w.Len())
	t.Logf("%d trims released blocks while timers moved", released.Load())
	w.Stop() // the workers have returned their last entries
	w.TrimNow()
	require.Zero(t, w.Stats().HeldBytes, "once every timer is over, every block goes back")
	s := w.Stats()
	require.Equal(t, uint64(2*rounds*batch), s.Scheduled)
	require.Equal(t, s.Scheduled, s.Fired+s.Stopped, "stats %+v", s)
	require.Equal(t, uint64(fired.Load()), s.Fired)
	require.Equal(t, uint64(stopsTrue.Load()), s.Stopped)
}

// TestTrimKeepsGenerationsAbove reuses a few entries many times (their gens climb), lets the
// trimmer release their block, and checks that the entries of the block that replaces it start
// above every gen a stale handle holds.
func TestTrimKeepsGenerationsAbove(t *testing.T) {
	w, clk := manualWheel(t, sw.WithShards(1))
	noop := func(any) {}
	var last []sw.Timer
	for range 50 {
		last = last[:0]
		for range 10 {
			h, err := w.AfterFuncArg(0, noop, nil) // due now: the next Advance drains the shard
			require.NoError(t, err)
			last = append(last, h)
		}
		for _, h := range last {
			require.True(t, h.Stop())
		}
		clk.Advance(0) // the shard takes the cancels: the entries are free for the next round
	}
	high := map[uint32]uint64{}
	for _, h := range last {
		i, gen := h.Slot()
		require.Greater(t, gen, uint64(40), "the entries were reused: their gens climbed")
		high[i] = gen
	}
	clk.Advance(sw.TrimQuiet)
	clk.Advance(sw.TrimQuiet)
	require.Zero(t, w.Stats().HeldBytes, "the block went back")
	for range 10 {
		h, err := w.AfterFuncArg(time.Hour, noop, nil)
		require.NoError(t, err)
		i, gen := h.Slot()
		for _, old := range high {
			require.Greater(t, gen, old, "index %d: a new gen at or below a stale handle's", i)
		}
		require.True(t, h.Stop())
	}
	for _, h := range last {
		require.False(t, h.Stop())
		require.False(t, h.Reset(time.Second))
	}
	requireBalance(t, w)
}
