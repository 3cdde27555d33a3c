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
	quiet := func(k int) bool {
		w.stopMu.Lock()
		defer w.stopMu.Unlock()
		return w.quietLocked(k)
	}

	// The worker runs a callback outside any Stop: not quiet.
	require.False(t, quiet(0), "a callback outside any Stop")
	// It calls Stop: quiet; the Stop returns: the rest of its callback and batch are excused, for
	// any waiter (review 50), until the worker is back in its loop.
	w.enterStop(0, false)
	require.True(t, quiet(0), "a Stop on top")
	w.leaveStop(0, false, true)
	require.True(t, quiet(0), "the rest of a callback whose Stop returned")
	w.batchOver(0)
	require.False(t, quiet(0), "what the worker takes from the queue once back in its loop")

	// Its next Stop drains a chunk: not quiet while the chunk's callbacks run, in no Stop.
	w.enterStop(0, false)
	w.pushDrain(0)
	require.False(t, quiet(0), "a drained chunk")
	// A callback of it calls Stop: quiet while it is in it; once that Stop returned, the rest of
	// the chunk is excused (review 47).
	w.enterStop(0, false)
	require.True(t, quiet(0), "a Stop on top of a drained chunk")
	w.leaveStop(0, false, true)
	require.True(t, quiet(0), "the rest of a chunk whose callback's Stop returned")
	w.popDrain(0)
	require.True(t, quiet(0), "the chunk ran: the Stop that drained it is on top")
	// The next chunk it drains is not excused (review 45's chain); nor by a Stop of one of its
	// callbacks that runtime.Goexit unwound.
	w.pushDrain(0)
	require.False(t, quiet(0), "the next drained chunk")
	w.enterStop(0, false)
	w.leaveStop(0, false, false)
	require.False(t, quiet(0), "a drained chunk whose callback's Stop a Goexit unwound")
	w.popDrain(0)
	w.leaveStop(0, false, false)
	require.False(t, quiet(0), "a Stop a Goexit unwound excuses nothing")
	// A slot's frames are its own: worker 0's Stops say nothing of the advancer's slot.
	require.False(t, quiet(1), "the advancer's slot, with no Stop on it")

	w.stopMu.Lock()
	stops, drains := stopDepthLocked(w, 0)
	w.stopMu.Unlock()
	require.Zero(t, stops+drains)
}
