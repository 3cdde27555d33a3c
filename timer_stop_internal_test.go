package shardwheel

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Timer.Stop of a pending timer: one whose add the shard has taken (the Stop's cancel command
// frees the entry), and one whose add is still queued in the ring (no command: the add frees it,
// Timer.stopQueued), also with the Stop paused between its two steps.

// timerStopPayload is a callback argument whose reachability a test watches (weak pointer).
type timerStopPayload struct{ _ [64]byte }

// TestStopOfTakenTimerLetsGoAtOnce: a Stop of a pending timer whose add the shard has taken lets go
// of the callback and its argument at once, not when the shard takes its cancel command. On a quiet
// shard of a manual clock nobody takes that command until the next Advance, and the stopped timer's
// argument must not stay reachable through the entry meanwhile (README, "Prompt release": once Stop
// reports true, the wheel no longer keeps the callback or its argument reachable).
func TestStopOfTakenTimerLetsGoAtOnce(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, _ := newManualWheel(t, WithShards(1), WithWorkers(0))
	s := w.shards[0]

	tm := func() Timer {
		tm, err := w.AfterFuncArg(time.Hour, func(any) {}, new(timerStopPayload))
		require.NoError(t, err)
		return tm
	}()
	takeRing(s) // the shard takes the add: the entry is linked, no longer queued
	e := s.slab.at(tm.i)
	word := e.state.Load()
	require.True(t, isState(word, stPending) && !isQueued(word) && e.linked())
	wp := weak.Make(e.arg.(*timerStopPayload))

	require.True(t, tm.Stop())
	require.Nil(t, e.f, "Stop kept the callback until the shard takes its cancel")
	require.Nil(t, e.arg, "Stop kept the argument until the shard takes its cancel")
	runtime.GC()
	runtime.GC()
	require.Nil(t, wp.Value(), "the stopped timer's argument is still reachable")
	require.Equal(t, 0, w.Len())
}

// TestStopQueuedSendsNoCommand: a Stop of a timer whose add the shard has not taken yet reports
// true, sends no command, and lets go of the callback at once; a second Stop and a Reset report
// false. The shard, taking the add, finds the entry stopped and frees it (the next arm takes it,
// with the next gen), and the timer never fires.
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

// TestStopQueuedPausedWhileTheShardTakesTheAdd: the shard takes the add while a Stop is paused
// between its CAS to stopping and its CAS to stopped: the shard clears queued and leaves the entry
// unlinked and unfreed; the Stop's second CAS fails, so it sends a cancel, which frees the entry.
// Only the paused Stop reports true (a second Stop and a Reset meanwhile report false), the timer
// never fires, and the entry is freed once.
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

// TestStopQueuedFinishedBeforeTheAdd: the same pause, with the add taken only after the Stop
// finished: the Stop sends no command, the add frees the entry, and the timer never fires.
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

// TestStopQueuedPausedAcrossWheelStop: a Stop of a queued timer, paused between its two steps
// (stopping, then stopped), across a whole Wheel.Stop. That Stop reported true, so Wheel.Stop
// counts nothing (it returns 0): its drop takes the add, which leaves the stopping entry to the
// paused Stop, whose cancel then finds the ring closed. The timer never fires, and the books
// balance with one Stopped.
func TestStopQueuedPausedAcrossWheelStop(t *testing.T) {
	w, _, _ := parkWheel(t)
	tm, err := w.AfterFunc(time.Millisecond, func() { t.Error("fired") })
	require.NoError(t, err)
	ok, finish := tm.StopQueuedHeld()
	require.True(t, ok)
	require.Zero(t, w.Stop())
	finish()
	require.False(t, tm.Stop())
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	require.EqualValues(t, 1, st.Stopped)
}

// TestStopQueuedGivesMaxPendingPlaceBackAtOnce: WithMaxPending(2), with one producer paused on the
// ring's head slot holding one place: a second timer T (queued behind it) takes the last place, and
// a third arm is refused with an error that names the bound. T's Stop, its add still queued, sends
// no command and gives the place back at once, before the shard has seen anything, so the next arm
// is accepted. After the publish the shard frees T's entry as it takes T's add, and T never runs;
// the books balance; both places are free again once all is over; and T's stale handle does nothing
// to its entry's next owner.
func TestStopQueuedGivesMaxPendingPlaceBackAtOnce(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := timerManualWheel(t, WithShards(1), WithWorkers(0), WithRingSize(64), WithMaxPending(2))
	defer w.Stop()
	s := w.shards[0]

	ran := map[string]int{}
	mk := func(name string) func(any) { return func(any) { ran[name]++ } }
	h := w.ArmHeld(time.Millisecond, mk("held"), nil)
	tm, err := w.AfterFuncArg(time.Millisecond, mk("T"), nil)
	require.NoError(t, err)
	_, err = w.AfterFuncArg(time.Millisecond, mk("refused"), nil)
	require.ErrorIs(t, err, ErrTooManyTimers)
	require.True(t, strings.Contains(err.Error(), "WithMaxPending(2)"), "the error names the bound: %v", err)

	tailBefore := s.ring.tail.Load()
	require.True(t, tm.Queued())
	require.True(t, tm.Stop(), "Stop of a queued pending timer")
	require.Equal(t, tailBefore, s.ring.tail.Load(), "a Stop of a queued timer sends no command")
	require.False(t, tm.Stop(), "a second Stop reports false")
	require.False(t, tm.Reset(time.Millisecond), "Reset of a stopped timer reports false")

	u, err := w.AfterFuncArg(time.Millisecond, mk("U"), nil)
	require.NoError(t, err, "T's Stop gave its place back")
	ui, _ := u.Slot()
	ti, _ := tm.Slot()
	require.NotEqual(t, ti, ui, "T's entry is not free before the shard takes its add")

	h.Publish()
	clk.Advance(time.Millisecond)
	require.Equal(t, map[string]int{"held": 1, "U": 1}, ran)
	require.Zero(t, w.Len())
	st := requireBooks(t, w)
	require.Equal(t, uint64(1), st.Stopped)
	require.Equal(t, uint64(1), st.Rejected)

	// Both places are free: two timers are accepted, and T's entry is reused (last in, first
	// out after the drain that freed it), with a gen above T's.
	a, err := w.AfterFuncArg(time.Hour, mk("a"), nil)
	require.NoError(t, err)
	b, err := w.AfterFuncArg(time.Hour, mk("b"), nil)
	require.NoError(t, err)
	_, err = w.AfterFuncArg(time.Hour, mk("c"), nil)
	require.True(t, errors.Is(err, ErrTooManyTimers))
	_, tgen := tm.Slot()
	for _, x := range []Timer{a, b} {
		if i, g := x.Slot(); i == ti {
			require.Greater(t, g, tgen)
		}
	}
	require.False(t, tm.Stop(), "T's stale handle does nothing to the entry's new owner")
	require.Equal(t, 2, w.Len())
	require.Equal(t, 2, w.Stop(), "both are pending at Stop")
	requireBooks(t, w)
}

// TestStopQueuedEveryRearm: an Every's re-arm is queued too: a Stop between runs, before the shard
// took the re-arm's add, reports true and sends no command; the series ends, and the add frees the
// entry.
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
