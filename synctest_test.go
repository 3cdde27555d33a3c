package shardwheel_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestSynctestBubble runs a Wheel on its default (system) clock inside a testing/synctest bubble:
// its clock goroutine and workers sleep on the bubble's fake time, so timers, deadlines and Every
// fire exactly as fake time passes, and synctest.Wait returns once the wheel is idle.
func TestSynctestBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := sw.New()
		require.NoError(t, err)
		defer w.Stop()
		start := time.Now()

		var fired atomic.Int64
		var firedAt atomic.Int64 // fake nanoseconds since start
		_, err = w.AfterFunc(10*time.Second, func() {
			firedAt.Store(int64(time.Since(start)))
			fired.Add(1)
		})
		require.NoError(t, err)
		stopped, err := w.AfterFunc(20*time.Second, func() { t.Error("stopped timer fired") })
		require.NoError(t, err)

		ctx, cancel := w.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		dl, ok := ctx.Deadline()
		require.True(t, ok)
		require.Equal(t, start.Add(15*time.Second), dl)

		var ticks atomic.Int64
		every, err := w.Every(time.Second, func() { ticks.Add(1) })
		require.NoError(t, err)

		synctest.Wait() // the wheel is idle: nothing is due yet
		require.Zero(t, fired.Load())
		require.Zero(t, ticks.Load())

		time.Sleep(10*time.Second - time.Nanosecond)
		synctest.Wait()
		require.Zero(t, fired.Load(), "never early")
		require.EqualValues(t, 9, ticks.Load())

		time.Sleep(time.Nanosecond)
		synctest.Wait()
		require.EqualValues(t, 1, fired.Load())
		require.GreaterOrEqual(t, firedAt.Load(), int64(10*time.Second))
		require.NoError(t, ctx.Err())

		time.Sleep(5 * time.Second)
		synctest.Wait()
		select {
		case <-ctx.Done():
		default:
			t.Fatal("deadline passed in fake time, context not done")
		}
		require.Equal(t, context.DeadlineExceeded, ctx.Err())
		require.EqualValues(t, 15, ticks.Load())

		require.True(t, every.Stop())
		require.True(t, stopped.Stop())
		time.Sleep(time.Minute)
		synctest.Wait()
		require.EqualValues(t, 15, ticks.Load())
		require.Equal(t, 0, w.Len())
		require.Equal(t, 0, w.Stop())
	})
}

// TestSynctestKeyed shows idle timeouts in a bubble: a key kept alive by Move does not fire; one
// left alone fires at its deadline in fake time.
func TestSynctestKeyed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := sw.New()
		require.NoError(t, err)
		defer w.Stop()
		closed := make(chan string, 2)
		k := sw.NewKeyed(w, func(key string, _ int) { closed <- key })
		require.NoError(t, k.Set("busy", 1, 30*time.Second))
		require.NoError(t, k.Set("idle", 2, 30*time.Second))
		for range 5 {
			time.Sleep(20 * time.Second)
			require.True(t, k.Move("busy", 30*time.Second))
		}
		synctest.Wait()
		require.Equal(t, "idle", <-closed)
		require.Equal(t, 1, k.Len())
		time.Sleep(30 * time.Second)
		synctest.Wait()
		require.Equal(t, "busy", <-closed)
		require.Equal(t, 0, k.Len())
	})
}

// TestSynctestDueNowWhileCallbackBlocks: while a callback blocks the worker that was keeping time
// (it let go of the role without waking another worker, expecting to be done within the tick), a
// timer armed with d = 0 runs at once on the other worker, before fake time moves: the producer
// signals and the signal wakes an idle worker to keep time. (A review's repro: before the fix the
// timer waited for the watchdog, a tick later.)
func TestSynctestDueNowWhileCallbackBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := sw.New(sw.WithWorkers(2))
		require.NoError(t, err)
		defer w.Stop()
		entered, release := armStuck(t, w, time.Second, nil)
		time.Sleep(time.Second)
		<-entered
		synctest.Wait()
		start := time.Now()
		var fired atomic.Int32
		_, err = w.AfterFunc(0, func() { fired.Add(1) })
		require.NoError(t, err)
		synctest.Wait()
		got := fired.Load()
		close(release)
		require.EqualValues(t, 1, got, "the d = 0 timer waited while a callback blocked a worker")
		require.Zero(t, time.Since(start), "fake time moved before it ran")
	})
}
