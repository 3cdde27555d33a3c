package shardwheel

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A manual clock's Advance may queue a task for the workers after the wheel stopped (the callbacks
// it took from the wheel still run). A worker that found the queue empty just before must not exit
// on the quit that closes right after: it read quit before its look, so it looks again.

// stopPauseAfterEmptyLook pauses the next worker that finds the queue empty, once armed: it
// closes paused and waits for resume.
func stopPauseAfterEmptyLook(t *testing.T) (arm func(), paused, resume chan struct{}) {
	var armed atomic.Bool
	paused, resume = make(chan struct{}), make(chan struct{})
	testHookQueueEmpty = func(*Wheel) {
		if armed.CompareAndSwap(true, false) {
			close(paused)
			<-resume
		}
	}
	t.Cleanup(func() { testHookQueueEmpty = nil })
	return func() { armed.Store(true) }, paused, resume
}

// TestStopTaskQueuedAsWorkerLooksStillRuns: one worker, a queue of one task, CallerRuns. A callback
// that the Advance runs itself stops the wheel from inside, lets the worker go on and waits until
// the worker has found the queue empty; the Advance then queues its last task and closes quit. The
// worker still runs that task before it exits: every callback taken from the wheel runs once.
func TestStopTaskQueuedAsWorkerLooksStillRuns(t *testing.T) {
	arm, paused, resume := stopPauseAfterEmptyLook(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1), WithFullPolicy(CallerRuns))
	require.NoError(t, err)
	relX, inX := make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() { close(inX); <-relX }) // keeps the worker busy
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	<-inX

	var ran, onAdvancer atomic.Int32
	var advancer atomic.Int64
	for range 3 {
		_, err := w.AfterFunc(time.Millisecond, func() {
			ran.Add(1)
			if goid() == advancer.Load() && onAdvancer.Add(1) == 1 {
				w.Stop()
				arm()
				close(relX)
				<-paused
			}
		})
		require.NoError(t, err)
	}
	advanced := make(chan struct{})
	go func() {
		defer close(advanced)
		advancer.Store(goid())
		clk.Advance(time.Millisecond)
	}()
	<-advanced // the Advance queued its last task and closed quit
	close(resume)
	require.Zero(t, w.Stop())
	st := w.Stats()
	require.EqualValues(t, 3, ran.Load(), "a callback taken from the wheel never ran: %+v", st)
	require.Zero(t, st.Queued)
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "stats %+v", st)
}

// TestStopTaskQueuedDuringOutsideStopStillRuns: the same with the Block policy and a Stop from
// another goroutine while an Advance waits for room in the queue. Once the wheel has stopped the
// Advance runs what finds the queue full itself, the worker empties the queue meanwhile, and the
// Advance's last task lands after the worker found the queue empty: it still runs, and the outside
// Stop returns only after it has.
func TestStopTaskQueuedDuringOutsideStopStillRuns(t *testing.T) {
	arm, paused, resume := stopPauseAfterEmptyLook(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1))
	require.NoError(t, err)
	relX, inX := make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() { close(inX); <-relX })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	<-inX

	var ran, onAdvancer atomic.Int32
	var advancer atomic.Int64
	for range 4 {
		_, err := w.AfterFunc(time.Millisecond, func() {
			ran.Add(1)
			if goid() == advancer.Load() && onAdvancer.Add(1) == 1 {
				arm()
				close(relX)
				<-paused
			}
		})
		require.NoError(t, err)
	}
	advanced := make(chan struct{})
	go func() {
		defer close(advanced)
		advancer.Store(goid())
		clk.Advance(time.Millisecond)
	}()
	require.Eventually(t, func() bool { return len(w.pool.queue) == 1 && w.Stats().Queued == 4 },
		5*time.Second, time.Millisecond, "the Advance queued one task and waits for room")
	stopped := make(chan int)
	go func() { stopped <- w.Stop() }()
	<-advanced
	close(resume)
	require.Zero(t, <-stopped)
	st := w.Stats()
	require.EqualValues(t, 4, ran.Load(), "a callback taken from the wheel never ran: %+v", st)
	require.Zero(t, st.Queued)
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "stats %+v", st)
}
