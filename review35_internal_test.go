package shardwheel

import (
	"math"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 35: ManualClock.Advance's rounds over several wheels (commit aae1a5d): the end of time,
// wheels made or stopped during an Advance, a worker's Advance against a holder that is stopping
// or unwinding, and the single-wheel path left as it was.

// wheels35 returns one wheel per option list on clk, stopped at the end of the test.
func wheels35(t *testing.T, clk *ManualClock, optss ...[]Option) []*Wheel {
	t.Helper()
	var ws []*Wheel
	for _, opts := range optss {
		w, err := New(append([]Option{WithClock(clk)}, opts...)...)
		require.NoError(t, err)
		t.Cleanup(func() { w.Stop() })
		ws = append(ws, w)
	}
	return ws
}

// within35 waits for ch for up to 5s and reports whether it was closed.
func within35(ch <-chan struct{}) bool { return waitFor35(ch, 5*time.Second) }

// waitFor35 waits for ch for up to d and reports whether it was closed.
func waitFor35(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// endOfTime35 arms a timer of math.MaxInt64 on the first of n WithWorkers(0) wheels on one clock,
// advances the clock to the end of time and returns how many times it fired.
func endOfTime35(t *testing.T, n int) int {
	clk := NewManualClock(time.Unix(0, 0))
	var optss [][]Option
	for range n {
		optss = append(optss, []Option{WithWorkers(0), WithShards(1)})
	}
	ws := wheels35(t, clk, optss...)
	fired := 0
	_, err := ws[0].AfterFunc(math.MaxInt64, func() { fired++ })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64)
	clk.Advance(0)
	return fired
}

// TestReview35FixedEndOfTimeTwoWheels: "The clock saturates at math.MaxInt64 nanoseconds past its
// start, the end of time, where every timer is due" (ManualClock.Advance's doc; `never`: "a timer
// at the end of time fires when a manual clock is advanced that far"). A timer whose deadline
// saturates at the end of time leaves its shard's next at never (noteDeadline lowers nothing), and
// nextRound (clock.go:140) reports a wheel whose minNext is never as having nothing due, so with
// two wheels on the clock rounds never gives that wheel a round: Advance(math.MaxInt64) returns
// with the timer unfired. With one wheel (the pin below: advance itself, limit never) it fires.
func TestReview35FixedEndOfTimeTwoWheels(t *testing.T) {
	require.Equal(t, 1, endOfTime35(t, 2), "two wheels: a timer at the end of time did not fire at Advance(math.MaxInt64)")
}

// TestReview35PinEndOfTimeOneWheel: the single-wheel path, unchanged.
func TestReview35PinEndOfTimeOneWheel(t *testing.T) {
	require.Equal(t, 1, endOfTime35(t, 1))
}

// TestReview35FixedEndOfTimeWheelMadeLater: the same through the door the doc names, "also of one
// made after the clock had moved (manualBase > 0)" (nanos): a wheel made at 1s, with a tick of
// 3ms, arms a timer of math.MaxInt64 (due at the end of time), next to a wheel made at 0 with a
// timer at 1h. The round at 1h fires a's; b's is never given a round.
func TestReview35FixedEndOfTimeWheelMadeLater(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a := wheels35(t, clk, []Option{WithWorkers(0)})[0]
	clk.Advance(time.Second)
	b := wheels35(t, clk, []Option{WithWorkers(0), WithTick(3 * time.Millisecond)})[0]
	var order []string
	_, err := a.AfterFunc(time.Hour, func() { order = append(order, "a") })
	require.NoError(t, err)
	_, err = b.AfterFunc(math.MaxInt64, func() { order = append(order, "b") })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64)
	require.Equal(t, []string{"a", "b"}, order, "every timer is due at the end of time")
}

// TestReview35FixedGoexitRerunOnlyToLimit: a worker's Advance that finds another wheel's advMu held
// sets rerun and returns, "counting on this holder" (advanceManual's doc: "What is still due fires
// at the next Advance, or now, on this goroutine as it unwinds, if a worker's Advance asked for a
// rerun meanwhile"). When the holder is in rounds and its callback calls runtime.Goexit, the
// deferred rerun (clock.go:259) advances only to the round's limit R, not to the clock's new
// time, and the rounds that would have gone on are gone with the goroutine. Here wheel a's
// callback at 1ms waits for b's worker to Advance the clock to 11ms (which sets a's rerun, a's
// advMu being held) and then calls Goexit: a's timer at 5ms is never dispatched, though the
// worker's Advance(10ms) returned and the holder has unwound. Before the change (limit never)
// the unwinding rerun went to 11ms.
func TestReview35FixedGoexitRerunOnlyToLimit(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	ws := wheels35(t, clk, []Option{WithWorkers(1), WithShards(1)}, []Option{WithWorkers(0), WithShards(1)})
	b, a := ws[0], ws[1]
	inB, advanced := make(chan struct{}), make(chan struct{})
	_, err := b.AfterFunc(time.Millisecond, func() { // on b's worker
		<-inB
		clk.Advance(10 * time.Millisecond)
		close(advanced)
	})
	require.NoError(t, err)
	_, err = a.AfterFunc(time.Millisecond, func() { // on the advancer, after b's round at 1ms
		close(inB)
		<-advanced
		runtime.Goexit()
	})
	require.NoError(t, err)
	var late atomic.Int32
	_, err = a.AfterFunc(5*time.Millisecond, func() { late.Add(1) })
	require.NoError(t, err)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		clk.Advance(time.Millisecond)
	}()
	require.True(t, within35(ended), "the advancer did not end")
	require.Equal(t, 11*time.Millisecond, clk.Now().Sub(time.Unix(0, 0)))
	require.Equal(t, int32(1), late.Load(),
		"the clock is at 11ms, the worker's Advance returned counting on the holder, and the holder unwound: a's timer at 5ms was not dispatched")
}

// TestReview35FixedStoppedWheelCallbackAdvanceNests: "Called from a callback while another Advance
// of the wheel (or of another wheel on this clock) is in progress, it moves the clock and returns
// at once". A WithWorkers(0) callback that stops its own wheel and then calls Advance is not
// recognised: Advance looks for self among the advancers of the wheels still attached
// (clock.go:87-93), and Stop detached the wheel. So the inner Advance runs the other wheel's
// timers up to the new time nested in the callback, before the rest of the stopped wheel's batch,
// which "still run after Stop returns": b's timer at 2ms runs before a's second timer at 1ms
// ("in order of deadline rounded up to the tick ... across wheels too").
func TestReview35FixedStoppedWheelCallbackAdvanceNests(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	ws := wheels35(t, clk, []Option{WithWorkers(0), WithShards(1)}, []Option{WithWorkers(0), WithShards(1)})
	a, b := ws[0], ws[1]
	var order []string
	nested := false
	for i := 0; i < 2; i++ {
		_, err := a.AfterFunc(time.Millisecond, func() {
			order = append(order, "a@1ms")
			if len(order) == 1 {
				a.Stop()
				clk.Advance(time.Millisecond) // from a callback of an Advance in progress: returns at once
				nested = len(order) > 1
			}
		})
		require.NoError(t, err)
	}
	_, err := b.AfterFunc(2*time.Millisecond, func() { order = append(order, "b@2ms") })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.False(t, nested, "the Advance called from a's callback ran b's timers before it returned: %v", order)
	require.Equal(t, []string{"a@1ms", "a@1ms", "b@2ms"}, order)
}

// TestReview35FixedWheelMadeDuringAdvance: "before it returns, dispatches every timer of every wheel
// on this clock whose deadline is at or before the new time" and "A timer armed with d <= 0 by a
// callback of this Advance is due at the clock's new time: it fires in this Advance if the callback
// ran in a round at an earlier instant". A callback in the round at 1ms of an Advance to 3ms makes
// a wheel on the clock and arms a timer on it at once. Advance took its list of wheels once, before
// the rounds (clock.go:84-86), and never looks again: the timer waits for the next Advance.
func TestReview35FixedWheelMadeDuringAdvance(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	ws := wheels35(t, clk, []Option{WithWorkers(0), WithShards(1)}, []Option{WithWorkers(0), WithShards(1)})
	var c *Wheel
	fired := 0
	_, err := ws[0].AfterFunc(time.Millisecond, func() {
		var err error
		c, err = New(WithClock(clk), WithWorkers(0))
		require.NoError(t, err)
		_, err = c.AfterFunc(0, func() { fired++ })
		require.NoError(t, err)
	})
	require.NoError(t, err)
	clk.Advance(3 * time.Millisecond)
	require.NotNil(t, c)
	defer c.Stop()
	require.Equal(t, 1, fired, "a timer armed at once in the round at 1ms, due at 3ms, on a wheel of this clock, did not fire in the Advance to 3ms")
}

// stoppingWorker35 is the scenario of TestReview35FixedWorkerOfStoppingWheelAdvanceWaits, with a
// being stopped or not, and reports whether b's callback gave up waiting for a's worker.
func stoppingWorker35(t *testing.T, stopping bool) (gaveUp bool) {
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(1), WithShards(1))
	require.NoError(t, err)
	b, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	defer b.Stop()
	inA, goA, doneA := make(chan struct{}), make(chan struct{}), make(chan struct{})
	_, err = a.AfterFunc(time.Millisecond, func() { // on a's worker
		close(inA)
		<-goA
		clk.Advance(time.Millisecond)
		close(doneA)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.True(t, within35(inA))
	stopped := make(chan struct{})
	if stopping {
		go func() { defer close(stopped); a.Stop() }()
		// finishStop has begun: a's Stop waits for its worker's callback.
		require.Eventually(t, func() bool { return isClosed(a.quit) }, 5*time.Second, time.Millisecond, "a's Stop did not begin")
	}
	_, err = b.AfterFunc(time.Millisecond, func() { // on the advancer below, holding b's advMu
		close(goA)
		gaveUp = !waitFor35(doneA, 3*time.Second)
	})
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { defer close(advanced); clk.Advance(time.Millisecond) }()
	// On failure b's callback gives up after 3s, and then everything finishes.
	require.True(t, waitFor35(advanced, 10*time.Second))
	require.True(t, waitFor35(doneA, 10*time.Second))
	if stopping {
		require.True(t, waitFor35(stopped, 10*time.Second))
	} else {
		a.Stop()
	}
	return gaveUp
}

// TestReview35FixedWorkerOfStoppingWheelAdvanceWaits: the change's promise, "a worker's Advance
// never waits for another wheel" (inCallback: "an Advance there must not wait for another wheel's
// advMu, whose holder may be waiting ... for g itself"). inCallback (clock.go:149-158) looks for g among
// the workers of the wheels attached to the clock, and Stop detaches its wheel (shardwheel.go:374)
// before it waits for that wheel's workers to finish their callbacks (finishStop). So a worker of
// wheel a while a is being stopped, still running its callback, is taken for an outsider: its
// Advance Locks b's advMu (clock.go:239), whose holder runs b's callback that waits for that
// worker's Advance to return. Each waits for the other (here for 3s, then b's callback gives up
// and the test fails); without the Stop (the pin below) the worker's Advance sets rerun and
// returns.
func TestReview35FixedWorkerOfStoppingWheelAdvanceWaits(t *testing.T) {
	defer goleak.VerifyNone(t)
	require.False(t, stoppingWorker35(t, true),
		"the Advance of a callback on a worker of a wheel being stopped waited for b's advMu, held by the Advance that waits for that callback")
}

// TestReview35PinWorkerAdvanceDoesNotWaitForHolder: the same without a's Stop: a's worker's
// Advance sets b's rerun and returns, and the holder's rounds go on to the new time.
func TestReview35PinWorkerAdvanceDoesNotWaitForHolder(t *testing.T) {
	defer goleak.VerifyNone(t)
	require.False(t, stoppingWorker35(t, false))
}

// TestReview35FixedWorkerAdvanceWaitsForOtherWheelsQueue: "a worker's Advance never waits for
// another wheel" (the change's title). When a's worker calls Advance and no one else holds b's
// advMu, its rounds take it and dispatch b's batch with Block, waiting for room in b's queue:
// advanceManual's onWorker is b.isWorker(self) (clock.go:262), false for a's worker, so dispatch
// waits (workers.go:152). b's worker, whose callback waits for a's callback, never makes room:
// the same cycle inCallback breaks when another goroutine holds b's advMu (b's queue, its worker,
// a's worker), closed here by a's worker holding advMu itself. b's callback gives up after 3s and
// the test fails.
func TestReview35FixedWorkerAdvanceWaitsForOtherWheelsQueue(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(1), WithShards(1))
	require.NoError(t, err)
	b, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1), WithFullPolicy(Block))
	require.NoError(t, err)
	inA, goA, doneA, inB := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	_, err = a.AfterFunc(time.Millisecond, func() { // on a's worker
		close(inA)
		<-goA
		clk.Advance(time.Millisecond) // to 3ms, where b has a timer and its queue is full
		close(doneA)
	})
	require.NoError(t, err)
	gaveUp := false
	_, err = b.AfterFunc(time.Millisecond, func() { // on b's worker: waits for a's callback
		close(inB)
		gaveUp = !waitFor35(doneA, 3*time.Second)
	})
	require.NoError(t, err)
	var bRuns atomic.Int32
	for _, d := range []time.Duration{2 * time.Millisecond, 3 * time.Millisecond} {
		_, err = b.AfterFunc(d, func() { bRuns.Add(1) })
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	require.True(t, within35(inA))
	require.True(t, within35(inB))
	clk.Advance(time.Millisecond) // b's timer at 2ms fills b's queue (size 1): its worker is busy
	require.Eventually(t, func() bool { return len(b.pool.queue) == 1 }, 5*time.Second, time.Millisecond)
	close(goA)
	require.True(t, waitFor35(doneA, 10*time.Second))
	clk.Advance(0)
	require.Eventually(t, func() bool { return bRuns.Load() == 2 }, 5*time.Second, time.Millisecond)
	a.Stop()
	b.Stop()
	require.False(t, gaveUp, "a's worker's Advance waited for room in b's queue, which b's worker empties only after a's callback returns")
}

// concurrentReturn35 runs two Advances on a clock with n WithWorkers(0) wheels: the first is held
// up inside a callback of a batch of two due at 1ms; the second, Advance(0) from another
// goroutine, is let go 200ms after it began. It reports whether the other callback of that batch
// had run when the second Advance returned.
func concurrentReturn35(t *testing.T, n int) bool {
	clk := NewManualClock(time.Unix(0, 0))
	var optss [][]Option
	for range n {
		optss = append(optss, []Option{WithWorkers(0), WithShards(1)})
	}
	ws := wheels35(t, clk, optss...)
	var first, other atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	for i := 0; i < 2; i++ {
		_, err := ws[0].AfterFunc(time.Millisecond, func() {
			if first.CompareAndSwap(false, true) {
				close(entered)
				<-release
				return
			}
			other.Store(true)
		})
		require.NoError(t, err)
	}
	h1 := make(chan struct{})
	go func() { defer close(h1); clk.Advance(time.Millisecond) }()
	require.True(t, within35(entered))
	var ranAtReturn atomic.Bool
	h2 := make(chan struct{})
	go func() {
		defer close(h2)
		clk.Advance(0)
		ranAtReturn.Store(other.Load())
	}()
	time.Sleep(200 * time.Millisecond)
	close(release)
	require.True(t, within35(h1))
	require.True(t, within35(h2))
	return ranAtReturn.Load()
}

// TestReview35FixedConcurrentAdvanceReturnsBeforeDue: API.md, "When Advance returns, every timer
// whose deadline is at or before the new time has been dispatched; with WithWorkers(0) it has also
// run". With one wheel an Advance concurrent with another waits for advMu (the pin below), so it
// returns once the other's batch has run. With two wheels, rounds decides from nextRound
// (clock.go:113-120), and a wheel whose due timers another Advance has already taken out of the
// shards (into its w.batch, running) looks idle: the second Advance returns at once while a timer
// due at 1ms has neither run nor, as far as anyone can tell, been dispatched.
func TestReview35FixedConcurrentAdvanceReturnsBeforeDue(t *testing.T) {
	require.True(t, concurrentReturn35(t, 2),
		"Advance(0) at 1ms returned while a WithWorkers(0) timer due at 1ms had not run (it waited in another Advance's batch)")
}

// TestReview35PinConcurrentAdvanceOneWheelWaits: the single-wheel path, unchanged: the second
// Advance waits for the first's advMu, and returns after the batch ran.
func TestReview35PinConcurrentAdvanceOneWheelWaits(t *testing.T) {
	require.True(t, concurrentReturn35(t, 1))
}

// TestReview35PinStopOtherWheelAndAdvanceFromCallback: WithWorkers(0) wheels of different ticks,
// one made after the clock moved. In the round at 1ms a's callback stops c (which drops c's two
// timers) and moves the clock on by 5ms; the rounds go on to 6ms, in order of deadline rounded
// up to each wheel's tick across a and b, none early, each once.
func TestReview35PinStopOtherWheelAndAdvanceFromCallback(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	a := wheels35(t, clk, []Option{WithWorkers(0), WithShards(2)})[0]
	clk.Advance(700 * time.Microsecond)
	ws := wheels35(t, clk, []Option{WithWorkers(0), WithTick(3 * time.Millisecond)}, []Option{WithWorkers(0)})
	b, c := ws[0], ws[1]
	var order []string
	arm := func(w *Wheel, name string, d time.Duration, f func()) {
		when := clk.elapsed.Load() + int64(d)
		_, err := w.AfterFunc(d, func() {
			require.LessOrEqual(t, when, clk.elapsed.Load(), "%s ran early", name)
			order = append(order, name)
			if f != nil {
				f()
			}
		})
		require.NoError(t, err)
	}
	dropped := -1
	arm(a, "a@1ms", 300*time.Microsecond, func() {
		dropped = c.Stop()
		clk.Advance(5 * time.Millisecond)
	})
	arm(c, "c@2ms", 1300*time.Microsecond, nil)
	arm(c, "c@4ms", 3300*time.Microsecond, nil)
	arm(b, "b@1.7ms→3.7ms", time.Millisecond, nil) // b's ticks start at 0.7ms
	arm(a, "a@2ms", 1300*time.Microsecond, nil)
	arm(a, "a@5ms", 4300*time.Microsecond, nil)
	arm(b, "b@4ms→6.7ms→6ms", 3300*time.Microsecond, nil) // rounded up to 6.7ms, the Advance's 6ms is sooner
	arm(a, "a@7ms", 6300*time.Microsecond, nil)
	clk.Advance(300 * time.Microsecond)
	require.Equal(t, 2, dropped)
	require.Equal(t, []string{"a@1ms", "a@2ms", "b@1.7ms→3.7ms", "a@5ms", "b@4ms→6.7ms→6ms"}, order)
	clk.Advance(time.Millisecond)
	require.Equal(t, "a@7ms", order[len(order)-1])
	require.Len(t, order, 6)
}
