package shardwheel_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
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
// callback there may block, and returns a channel closed when that Advance returns, or when a
// callback that it runs ends its goroutine with runtime.Goexit).
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
		go func() { defer close(done); clk.Advance(d) }()
		return done
	}
}

// TestStopOutsideWaitsForCallbackThatStopped: a callback calls Stop, which returns at once with
// the count of what was pending, and then blocks; Len is 0 and AfterFunc returns ErrClosed. A Stop
// from outside returns (0) only after that callback has returned and every goroutine of the wheel
// has exited, also when the callback ends in runtime.Goexit after its Stop (its worker's
// replacement, or the Advance's goroutine, ends too).
func TestStopOutsideWaitsForCallbackThatStopped(t *testing.T) {
	for _, c := range stopClocks {
		for _, goexit := range []bool{false, true} {
			name := c.name
			if goexit {
				name += "/goexit"
			}
			t.Run(name, func(t *testing.T) {
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
					if goexit {
						runtime.Goexit()
					}
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
				select {
				case <-returned:
					t.Fatal("the outside Stop returned while the callback that called Stop was blocked")
				default:
				}
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
}

// TestStopTwoCallbacksWaitForEachOther: two callbacks, one on each worker, each call Stop and
// then wait for the other to have returned from its Stop. Neither Stop waits for the other
// callback, so both return, and exactly one Stop counts the timer that was pending. With a Stop
// from outside under way first (the callbacks' Stops are then later ones and return 0), the same
// holds, and the outside Stop returns the count only once both callbacks have returned.
func TestStopTwoCallbacksWaitForEachOther(t *testing.T) {
	for _, c := range stopClocks {
		if c.workers < 2 {
			continue // one goroutine runs one callback at a time: they could not wait for each other
		}
		for _, outsideFirst := range []bool{false, true} {
			name := c.name
			if outsideFirst {
				name += "/outside-first"
			}
			t.Run(name, func(t *testing.T) {
				defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
				w, advance := stopWheel(t, c.manual, c.workers, sw.WithShards(2))
				_, err := w.AfterFunc(time.Hour, func() {})
				require.NoError(t, err)
				var wg sync.WaitGroup
				wg.Add(2)
				var inside, returned atomic.Int64
				started := make(chan struct{}, 2)
				gate, done := make(chan struct{}), make(chan struct{})
				for range 2 {
					// The second is armed once the first runs, so that the other worker runs it
					// (two armed together may fire in one batch, on one worker, one after the other).
					_, err := w.AfterFunc(time.Millisecond, func() {
						defer returned.Add(1)
						started <- struct{}{}
						<-gate // both are running
						inside.Add(int64(w.Stop()))
						wg.Done()
						wg.Wait() // for the other callback's Stop
					})
					require.NoError(t, err)
					advance(time.Millisecond)
					within(t, started, "a callback did not start")
				}
				type outsideResult struct{ n, returned int64 }
				outside := make(chan outsideResult, 1)
				if outsideFirst {
					go func() { n := w.Stop(); outside <- outsideResult{int64(n), returned.Load()} }()
					require.Eventually(t, func() bool { return w.Len() == 0 }, 5*time.Second, time.Millisecond,
						"the outside Stop did not drop the hour-long timer")
				}
				close(gate)
				go func() { wg.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Fatal("deadlock: the callbacks' Stops did not both return")
				}
				if outsideFirst {
					select {
					case r := <-outside:
						require.EqualValues(t, 1, r.n, "the outside Stop counts the hour-long timer")
						require.EqualValues(t, 2, r.returned, "the outside Stop returned before both callbacks")
					case <-time.After(5 * time.Second):
						t.Fatal("the outside Stop never returned")
					}
					require.Zero(t, inside.Load(), "the callbacks' Stops came later: each returns 0")
				} else {
					require.Zero(t, w.Stop())
					require.EqualValues(t, 1, inside.Load(), "one of the callbacks' Stops counts the hour-long timer")
				}
				requireBalance(t, w)
				require.EqualValues(t, 1, w.Stats().Dropped)
			})
		}
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
	gate, firstStarted := make(chan struct{}), make(chan struct{})
	firstStopped, secondStopped := make(chan struct{}), make(chan struct{})
	var filler atomic.Bool
	_, err = w.AfterFunc(time.Millisecond, func() { // on the worker
		close(firstStarted)
		<-gate
		w.Stop()
		close(firstStopped)
		<-secondStopped
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond) // dispatched: the worker runs it, and it waits for gate
	// Once it has started, its task has left the queue: the queue's one slot is the filler's.
	within(t, firstStarted, "the first callback did not start")
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
// still being armed, and a Stop from outside comes once the first callback has started. Exactly
// one Stop counts what was pending, the others return 0; every timer ends once (ran, or counted by
// that Stop); the outside Stop returns only when no callback is running, none starts after it,
// and no goroutine of the wheel is left.
func TestStopStormFromCallbacks(t *testing.T) {
	for _, c := range stopClocks {
		t.Run(c.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			w, advance := stopWheel(t, c.manual, c.workers, sw.WithShards(4))
			var total, calls, ran, inFlight, late atomic.Int64
			var outsideReturned atomic.Bool
			f := func() {
				inFlight.Add(1)
				defer inFlight.Add(-1)
				if outsideReturned.Load() {
					late.Add(1)
				}
				ran.Add(1)
				total.Add(int64(w.Stop()))
				calls.Add(1)
				time.Sleep(100 * time.Microsecond) // the rest of the callback, after its Stop
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
			advanced := advance(5 * time.Millisecond)
			require.Eventually(t, func() bool { return ran.Load() > 0 }, 5*time.Second, 100*time.Microsecond)
			total.Add(int64(w.Stop())) // from outside, racing the callbacks and their Stops
			outsideReturned.Store(true)
			require.Zero(t, inFlight.Load(), "the outside Stop returned while a callback ran")
			<-advanced
			arming.Wait()
			st := w.Stats()
			require.Zero(t, late.Load(), "a callback started after the outside Stop returned")
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
// That next run is counted once: the run in progress then calls Stop itself, which returns 0.
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
				everyStop := make(chan int, 1)
				var runs atomic.Int32
				_, err := w.Every(time.Millisecond, func() {
					if runs.Add(1) == 1 {
						close(running)
						for w.Len() != 0 {
							time.Sleep(time.Millisecond)
						}
						everyStop <- w.Stop()
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
				require.Zero(t, <-everyStop, "the Every's own Stop came later: its next run was counted once")
				require.EqualValues(t, 1, runs.Load(), "the run in progress finished, and no other started")
				st := w.Stats()
				require.EqualValues(t, 51, st.Dropped)
				require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "stats %+v", st)
			})
		}
	}
}

// TestStopFromEveryCountsItsNextRun: an Every's f that stops the wheel ends its own series. During
// the run its next run is pending (Len counts it), and Stop counts it in what it returns, which is
// Stats.Dropped, on every clock.
func TestStopFromEveryCountsItsNextRun(t *testing.T) {
	for _, c := range stopClocks {
		t.Run(c.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			w, advance := stopWheel(t, c.manual, c.workers)
			_, err := w.AfterFunc(time.Hour, func() {})
			require.NoError(t, err)
			type result struct{ pending, n int }
			got := make(chan result, 1)
			var runs atomic.Int32
			_, err = w.Every(time.Millisecond, func() {
				if runs.Add(1) == 1 {
					pending := w.Len()
					got <- result{pending, w.Stop()}
				}
			})
			require.NoError(t, err)
			<-advance(3 * time.Millisecond)
			var r result
			select {
			case r = <-got:
			case <-time.After(5 * time.Second):
				t.Fatal("the Every never ran")
			}
			require.Equal(t, 2, r.pending, "during the run: the hour-long timer and the Every's next run")
			require.Equal(t, 2, r.n, "the hour-long timer and the Every's own next run")
			w.Stop()
			require.EqualValues(t, 1, runs.Load())
			st := w.Stats()
			require.EqualValues(t, r.n, st.Dropped, "stats %+v", st)
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
// the goroutine that holds them, on a worker of the system clock and on a manual advancer. (On the
// system clock the 20 are made due while the only worker runs another callback, so that it takes
// them in one batch: armed a few microseconds apart, they may otherwise straddle its wake-up.)
func TestStopQueuedCountsWhatWaitsBehindABlockedCallback(t *testing.T) {
	for _, c := range []struct {
		name    string
		manual  bool
		workers int
	}{{"system-one-worker", false, 1}, {"manual-advancer", true, 0}} {
		t.Run(c.name, func(t *testing.T) {
			w, advance := stopWheel(t, c.manual, c.workers, sw.WithShards(1))
			var holdGate chan struct{}
			if !c.manual {
				var holding chan struct{}
				holding, holdGate = armStuck(t, w, 0, nil)
				within(t, holding, "the holding callback did not start")
			}
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
			if holdGate != nil {
				time.Sleep(2 * time.Millisecond) // all 20 are due
				close(holdGate)
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

// TestUseAfterStop: Stop returns how many timers were pending (a later call returns 0). After
// it, AfterFunc, AfterFuncArg and Every return ErrClosed, as does a Keyed's Set, each counted in
// Stats.Rejected; Len is 0; the handles of the dropped timers report false; and nothing fires.
func TestUseAfterStop(t *testing.T) {
	w, clk := manualWheel(t)
	var fired atomic.Int32
	tm, err := w.AfterFunc(time.Second, func() { fired.Add(1) })
	require.NoError(t, err)
	ev, err := w.Every(time.Second, func() { fired.Add(1) })
	require.NoError(t, err)
	require.Equal(t, 2, w.Len())
	require.Equal(t, 2, w.Stop())
	require.Zero(t, w.Stop(), "later calls return 0")
	require.Zero(t, w.Len())
	_, err = w.AfterFunc(time.Second, func() {})
	require.ErrorIs(t, err, sw.ErrClosed)
	_, err = w.AfterFuncArg(math.MaxInt64, func(any) {}, nil)
	require.ErrorIs(t, err, sw.ErrClosed)
	_, err = w.Every(time.Second, func() {})
	require.ErrorIs(t, err, sw.ErrClosed)
	k := sw.NewKeyed(w, func(int, int) { fired.Add(1) })
	require.ErrorIs(t, k.Set(1, 1, time.Second), sw.ErrClosed)
	require.Zero(t, k.Len())
	require.False(t, tm.Stop(), "a timer counted by Wheel.Stop cannot also be stopped")
	require.False(t, tm.Reset(time.Second))
	require.False(t, ev.Stop(), "nor can an Every whose next run Wheel.Stop counted")
	clk.Advance(time.Hour)
	require.Zero(t, fired.Load(), "pending timers never fire after Stop")
	require.Zero(t, w.Len())
	s := w.Stats()
	require.Equal(t, uint64(2), s.Dropped)
	require.Equal(t, uint64(4), s.Rejected)
	requireBalance(t, w)
}

// TestStopFromCallback: Stop called from a callback, on one worker or several, returns at once,
// with the count of what was pending, although the callback that called it is still running; a
// later Stop from outside returns 0.
func TestStopFromCallback(t *testing.T) {
	for _, workers := range []int{1, 3} {
		w, err := sw.New(sw.WithWorkers(workers))
		require.NoError(t, err)
		res := make(chan int, 1)
		// The hour-long timer is armed first, so that it is pending whenever the callback runs.
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
		_, err = w.AfterFunc(time.Millisecond, func() { res <- w.Stop() })
		require.NoError(t, err)
		require.Equal(t, 1, <-res, "Stop inside a callback does not wait for itself")
		require.Zero(t, w.Stop(), "a later Stop waits for the first and returns 0")
	}
}

// TestFaultStopWhileHammered: Wheel.Stop while producers schedule and stop as fast as they can.
// Calls that got ErrClosed were not accepted; every accepted timer ran, was stopped, or was
// counted by Wheel.Stop; and no callback starts after Wheel.Stop returned.
func TestFaultStopWhileHammered(t *testing.T) {
	const capIDs = 1 << 19
	target := int64(40_000)
	if testing.Short() {
		target = 10_000
	}
	w, err := sw.New(sw.WithShards(2), sw.WithWorkers(2), sw.WithRingSize(64))
	require.NoError(t, err)
	defer w.Stop()
	book := newFltBook(capIDs)
	var nextID, stoppedTrue, closedErrs atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			delays := []time.Duration{0, 50 * time.Microsecond, time.Millisecond, time.Hour}
			var prev sw.Timer
			prevID := -1
			for {
				id := int(nextID.Add(1) - 1)
				if id >= capIDs {
					return
				}
				tm, err := w.AfterFuncArg(delays[rng.IntN(len(delays))], func(a any) { book.ran(a.(int)) }, id)
				if err != nil {
					assert.ErrorIs(t, err, sw.ErrClosed)
					closedErrs.Add(1)
					book.stop(id) // not accepted: mark it so that the check does not count it as dropped
					return
				}
				if rng.IntN(3) == 0 && prevID >= 0 && prev.Stop() {
					book.stop(prevID)
					stoppedTrue.Add(1)
				}
				prev, prevID = tm, id
			}
		}()
	}
	require.Eventually(t, func() bool { return nextID.Load() >= target }, fltPatience, time.Millisecond)
	dropped := w.Stop()
	ranAtStop, _ := book.totals(capIDs)
	wg.Wait()
	ids := int(min(nextID.Load(), capIDs))
	ranAfter, _ := book.totals(capIDs)
	require.Equal(t, ranAtStop, ranAfter, "callbacks started after Wheel.Stop returned")
	rejected := int(closedErrs.Load())
	accepted := ids - rejected
	require.Positive(t, rejected, "every producer ends on ErrClosed")
	book.check(t, ids, dropped)
	s := int(stoppedTrue.Load())
	require.Equal(t, accepted, ranAfter+s+dropped)
	fltBalance(t, w, accepted, ranAfter, s, dropped)
	t.Logf("accepted %d: fired %d, stopped %d, dropped by Wheel.Stop %d; rejected %d", accepted, ranAfter, s, dropped, rejected)
}

// TestFaultStopInsideCallback: Wheel.Stop called from a callback returns at once (no deadlock),
// waiting for no other callback, also one that waits for that Stop to return, and every timer is
// accounted for.
func TestFaultStopInsideCallback(t *testing.T) {
	for _, workers := range []int{0, 1, 4} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			clock := sw.NewManualClock(time.Unix(0, 0))
			opts := []sw.Option{sw.WithWorkers(workers), sw.WithShards(2)}
			if workers == 0 {
				opts = append(opts, sw.WithClock(clock))
			}
			w, err := sw.New(opts...)
			require.NoError(t, err)
			defer w.Stop()

			const far, near = 50, 30
			n := far + near + 2
			book := newFltBook(n)
			for i := 0; i < far; i++ { // pending at Stop: dropped
				_, err := w.AfterFuncArg(time.Hour, func(a any) { book.ran(a.(int)) }, i)
				require.NoError(t, err)
			}
			for i := far; i < far+near; i++ { // due with the stopper, or just after
				_, err := w.AfterFuncArg(time.Duration(i%3)*time.Millisecond, func(a any) { book.ran(a.(int)) }, i)
				require.NoError(t, err)
			}
			// B, with several workers: a callback running on another worker that waits for A's
			// Stop to return. B is due a tick before A, so that it travels in an earlier batch and
			// never in the same task as A.
			bID, aID := n-2, n-1
			bStarted, aStopped := make(chan struct{}), make(chan struct{})
			if workers > 1 {
				_, err = w.AfterFunc(0, func() {
					close(bStarted)
					<-aStopped
					book.ran(bID)
				})
				require.NoError(t, err)
			} else {
				close(bStarted)
				book.stop(bID) // not scheduled: out of the count
			}
			type result struct {
				n, again  int
				errClosed error
			}
			res := make(chan result, 1)
			_, err = w.AfterFunc(time.Millisecond, func() {
				book.ran(aID)
				<-bStarted
				var r result
				r.n = w.Stop()
				close(aStopped)
				r.again = w.Stop()
				_, r.errClosed = w.AfterFunc(0, func() {})
				res <- r
			})
			require.NoError(t, err)
			scheduled := n
			if workers <= 1 {
				scheduled--
			}

			if workers == 0 {
				advanced := make(chan struct{})
				go func() { clock.Advance(2 * time.Hour); close(advanced) }()
				select {
				case <-advanced:
				case <-time.After(fltPatience):
					t.Fatal("Advance did not return: Wheel.Stop inside a callback deadlocked")
				}
			}
			var r result
			select {
			case r = <-res:
			case <-time.After(fltPatience):
				t.Fatal("Wheel.Stop inside a callback deadlocked")
			}
			assert.Equal(t, 0, r.again, "a second Stop returns 0")
			assert.ErrorIs(t, r.errClosed, sw.ErrClosed)
			assert.GreaterOrEqual(t, r.n, far, "the hour-long timers are pending at Stop")
			// The rest of the stopper's batch (and, with one worker, tasks queued behind it) may
			// still run after its callback returns; wait for them, then account for everyone.
			fltWaitQuiet(t, w, func() bool { ran, _ := book.totals(n); return ran+r.n == scheduled })
			require.Equal(t, 0, w.Stop())
			book.check(t, n, r.n)
			ran, _ := book.totals(n)
			fltBalance(t, w, scheduled, ran, 0, r.n)
		})
	}
}

// TestFaultStopInsideCallerRunsCallback: under CallerRuns, a callback that the dispatching
// goroutine (here the caller of ManualClock.Advance) runs itself, because the queue is full,
// calls Wheel.Stop while the rest of its batch still waits to be dispatched. Stop must return,
// the dispatcher must not panic, and every timer must be accounted for once (the rest of the
// batch runs after that callback returns, as Wheel.Stop's doc says).
func TestFaultStopInsideCallerRunsCallback(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(1), sw.WithQueueSize(1),
		sw.WithFullPolicy(sw.CallerRuns), sw.WithShards(1))
	require.NoError(t, err)
	defer w.Stop()
	const n = 100
	book := newFltBook(n)
	gate := make(chan struct{})
	var caller atomic.Int64
	var once sync.Once
	stopped := make(chan int, 1)
	for i := 0; i < n; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			book.ran(i)
			if fltGoid() != caller.Load() {
				<-gate // the worker holds on, so that the queue stays full
				return
			}
			once.Do(func() {
				close(gate)
				stopped <- w.Stop()
			})
		})
		require.NoError(t, err)
	}
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		caller.Store(fltGoid())
		clock.Advance(time.Millisecond)
	}()
	var p any
	select {
	case p = <-panicked:
	case <-time.After(fltPatience):
		t.Fatal("Advance did not return")
	}
	require.Nil(t, p, "ManualClock.Advance panicked after a caller-run callback stopped the wheel")
	dropped := <-stopped
	require.Equal(t, 0, dropped, "all %d timers were due and dispatched together", n)
	fltWaitQuiet(t, w, func() bool { r, _ := book.totals(n); return r == n })
	book.check(t, n, 0)
	fltBalance(t, w, n, n, 0, 0)
}

// TestStopFromCallbackWhileStopping: a Stop from outside is under way (it has dropped what was
// pending and waits for the callbacks) when a callback calls Stop too. That Stop returns at once,
// with 0, while a callback on the other worker still runs; the outside Stop returns the count only
// once both callbacks have returned.
func TestStopFromCallbackWhileStopping(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w, err := sw.New(sw.WithWorkers(2), sw.WithShards(1))
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	var aDone, bDone atomic.Bool
	aIn, aRelease := make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(0, func() { // A
		close(aIn)
		<-aRelease
		aDone.Store(true)
	})
	require.NoError(t, err)
	within(t, aIn, "A never started")
	type result struct {
		n            int
		aDone, bDone bool
	}
	bIn, bGo := make(chan struct{}), make(chan struct{})
	bOut := make(chan result, 1)
	// B is armed once A runs: A's worker let go of the keeper role and of the shard's ownership,
	// so the other worker runs B.
	_, err = w.AfterFunc(0, func() {
		close(bIn)
		<-bGo
		n := w.Stop()
		bOut <- result{n: n, aDone: aDone.Load()}
		bDone.Store(true)
	})
	require.NoError(t, err)
	within(t, bIn, "B never started on the other worker")
	first := make(chan result, 1)
	go func() { n := w.Stop(); first <- result{n, aDone.Load(), bDone.Load()} }()
	require.Eventually(t, func() bool { return w.Len() == 0 }, 5*time.Second, time.Millisecond,
		"the outside Stop did not drop the hour-long timer")
	close(bGo)
	select {
	case r := <-bOut:
		require.Zero(t, r.n, "a later Stop returns 0")
		require.False(t, r.aDone, "B's Stop waited for callback A")
	case <-time.After(5 * time.Second):
		t.Fatal("deadlock: B's Stop waited while a Stop from outside waited for B")
	}
	select {
	case <-first:
		t.Fatal("the outside Stop returned while callback A still ran")
	default:
	}
	close(aRelease)
	select {
	case r := <-first:
		require.Equal(t, 1, r.n, "the outside Stop counts the hour-long timer")
		require.True(t, r.aDone && r.bDone, "the outside Stop returned before a callback")
	case <-time.After(5 * time.Second):
		t.Fatal("the outside Stop never returned")
	}
	requireBalance(t, w)
}

// TestStopFromWorkerUnblocksAdvanceOnFullQueue: with a manual clock, one worker, a queue of one
// task and the Block policy, an Advance that dispatches a batch waits for room in the queue, which
// only the worker makes. The worker's callback calls Stop, which returns at once; the Advance then
// stops waiting and runs the rest of the batch itself, so it returns; and every callback of the
// batch, taken from the wheel before Stop, runs once.
func TestStopFromWorkerUnblocksAdvanceOnFullQueue(t *testing.T) {
	w, clk := blockingManualWheel(t)
	var first atomic.Bool
	var ran atomic.Int32
	for i := 0; i < 4; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			ran.Add(1)
			if first.CompareAndSwap(false, true) { // on the one worker: the Advance waits for room
				w.Stop()
			}
		})
		require.NoError(t, err)
	}
	done := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(done) }()
	within(t, done, "deadlock: Advance blocks on the full queue, the only worker blocks in Stop")
	require.Zero(t, w.Stop())
	require.EqualValues(t, 4, ran.Load(), "a callback taken from the wheel before Stop did not run")
	requireBalance(t, w)
}

// TestStopCountWithEveryAfterIt: one callback stops the wheel; an Every's first run fired in the
// same round, on the same goroutine, and runs before or after the Stop (in either order). The
// Every's run happens once, its series ends, and Stop's count equals Stats.Dropped with the
// books balanced; a second Stop returns 0.
func TestStopCountWithEveryAfterIt(t *testing.T) {
	for _, stopFirst := range []bool{true, false} {
		clock := sw.NewManualClock(time.Unix(0, 0))
		w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0), sw.WithShards(1))
		require.NoError(t, err)
		got, runs := -1, 0
		stopAt, everyAt := 900*time.Microsecond, time.Millisecond
		if !stopFirst {
			stopAt, everyAt = 1100*time.Microsecond, 900*time.Microsecond
		}
		_, err = w.AfterFunc(stopAt, func() { got = w.Stop() })
		require.NoError(t, err)
		_, err = w.Every(everyAt, func() { runs++ })
		require.NoError(t, err)
		for range 3 {
			_, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
			require.NoError(t, err)
		}
		clock.Advance(2 * time.Millisecond)
		require.Equal(t, 1, runs, "stopFirst=%v: the Every's fired run runs once, and no other", stopFirst)
		require.Zero(t, w.Stop())
		st := w.Stats()
		require.EqualValues(t, got, st.Dropped, "stopFirst=%v: %+v", stopFirst, st)
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "stopFirst=%v: %+v", stopFirst, st)
		want := 3 // the three an hour out
		if !stopFirst {
			want++ // the series' next run, re-armed before the Stop
		}
		require.Equal(t, want, got, "stopFirst=%v", stopFirst)
	}
}

// TestStopCountEveryAtEndOfTime: a series whose run comes at the end of a manual clock's time ends
// there (the clock cannot move again): its next run is taken back, not pending. So Len is 0, the
// handle's Stop reports false, Dropped stays 0, the books balance, and a later Stop returns 0:
// nothing was pending.
func TestStopCountEveryAtEndOfTime(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0))
	require.NoError(t, err)
	runs := 0
	ev, err := w.Every(time.Hour, func() { runs++ })
	require.NoError(t, err)
	clock.Advance(math.MaxInt64)
	require.Equal(t, 1, runs)
	require.Zero(t, w.Len(), "the series ended at the end of time")
	require.False(t, ev.Stop())
	st := w.Stats()
	require.Zero(t, st.Pending)
	require.Zero(t, st.Dropped)
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped, "%+v", st)
	require.Zero(t, w.Stop(), "nothing was pending at Wheel.Stop")
}

// TestStopFromCallbackThenStopFiredTimer: a callback stops the wheel and then stops a timer that
// fired in the same batch and has not started. Wheel.Stop does not count it (it was no longer
// pending); Timer.Stop reports true and the callback never runs (Timer.Stop's doc): the timer
// ends in exactly one of the three ways, and the books balance.
func TestStopFromCallbackThenStopFiredTimer(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0), sw.WithShards(1))
	require.NoError(t, err)
	var second sw.Timer
	got, stopped, ran := -1, false, 0
	_, err = w.AfterFunc(500*time.Microsecond, func() {
		ran++
		got = w.Stop()
		stopped = second.Stop()
	})
	require.NoError(t, err)
	second, err = w.AfterFunc(900*time.Microsecond, func() { ran++ })
	require.NoError(t, err)
	clock.Advance(time.Millisecond)
	require.Zero(t, got, "the second timer had fired: Stop does not count it as pending")
	require.True(t, stopped, "the fired timer had not started: its Stop prevents it")
	require.Equal(t, 1, ran, "only the first callback ran")
	require.False(t, second.Stop())
	st := w.Stats()
	require.Equal(t, uint64(2), st.Scheduled)
	require.Equal(t, uint64(1), st.Fired)
	require.Equal(t, uint64(1), st.Stopped)
	require.Zero(t, st.Dropped)
}
