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

// TestRacePickSpreads checks the race detector's shard pick (pick_race.go): a goroutine keeps to
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

// TestRacePickRoundRobin: the race build's picker gives each new stack the next shard in turn,
// so goroutines that arm at the same time do not share a ring by chance; a stack keeps its shard;
// stacks whose hashes share a slot share its shard.
func TestRacePickRoundRobin(t *testing.T) {
	const n = 4
	var p sw.Picker
	got := map[uint32]uintptr{}
	addr := uintptr(1 << 30)
	for len(got) < n {
		s := p.ShardFor(addr, n)
		require.Less(t, s, uint32(n))
		prev, seen := got[s]
		require.False(t, seen, "stacks %#x and %#x share shard %d before every shard has one", prev, addr, s)
		got[s] = addr
		addr += 2 << 10 // the next 2 KiB stack
	}
	for s, a := range got {
		require.Equal(t, s, p.ShardFor(a, n), "a stack keeps its shard")
		require.Equal(t, s, p.ShardFor(a+1000, n), "deeper in the same 2 KiB stack: the same shard")
	}
	// Many stacks: the table hands out every shard.
	var q sw.Picker
	bySlot := map[uint32]int{}
	for i := range 257 {
		bySlot[q.ShardFor(uintptr(1<<30+i<<11), n)]++
	}
	require.Len(t, bySlot, n, "every shard is handed out")
}
