package shardwheel

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTrimLookRightAfterGrow (review 25's remark): a shard whose slab is full and trimmed (every
// entry in use for longer than trimQuiet) grows, and the trimmer looks while the grow is still
// under way. The look must see the grow and look again within trimLook, so that the new chunk is
// watched: when the grow noted itself (onGrow) before it pushed the chunk's entries on the free
// stack, the look cleared trimDirty, found the tag unchanged and the slab trimmed, and slept for
// trimIdleLook (30 s), which only delays giving the chunk back.
func TestTrimLookRightAfterGrow(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	s := w.shards[0]
	for range blockLen - 1 { // entry 0 of the first chunk stays unused: the chunk is full
		_, err := w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
	}
	require.Zero(t, uint32(s.slab.free.Load()), "the free stack is empty")
	for range 8 { // looks, then a trim once the slab has been quiet for trimQuiet
		clk.Advance(time.Second)
	}
	require.True(t, w.trim.slabs[0].trimmed, "the full slab is trimmed")

	var now, next int64
	grew := s.slab.onGrow
	s.slab.onGrow = func() {
		grew()
		now = w.nanos()
		next = w.trimIdle(now) // the trimmer, looking while the grow is under way
	}
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	require.NotZero(t, now, "the slab did not grow")
	require.LessOrEqual(t, next-now, int64(trimLook), "the look after the grow is %v away", time.Duration(next-now))
}
