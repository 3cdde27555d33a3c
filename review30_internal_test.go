package shardwheel

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Review 30: 31ffb13 (dispatch's deferred rest, finishStop's drain on the only worker, the
// rerun in advanceManual's Goexit handler) and 41eab60 (endRun's letGoDropped, Keyed's early
// refusal after Stop).

// TestReview30GoexitInStopDrainReleasesLaterStop (bug, fixed since): Stop runs on the only worker (a
// callback calls it), with two callbacks waiting in the queue, handed to the pool before Stop.
// finishStop (shardwheel.go:424-454) drains the queue on that worker; the first drained callback
// calls runtime.Goexit. The deferred close(w.stopped) (shardwheel.go:425) runs as the goroutine
// unwinds, so the first Stop is "finished"; the worker's replacement (work's deferred call,
// expiry.go:141-148) then runs the second queued callback. A later Stop from any goroutine waits
// on stopped (shardwheel.go:343-345), which is already closed: it returns while a callback handed
// to the pool before Stop is still running, on a goroutine the wheel started that has not exited
// (API.md: "callbacks already ... handed to the worker pool, run to their end before Stop
// returns; every goroutine the wheel started has exited when Stop returns"; goleak would flag
// the replacement in a test that ends there).
func TestReview30GoexitInStopDrainReleasesLaterStop(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1))
	require.NoError(t, err)

	gate1, t1Started, t1Ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
	stopReturned := false
	_, err = w.AfterFunc(time.Millisecond, func() {
		defer close(t1Ended) // runs as the Goexit in the drain unwinds this goroutine
		close(t1Started)
		<-gate1
		w.Stop()
		stopReturned = true
	})
	require.NoError(t, err)
	clock.Advance(time.Millisecond)
	<-t1Started

	// Two chunks wait in the queue behind the busy worker.
	var goexitRan atomic.Int32
	_, err = w.AfterFunc(0, func() { goexitRan.Add(1); runtime.Goexit() })
	require.NoError(t, err)
	clock.Advance(0)
	gate3, t3Started := make(chan struct{}), make(chan struct{})
	var t3Done atomic.Bool
	_, err = w.AfterFunc(0, func() {
		close(t3Started)
		<-gate3
		t3Done.Store(true)
	})
	require.NoError(t, err)
	clock.Advance(0)
	require.Equal(t, 2, len(w.pool.queue))

	close(gate1)
	<-t1Ended
	require.False(t, stopReturned, "the Goexit in the drain ended the goroutine of Stop's caller")
	require.Equal(t, int32(1), goexitRan.Load())
	<-t3Started // on the worker that took the place of the one that ended

	var t3DoneAtReturn atomic.Bool
	later := make(chan int)
	go func() {
		n := w.Stop()
		t3DoneAtReturn.Store(t3Done.Load())
		later <- n
	}()
	select {
	case <-later:
		close(gate3)
		t.Fatalf("a later Stop returned while a callback handed to the pool before the first Stop "+
			"was still running on a wheel goroutine (done %v)", t3DoneAtReturn.Load())
	case <-time.After(300 * time.Millisecond):
	}
	close(gate3)
	require.Zero(t, <-later)
	require.True(t, t3DoneAtReturn.Load())
	require.Eventually(t, func() bool { return WorkerGoroutines(w) == 0 }, 5*time.Second, time.Millisecond)
	review28Balance(t, w, 0)
}

// TestReview30StopDrainRunsQueuedOnce (pin): Stop on the only worker drains the queue
// (shardwheel.go:437-453): a queued Every run and a queued one-shot run once each before Stop
// returns; the one-shot calls Stop (returns 0 at once: a worker) and Advance (the wheel is
// detached) without hanging the drain; the Every's run started after Stop began, so its next
// run is not counted (runPeriodic) and Stop returns exactly the two pending timers, which is
// Stats.Dropped.
func TestReview30StopDrainRunsQueuedOnce(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1))
	require.NoError(t, err)
	for range 2 {
		_, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
		require.NoError(t, err)
	}
	gate, started := make(chan struct{}), make(chan struct{})
	var everyRuns, xRuns, innerStop atomic.Int32
	got := -1
	var atReturn [2]int32
	returned := make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() {
		close(started)
		<-gate
		got = w.Stop()
		atReturn = [2]int32{everyRuns.Load(), xRuns.Load()}
		close(returned)
	})
	require.NoError(t, err)
	clock.Advance(time.Millisecond)
	<-started
	_, err = w.Every(time.Millisecond, func() { everyRuns.Add(1) })
	require.NoError(t, err)
	clock.Advance(time.Millisecond) // the Every's first run: queued
	_, err = w.AfterFunc(0, func() {
		xRuns.Add(1)
		innerStop.Store(int32(w.Stop()) + 1)
		clock.Advance(2 * time.Hour)
	})
	require.NoError(t, err)
	clock.Advance(0)
	require.Equal(t, 2, len(w.pool.queue))
	close(gate)
	<-returned
	require.Zero(t, w.Stop())
	require.Equal(t, [2]int32{1, 1}, atReturn, "the queued callbacks ran once each before Stop returned")
	require.Equal(t, int32(1), innerStop.Load(), "Stop from a drained callback returns 0")
	require.Equal(t, 2, got, "the two pending timers; not the Every's next run")
	require.Eventually(t, func() bool { return WorkerGoroutines(w) == 0 }, 5*time.Second, time.Millisecond)
	require.Equal(t, int32(1), everyRuns.Load())
	review28Balance(t, w, got)
}

// TestReview30DispatchGoexitTwice (pin): a batch of four chunks runs on the Advance caller (the
// only worker busy, the queue full, CallerRuns). The first chunk's callback calls Goexit:
// dispatch's deferred call (workers.go:153-157) runs batch[1:]; in it the third calls Goexit
// too, and runFrom's deferred call runs the fourth. Each runs exactly once, none is lost, and
// the clock is free afterwards (advanceManual's deferred call).
func TestReview30DispatchGoexitTwice(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1), WithQueueSize(1), WithFullPolicy(CallerRuns))
	require.NoError(t, err)
	release, started := make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(0, func() { close(started); <-release })
	require.NoError(t, err)
	clock.Advance(0)
	<-started
	_, err = w.AfterFunc(0, func() { <-release })
	require.NoError(t, err)
	clock.Advance(0)
	require.Equal(t, 1, len(w.pool.queue))

	var runs [4]atomic.Int32
	var order atomic.Int32
	for i := range 4 {
		_, err = w.AfterFunc(time.Millisecond, func() {
			runs[i].Add(1)
			if k := order.Add(1); k == 1 || k == 3 {
				runtime.Goexit()
			}
		})
		require.NoError(t, err)
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		clock.Advance(time.Millisecond)
		t.Error("Advance returned: the Goexit did not end its goroutine")
	}()
	<-ended
	for i := range runs {
		require.Equal(t, int32(1), runs[i].Load(), "callback %d", i)
	}
	close(release)
	fired := make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() { close(fired) })
	require.NoError(t, err)
	clock.Advance(time.Millisecond)
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("the clock was not let go")
	}
	n := w.Stop()
	require.Zero(t, n)
	require.Zero(t, WorkerGoroutines(w))
	review28Balance(t, w, n)
}
