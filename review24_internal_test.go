package shardwheel

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReview24OverdueGapCovered pins the window inside overdue between a producer's CAS of target
// to awake and its signal (the producer paused there: preemption, GC). Meanwhile target is awake,
// so a producer that notes an earlier deadline does not signal, and no token is in wake yet. No
// wake-up is lost, because the CAS disarms nothing: a sleeping keeper still has its own timer, and
// a role let go of by releaseLater still has its watchdog. The deadline waits at most until one of
// them runs (or the paused producer resumes), and the late signal then costs one more round, not
// a loop. The runtime's lateness that overdue is for is simulated by a target in the past.
func TestReview24OverdueGapCovered(t *testing.T) {
	t.Run("keeper sleeps", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var sleeps atomic.Int32
			testHookSleep = func(*Wheel) { sleeps.Add(1) }
			defer func() { testHookSleep = nil }()
			w, err := New(WithWorkers(1), WithShards(2), WithTick(time.Millisecond))
			require.NoError(t, err)
			defer w.Stop()
			armOn(t, w, 1, time.Hour, func(any) {}, nil) // shard 1's slab has grown: no grow signal later
			armOn(t, w, 0, time.Second, func(any) {}, nil)
			synctest.Wait()
			require.Equal(t, w.shards[0].next.Load(), w.target.Load(), "the keeper sleeps until the second")
			time.Sleep(10 * time.Millisecond)
			// P read a target that had passed (its runtime timer late) and won the CAS; it is
			// paused before its signal.
			passed := int64(5 * time.Millisecond)
			w.target.Store(passed)
			require.True(t, w.target.CompareAndSwap(passed, awake))
			start := time.Now()
			var firedAt atomic.Int64
			armOn(t, w, 1, 10*time.Millisecond, func(any) { firedAt.Store(int64(time.Since(start))) }, nil)
			time.Sleep(time.Second)
			got := time.Duration(firedAt.Load())
			require.NotZero(t, got, "a deadline noted in the gap was lost")
			require.LessOrEqual(t, got, time.Second, "it waits at most for the keeper's own timer: %v", got)
			// P resumes: its token is one more look, and the keeper sleeps again.
			before := sleeps.Load()
			w.signal()
			synctest.Wait()
			require.Equal(t, before+1, sleeps.Load(), "the late signal: one more round")
			require.NotEqual(t, int64(awake), w.target.Load(), "and a target to sleep until")
		})
	})

	t.Run("role free after releaseLater", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var (
				w    *Wheel
				at   atomic.Int64
				done atomic.Bool
			)
			start := time.Now()
			testHookYielded = func(w *Wheel) {
				if time.Since(start) >= time.Second && done.CompareAndSwap(false, true) {
					// P read the watchdog's moment passed and won the CAS; it is paused
					// before its signal. releaseLater goes on and arms its watchdog.
					at.Store(w.target.Load())
					if !w.target.CompareAndSwap(at.Load(), awake) {
						panic("target moved under a paused releaseLater")
					}
				}
			}
			defer func() { testHookYielded = nil }()
			var err error
			w, err = New(WithWorkers(2), WithShards(2), WithTick(time.Millisecond))
			require.NoError(t, err)
			defer w.Stop()
			started, block := make(chan struct{}), make(chan struct{})
			armOn(t, w, 1, time.Hour, func(any) {}, nil)
			armOn(t, w, 0, time.Second, func(any) { close(started); <-block }, nil) // one callback: no hurry
			<-started
			require.True(t, done.Load(), "the hook never ran")
			require.Equal(t, int64(awake), w.target.Load())
			require.False(t, w.keeper.Load(), "the role is free while the callback blocks")
			// Q notes a deadline earlier than the watchdog: target is awake, so no signal.
			armedAt := time.Now()
			require.Less(t, w.deadline(100*time.Microsecond), at.Load(), "the test's premise")
			var firedAt atomic.Int64
			armOn(t, w, 1, 100*time.Microsecond, func(any) { firedAt.Store(int64(time.Since(armedAt))) }, nil)
			time.Sleep(10 * time.Millisecond)
			got := time.Duration(firedAt.Load())
			close(block)
			require.NotZero(t, got, "a deadline noted in the gap was lost")
			require.LessOrEqual(t, got, 2*time.Millisecond, "it waits at most for the watchdog (a tick): %v", got)
		})
	})
}
