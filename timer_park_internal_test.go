package shardwheel

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Resets whose entry the shard parked: an advance that meets an entry held by a Reset links it in
// the held bucket, where no advance looks, and the Reset, finding it parked, sends the command
// that moves it to its deadline (entry.go, shard.expire).

// TestResetParkedAtWheelStop: Wheel.Stop while a paused Reset holds a parked entry waits for the
// Reset (two stores), then drops the timer and counts it once (the Reset's command finds the ring
// closed). Nothing fires, a later Stop or Reset reports false, nothing is pending, and the books
// balance.
func TestResetParkedAtWheelStop(t *testing.T) {
	w, clk, _ := parkWheel(t)
	fired := 0
	tm, err := w.AfterFunc(time.Millisecond, func() { fired++ })
	require.NoError(t, err)
	finish := holdReset(t, tm, 5*time.Millisecond)
	clk.Advance(time.Millisecond)
	require.True(t, isParked(w, tm), "the advance met the held entry: parked")
	done := make(chan int)
	go func() { done <- w.Stop() }()
	select {
	case n := <-done:
		t.Fatalf("Wheel.Stop returned %d while a Reset held a pending timer", n)
	case <-time.After(20 * time.Millisecond):
	}
	finish()
	require.Equal(t, 1, <-done)
	require.Zero(t, fired)
	require.False(t, tm.Stop())
	require.False(t, tm.Reset(time.Millisecond))
	require.Zero(t, w.Len())
	requireBalanced(t, w)
}

// TestResetParkedThenStopped: a parked entry whose Reset has finished (pending, still in the held
// bucket) while its command waits behind a slot claimed by a paused Stop of another timer: a Stop
// of the timer reports true, its cancel frees the entry from the held bucket, and the Reset's
// command, applied before it, is harmless. The timer never fires, and nothing stays linked.
func TestResetParkedThenStopped(t *testing.T) {
	w, clk, _ := parkWheel(t)
	fired := 0
	tm, err := w.AfterFunc(time.Millisecond, func() { fired++ })
	require.NoError(t, err)
	d, err := w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	finish := holdReset(t, tm, 5*time.Millisecond)
	clk.Advance(time.Millisecond)
	require.True(t, isParked(w, tm))
	ok, held := d.StopHeld() // the ring stalls here: the Reset's command waits behind it
	require.True(t, ok)
	finish()
	require.True(t, isParked(w, tm), "the command is behind the held slot")
	require.True(t, tm.Stop(), "pending again: Stop prevents it")
	clk.Advance(10 * time.Millisecond)
	held.Publish()
	clk.Advance(time.Hour)
	require.Zero(t, fired)
	require.Zero(t, w.Len())
	require.NoError(t, w.Verify())
	require.Zero(t, tm.s.tw.count, "nothing linked")
	requireBalanced(t, w)
}

// TestResetParkedThenResetAgain: a parked entry whose Reset has finished, its command not taken
// yet; a second Reset to a later deadline (the entry is no longer parked, so it sends no command)
// returns. The first Reset's command moves the entry to the second's deadline, and the timer fires
// exactly there, never before. Also a second Reset to an earlier deadline, and to one in the same
// tick.
func TestResetParkedThenResetAgain(t *testing.T) {
	for _, tc := range []struct {
		name   string
		second time.Duration // Reset at 1 ms
		due    time.Duration
	}{
		{"later", 8 * time.Millisecond, 9 * time.Millisecond},
		{"earlier", 1500 * time.Microsecond, 2500 * time.Microsecond},
		{"same tick", 3900 * time.Microsecond, 4900 * time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, clk, now := parkWheel(t)
			var firedAt time.Duration = -1
			tm, err := w.AfterFunc(time.Millisecond, func() { firedAt = now() })
			require.NoError(t, err)
			d, err := w.AfterFunc(time.Hour, func() {})
			require.NoError(t, err)
			finish := holdReset(t, tm, 4*time.Millisecond) // due 4 ms
			clk.Advance(time.Millisecond)
			require.True(t, isParked(w, tm))
			ok, held := d.StopHeld()
			require.True(t, ok)
			finish()
			require.True(t, tm.Reset(tc.second))
			held.Publish()
			clk.Advance(tc.due - now() - 1)
			require.Equal(t, time.Duration(-1), firedAt, "fired before its last deadline")
			clk.Advance(1)
			require.Equal(t, tc.due, firedAt)
			require.NoError(t, w.Verify())
			require.Zero(t, w.Len())
		})
	}
}

// TestResetParkedEvery: an Every whose Reset is paused across the advance that meets its re-armed
// entry does not run while held; it is parked, then moved to the Reset's deadline (25 ms), and the
// series keeps its rate from there (35 ms).
func TestResetParkedEvery(t *testing.T) {
	w, clk, now := parkWheel(t)
	var runs []time.Duration
	tm, err := w.Every(10*time.Millisecond, func() { runs = append(runs, now()) })
	require.NoError(t, err)
	clk.Advance(10 * time.Millisecond)
	require.Equal(t, []time.Duration{10 * time.Millisecond}, runs)
	finish := holdReset(t, tm, 15*time.Millisecond) // due 25 ms; the series' own run is at 20 ms
	clk.Advance(10 * time.Millisecond)
	require.True(t, isParked(w, tm))
	require.Len(t, runs, 1, "ran while a Reset held it")
	finish()
	clk.Advance(5*time.Millisecond - 1)
	require.Len(t, runs, 1)
	clk.Advance(1)
	clk.Advance(10 * time.Millisecond)
	require.Equal(t, []time.Duration{10 * time.Millisecond, 25 * time.Millisecond, 35 * time.Millisecond}, runs)
	require.True(t, tm.Stop())
	require.NoError(t, w.Verify())
	requireBalanced(t, w)
}

// TestResetParkedNotMovedByAnEarlierCommand: a parked entry stays in the held bucket until the
// Reset that parked it sends its own command; an earlier Reset's command does not move it. Were it
// moved, the next advance would take it while still parked and drop it, the parked Reset's own
// command would find it unlinked, and the timer would never fire.
//
//  1. Reset0 of T (to 2 ms) publishes its reset command behind a slot claimed by a paused Stop
//     of another timer, so that no drain sees it yet (a Reset0 paused between its final CAS and
//     its send is the same).
//  2. Reset1 of T holds it (resetting) and is paused (preemption, GC assist).
//  3. The advance to T's old deadline meets it held: parks it (stParked, held bucket).
//  4. The paused slot is published; the next advance's drain applies Reset0's command, which
//     must leave the parked entry where it is (moved into the bucket of 2 ms, it would be taken
//     by this same advance and dropped).
//  5. Reset1 goes on: its CAS fails (parked), it stores pending and sends its command, which
//     moves the entry to 50 ms.
//
// Keyed.Move storms (concurrent Resets of one timer) are where two Resets of one timer meet.
func TestResetParkedNotMovedByAnEarlierCommand(t *testing.T) {
	w, clk, now := parkWheel(t)
	var firedAt time.Duration = -1
	tm, err := w.AfterFunc(10*time.Millisecond, func() { firedAt = now() })
	require.NoError(t, err)
	d, err := w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	ok, held := d.StopHeld()
	require.True(t, ok)
	require.True(t, tm.Reset(2*time.Millisecond))   // 1. its command waits behind the held slot
	finish := holdReset(t, tm, 50*time.Millisecond) // 2.
	clk.Advance(10 * time.Millisecond)              // 3.
	require.True(t, isParked(w, tm), "the advance met the held entry: parked")
	held.Publish()
	clk.Advance(0) // 4.
	finish()       // 5.
	clk.Advance(40*time.Millisecond - 1)
	require.Equal(t, time.Duration(-1), firedAt, "fired before its deadline")
	clk.Advance(1)
	require.Equal(t, 50*time.Millisecond, firedAt, "T, reset to 50 ms, not fired at 50 ms (Len %d)", w.Len())
	clk.Advance(time.Hour)
	require.Zero(t, w.Len())
	require.NoError(t, w.Verify())
}

// TestResetParkedCommandAppliedWhileAnotherResetHolds: the parking Reset's command is applied while
// a second Reset holds the entry (resetting, in the held bucket): it moves the entry out at the
// deadline it reads (the first Reset's; the second has not stored its own yet). Then the second
// Reset finishes: with the entry met and parked again by an advance meanwhile, or not met, to a
// later or an earlier deadline. The timer fires once, exactly at the second Reset's deadline (or at
// once, if the advance already passed it).
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
		{"earlier than the first's, met", 2500 * time.Microsecond, true, 3500 * time.Microsecond}, // met at 5 ms: parked, fires at once when the Reset finishes
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, clk, now := parkWheel(t)
			var fired []time.Duration
			tm, err := w.AfterFunc(ms, func() { fired = append(fired, now()) })
			require.NoError(t, err)
			finish1 := holdReset(t, tm, 5*ms) // due 5 ms
			clk.Advance(ms)
			require.True(t, isParked(w, tm))
			finish1() // pending again, still in the held bucket; its command is in the ring
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

// parkStorm arms 64 timers on w (one-shots, or Everys with every) and for dur lets 8 goroutines
// Stop and Reset them at random, one Reset in 20 paused between its two steps (ResetHeld) so that
// advances meet entries held and park them; tick, if not nil, advances a manual clock meanwhile.
// Then each one-shot has run or been stopped, exactly once; each Every's series has been ended by
// exactly one Stop; and nothing is pending.
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
					// A Reset paused between its two steps (preemption): an
					// advance that meets the entry held parks it.
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

// TestResetParkStormSystemClock: parkStorm of one-shots on the system clock, twice; the books
// balance.
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

// TestResetParkStormManualClock: parkStorm of one-shots while a manual clock advances by random
// steps, twice.
func TestResetParkStormManualClock(t *testing.T) {
	for round := 0; round < 2; round++ {
		clk := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clk), WithShards(2), WithWorkers(2), WithTick(100*time.Microsecond))
		require.NoError(t, err)
		parkStorm(t, w, func() { clk.Advance(time.Duration(rand.IntN(300)) * time.Microsecond) }, 300*time.Millisecond, false)
		w.Stop()
	}
}

// TestResetParkStormEvery: parkStorm of Everys on the system clock, twice.
func TestResetParkStormEvery(t *testing.T) {
	for round := 0; round < 2; round++ {
		w, err := New(WithShards(2), WithWorkers(3), WithTick(100*time.Microsecond))
		require.NoError(t, err)
		parkStorm(t, w, nil, 300*time.Millisecond, true)
		w.Stop()
	}
}
