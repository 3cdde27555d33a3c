package shardwheel_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestShardAlignment checks, at the real addresses, that every shard's producer line (the ring's
// tail), slab line and owner line each start a cache line: the false-sharing claims of shard.go
// rest on it, and the allocator's header (mallocHeaderSize) moves objects by 8 bytes.
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

// TestTargetOffIdleLine checks, at the real addresses, that the keeper's target, which every arm
// reads (overdue), does not share a cache line with the idle count, which every worker writes at
// each idle spell (shardwheel.go).
func TestTargetOffIdleLine(t *testing.T) {
	for range 8 {
		w, _ := manualWheel(t)
		target, idle := w.TargetIdleAddrs()
		require.NotEqual(t, target/sw.CacheLineSize, idle/sw.CacheLineSize, "target at %#x, idle at %#x", target, idle)
	}
}

// TestMaxPendingBound hammers a striped WithMaxPending from many goroutines on many shards, each
// arming timers an hour out and stopping some of them, and a keeper of the tally that counts a
// timer only while it is certainly pending (after AfterFuncArg returned, before Stop is called):
// that count must never pass the bound, which is exact (no slack). Every refusal is an
// ErrTooManyTimers that names the bound. Then, with every timer stopped, one goroutine must get
// the whole bound back (credits left in other shards' stocks are collected), and no more; and
// timers that fire give theirs back too.
func TestMaxPendingBound(t *testing.T) {
	const limit = 100
	w, clk := manualWheel(t, sw.WithMaxPending(limit), sw.WithShards(8))
	goroutines, rounds := 16, 2000
	if raceEnabled || testing.Short() {
		rounds = 400
	}
	var held, peak, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rg := rand.New(rand.NewPCG(uint64(g), 1))
			var mine []sw.Timer
			for range rounds {
				if len(mine) > 0 && rg.IntN(3) == 0 { // arms outnumber stops: every goroutine reaches the bound
					k := rg.IntN(len(mine))
					held.Add(-1)
					if !mine[k].Stop() {
						t.Error("Stop of a pending timer reported false")
					}
					mine[k] = mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					continue
				}
				tm, err := w.AfterFuncArg(time.Hour, noopArg, nil)
				if err != nil {
					if !errors.Is(err, sw.ErrTooManyTimers) || err.Error() != "shardwheel: too many pending timers: WithMaxPending(100) reached" {
						t.Errorf("refusal: %v", err)
					}
					refused.Add(1)
					continue
				}
				for h := held.Add(1); ; {
					p := peak.Load()
					if h <= p || peak.CompareAndSwap(p, h) {
						break
					}
				}
				mine = append(mine, tm)
			}
			for _, tm := range mine {
				held.Add(-1)
				if !tm.Stop() {
					t.Error("Stop of a pending timer reported false")
				}
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, peak.Load(), int64(limit), "more timers pending than WithMaxPending")
	require.Positive(t, refused.Load(), "the bound was reached")
	require.Zero(t, w.Len())

	// Quiet: the whole bound is available again, to one goroutine, and no more.
	var timers []sw.Timer
	for i := range limit {
		tm, err := w.AfterFuncArg(time.Millisecond, noopArg, nil)
		require.NoError(t, err, "timer %d of %d once every earlier one was stopped", i, limit)
		timers = append(timers, tm)
	}
	_, err := w.AfterFuncArg(time.Millisecond, noopArg, nil)
	require.EqualError(t, err, "shardwheel: too many pending timers: WithMaxPending(100) reached")
	require.ErrorIs(t, err, sw.ErrTooManyTimers)
	require.True(t, timers[0].Stop())
	_, err = w.AfterFuncArg(time.Millisecond, noopArg, nil)
	require.NoError(t, err, "a stopped timer gives its credit back")

	// Fired timers give theirs back: all of them fire, and the bound is free again.
	clk.Advance(time.Millisecond)
	require.Zero(t, w.Len())
	for i := range limit {
		_, err := w.AfterFuncArg(time.Hour, noopArg, nil)
		require.NoError(t, err, "timer %d of %d once every earlier one fired", i, limit)
	}
	_, err = w.AfterFuncArg(time.Hour, noopArg, nil)
	require.ErrorIs(t, err, sw.ErrTooManyTimers)
	require.Equal(t, limit, w.Stop(), "Stop drops the timers that hold the bound")
}

// TestMaxPendingNoLimit: a wheel without the option never refuses for the count of its timers.
func TestMaxPendingNoLimit(t *testing.T) {
	w, _ := manualWheel(t, sw.WithShards(4))
	for range 10_000 {
		_, err := w.AfterFuncArg(time.Hour, noopArg, nil)
		require.NoError(t, err)
	}
	require.Equal(t, 10_000, w.Len())
}
