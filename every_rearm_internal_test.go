package shardwheel

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The lost-wake-up family of TestEveryRearmResetEarlier, probed by the third review of this
// change: each test drives one interleaving by hand (the Every's worker blocked on the shard's
// mutex inside its send, as in that test) and checks that the run starts at the deadline the
// user set last, never earlier. The first failed before every.go's fix.

// resetAheadOfAdd drives TestEveryRearmResetEarlier's interleaving up to the worker's add: the
// Every's worker, having re-armed the entry for 20 ms, is blocked on the shard's mutex inside its
// send; a Reset to 13 ms sends its command and notes 13 ms; an advance of the shard takes the
// command (ignored: the entry is not linked yet) and publishes the wheel's own next. It returns
// with ev.s.mu held; the caller goes on, lets go of mu, and waits for the add (waitAddSent).
func resetAheadOfAdd(t *testing.T) (*Wheel, *ManualClock, Timer, *atomic.Int32) {
	t.Helper()
	w, clk, ev, runs, held := everyStuckInSend(t)
	s := ev.s
	s.mu.Lock()
	waitBlockedInSend(t)
	held.Publish()
	s.drainLocked() // the two cancels: two slots free, and the worker waits for mu
	require.True(t, ev.Reset(3*time.Millisecond), "due at 13 ms")
	require.LessOrEqual(t, s.next.Load(), int64(13*time.Millisecond))
	s.advanceLocked(w.nanos(), 0) // as Wheel.advance does for the shard (nothing is due at 10 ms)
	return w, clk, ev, runs
}

// waitAddSent waits until the worker blocked in its send has published its add and noted its
// deadline: the shard's next, never after resetAheadOfAdd's advance, moves.
func waitAddSent(t *testing.T, s *shard) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); s.next.Load() == never; {
		require.True(t, time.Now().Before(deadline), "the worker never sent its add")
		time.Sleep(time.Millisecond)
	}
}

// waitRuns waits (real time) until runs reaches n, advancing the manual clock by 0 so that a
// shard whose add arrived late is looked at; it reports whether it got there.
func waitRuns(clk *ManualClock, runs interface{ Load() int32 }, n int32) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if runs.Load() >= n {
			return true
		}
		time.Sleep(time.Millisecond)
		clk.Advance(0)
	}
	return runs.Load() >= n
}

// Two Resets to earlier deadlines, both commands ahead of the worker's add, each ignored by an
// advance that then publishes the wheel's own next: the run must start at the second one.
func TestEveryRearmTwoResetsAheadOfAdd(t *testing.T) {
	w, clk, ev, runs := resetAheadOfAdd(t)
	defer w.Stop()
	s := ev.s
	require.True(t, ev.Reset(time.Millisecond)) // 11 ms
	s.advanceLocked(w.nanos(), 0)               // ignores it too
	require.NoError(t, strongVerifyLocked(s))
	s.mu.Unlock()
	waitAddSent(t, s)
	require.NoError(t, strongVerifyAll(w))
	clk.Advance(time.Millisecond - 1)
	time.Sleep(10 * time.Millisecond)
	require.Equal(t, int32(1), runs.Load(), "early")
	clk.Advance(1) // 11 ms
	require.True(t, waitRuns(clk, runs, 2), "the run Reset to 11 ms did not start at 11 ms (shard next %v)", time.Duration(s.next.Load()))
	require.True(t, ev.Stop())
}

// A Reset to earlier, its command ahead of the add and ignored; then a second Reset claims the
// entry and is paused (held) while the worker sends its add and notes its deadline; the shard
// takes the add (linking the held entry at 13 ms); the second Reset then lowers to 11 ms.
func TestEveryRearmResetHeldAcrossAdd(t *testing.T) {
	w, clk, ev, runs := resetAheadOfAdd(t)
	defer w.Stop()
	s := ev.s
	ok, release := ev.ResetHeld(time.Millisecond) // 11 ms, claimed only
	require.True(t, ok)
	s.mu.Unlock()
	waitAddSent(t, s)
	takeRing(s) // the shard takes the add: the held entry is linked at 13 ms
	if ev.Queued() {
		release()
		t.Fatal("the add was not taken")
	}
	release() // 11 ms: lower, so a reset command and a note
	require.NoError(t, strongVerifyAll(w))
	clk.Advance(time.Millisecond - 1)
	time.Sleep(10 * time.Millisecond)
	require.Equal(t, int32(1), runs.Load(), "early")
	clk.Advance(1)
	require.True(t, waitRuns(clk, runs, 2), "the run Reset to 11 ms did not start at 11 ms")
	require.True(t, ev.Stop())
}

// The same with the second Reset raising (to 30 ms) instead: no command; the entry is linked at
// 13 ms and re-inserted there. The run must start at 30 ms, not before.
func TestEveryRearmResetHeldRaiseAcrossAdd(t *testing.T) {
	w, clk, ev, runs := resetAheadOfAdd(t)
	defer w.Stop()
	s := ev.s
	ok, release := ev.ResetHeld(20 * time.Millisecond) // 30 ms
	require.True(t, ok)
	s.mu.Unlock()
	waitAddSent(t, s)
	takeRing(s)
	release()
	require.NoError(t, strongVerifyAll(w))
	clk.Advance(20*time.Millisecond - 1)
	time.Sleep(10 * time.Millisecond)
	require.Equal(t, int32(1), runs.Load(), "early")
	require.NoError(t, strongVerifyAll(w))
	clk.Advance(1)
	require.True(t, waitRuns(clk, runs, 2), "the run Reset to 30 ms did not start at 30 ms")
	require.True(t, ev.Stop())
}

// ManualClock.Advance's rule for a d <= 0 timer armed by a callback (found by the third review:
// its doc said such a timer always waits for the next Advance). It is due at the clock's time,
// which is the end of this Advance: armed in a round at an earlier instant (a 5 ms timer's, in
// an Advance to 10 ms) it fires in the round at 10 ms of the same Advance; armed in that last
// round it waits for the next Advance, or a callback that re-arms itself would never let Advance
// return.
func TestManualCallbackDueNowByRound(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0), WithTick(time.Millisecond))
	require.NoError(t, err)
	defer w.Stop()
	var fired []string
	arm := func(name string) func() {
		return func() {
			_, err := w.AfterFunc(0, func() { fired = append(fired, name) })
			require.NoError(t, err)
		}
	}
	_, err = w.AfterFunc(5*time.Millisecond, arm("from 5 ms"))
	require.NoError(t, err)
	_, err = w.AfterFunc(10*time.Millisecond, arm("from 10 ms"))
	require.NoError(t, err)
	clk.Advance(10 * time.Millisecond)
	require.Equal(t, []string{"from 5 ms"}, fired, "armed in an earlier round: this Advance; in the last: the next")
	clk.Advance(0)
	require.Equal(t, []string{"from 5 ms", "from 10 ms"}, fired)
}
