package shardwheel_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	sw "github.com/shardwheel/shardwheel"
)

// Wheel.Stop: from outside a callback it waits for every callback and goroutine; from inside one
// it waits for nothing. Either way it drops and counts exactly what is pending.

// stopClocks are the ways a callback can run: on a worker of the system clock, on a worker of a
// manual clock, and on the goroutine of a ManualClock.Advance (WithWorkers(0)).
var stopClocks = []struct {
	name    string
	manual  bool
	workers int
}{
	{"system", false, 2},
	{"manual-workers", true, 2},
	{"manual-advancer", true, 0},
}

// stopWheel makes a wheel for one of stopClocks; advance fires what is due within d (on the
// system clock it waits for d; on a manual clock it advances in a goroutine of its own, since a
// callback there may block, and returns a channel closed when that Advance returns).
func stopWheel(t *testing.T, manual bool, workers int, opts ...sw.Option) (w *sw.Wheel, advance func(d time.Duration) <-chan struct{}) {
	t.Helper()
	if !manual {
		w, err := sw.New(append([]sw.Option{sw.WithWorkers(workers)}, opts...)...)
		require.NoError(t, err)
		return w, func(d time.Duration) <-chan struct{} {
			done := make(chan struct{})
			go func() { time.Sleep(d); close(done) }()
			return done
		}
	}
	clk := sw.NewManualClock(epoch)
	w, err := sw.New(append([]sw.Option{sw.WithClock(clk), sw.WithWorkers(workers)}, opts...)...)
	require.NoError(t, err)
	return w, func(d time.Duration) <-chan struct{} {
		done := make(chan struct{})
		go func() { clk.Advance(d); close(done) }()
		return done
	}
}

// TestStopOutsideWaitsForCallbackThatStopped: a callback calls Stop, which returns at once with
// the count of what was pending, and then blocks; a Stop from outside returns only after that
// callback has returned and every goroutine of the wheel has exited.
func TestStopOutsideWaitsForCallbackThatStopped(t *testing.T) {
	for _, c := range stopClocks {
		t.Run(c.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			w, advance := stopWheel(t, c.manual, c.workers)
			for range 3 {
				_, err := w.AfterFunc(time.Hour, func() {})
				require.NoError(t, err)
			}
			inside := make(chan int, 1)
			gate := make(chan struct{})
			var finished atomic.Bool
			_, err := w.AfterFunc(time.Millisecond, func() {
				inside <- w.Stop()
				<-gate
				finished.Store(true)
			})
			require.NoError(t, err)
			advanced := advance(time.Millisecond)
			select {
			case n := <-inside:
				require.Equal(t, 3, n, "Stop from the callback returns at once, with the count")
			case <-time.After(5 * time.Second):
				t.Fatal("Stop called from a callback did not return while the callback was blocked")
			}
			_, err = w.AfterFunc(time.Millisecond, func() {})
			require.ErrorIs(t, err, sw.ErrClosed)
			require.Zero(t, w.Len())

			returned := make(chan bool, 1)
			go func() { require.Zero(t, w.Stop()); returned <- finished.Load() }()
			time.Sleep(20 * time.Millisecond) // let the outside Stop reach its wait
			close(gate)
			select {
			case fin := <-returned:
				require.True(t, fin, "the outside Stop returned before the callback that called Stop")
			case <-time.After(5 * time.Second):
				t.Fatal("the outside Stop never returned")
			}
			<-advanced
			requireBalance(t, w)
		})
	}
}

// TestStopTwoCallbacksWaitForEachOther: two callbacks each call Stop and then wait for the other
// to have returned from its Stop. Neither Stop waits for the other callback, so both return.
func TestStopTwoCallbacksWaitForEachOther(t *testing.T) {
	for _, c := range stopClocks {
		if c.workers < 2 {
			continue // one goroutine runs one callback at a time: they could not wait for each other
		}
		t.Run(c.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			w, advance := stopWheel(t, c.manual, c.workers, sw.WithShards(2))
			var wg sync.WaitGroup
			wg.Add(2)
			started := make(chan struct{}, 2)
			gate, done := make(chan struct{}), make(chan struct{})
			for range 2 {
				// The second is armed once the first runs, so that the other worker runs it
				// (two armed together may fire in one batch, on one worker, one after the other).
				_, err := w.AfterFunc(time.Millisecond, func() {
					started <- struct{}{}
					<-gate // both are running
					w.Stop()
					wg.Done()
					wg.Wait() // for the other callback's Stop
				})
				require.NoError(t, err)
				advance(time.Millisecond)
				within(t, started, "a callback did not start")
			}
			close(gate)
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("deadlock: the callbacks' Stops did not both return")
			}
			w.Stop()
			requireBalance(t, w)
		})
	}
}

// TestStopLetsBlockedDispatchRunTheRest: with a manual clock, one worker and a queue of one task
// (Block), a callback on the worker waits for a callback that the Advance still holds, blocked on
// the full queue. Once the first callback calls Stop, the Advance stops waiting for room and runs
// the second itself, so the two that call Stop and wait for each other both return.
func TestStopLetsBlockedDispatchRunTheRest(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	clk := sw.NewManualClock(epoch)
	w, err := sw.New(sw.WithClock(clk), sw.WithWorkers(1), sw.WithQueueSize(1), sw.WithShards(1))
	require.NoError(t, err)
	gate := make(chan struct{})
	firstStopped, secondStopped := make(chan struct{}), make(chan struct{})
	var filler atomic.Bool
	_, err = w.AfterFunc(time.Millisecond, func() { // on the worker
		<-gate
		w.Stop()
		close(firstStopped)
		<-secondStopped
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond) // dispatched: the worker runs it, and it waits for gate
	_, err = w.AfterFunc(time.Millisecond, func() { filler.Store(true) })
	require.NoError(t, err)
	_, err = w.AfterFunc(2*time.Millisecond, func() {
		w.Stop()
		close(secondStopped)
		<-firstStopped
	})
	require.NoError(t, err)
	advanced := make(chan struct{})
	// Round one queues the filler (the queue's one slot); round two waits for room.
	go func() { clk.Advance(2 * time.Millisecond); close(advanced) }()
	require.Eventually(t, func() bool { return w.Stats().Queued == 2 }, 5*time.Second, time.Millisecond,
		"the filler waits in the queue and the second callback in the blocked dispatch")
	close(gate)
	within(t, advanced, "deadlock: the Advance kept waiting for room after Stop")
	within(t, firstStopped, "the first callback's Stop did not return")
	w.Stop()
	require.True(t, filler.Load(), "the filler, taken from the wheel before Stop, ran")
	requireBalance(t, w)
}

// TestStopStormFromCallbacks: many callbacks call Stop at once, on every clock, while timers are
// still being armed. Exactly one Stop counts what was pending, the others return 0; every timer
// ends once (ran, or counted by that Stop); and after a Stop from outside no goroutine of the
// wheel is left.
func TestStopStormFromCallbacks(t *testing.T) {
	for _, c := range stopClocks {
		t.Run(c.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			w, advance := stopWheel(t, c.manual, c.workers, sw.WithShards(4))
			var total, calls, ran atomic.Int64
			f := func() {
				ran.Add(1)
				total.Add(int64(w.Stop()))
				calls.Add(1)
			}
			armed := 0
			for i := range 400 {
				d := time.Duration(1+i%5) * time.Millisecond
				if i%4 == 0 {
					d = time.Hour // still pending when the first Stop comes
				}
				if _, err := w.AfterFunc(d, f); err == nil {
					armed++
				}
			}
			var arming sync.WaitGroup
			arming.Add(1)
			go func() { // more arms race the Stops: each is refused or counted
				defer arming.Done()
				for range 200 {
					if _, err := w.AfterFunc(time.Millisecond, f); err != nil {
						require.ErrorIs(t, err, sw.ErrClosed)
					}
				}
			}()
			<-advance(5 * time.Millisecond)
			arming.Wait()
			total.Add(int64(w.Stop()))
			st := w.Stats()
			require.Equal(t, ran.Load(), calls.Load(), "every Stop from a callback returned")
			require.Equal(t, uint64(ran.Load()), st.Fired)
			require.Equal(t, uint64(total.Load()), st.Dropped, "the Stops' counts sum to what was dropped")
			require.Equal(t, st.Scheduled, st.Fired+st.Dropped, "each timer ran or was counted: %+v", st)
			require.GreaterOrEqual(t, st.Dropped, uint64(armed/4), "the hour-long timers were dropped")
			require.Zero(t, st.Pending)
			require.Zero(t, st.Queued)
		})
	}
}

// TestStopCountsExactlyWhatIsPending: Stop, from inside a callback or from outside, returns the
// timers that were pending: not those already taken from the wheel to run (they still run), and
// the next run of an Every whose run is in progress (that run finishes; the next never starts).
func TestStopCountsExactlyWhatIsPending(t *testing.T) {
	for _, fromCallback := range []bool{false, true} {
		for _, c := range stopClocks {
			if fromCallback && c.workers == 0 {
				continue // one goroutine: the Every's own f is that callback (TestStopFromEveryCountsItsNextRun)
			}
			name := c.name + "/outside"
			if fromCallback {
				name = c.name + "/inside"
			}
			t.Run(name, func(t *testing.T) {
				defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
				w, advance := stopWheel(t, c.manual, c.workers, sw.WithShards(2))
				for range 50 {
					_, err := w.AfterFunc(time.Hour, func() {})
					require.NoError(t, err)
				}
				// An Every whose first run blocks until the wheel has stopped (Len drops to 0
				// once Stop has dropped what was pending).
				running := make(chan struct{})
				var runs atomic.Int32
				_, err := w.Every(time.Millisecond, func() {
					if runs.Add(1) == 1 {
						close(running)
						for w.Len() != 0 {
							time.Sleep(time.Millisecond)
						}
					}
				})
				require.NoError(t, err)
				advanced := advance(time.Millisecond)
				within(t, running, "the Every's first run did not start")
				var n int
				if fromCallback {
					// Armed now, it fires on the other worker: the Every's holds its own.
					got := make(chan int, 1)
					_, err = w.AfterFunc(time.Millisecond, func() { got <- w.Stop() })
					require.NoError(t, err)
					<-advanced
					advanced = advance(time.Millisecond)
					n = <-got
					<-advanced
					w.Stop()
				} else {
					n = w.Stop()
					<-advanced
				}
				require.Equal(t, 51, n, "the hour-long timers and the next run of the Every in progress")
				require.EqualValues(t, 1, runs.Load(), "the run in progress finished, and no other started")
				st := w.Stats()
				require.EqualValues(t, 51, st.Dropped)
				require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "stats %+v", st)
			})
		}
	}
}

// TestStopFromEveryCountsItsNextRun: an Every's f that stops the wheel ends its own series; its
// next run is counted in what Stop returns, on every clock.
func TestStopFromEveryCountsItsNextRun(t *testing.T) {
	for _, c := range stopClocks {
		t.Run(c.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			w, advance := stopWheel(t, c.manual, c.workers)
			_, err := w.AfterFunc(time.Hour, func() {})
			require.NoError(t, err)
			got := make(chan int, 1)
			var runs atomic.Int32
			_, err = w.Every(time.Millisecond, func() {
				if runs.Add(1) == 1 {
					got <- w.Stop()
				}
			})
			require.NoError(t, err)
			<-advance(3 * time.Millisecond)
			select {
			case n := <-got:
				require.Equal(t, 2, n, "the hour-long timer and the Every's own next run")
			case <-time.After(5 * time.Second):
				t.Fatal("the Every never ran")
			}
			w.Stop()
			require.EqualValues(t, 1, runs.Load())
			st := w.Stats()
			require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "stats %+v", st)
		})
	}
}

// TestStopEveryRunStartedAfterStop: an Every's run that had fired before Stop but starts after it
// (it waited behind a callback that called Stop) runs, and has no next run: nothing of it is
// counted as dropped, and the books balance.
func TestStopEveryRunStartedAfterStop(t *testing.T) {
	w, clk := manualWheel(t, sw.WithShards(1))
	var runs atomic.Int32
	_, err := w.AfterFunc(time.Millisecond, func() {
		require.Zero(t, w.Stop(), "nothing else is pending: the Every's run was taken with this one")
	})
	require.NoError(t, err)
	_, err = w.Every(time.Millisecond, func() { runs.Add(1) })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.EqualValues(t, 1, runs.Load(), "the run fired before Stop, and ran after it")
	st := w.Stats()
	require.Zero(t, st.Dropped)
	require.Equal(t, st.Scheduled, st.Fired, "stats %+v", st)
}

// TestStopQueuedCountsWhatWaitsBehindABlockedCallback: Stats.Queued counts every callback that is
// due and taken from the wheel but not started, also those waiting behind a running callback on
// the goroutine that holds them, on a worker of the system clock and on a manual advancer.
func TestStopQueuedCountsWhatWaitsBehindABlockedCallback(t *testing.T) {
	for _, c := range []struct {
		name    string
		manual  bool
		workers int
	}{{"system-one-worker", false, 1}, {"manual-advancer", true, 0}} {
		t.Run(c.name, func(t *testing.T) {
			w, advance := stopWheel(t, c.manual, c.workers, sw.WithShards(1))
			gate := make(chan struct{})
			var ran atomic.Int32
			for range 20 {
				_, err := w.AfterFunc(time.Millisecond, func() {
					if ran.Add(1) == 1 {
						<-gate // the first to start (callbacks of one tick run in any order)
					}
				})
				require.NoError(t, err)
			}
			advanced := advance(5 * time.Millisecond)
			require.Eventually(t, func() bool { return w.Stats().Queued == 19 }, 5*time.Second, time.Millisecond,
				"the 19 due behind the blocked callback are queued (Queued %d)", w.Stats().Queued)
			require.EqualValues(t, 1, ran.Load())
			require.Equal(t, 19, w.Len(), "a callback that has not started is still pending")
			close(gate)
			<-advanced
			require.Eventually(t, func() bool { return ran.Load() == 20 }, 5*time.Second, time.Millisecond)
			require.Eventually(t, func() bool { return w.Stats().Queued == 0 }, 5*time.Second, time.Millisecond)
			w.Stop()
			requireBalance(t, w)
		})
	}
}
