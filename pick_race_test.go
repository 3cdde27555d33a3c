//go:build race

package shardwheel_test

import (
	"sync"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// raceEnabled reports whether the tests run under the race detector, which makes every atomic
// and channel operation many times slower: loop counts shrink accordingly.
const raceEnabled = true

// TestRacePickSpreads: under the race detector's shard pick (pick_race.go) a goroutine keeps to
// one shard, and goroutines spread over the shards.
func TestRacePickSpreads(t *testing.T) {
	w, _ := manualWheel(t, sw.WithShards(4))
	var mu sync.Mutex
	used := map[int]bool{}
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			home := -1
			for range 10 {
				tm, err := w.AfterFuncArg(time.Hour, noopArg, nil)
				if err != nil {
					t.Error(err)
					return
				}
				s := w.ShardOf(tm)
				if home == -1 {
					home = s
				}
				if s != home {
					t.Errorf("one goroutine's timers landed on shards %d and %d", home, s)
				}
				if !tm.Stop() {
					t.Error("Stop of a pending timer reported false")
				}
			}
			mu.Lock()
			used[home] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.Greater(t, len(used), 1, "64 goroutines all landed on one shard")
}

// TestRacePickRoundRobin: the race build's picker gives each new stack window the next shard in
// turn, from shard 0, so goroutines that arm at the same time do not share a ring by chance (as a
// bare hash of their stack addresses often would: half the time with two shards); a window keeps
// its shard; with more shards than the table has slots, every shard is still reached.
func TestRacePickRoundRobin(t *testing.T) {
	const n = 4
	var p sw.Picker
	base := uintptr(1 << 30)
	stack := func(k int) uintptr { return base + uintptr(k)<<11 } // the k-th 2 KiB stack
	for k := range n {
		require.EqualValues(t, k, p.ShardFor(stack(k), n), "the %d-th new stack takes the next shard", k)
	}
	for k := range n {
		require.EqualValues(t, k, p.ShardFor(stack(k), n), "a stack keeps its shard")
		require.EqualValues(t, k, p.ShardFor(stack(k)+1000, n), "elsewhere in the same 2 KiB window: the same shard")
	}

	var two sw.Picker
	require.EqualValues(t, 0, two.ShardFor(stack(0), 2))
	require.EqualValues(t, 1, two.ShardFor(stack(1), 2), "two producers, two shards")

	const many = 1024 // more shards than slots: the bare hash, which reaches them all
	var q sw.Picker
	seen := map[uint32]bool{}
	for k := range 16 * many {
		s := q.ShardFor(stack(k), many)
		require.Less(t, s, uint32(many))
		seen[s] = true
	}
	require.Len(t, seen, many, "every one of %d shards is reached", many)
}
