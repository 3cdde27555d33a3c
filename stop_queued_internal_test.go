package shardwheel

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Stop that comes before the shard took the timer's add sends no cancel (timer.go: the queued
// bit). These tests drive each step of that protocol by hand, on one shard of a manual clock:
// the Stop alone, the Stop paused while the shard takes the add, and a Reset whose entry the
// shard takes between its claim and its release.

// commands returns how many commands were ever pushed to s's ring.
func commands(s *shard) uint64 { return s.ring.tail.Load() &^ ringClosed }

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

func TestStopQueuedSendsNoCommand(t *testing.T) {
	w, clk, _ := parkWheel(t)
	fired := 0
	tm, err := w.AfterFunc(time.Millisecond, func() { fired++ })
	require.NoError(t, err)
	require.True(t, tm.Queued(), "the shard has not taken the add")
	before := commands(tm.s)

	require.True(t, tm.Stop())
	require.Equal(t, before, commands(tm.s), "a Stop of a queued timer pushes no command")
	e := tm.s.slab.at(tm.i)
	require.Nil(t, e.f, "Stop lets go of the callback at once")
	require.False(t, tm.Stop(), "only the first Stop reports true")
	require.False(t, tm.Reset(time.Millisecond))

	takeRing(tm.s) // the shard takes the add, finds the entry stopped, and frees it
	require.False(t, e.linked())
	clk.Advance(time.Hour)
	require.Zero(t, fired)
	requireFreed(t, w, tm)
	require.NoError(t, w.Verify())
	requireBalanced(t, w)
	require.Zero(t, w.Len())
}

// The shard takes the add while the Stop is paused between its CAS to stopping and its CAS to
// stopped: the shard clears queued and leaves the entry unlinked and unfreed; the Stop's second
// CAS fails, so it sends a cancel, which frees the entry.
func TestStopQueuedPausedWhileTheShardTakesTheAdd(t *testing.T) {
	w, clk, _ := parkWheel(t)
	fired := 0
	tm, err := w.AfterFunc(time.Millisecond, func() { fired++ })
	require.NoError(t, err)
	ok, finish := tm.StopQueuedHeld()
	require.True(t, ok)
	require.False(t, tm.Stop(), "the paused Stop is the one that reports true")
	require.False(t, tm.Reset(time.Minute), "a stopping timer cannot be reset")

	takeRing(tm.s)
	e := tm.s.slab.at(tm.i)
	require.False(t, tm.Queued(), "the shard took the add")
	require.False(t, e.linked(), "and did not link a stopping entry")
	require.True(t, isState(e.state.Load(), stStopping), "nor free it")

	before := commands(tm.s)
	finish()
	require.Equal(t, before+1, commands(tm.s), "the Stop, finding the add taken, sends a cancel")
	require.True(t, isState(e.state.Load(), stStopped))
	takeRing(tm.s)
	clk.Advance(time.Hour)
	require.Zero(t, fired)
	requireFreed(t, w, tm)
	require.NoError(t, w.Verify())
	requireBalanced(t, w)
}

// The same pause, with the add taken only after the Stop finished: the add frees the entry.
func TestStopQueuedFinishedBeforeTheAdd(t *testing.T) {
	w, clk, _ := parkWheel(t)
	tm, err := w.AfterFunc(time.Millisecond, func() { t.Error("a stopped timer fired") })
	require.NoError(t, err)
	ok, finish := tm.StopQueuedHeld()
	require.True(t, ok)
	before := commands(tm.s)
	finish()
	require.Equal(t, before, commands(tm.s))
	takeRing(tm.s)
	clk.Advance(time.Hour)
	requireFreed(t, w, tm)
	requireBalanced(t, w)
}

// A Reset claims a queued entry, the shard takes the add (clearing queued under the Reset's
// feet), and the Reset's release CAS fails for that: it retries, keeps the timer where the add
// linked it, and the timer fires at the new deadline. With park, an Advance to the old deadline
// takes the add and meets the held entry too: it parks it, the release finds it parked and sends
// its command, and the timer fires at the later of the two deadlines (a review's case).
func TestResetOfQueuedEntryWhileTheShardTakesTheAdd(t *testing.T) {
	const armed = 5 * time.Millisecond
	for _, park := range []bool{false, true} {
		for _, d := range []time.Duration{2 * time.Millisecond, 10 * time.Millisecond} { // earlier, later
			t.Run(fmt.Sprintf("park=%v/%v", park, d), func(t *testing.T) {
				w, clk, since := parkWheel(t)
				var at []time.Duration
				tm, err := w.AfterFunc(armed, func() { at = append(at, since()) })
				require.NoError(t, err)
				require.True(t, tm.Queued())
				ok, release := tm.ResetHeld(d)
				require.True(t, ok)
				want := d
				if park {
					clk.Advance(armed)
					require.True(t, isParked(w, tm))
					require.Empty(t, at)
					want = max(d, armed)
				} else {
					takeRing(tm.s)
					require.True(t, tm.s.slab.at(tm.i).linked(), "the add links a held entry")
				}
				require.False(t, tm.Queued())
				release()
				require.False(t, tm.Queued(), "the release keeps the bit the shard cleared")
				require.Equal(t, park, isParked(w, tm), "parked until the release's command is taken")
				if want > since() {
					clk.Advance(want - since() - time.Nanosecond)
					require.Empty(t, at, "never early")
				}
				clk.Advance(want - since())
				require.Equal(t, []time.Duration{want}, at)
				clk.Advance(time.Hour)
				require.Len(t, at, 1)
				require.NoError(t, w.Verify())
				requireBalanced(t, w)
			})
		}
	}
}

// An Every's re-arm is queued too: a Stop between runs, before the shard took the re-arm's add,
// sends no command, and the series ends.
func TestStopQueuedEveryRearm(t *testing.T) {
	w, clk, _ := parkWheel(t)
	runs := 0
	tm, err := w.Every(time.Millisecond, func() { runs++ })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, runs)
	if !tm.Queued() {
		t.Fatal("after a run inside Advance the re-arm's add should still be in the ring")
	}
	before := commands(tm.s)
	require.True(t, tm.Stop())
	require.Equal(t, before, commands(tm.s))
	clk.Advance(time.Second)
	require.Equal(t, 1, runs)
	requireFreed(t, w, tm)
	requireBalanced(t, w)
}
