package shardwheel

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// stopDepthLocked counts the Stop and drain frames on slot k; the caller holds w.stopMu.
func stopDepthLocked(w *Wheel, k int) (stops, drains int) {
	for _, f := range w.frames[k] {
		if f.drain {
			drains++
		} else {
			stops++
		}
	}
	return stops, drains
}

// TestStopWaitQuietRule drives one slot's frames by hand through the shapes stopwait.go names,
// and checks what a waiter that began at a given epoch reads (quietLocked): the rule itself,
// apart from the goroutines that make those shapes.
func TestStopWaitQuietRule(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1))
	require.NoError(t, err)
	defer w.Stop()
	quiet := func(since uint64) bool {
		w.stopMu.Lock()
		defer w.stopMu.Unlock()
		return w.quietLocked(0, since)
	}
	waiter := func() uint64 { // a waiter on another goroutine begins now
		w.stopMu.Lock()
		defer w.stopMu.Unlock()
		w.epoch++
		return w.epoch
	}

	// The worker runs a callback outside any Stop: not quiet.
	early := waiter()
	require.False(t, quiet(early), "a callback outside any Stop")
	// It calls Stop: quiet; the Stop returns: its callback is excused for a waiter that began
	// before, not for one that begins after.
	w.markStop(0, false, 1, false)
	require.True(t, quiet(early), "a Stop on top")
	w.markStop(0, false, -1, true)
	late := waiter()
	require.True(t, quiet(early), "the rest of a callback whose Stop returned while the waiter waited")
	require.False(t, quiet(late), "the rest of a callback whose Stop returned before the waiter began")

	// Its next Stop drains a chunk: not quiet while the chunk's callbacks run, in no Stop.
	since := waiter()
	w.markStop(0, false, 1, false)
	w.pushDrain(0)
	require.False(t, quiet(since), "a drained chunk")
	// A callback of it calls Stop: quiet while it is in it; once that Stop returned, the rest of
	// the chunk is excused (review 47) for this waiter, not for one that begins after.
	w.markStop(0, false, 1, false)
	require.True(t, quiet(since), "a Stop on top of a drained chunk")
	w.markStop(0, false, -1, true)
	require.True(t, quiet(since), "the rest of a chunk whose callback's Stop returned")
	require.False(t, quiet(waiter()), "the same, for a waiter that began after that Stop returned")
	w.popDrain(0)
	require.True(t, quiet(since), "the chunk ran: the Stop that drained it is on top")
	// The next chunk it drains is not excused (review 45's chain); nor by a Stop of one of its
	// callbacks that runtime.Goexit unwound.
	w.pushDrain(0)
	require.False(t, quiet(since), "the next drained chunk")
	w.markStop(0, false, 1, false)
	w.markStop(0, false, -1, false)
	require.False(t, quiet(since), "a drained chunk whose callback's Stop a Goexit unwound")
	w.popDrain(0)
	w.markStop(0, false, -1, true)
	require.True(t, quiet(since), "the draining Stop returned while the waiter waited")
	// A slot's frames are its own: worker 0's Stop says nothing of the advancer's slot.
	require.False(t, func() bool {
		w.stopMu.Lock()
		defer w.stopMu.Unlock()
		return w.quietLocked(1, since)
	}(), "the advancer's slot, with no Stop on it")

	w.stopMu.Lock()
	stops, drains := stopDepthLocked(w, 0)
	w.stopMu.Unlock()
	require.Zero(t, stops+drains)
}
