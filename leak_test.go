package shardwheel_test

import (
	"runtime"
	"sync"
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
	// moves between Ps, differently each round, and each shard's slab grows by whole chunks, so
	// the sum of their capacities moved with the split (this failed about one run in four).
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
