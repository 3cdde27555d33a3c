package shardwheel

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The parked protocol's edges (timer.go: a Reset paused while the shard met its entry), written
// by the second review of exact deadlines: a parked entry at Wheel.Stop, stopped before its
// Reset's command is applied, reset again meanwhile, an Every, and one that an earlier Reset's
// command must not move (TestResetParkedNotMovedByAnEarlierCommand failed before the fix: the
// timer was lost).

// parkWheel is a one-shard wheel on a manual clock whose callbacks run inside Advance.
func parkWheel(t *testing.T) (*Wheel, *ManualClock, func() time.Duration) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(1), WithTick(time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	return w, clk, func() time.Duration { return clk.Now().Sub(time.Unix(0, 0)) }
}

// isParked reports whether tm's entry is linked in the held bucket.
func isParked(w *Wheel, tm Timer) bool {
	s := tm.s
	s.mu.Lock()
	defer s.mu.Unlock()
	lv, _, _, ok := s.tw.position(s.slab.at(tm.i))
	return ok && lv == heldLv
}

func requireBalanced(t *testing.T, w *Wheel) {
	t.Helper()
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "counters: %+v", st)
}

// A parked entry at Wheel.Stop: Stop waits for the paused Reset, then drops the timer once (the
// Reset's command finds the ring closed). Nothing fires, nothing leaks, the counters balance.
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

// Parked, released (pending, still in the held bucket), and its command stuck behind a paused
// Stop's slot: a Stop of the timer then wins, its cancel frees the entry from the held bucket,
// and the Reset's command, applied before it, is harmless. The timer never fires.
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

// Parked, released, its command not yet applied; a second Reset to a later deadline (which, not
// parked, sends no command) returns: the first Reset's command must move the entry to the
// second's deadline, and it fires exactly there. Also a second Reset to an earlier deadline.
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

// An Every whose Reset is paused across the advance that meets its re-armed entry: parked, then
// moved to the Reset's deadline; the series keeps its rate from there.
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
// Reset that parked it sends its own command; an earlier Reset's command does not move it. Found
// by review at 269d64a, where it did: the next advance then met the entry still parked and
// dropped it, the parked Reset's own command found it unlinked, and the timer never fired.
//
//  1. Reset0 of T (to 2 ms) publishes its reset command behind a slot claimed by a paused Stop
//     of another timer, so that no drain sees it yet (a Reset0 goroutine paused between its
//     release and its send is the same).
//  2. Reset1 of T claims it (resetting) and is paused (preemption, GC assist).
//  3. The advance to T's old deadline meets it held: parks it (stParked, held bucket).
//  4. The paused slot is published; the next advance's drain applies Reset0's command, which
//     must leave the parked entry where it is (it used to move it into the bucket of 2 ms, and
//     the same advance took that bucket and dropped the entry).
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
