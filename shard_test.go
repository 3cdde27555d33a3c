package shardwheel_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestFullRing: with a ring of two slots and many producers, a producer that finds the ring full
// drains it itself, and nothing is lost: every timer fires or is stopped.
func TestFullRing(t *testing.T) {
	w, err := sw.New(sw.WithRingSize(2), sw.WithShards(2))
	require.NoError(t, err)
	defer w.Stop()
	const producers, each = 16, 500
	var fired, stopped atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				tm, err := w.AfterFunc(time.Duration(i%3)*time.Millisecond, func() {
					if fired.Add(1)+stopped.Load() == producers*each {
						close(done)
					}
				})
				if err != nil {
					t.Error(err)
					return
				}
				if i%4 == 0 && tm.Stop() {
					if stopped.Add(1)+fired.Load() == producers*each {
						close(done)
					}
				}
			}
		}(p)
	}
	wg.Wait()
	<-done
	require.EqualValues(t, producers*each, fired.Load()+stopped.Load())
}

// TestLostWakeupBehindUnpublishedCancel: a timer armed behind a Stop paused between the claim of
// its cancel's ring slot and its publish is not lost: it fires at its deadline. On one shard, with
// a manual clock and callbacks on the advancer:
//  1. A Stop of timer D has made its state CAS and claimed its ring slot, and is paused before it
//     publishes the cancel.
//  2. Timer B is armed behind it; its noteDeadline sees the shard's next (C's, earlier) and
//     returns.
//  3. The advance fires C. Its drain stops at D's slot, so it cannot see B; the wheel itself has
//     nothing due.
//  4. The Stop publishes its cancel; a cancel notes no deadline.
//
// The advance's "nothing due" is only what the consumer could see: left at that, nothing would
// look at the shard again and B would never fire. So the drain records that it stalled on D's
// slot, the publish in 4 kicks the shard, and the next Advance drains B.
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
// ring and nothing more: B still fires at its deadline, never earlier.
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

// TestLayout: an entry is 48 bytes, and the shard's producer, slab and owner fields each start a
// cache line (counting the allocator's header): the memory per timer and the false-sharing claims
// rest on these sizes.
func TestLayout(t *testing.T) {
	require.Equal(t, uintptr(48), sw.EntrySize, "an entry must stay 48 bytes: the memory per pending timer rests on it")
	line := sw.CacheLineSize
	start := line - sw.MallocHeaderSize // the shard's offset 0 is this far into its first line
	require.Equal(t, start, sw.ShardTailAt, "the ring's tail starts the producers' line")
	require.Equal(t, start+line, sw.ShardSlabAt, "the slab's free stack starts the next line")
	require.Equal(t, start+2*line, sw.ShardOwnerAt, "the owner's fields start the line after it")
	require.Zero(t, (sw.ShardSize+sw.MallocHeaderSize)%line, "a shard ends on a line")
}

// TestShardAlignment: at the real addresses, every shard's producer line (the ring's tail), slab
// line and owner line each start a cache line: the false-sharing claims of shard.go rest on it, and
// the allocator's header (mallocHeaderSize) moves objects by 8 bytes.
func TestShardAlignment(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 16, 64} {
		w, _ := manualWheel(t, sw.WithShards(n))
		producer, slab, owner := w.ShardLineAddrs()
		require.Len(t, producer, n)
		for i := range producer {
			require.Zero(t, producer[i]%sw.CacheLineSize, "shards=%d: shard %d's producer line at %#x", n, i, producer[i])
			require.Zero(t, slab[i]%sw.CacheLineSize, "shards=%d: shard %d's slab line at %#x", n, i, slab[i])
			require.Zero(t, owner[i]%sw.CacheLineSize, "shards=%d: shard %d's owner line at %#x", n, i, owner[i])
		}
	}
}

// TestTargetOffIdleLine: at the real addresses, the keeper's target, which every arm reads
// (overdue), does not share a cache line with the idle count, which every worker writes at each
// idle spell.
func TestTargetOffIdleLine(t *testing.T) {
	for range 8 {
		w, _ := manualWheel(t)
		target, idle := w.TargetIdleAddrs()
		require.NotEqual(t, target/sw.CacheLineSize, idle/sw.CacheLineSize, "target at %#x, idle at %#x", target, idle)
	}
}
