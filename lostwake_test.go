package shardwheel_test

import (
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestLostWakeupBehindUnpublishedCancel is the interleaving a reader found in v1, step by step,
// on one shard with a manual clock and callbacks on the advancer:
//  1. A Stop of timer D has made its state CAS and claimed its ring slot, and is paused before it
//     publishes the cancel.
//  2. Timer B is armed behind it; its noteDeadline sees the shard's next (C's, earlier) and
//     returns.
//  3. The advance fires C. Its drain stops at A's slot, so it cannot see B, and it publishes the
//     wheel's own next due: none.
//  4. A publishes its cancel; a cancel notes no deadline.
//
// In v1 nothing then looked at the shard again: after a day of manual time B had not fired.
func TestLostWakeupBehindUnpublishedCancel(t *testing.T) {
	w, clk := manualWheel(t, sw.WithShards(1))
	var fired []string
	note := func(name string) func() { return func() { fired = append(fired, name) } }

	_, err := w.AfterFunc(time.Millisecond, note("C"))
	require.NoError(t, err)
	d, err := w.AfterFunc(time.Hour, note("D"))
	require.NoError(t, err)

	stopped, held := d.StopHeld() // 1.
	require.True(t, stopped)
	_, err = w.AfterFunc(5*time.Millisecond, note("B")) // 2.
	require.NoError(t, err)
	clk.Advance(time.Millisecond) // 3.
	require.Equal(t, []string{"C"}, fired)
	held.Publish() // 4.

	clk.Advance(4 * time.Millisecond)
	require.Equal(t, []string{"C", "B"}, fired, "B is due at 5 ms and must have fired")
	clk.Advance(24 * time.Hour)
	require.Equal(t, []string{"C", "B"}, fired)
	require.Zero(t, w.Len())
	require.NoError(t, w.Verify())
}

// TestLostWakeupHeldNeverEarly: the same pause, with no earlier timer; the drain stalls on the
// held cancel, whose publish then kicks the shard. The kick makes the next Advance drain the
// ring and nothing more: B still fires at its deadline, not earlier.
func TestLostWakeupHeldNeverEarly(t *testing.T) {
	w, clk := manualWheel(t, sw.WithShards(1))
	var fired []string
	note := func(name string) func() { return func() { fired = append(fired, name) } }

	d, err := w.AfterFunc(time.Hour, note("D"))
	require.NoError(t, err)
	stopped, held := d.StopHeld()
	require.True(t, stopped)
	_, err = w.AfterFunc(5*time.Millisecond, note("B"))
	require.NoError(t, err)
	clk.Advance(time.Millisecond) // the drain stalls on the held cancel
	held.Publish()                // kicks the shard
	clk.Advance(3 * time.Millisecond)
	require.Empty(t, fired, "the kick drains the ring; B is not due before 5 ms")
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"B"}, fired)
}
