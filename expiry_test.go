package shardwheel_test

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	sw "github.com/shardwheel/shardwheel"
)

// TestExpirySlowCallbackHoldsNothing: a callback that blocks its worker must not hold up the
// timers that come due after it, on its own shard or another: the worker gave up the keeper role
// and its shard's claim before it ran the callback, so the other worker keeps time.
func TestExpirySlowCallbackHoldsNothing(t *testing.T) {
	w, err := sw.New(sw.WithWorkers(2), sw.WithShards(1))
	require.NoError(t, err)
	started, release := armStuck(t, w, 0, nil)
	<-started
	const n = 100
	var wg sync.WaitGroup
	wg.Add(n)
	for i := 0; i < n; i++ {
		_, err := w.AfterFunc(time.Duration(i%7)*time.Millisecond, wg.Done)
		require.NoError(t, err)
	}
	wg.Wait() // all ran while the first callback still blocks its worker
	close(release)
	require.Zero(t, w.Stop())
	requireBalance(t, w)
}

// TestExpiryFloodWithStopsAndStop: floods due at one instant on every shard while other
// goroutines stop half of them and Wheel.Stop comes in the middle: workers advance shards in
// bounded steps and steal chunks from each other while Stops race both. Every timer is counted
// exactly once (ran, stopped, or returned by Stop) and none runs twice or after Stop returned.
func TestExpiryFloodWithStopsAndStop(t *testing.T) {
	for _, procs := range []int{1, 2, 4} {
		func() {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			w, err := sw.New(sw.WithShards(3), sw.WithWorkers(3), sw.WithQueueSize(64))
			require.NoError(t, err)
			const per = 20_000
			runs := make([]atomic.Int32, 3*per)
			var stopped, scheduled atomic.Int64
			var after atomic.Bool
			var late atomic.Int64
			f := func(a any) {
				if after.Load() {
					late.Add(1)
				}
				runs[a.(int)].Add(1)
			}
			due := 20 * time.Millisecond
			var wg sync.WaitGroup
			for g := 0; g < 3; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ts := make([]sw.Timer, 0, per)
					for i := 0; i < per; i++ {
						tm, err := w.AfterFuncArg(due, f, g*per+i)
						if err != nil {
							break // ErrClosed: Stop came first
						}
						scheduled.Add(1)
						ts = append(ts, tm)
					}
					for i := 0; i < len(ts); i += 2 {
						if ts[i].Stop() {
							stopped.Add(1)
						}
					}
				}()
			}
			time.Sleep(due + time.Duration(procs)*time.Millisecond)
			dropped := w.Stop()
			after.Store(true)
			wg.Wait()
			var ran int64
			for i := range runs {
				c := runs[i].Load()
				require.LessOrEqual(t, c, int32(1), "timer %d ran %d times", i, c)
				ran += int64(c)
			}
			require.Zero(t, late.Load(), "callbacks ran after Stop returned")
			require.Equal(t, scheduled.Load(), ran+stopped.Load()+int64(dropped),
				"procs %d: scheduled %d = ran %d + stopped %d + dropped %d", procs, scheduled.Load(), ran, stopped.Load(), dropped)
			requireBalance(t, w)
		}()
	}
}
