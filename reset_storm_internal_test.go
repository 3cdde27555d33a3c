package shardwheel

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Written by the third review of the exact-deadline change, as regression tests (none failed). Storms of concurrent Resets and Stops of the same timers, some paused between claim and
// release so that advances park their entries (the parked protocol under real interleavings), on
// the system clock, on a manual clock advanced concurrently, and for Every; the parking Reset's
// command applied while a later Reset holds the entry; and the wheel model with commands applied
// between the budgeted steps of one advance (as each advanceLocked step's drain does).

func parkStorm(t *testing.T, w *Wheel, tick func(), dur time.Duration, every bool) {
	const n = 64
	var fired [n]atomic.Int32
	var stopped [n]atomic.Int32
	var parkedRuns atomic.Int64
	tms := make([]Timer, n)
	for k := range tms {
		var err error
		if every {
			tms[k], err = w.Every(time.Duration(50+rand.IntN(500))*time.Microsecond, func() { fired[k].Add(1) })
		} else {
			tms[k], err = w.AfterFunc(time.Duration(rand.IntN(2000))*time.Microsecond, func() { fired[k].Add(1) })
		}
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := r.IntN(n)
				switch r.IntN(200) {
				case 0:
					if tms[k].Stop() {
						stopped[k].Add(1)
					}
				case 1, 2, 3, 4, 5, 6, 7, 8, 9, 10:
					// A Reset paused between its claim and its release (preemption): the
					// advance meets the entry held and parks it.
					if ok, release := tms[k].ResetHeld(time.Duration(r.IntN(1500)-100) * time.Microsecond); ok {
						time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
						if isParked(w, tms[k]) {
							parkedRuns.Add(1)
						}
						release()
					}
				default:
					tms[k].Reset(time.Duration(r.IntN(1500)-100) * time.Microsecond)
				}
				if r.IntN(16) == 0 {
					time.Sleep(time.Duration(r.IntN(50)) * time.Microsecond)
				}
			}
		}()
	}
	if tick != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				tick()
			}
		}()
	}
	time.Sleep(dur)
	close(stop)
	wg.Wait()
	if every {
		for k := range tms {
			if tms[k].Stop() {
				stopped[k].Add(1)
			}
		}
	}
	// Everything left must come due and fire within a few ms (resets were at most 1.4 ms out).
	deadline := time.Now().Add(2 * time.Second)
	for w.Len() != 0 && time.Now().Before(deadline) {
		if tick != nil {
			tick()
		}
		time.Sleep(time.Millisecond)
	}
	if tick != nil {
		tick()
	}
	t.Logf("Resets that found their entry parked: %d", parkedRuns.Load())
	require.NoError(t, w.Verify())
	for k := range tms {
		f, s := fired[k].Load(), stopped[k].Load()
		if every {
			require.LessOrEqual(t, s, int32(1), "timer %d stopped %d times", k, s)
			require.Equal(t, int32(1), s, "every %d: its series not ended by one Stop (fired %d)", k, f)
		} else {
			require.Equal(t, int32(1), f+s, "timer %d: fired %d, stopped %d (Len %d)", k, f, s, w.Len())
		}
	}
	require.Zero(t, w.Len())
}

func TestResetParkStormSystemClock(t *testing.T) {
	for round := 0; round < 2; round++ {
		w, err := New(WithShards(2), WithWorkers(3), WithTick(100*time.Microsecond))
		require.NoError(t, err)
		parkStorm(t, w, nil, 300*time.Millisecond, false)
		st := w.Stats()
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+uint64(st.Pending), "%+v", st)
		w.Stop()
	}
}

func TestResetParkStormManualClock(t *testing.T) {
	for round := 0; round < 2; round++ {
		clk := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clk), WithShards(2), WithWorkers(2), WithTick(100*time.Microsecond))
		require.NoError(t, err)
		parkStorm(t, w, func() { clk.Advance(time.Duration(rand.IntN(300)) * time.Microsecond) }, 300*time.Millisecond, false)
		w.Stop()
	}
}

func TestResetParkStormEvery(t *testing.T) {
	for round := 0; round < 2; round++ {
		w, err := New(WithShards(2), WithWorkers(3), WithTick(100*time.Microsecond))
		require.NoError(t, err)
		parkStorm(t, w, nil, 300*time.Millisecond, true)
		w.Stop()
	}
}

// TestResetParkedCommandAppliedWhileAnotherResetHolds: the parking Reset's command is applied
// while a second Reset holds the entry (resetting, in the held bucket): it moves the entry out
// at the deadline it reads (the first Reset's, the second has not stored yet). Then the second
// Reset releases: with the entry met and parked again by the advance meanwhile, or not met, to a
// later or an earlier deadline. The timer fires once, exactly at the second Reset's deadline.
func TestResetParkedCommandAppliedWhileAnotherResetHolds(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name    string
		second  time.Duration // Reset at 1 ms
		reparks bool          // advance to 5 ms (the first Reset's deadline) while the second holds
		due     time.Duration
	}{
		{"later, re-parked", 8 * ms, true, 9 * ms},
		{"later, not met", 8 * ms, false, 9 * ms},
		{"earlier, not met", 2 * ms, false, 3 * ms},
		{"earlier than the first's, met", 2500 * time.Microsecond, true, 3500 * time.Microsecond}, // met at 5 ms: parked, fires at once after its release
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, clk, now := parkWheel(t)
			var fired []time.Duration
			tm, err := w.AfterFunc(ms, func() { fired = append(fired, now()) })
			require.NoError(t, err)
			finish1 := holdReset(t, tm, 5*ms) // due 5 ms
			clk.Advance(ms)
			require.True(t, isParked(w, tm))
			finish1() // pending, still held; its command is in the ring
			finish2 := holdReset(t, tm, tc.second)
			released := false
			defer func() {
				if !released {
					finish2() // else the cleanup's Wheel.Stop waits for it forever
				}
			}()
			s := tm.s
			s.mu.Lock()
			s.drainLocked() // a drain (a full ring's producer, the trimmer) applies the first Reset's command
			s.mu.Unlock()
			require.False(t, isParked(w, tm), "the first Reset's command moves the entry out")
			if tc.reparks {
				clk.Advance(4 * ms)
				require.True(t, isParked(w, tm), "met while the second Reset holds it: parked")
			}
			finish2()
			released = true
			if d := tc.due - now() - 1; d >= 0 {
				clk.Advance(d)
				require.Empty(t, fired, "fired before its deadline")
				clk.Advance(1)
			} else {
				clk.Advance(0)
			}
			require.Equal(t, []time.Duration{max(tc.due, now())}, fired)
			clk.Advance(time.Hour)
			require.Len(t, fired, 1)
			require.NoError(t, w.Verify())
			require.Zero(t, w.Len())
			requireBalanced(t, w)
		})
	}
}
