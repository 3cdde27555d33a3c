package shardwheel_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	sw "github.com/shardwheel/shardwheel"
)

// Stop and Advance called from callbacks, while another goroutine stops or advances the wheel:
// none of them may wait for a goroutine that waits for it (found by review).

// within fails the test with why unless ch delivers within 5 s: a deadlock shows as a failure,
// not as a test binary that hangs until its timeout.
func within(t *testing.T, ch <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal(why)
	}
}

// blockingManualWheel is a manual-clock wheel whose one worker and one-slot queue make Advance
// block on the queue as soon as a callback holds the worker (the Block policy).
func blockingManualWheel(t *testing.T) (*sw.Wheel, *sw.ManualClock) {
	return manualWheel(t, sw.WithShards(1), sw.WithWorkers(1), sw.WithQueueSize(1))
}

// TestStopFromCallbackWhileStopping (found by review): API.md says Stop is safe from several goroutines and,
// from inside a callback, does not deadlock. Here another goroutine's Stop is under way (it waits
// for the workers to exit) when a running callback calls Stop too: the callback's Stop waits in
// the first Stop, which waits for the callback's worker: a later Stop on a worker returns at once.
func TestStopFromCallbackWhileStopping(t *testing.T) {
	w, err := sw.New(sw.WithWorkers(2), sw.WithShards(1))
	require.NoError(t, err)
	started := make(chan struct{})
	_, err = w.AfterFunc(0, func() {
		close(started)
		time.Sleep(50 * time.Millisecond) // the other Stop is waiting for this worker by now
		w.Stop()
	})
	require.NoError(t, err)
	<-started
	done := make(chan struct{})
	go func() { w.Stop(); close(done) }()
	within(t, done, "deadlock: Stop waits for the worker, whose callback waits for the first for that Stop")
}

// TestStopFromTwoCallbacks (found by review): two callbacks on two workers call Stop at about
// the same time; neither waits for the other's worker.
func TestStopFromTwoCallbacks(t *testing.T) {
	w, err := sw.New(sw.WithWorkers(2), sw.WithShards(2))
	require.NoError(t, err)
	gate := make(chan struct{})
	in := make(chan struct{}, 2)
	out := make(chan struct{}, 2)
	for i := 0; i < 2; i++ {
		// The second is armed once the first runs: its worker let go of the keeper role and
		// of the shard's claim, so the other worker runs the second.
		_, err = w.AfterFunc(0, func() {
			in <- struct{}{}
			<-gate // both callbacks are running, one on each worker
			w.Stop()
			out <- struct{}{}
		})
		require.NoError(t, err)
		<-in
	}
	close(gate)
	for i := 0; i < 2; i++ {
		within(t, out, "deadlock: the first Stop waits for the other worker, whose Stop waits for the first")
	}
}

// TestManualClockStopFromCallbackDeadlock (found by review): API.md says Stop called from inside a callback
// waits for every other callback but not for its own, "no deadlock". With a manual clock, one
// worker and the Block policy, the Advance caller holds advMu while it dispatches; the worker's
// callback calls Stop, which waits for advMu; the Advance caller waits for room in the queue,
// which only that worker would make.
func TestManualClockStopFromCallbackDeadlock(t *testing.T) {
	w, clk := blockingManualWheel(t)
	first := true
	for i := 0; i < 4; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			if first { // only the one worker runs callbacks
				first = false
				w.Stop()
			}
		})
		require.NoError(t, err)
	}
	done := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(done) }()
	within(t, done, "deadlock: Advance blocks on the full queue, the only worker blocks in Stop on advMu")
}

// TestManualClockAdvanceFromCallbackDeadlock (found by review): Advance's doc says that called from a callback
// that Advance is running, it moves the clock and returns at once. On a worker it is not the
// advancer goroutine, so it waits for advMu, held by the Advance that waits for the queue.
func TestManualClockAdvanceFromCallbackDeadlock(t *testing.T) {
	w, clk := blockingManualWheel(t)
	first := true
	ran := make(chan struct{}, 8)
	for i := 0; i < 4; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			if first {
				first = false
				clk.Advance(time.Millisecond)
			}
			ran <- struct{}{}
		})
		require.NoError(t, err)
	}
	// Due at 2ms: the callback's Advance moves the clock there, and the running Advance (or
	// the rerun it asked for) dispatches it before it lets go.
	_, err := w.AfterFunc(2*time.Millisecond, func() { ran <- struct{}{} })
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(done) }()
	within(t, done, "deadlock: Advance blocks on the full queue, the only worker blocks in Advance on advMu")
	for i := 0; i < 5; i++ {
		within(t, ran, fmt.Sprintf("only %d of 5 callbacks ran", i))
	}
	require.Zero(t, w.Stop())
}

// TestManualClockSelfRearmZero (found by review): API.md: "a timer already due (d <= 0) fires at the next
// Advance". A callback that re-arms itself with d = 0 inside Advance is fired again by the same
// Advance, round after round: a self re-arming callback makes Advance never return.
func TestManualClockSelfRearmZero(t *testing.T) {
	w, clk := manualWheel(t, sw.WithShards(1))
	runs := 0
	var f func()
	f = func() {
		runs++
		if runs < 1000 { // bounded here so that the test ends; unbounded, Advance would spin
			_, err := w.AfterFunc(0, f)
			require.NoError(t, err)
		}
	}
	_, err := w.AfterFunc(0, f)
	require.NoError(t, err)
	clk.Advance(0)
	require.Equal(t, 1, runs, "one Advance ran the self re-arming d=0 callback %d times", runs)
	clk.Advance(0) // the re-armed one fires at the next Advance
	require.Equal(t, 2, runs)
	require.Equal(t, 1, w.Len())
}
