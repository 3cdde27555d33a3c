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
