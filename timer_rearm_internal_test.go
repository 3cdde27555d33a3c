package shardwheel

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// An Every's Timer between two runs: after a run the worker re-arms the entry (pending, queued)
// and then sends its add, which may wait for room in a full ring; and the periodic bit that marks
// an Every's entry through every state.

// takeThrough lets the shard take its ring until its head reaches pos: the commands up to
// there (the worker's add among them) were published and taken. It waits for the worker rather
// than sleeping a fixed time.
func takeThrough(t *testing.T, s *shard, pos uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		takeRing(s)
		s.mu.Lock()
		h := s.head
		s.mu.Unlock()
		if h >= pos {
			return
		}
		require.True(t, time.Now().Before(deadline), "the worker never published its add (head %d, want %d)", h, pos)
		time.Sleep(time.Millisecond)
	}
}

// requireSeriesEnded checks an Every stopped while its worker waited to send the re-arm's add:
// once the shard has taken the commands up to pos (the add among them) and two hours passed, it
// ran once, nothing is pending, the counters balance, and its entry is back on the free stack
// exactly once.
func requireSeriesEnded(t *testing.T, w *Wheel, clk *ManualClock, ev Timer, runs *atomic.Int32, pos uint64) {
	t.Helper()
	clk.Advance(time.Hour)
	clk.Advance(time.Hour)
	takeThrough(t, ev.s, pos)
	require.Equal(t, int32(1), runs.Load())
	require.Zero(t, w.Len())
	require.NoError(t, w.Verify())
	requireBalanced(t, w)
	freeStackAudit(t, w)
}

// TestQueuedEveryRearmStuckInSendThenStopped: an Every's worker has re-armed the entry (pending,
// queued) but its add waits for room in a full ring (everyStuckInSend). A Stop then reports true;
// the series runs no more, and the add, once the shard takes it (after the two held slots: head+3,
// waited for, not slept for), frees the entry exactly once.
func TestQueuedEveryRearmStuckInSendThenStopped(t *testing.T) {
	w, clk, ev, runs, held := everyStuckInSend(t)
	defer w.Stop()
	head := commands(ev.s) - 2
	require.True(t, ev.Stop())
	held.Publish()
	requireSeriesEnded(t, w, clk, ev, runs, head+3)
}

// TestQueuedEveryRearmStuckInSendResetThenStopped: the same, with a Reset to an earlier deadline
// before the Stop (its command waits for room in the ring too: with the worker's add, head+4). Both
// report true, the series runs no more, and the entry is freed once.
func TestQueuedEveryRearmStuckInSendResetThenStopped(t *testing.T) {
	w, clk, ev, runs, held := everyStuckInSend(t)
	defer w.Stop()
	head := commands(ev.s) - 2
	done := make(chan bool)
	e := ev.s.slab.at(ev.i)
	v0 := e.state.Load() & versionMask
	go func() { done <- ev.Reset(time.Millisecond) }()
	for deadline := time.Now().Add(5 * time.Second); e.state.Load()&versionMask == v0; {
		require.True(t, time.Now().Before(deadline), "the Reset never let go of the entry")
		time.Sleep(time.Millisecond)
	}
	require.True(t, ev.Stop())
	held.Publish()
	require.True(t, <-done)
	requireSeriesEnded(t, w, clk, ev, runs, head+4)
}

// TestQueuedEveryRearmStuckInSendReset: a Reset alone while the worker waits to send its add: the
// next run comes at the Reset's deadline (13 ms), not before it and not at the series' own (20 ms).
// After the Advance to 13 ms the test Advances by 0 until the run starts, which happens as soon as
// the worker's add is in: the add notes the Reset's deadline, so the shard's next does not stay at
// the stale 20 ms (a lost wake-up, which an Advance(0) at 13 ms would never look past).
func TestQueuedEveryRearmStuckInSendReset(t *testing.T) {
	w, clk, ev, runs, held := everyStuckInSend(t)
	defer w.Stop()
	done := make(chan bool)
	go func() { done <- ev.Reset(3 * time.Millisecond) }() // due at 13 ms
	held.Publish()
	require.True(t, <-done)
	clk.Advance(3*time.Millisecond - 1)
	time.Sleep(10 * time.Millisecond) // (a negative check: a sleep can only miss an early run)
	require.Equal(t, int32(1), runs.Load(), "early")
	clk.Advance(1)
	for deadline := time.Now().Add(5 * time.Second); runs.Load() != 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		clk.Advance(0)
	}
	require.Equal(t, int32(2), runs.Load(), "not run at the Reset's deadline (clock at %v)", clk.Now().Sub(time.Unix(0, 0)))
	require.True(t, ev.Stop())
}

// TestQueuedEveryRearmStuckInSendWheelStop: Wheel.Stop, from outside, while the worker that
// re-armed an Every waits to send its add: Stop waits for that add (a re-arm in progress, which
// runs no user code), then drops the series' next run from the ring and counts it, once. The Every
// ran once, its Stop then reports false, and the books balance.
func TestQueuedEveryRearmStuckInSendWheelStop(t *testing.T) {
	w, _, ev, runs, held := everyStuckInSend(t)
	done := make(chan int)
	go func() { done <- w.Stop() }()
	time.Sleep(10 * time.Millisecond)
	held.Publish()
	n := <-done
	require.Equal(t, 1, n, "the Every's next run, re-armed while Stop waited for its add, is dropped and counted once")
	require.Equal(t, int32(1), runs.Load())
	require.False(t, ev.Stop())
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
}

// TestTimerPeriodicBitOnlyForEvery: the periodic bit, by which a worker tells an Every's run from a
// one-shot without reading f or arg, is set for an Every's arming only and survives a Reset, its
// firing, its run and its re-arm; a one-shot armed next on the same entry has none, and the Every's
// stale handle does nothing to it.
func TestTimerPeriodicBitOnlyForEvery(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	s := w.shards[0]
	var seen []uint64
	var tm Timer
	tm, err = w.Every(time.Millisecond, func() { seen = append(seen, s.slab.at(tm.i).state.Load()) })
	require.NoError(t, err)
	e := s.slab.at(tm.i)
	require.True(t, isPeriodic(e.state.Load()))
	require.True(t, tm.Reset(2*time.Millisecond))
	require.True(t, isPeriodic(e.state.Load()))
	clk.Advance(2 * time.Millisecond)
	clk.Advance(time.Millisecond)
	require.Len(t, seen, 2)
	for _, st := range seen {
		require.True(t, isPeriodic(st) && isState(st, stRunning))
	}
	require.True(t, isPeriodic(e.state.Load()) && isState(e.state.Load(), stPending))
	require.True(t, tm.Stop())
	clk.Advance(time.Millisecond) // the shard frees the stopped entry (taking its re-arm's add)
	t1, err := w.AfterFunc(time.Millisecond, func() {})
	require.NoError(t, err)
	require.Equal(t, tm.i, t1.i)
	require.False(t, isPeriodic(e.state.Load()))
	require.False(t, tm.Stop(), "a stale handle")
}
