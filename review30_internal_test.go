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

// TestStopGoexitInQueuedCallbackAfterStop: Stop runs on the only worker (a callback calls it),
// with two callbacks waiting in the queue, taken from the wheel before Stop. The first of them
// calls runtime.Goexit: the worker's replacement runs the second, and a Stop from outside returns
// only once that callback has returned and every worker goroutine has exited.
func TestStopGoexitInQueuedCallbackAfterStop(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1))
	require.NoError(t, err)

	gate1, t1Started, t1Ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() {
		defer close(t1Ended)
		close(t1Started)
		<-gate1
		require.Zero(t, w.Stop())
	})
	require.NoError(t, err)
	clock.Advance(time.Millisecond)
	<-t1Started

	// Two tasks wait in the queue behind the busy worker.
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
	<-t3Started // on the worker that took the place of the one that ended
	require.Equal(t, int32(1), goexitRan.Load())

	var t3DoneAtReturn atomic.Bool
	later := make(chan int)
	go func() {
		n := w.Stop()
		t3DoneAtReturn.Store(t3Done.Load())
		later <- n
	}()
	time.Sleep(20 * time.Millisecond) // let the outside Stop reach its wait
	close(gate3)
	require.Zero(t, <-later)
	require.True(t, t3DoneAtReturn.Load(), "the outside Stop returned before a queued callback")
	require.Zero(t, WorkerGoroutines(w))
	review28Balance(t, w, 0)
}

// TestStopQueuedEveryRunAndCallbackRunOnce: Stop on the only worker (from a callback), with a
// queued Every run and a queued one-shot: both run once after it, on that worker; the one-shot
// calls Stop (0, at once) and Advance (the wheel is detached) without hanging; the Every's run
// started after Stop, so its next run is not counted, and Stop returns exactly the two pending
// timers, which is Stats.Dropped.
func TestStopQueuedEveryRunAndCallbackRunOnce(t *testing.T) {
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
	returned := make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() {
		close(started)
		<-gate
		got = w.Stop()
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
	require.Equal(t, int32(1), xRuns.Load(), "the queued one-shot ran once")
	require.Equal(t, int32(1), innerStop.Load(), "Stop from a queued callback returns 0")
	require.Equal(t, 2, got, "the two pending timers; not the Every's next run")
	require.Zero(t, WorkerGoroutines(w))
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
