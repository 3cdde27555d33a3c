package shardwheel

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Wheel.Stop, seen from inside: the runs of Every in progress, the queue, the manual advancer,
// and a Stop from outside under way while callbacks call Stop too. A Stop from a callback waits
// for nothing; one from outside waits for every callback and every goroutine of the wheel.

// stopWait returns what c delivers, failing the test after 10 s with what it waited for: a
// deadlock shows as a failure, not as a test binary that hangs until its timeout.
func stopWait[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("waited 10 s for %s", what)
		panic("unreachable")
	}
}

// stopUnderWay waits until a Stop has dropped what was pending (the wheel's stopped channel is
// closed): a Stop called from then on is a later one.
func stopUnderWay(t *testing.T, w *Wheel) {
	t.Helper()
	require.Eventually(t, func() bool { return isClosed(w.stopped) }, 10*time.Second, 100*time.Microsecond,
		"the first Stop never dropped what was pending")
}

// TestStopDropsTimersInCascade: Wheel.Stop while a cascade is in progress drops (and counts) the
// timers in the cascade's bucket too: it returns every timer that never ran.
func TestStopDropsTimersInCascade(t *testing.T) {
	const n = 100
	w, s, _, _, tms, _, ran := cascShard(t, n, 10)
	inC := 0
	for _, tm := range tms {
		if inCasc(tm) {
			inC++
		}
	}
	require.Greater(t, inC, 50)
	require.Zero(t, len(ran))
	require.Equal(t, n, s.tw.count)
	require.Equal(t, n, w.Stop(), "Wheel.Stop returns every pending timer, those in casc included")
	st := w.Stats()
	require.EqualValues(t, n, st.Dropped)
}

// TestStopLenZeroRightAfterInsideStop: "After Stop, Len is 0", also right after a Stop called from
// a callback that the manual advancer runs (WithWorkers(0)), although a timer that fired with it
// has not started yet; that timer still runs, once, after the Stop.
func TestStopLenZeroRightAfterInsideStop(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(1), WithTick(time.Millisecond))
	require.NoError(t, err)
	lenAfter, calls := -1, 0
	cb := func() {
		calls++
		if calls == 1 {
			w.Stop()
			lenAfter = w.Len()
		}
	}
	for range 2 {
		_, err = w.AfterFunc(time.Millisecond, cb)
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	require.Equal(t, 2, calls, "both had fired: the second runs after Stop, as documented")
	require.Zero(t, lenAfter, "Len right after Wheel.Stop returned, inside the callback")
}

// TestStopUnderLoadAccountsForEveryTimer races Wheel.Stop (from outside any callback) with arms,
// Resets, Stops, Every series (some slow, some panicking) and Keyed Sets, Moves and Removes on the
// system clock: every accepted timer ends exactly once (Scheduled == Fired + Stopped + what Stop
// returned), no callback starts after Stop returned, calls after Stop report ErrClosed or false,
// and Len is 0.
func TestStopUnderLoadAccountsForEveryTimer(t *testing.T) {
	rounds := 12
	if testing.Short() {
		rounds = 4
	}
	for r := 0; r < rounds; r++ {
		w, err := New(WithWorkers(2), WithShards(2), WithTick(100*time.Microsecond), WithRingSize(8),
			WithPanicHandler(func(any) {}))
		require.NoError(t, err)
		var after atomic.Bool
		var lateRuns atomic.Int32
		cb := func() {
			if after.Load() {
				lateRuns.Add(1)
			}
		}
		k := NewKeyed(w, func(string, int) { cb() })
		var wg sync.WaitGroup
		quit := make(chan struct{})
		for g := 0; g < 3; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var tms []Timer
				for i := 0; ; i++ {
					select {
					case <-quit:
						return
					default:
					}
					var tm Timer
					var err error
					switch i % 7 {
					case 0:
						tm, err = w.Every(time.Duration(50+i%200)*time.Microsecond, func() {
							cb()
							if i%3 == 0 {
								time.Sleep(200 * time.Microsecond)
							}
							if i%5 == 0 {
								panic("boom")
							}
						})
					case 1:
						err = k.Set(string(rune('a'+i%13)), i, time.Duration(i%300)*time.Microsecond)
					case 2:
						k.Move(string(rune('a'+i%13)), time.Duration(i%500)*time.Microsecond)
					case 3:
						k.Remove(string(rune('a' + i%13)))
					default:
						tm, err = w.AfterFunc(time.Duration(i%400)*time.Microsecond, cb)
					}
					if err != nil {
						require.ErrorIs(t, err, ErrClosed)
						return
					}
					if tm.s != nil {
						tms = append(tms, tm)
					}
					if len(tms) > 0 && i%2 == 0 {
						j := (i * 7) % len(tms)
						if i%4 == 0 {
							tms[j].Stop()
						} else {
							tms[j].Reset(time.Duration(i%300) * time.Microsecond)
						}
					}
				}
			}()
		}
		time.Sleep(time.Duration(2+r%5) * time.Millisecond)
		n := w.Stop()
		after.Store(true)
		close(quit)
		wg.Wait()
		time.Sleep(time.Millisecond)
		st := w.Stats()
		require.Zero(t, lateRuns.Load(), "round %d: a callback started after Wheel.Stop returned", r)
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+uint64(n), "round %d: Stop returned %d, %+v", r, n, st)
		require.EqualValues(t, n, st.Dropped, "round %d", r)
		require.Zero(t, w.Len())
		_, err = w.Every(time.Millisecond, func() {})
		require.ErrorIs(t, err, ErrClosed)
		require.ErrorIs(t, k.Set("x", 1, time.Millisecond), ErrClosed)
		require.Zero(t, w.Stop())
	}
}

// TestStopOnOnlyWorkerQueuedCallbackStillRuns: with a manual clock and one worker, a callback on
// that worker calls Stop while another callback, taken from the wheel, waits in the queue. Stop
// returns at once; the queued callback still runs once, on that worker, after it.
func TestStopOnOnlyWorkerQueuedCallbackStillRuns(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	// taskCap = 1: the batch of two is two tasks; Block waits for room for the second.
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1), WithQueueSize(1))
	require.NoError(t, err)
	defer w.Stop()
	var first atomic.Bool
	var otherRan atomic.Int32
	stopped := make(chan struct{})
	cb := func() {
		if !first.CompareAndSwap(false, true) {
			otherRan.Add(1)
			return
		}
		// Wait until the other one is in the queue (the Advance queues it once this task was taken).
		for len(w.pool.queue) == 0 {
			time.Sleep(time.Millisecond)
		}
		require.Zero(t, w.Stop(), "nothing was pending: both had fired")
		require.Equal(t, 1, w.Stats().Queued, "the other callback waits in the queue")
		close(stopped)
	}
	for range 2 {
		_, err = w.AfterFunc(time.Millisecond, cb)
		require.NoError(t, err)
	}
	clock.Advance(time.Millisecond)
	<-stopped
	w.Stop()
	require.Equal(t, int32(1), otherRan.Load(), "the queued callback ran once before the outside Stop returned")
	requireStoppedBooks(t, w, 0)
}

// TestStopDropsNextRunsOfBothSlotsOfOneGoroutine: an Every A runs on the only worker; its f calls
// Advance, which makes the worker the manual advancer, and, the queue being full (Y waits in it),
// a second Every B runs on it too, in the advancer's slot (CallerRuns). Both series have a run in
// progress on one goroutine, in two slots, and Stop drops the next run of each (dropRunning): it
// returns them with the three pending timers, which is Stats.Dropped, and the books balance. The
// Stop is B's own (it returns at once), or one from outside while B runs: B's Stop, a later one,
// then returns 0, and the outside Stop returns once Y, queued behind A, has run.
func TestStopDropsNextRunsOfBothSlotsOfOneGoroutine(t *testing.T) {
	for _, outsideFirst := range []bool{false, true} {
		name := "inside"
		if outsideFirst {
			name = "outside-first"
		}
		t.Run(name, func(t *testing.T) {
			clock := NewManualClock(time.Unix(0, 0))
			w, err := New(WithClock(clock), WithShards(1), WithWorkers(1), WithQueueSize(1), WithFullPolicy(CallerRuns))
			require.NoError(t, err)
			defer w.Stop()
			for range 3 {
				_, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
				require.NoError(t, err)
			}
			goOn, bIn := make(chan struct{}), make(chan struct{})
			got, bRuns, aRuns := -1, 0, 0
			var yRan atomic.Int32
			aDone := make(chan struct{})
			_, err = w.Every(10*time.Millisecond, func() {
				aRuns++
				defer close(aDone)
				<-goOn // the test's Advance has let go of the clock
				if _, err := w.AfterFunc(0, func() { yRan.Add(1) }); err != nil {
					panic(err)
				}
				clock.Advance(0) // into the queue, which is then full
				if _, err := w.Every(time.Millisecond, func() {
					bRuns++
					close(bIn)
					if outsideFirst {
						for !isClosed(w.stopped) {
							time.Sleep(50 * time.Microsecond)
						}
					}
					got = w.Stop()
				}); err != nil {
					panic(err)
				}
				clock.Advance(time.Millisecond) // B is due: it runs here
			})
			require.NoError(t, err)
			clock.Advance(10 * time.Millisecond)
			close(goOn)
			total := 0
			if outsideFirst {
				stopWait(t, bIn, "B's run")
				total = w.Stop()
				require.EqualValues(t, 1, yRan.Load(), "the outside Stop returned before Y, queued before it, ran")
				require.Zero(t, got, "B's Stop came later")
			} else {
				stopWait(t, aDone, "A's run")
				require.Eventually(t, func() bool { return yRan.Load() == 1 }, 5*time.Second, time.Millisecond)
				total = got
				require.Zero(t, w.Stop())
			}
			require.Equal(t, 1, aRuns)
			require.Equal(t, 1, bRuns)
			require.Equal(t, 5, total, "three pending, and the next run of A and of B")
			requireStoppedBooks(t, w, total)
		})
	}
}

// TestStopQueuedEveryRunHasNoNextRun: an Every's first run fired before Stop and waits in the
// queue (both workers busy) when a callback stops the wheel; it starts after that Stop, on a
// worker. It runs (it was taken from the wheel), and its next run, never pending, is not in what
// Stop returns: the callback's Stop returns the two pending timers, which is Stats.Dropped. A Stop
// from outside returns once that run is over, and the handle's Stop then reports false.
func TestStopQueuedEveryRunHasNoNextRun(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(2), WithQueueSize(1))
	require.NoError(t, err)
	defer w.Stop()
	for range 2 {
		_, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
		require.NoError(t, err)
	}
	// X holds one worker until Stop has begun.
	xStarted := make(chan struct{})
	_, err = w.AfterFunc(0, func() {
		close(xStarted)
		for !w.closed.Load() {
			time.Sleep(time.Millisecond)
		}
	})
	require.NoError(t, err)
	clock.Advance(0)
	<-xStarted

	var eRuns atomic.Int32
	got := -1
	stopped := make(chan struct{})
	_, err = w.AfterFunc(9*time.Millisecond, func() { // a round before E's
		for len(w.pool.queue) == 0 { // E's first run is queued behind this one
			time.Sleep(time.Millisecond)
		}
		got = w.Stop()
		close(stopped)
	})
	require.NoError(t, err)
	e, err := w.Every(10*time.Millisecond, func() { eRuns.Add(1) })
	require.NoError(t, err)
	clock.Advance(10 * time.Millisecond)
	<-stopped
	require.Equal(t, 2, got)
	require.Zero(t, w.Stop())
	require.Equal(t, int32(1), eRuns.Load(), "the queued run ran once, before the outside Stop returned")
	require.False(t, e.Stop(), "the run that started after Stop has no next run to stop")
	requireStoppedBooks(t, w, got)
}

// TestStopGoexitInQueuedCallbackAfterStop: a callback on the only worker stops the wheel: its Stop
// returns at once, with the three pending timers, while three callbacks taken from the wheel before
// it wait in the queue. They run after it, each once: the first calls Stop (0, at once), the
// second runtime.Goexit, which ends the worker; the worker that takes its place runs the third,
// and a Stop from outside returns only once that callback has returned and every worker goroutine
// has exited.
func TestStopGoexitInQueuedCallbackAfterStop(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1))
	require.NoError(t, err)
	for range 3 {
		_, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
		require.NoError(t, err)
	}

	gate1, t1Started, t1Ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
	t1Stop := make(chan int, 1)
	_, err = w.AfterFunc(time.Millisecond, func() {
		defer close(t1Ended)
		close(t1Started)
		<-gate1
		t1Stop <- w.Stop()
	})
	require.NoError(t, err)
	clock.Advance(time.Millisecond)
	<-t1Started

	// Three tasks wait in the queue behind the busy worker.
	queuedStop := make(chan int, 1)
	_, err = w.AfterFunc(0, func() { queuedStop <- w.Stop() })
	require.NoError(t, err)
	clock.Advance(0)
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
	require.Equal(t, 3, len(w.pool.queue))

	close(gate1)
	<-t1Ended
	require.Equal(t, 3, <-t1Stop, "the Stop from the running callback counts the three pending timers")
	<-t3Started // on the worker that took the place of the one that ended
	require.Zero(t, <-queuedStop, "a queued callback's Stop, a later one, returns 0")
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
	requireWorkersExited(t, w)
	requireStoppedBooks(t, w, 3)
	require.Equal(t, uint64(4), w.Stats().Fired)
}

// TestStopQueuedEveryRunAndCallbackRunOnce: Stop on the only worker (from a callback), with a
// queued Every run and a queued one-shot: both run once after it, on that worker; each calls Stop
// (0, at once), and the one-shot calls Advance (the wheel is detached) without hanging; the
// Every's run started after Stop, so its next run is not counted, and Stop returns exactly the two
// pending timers, which is Stats.Dropped.
func TestStopQueuedEveryRunAndCallbackRunOnce(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1))
	require.NoError(t, err)
	for range 2 {
		_, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
		require.NoError(t, err)
	}
	gate, started := make(chan struct{}), make(chan struct{})
	var everyRuns, everyStop, xRuns, innerStop atomic.Int32
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
	_, err = w.Every(time.Millisecond, func() {
		everyRuns.Add(1)
		everyStop.Store(int32(w.Stop()) + 1)
	})
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
	requireWorkersExited(t, w)
	require.Equal(t, int32(1), everyRuns.Load())
	require.Equal(t, int32(1), everyStop.Load(), "Stop from the queued Every run returns 0")
	requireStoppedBooks(t, w, got)
}

// TestStopConcurrentCallsCountOnce: Stop from many goroutines at once: one returns how many were
// pending, the others 0, each only once the wheel is stopped (Len 0, every worker exited); the
// count is Stats.Dropped, and Every then returns ErrClosed.
func TestStopConcurrentCallsCountOnce(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const n = 1000
	w, err := New(WithWorkers(2), WithShards(4))
	require.NoError(t, err)
	for i := 0; i < n; i++ {
		_, err := w.AfterFunc(time.Hour+time.Duration(i)*time.Millisecond, func() {})
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	res := make([]int, 8)
	for g := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[g] = w.Stop()
			if !isClosed(w.stopped) {
				t.Error("a Stop returned before the wheel was stopped")
			}
			if w.Len() != 0 {
				t.Error("Len after Stop")
			}
			for i, d := range w.pool.done {
				if !isClosed(d) {
					t.Errorf("a Stop returned before worker %d exited", i)
				}
			}
		}()
	}
	wg.Wait()
	total, nonzero := 0, 0
	for _, r := range res {
		total += r
		if r != 0 {
			nonzero++
		}
	}
	require.Equal(t, n, total, "%v", res)
	require.Equal(t, 1, nonzero, "%v", res)
	requireStoppedBooks(t, w, n)
	_, err = w.Every(time.Second, func() {})
	require.True(t, errors.Is(err, ErrClosed))
}

// TestStopFromCallbackThenStopRestOfBatchOnWorkers: on the system clock with workers, a batch of
// 20 timers due together is shared between the keeper and an idle worker; the first callback to
// start stops the wheel and then stops every other timer of the batch, plus one far timer. Each
// timer ends exactly one way: ran, or its Stop reported true (fired and not started: it never
// runs), or counted by Wheel.Stop (the far one only: a fired timer is no longer pending); and the
// books balance (Scheduled == Fired + Stopped + Dropped, Lateness.Count() == Fired).
func TestStopFromCallbackThenStopRestOfBatchOnWorkers(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithWorkers(2), WithShards(1), WithTick(time.Millisecond))
		require.NoError(t, err)
		const n = 20
		var (
			hs       [n]Timer
			ran      [n]atomic.Bool
			stopTrue [n]atomic.Bool
			first    atomic.Bool
			got      = -1
			far      Timer
			farStop  bool
		)
		ready := make(chan struct{})
		for i := range n {
			hs[i], err = w.AfterFunc(50*time.Millisecond, func() {
				<-ready
				if !first.CompareAndSwap(false, true) {
					ran[i].Store(true)
					return
				}
				ran[i].Store(true)
				got = w.Stop()
				for j := range n {
					if j != i && hs[j].Stop() {
						stopTrue[j].Store(true)
					}
				}
				farStop = far.Stop()
			})
			require.NoError(t, err)
		}
		far, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
		require.NoError(t, err)
		close(ready)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		require.Zero(t, w.Stop(), "later Stop calls return 0")
		require.Equal(t, 1, got, "Stop counts the far timer only: the batch had fired")
		require.False(t, farStop, "Stop counted the far timer")
		stopped := 0
		for i := range n {
			require.NotEqual(t, ran[i].Load(), stopTrue[i].Load(), "timer %d: ran %v, stopped %v",
				i, ran[i].Load(), stopTrue[i].Load())
			if stopTrue[i].Load() {
				stopped++
			}
		}
		st := w.Stats()
		require.Equal(t, uint64(n+1), st.Scheduled, "%+v", st)
		require.Equal(t, uint64(n-stopped), st.Fired, "%+v", st)
		require.Equal(t, uint64(stopped), st.Stopped, "%+v", st)
		require.Equal(t, uint64(1), st.Dropped, "%+v", st)
		require.Equal(t, st.Fired, st.Lateness.Count())
		require.Zero(t, st.Pending)
	})
}

// TestStopLaterOutsideWaitsForRunningCallback: while a first Stop from outside waits for a running
// callback, a later Stop from another goroutine outside returns 0, and only once that callback has
// returned and every worker has exited, as the first does; the first returns the count, which is
// Stats.Dropped, and Len is 0.
func TestStopLaterOutsideWaitsForRunningCallback(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w, err := New(WithWorkers(2), WithShards(2))
	require.NoError(t, err)
	in, release := make(chan struct{}), make(chan struct{})
	var done atomic.Bool
	_, err = w.AfterFunc(0, func() { close(in); <-release; done.Store(true) })
	require.NoError(t, err)
	stopWait(t, in, "the callback to start")
	for i := 0; i < 5; i++ {
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
	}
	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	stopUnderWay(t, w)
	time.AfterFunc(100*time.Millisecond, func() { close(release) })
	require.Equal(t, 0, w.Stop())
	require.True(t, done.Load(), "a later Stop returned before a running callback ended")
	requireWorkersExited(t, w)
	require.Equal(t, 5, stopWait(t, first, "the first Stop"))
	require.Equal(t, 0, w.Stop())
	require.Equal(t, 0, w.Len())
	requireStoppedBooks(t, w, 5)
}

// TestStopOutsideWaitsForWorkerAndAdvancerCallbacks: with a manual clock, one worker, a queue of
// one task and CallerRuns, A runs on the worker, Q waits in the queue, and an Advance runs X and
// then Y, one batch, on its own goroutine (no room in the queue). A Stop from outside is under way
// (it has dropped the one pending timer) when X calls Stop: it returns 0 at once, while A still
// runs. Y, fired with X, runs after X's Stop returned. A then calls Stop: it returns 0 at once,
// while Y still runs. The outside Stop returns the count only once A, Q, X and Y have all returned.
func TestStopOutsideWaitsForWorkerAndAdvancerCallbacks(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1), WithFullPolicy(CallerRuns))
	require.NoError(t, err)

	type result struct {
		n         int
		otherDone bool // the other callback that blocks (Y for A, A for X) had returned
	}
	var aDone, qDone, xDone, yDone atomic.Bool
	aIn, aGo, aOut := make(chan struct{}), make(chan struct{}), make(chan result, 1)
	_, err = w.AfterFunc(time.Millisecond, func() { // A, on the only worker
		close(aIn)
		<-aGo
		n := w.Stop()
		aOut <- result{n, yDone.Load()}
		aDone.Store(true)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	stopWait(t, aIn, "A to start on the worker")
	_, err = w.AfterFunc(time.Millisecond, func() { qDone.Store(true) }) // Q fills the queue
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, len(w.pool.queue), "Q waits in the queue")

	xIn, xGo, xOut := make(chan struct{}), make(chan struct{}), make(chan result, 1)
	yIn, yGo := make(chan struct{}), make(chan struct{})
	var xOnAdvancer, yAfterXStop atomic.Bool
	var n atomic.Int32
	f := func() { // the first of the batch to run is X, the second Y
		if n.Add(1) == 1 {
			close(xIn)
			g := goid()
			xOnAdvancer.Store(w.advancer.Load() == g && !w.pool.isWorker(g))
			<-xGo
			n := w.Stop()
			xOut <- result{n, aDone.Load()}
			xDone.Store(true)
			return
		}
		yAfterXStop.Store(xDone.Load())
		close(yIn)
		<-yGo
		yDone.Store(true)
	}
	for range 2 {
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
	}
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { defer close(advanced); clk.Advance(time.Millisecond) }()
	stopWait(t, xIn, "X to start on the advancer")

	type outsideResult struct {
		n          int
		a, q, x, y bool
	}
	first := make(chan outsideResult, 1)
	go func() {
		n := w.Stop()
		first <- outsideResult{n, aDone.Load(), qDone.Load(), xDone.Load(), yDone.Load()}
	}()
	stopUnderWay(t, w)
	close(xGo)
	r := stopWait(t, xOut, "X's Stop")
	require.Zero(t, r.n, "X's Stop came later")
	require.False(t, r.otherDone, "X's Stop waited for A, on the worker")
	stopWait(t, yIn, "Y to start after X")
	require.True(t, yAfterXStop.Load(), "Y, fired with X, started after X's Stop returned")
	close(aGo)
	r = stopWait(t, aOut, "A's Stop")
	require.Zero(t, r.n, "A's Stop came later")
	require.False(t, r.otherDone, "A's Stop waited for Y, on the advancer")
	select {
	case <-first:
		t.Fatal("the outside Stop returned while Y still ran")
	default:
	}
	close(yGo)
	o := stopWait(t, first, "the outside Stop")
	require.Equal(t, 1, o.n, "the outside Stop counts the hour-long timer")
	require.True(t, o.a && o.q && o.x && o.y, "the outside Stop returned before a callback: %+v", o)
	stopWait(t, advanced, "the Advance")
	require.True(t, xOnAdvancer.Load(), "X ran on the Advance's goroutine, not on a worker")
	requireStoppedBooks(t, w, 1)
	require.Equal(t, uint64(4), w.Stats().Fired)
}

// TestStopInsideWaitsForConcurrentDrop: a Stop from inside a callback while another Stop is still
// dropping the pending timers (held up by a Reset paused between its two steps) returns only once
// that drop is over: right after it, Len is 0, as after any Stop. It returns 0; the other Stop
// returns every timer that was pending.
func TestStopInsideWaitsForConcurrentDrop(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, err := New(WithWorkers(2), WithShards(1))
	require.NoError(t, err)
	const pending = 10
	for range pending {
		_, err := w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
	}
	held, err := w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	type result struct{ n, len int }
	started, release := make(chan struct{}), make(chan struct{})
	inside := make(chan result, 1)
	_, err = w.AfterFunc(0, func() {
		close(started)
		<-release
		n := w.Stop()
		inside <- result{n, w.Len()}
	})
	require.NoError(t, err)
	requireWithin(t, started, "the callback never started")
	finish := holdReset(t, held, 2*time.Hour) // the outside Stop's drop waits for this Reset
	outside := make(chan int, 1)
	go func() { outside <- w.Stop() }()
	waitUntil(t, "the outside Stop closes the wheel", w.closed.Load)
	close(release)
	// Let the inside Stop come while the drop still waits; the Reset then goes on by itself.
	time.AfterFunc(20*time.Millisecond, finish)
	got := <-inside
	require.Zero(t, got.len, "Len right after a Stop from inside a callback returned")
	require.Zero(t, got.n, "a later Stop returns 0")
	require.Equal(t, pending+1, <-outside, "the first Stop drops every pending timer")
	requireStoppedBooks(t, w, pending+1)
}

// TestStopInsideLeavesQueuedCallbacksToWorkers: with a manual clock, every worker runs a callback
// that calls Stop, and C, taken from the wheel, waits in the queue behind them. Each of those
// Stops returns at once, without running C or waiting for it (C has not run when the first of them
// returns); C runs once, after, on a worker, before a Stop from outside returns. The Stop that
// comes first counts the one pending timer: one from outside already under way, or the first
// callback's.
func TestStopInsideLeavesQueuedCallbacksToWorkers(t *testing.T) {
	for _, c := range []struct {
		workers      int
		outsideFirst bool
	}{{1, true}, {2, true}, {2, false}} {
		name := fmt.Sprintf("workers=%d", c.workers)
		if c.outsideFirst {
			name += "/outside-first"
		}
		t.Run(name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			clk := NewManualClock(time.Unix(0, 0))
			w, err := New(WithClock(clk), WithWorkers(c.workers), WithShards(1), WithQueueSize(4))
			require.NoError(t, err)
			require.Equal(t, 1, cap(w.pool.queue))

			var cRan atomic.Int32
			in := make(chan int, c.workers)
			goCh := make([]chan struct{}, c.workers)
			type result struct {
				n    int
				cRan int32
			}
			out := make([]chan result, c.workers)
			for i := range c.workers {
				goCh[i], out[i] = make(chan struct{}), make(chan result, 1)
			}
			var started atomic.Int32
			stopper := func() {
				i := int(started.Add(1)) - 1
				in <- i
				<-goCh[i]
				n := w.Stop()
				out[i] <- result{n, cRan.Load()}
			}
			for range c.workers { // one at a time: each goes to an idle worker
				_, err = w.AfterFunc(time.Millisecond, stopper)
				require.NoError(t, err)
				clk.Advance(time.Millisecond)
				stopWait(t, in, "a stopper to start")
			}
			_, err = w.AfterFunc(time.Millisecond, func() { cRan.Add(1) })
			require.NoError(t, err)
			clk.Advance(time.Millisecond) // every worker is busy: C waits in the queue
			require.Equal(t, 1, len(w.pool.queue), "C waits in the queue")
			_, err = w.AfterFunc(time.Hour, func() {})
			require.NoError(t, err)

			type outsideResult struct {
				n    int
				cRan int32
			}
			first := make(chan outsideResult, 1)
			if c.outsideFirst {
				go func() { n := w.Stop(); first <- outsideResult{n, cRan.Load()} }()
				stopUnderWay(t, w)
			}
			inside := 0
			for i := range c.workers {
				close(goCh[i])
				r := stopWait(t, out[i], "a stopper's Stop")
				inside += r.n
				if i == 0 {
					require.Zero(t, r.cRan, "the Stop ran C, queued behind every worker's callback")
				}
			}
			var o outsideResult
			if c.outsideFirst {
				o = stopWait(t, first, "the outside Stop")
				require.Zero(t, inside, "the callbacks' Stops came later")
			} else {
				o = outsideResult{w.Stop(), cRan.Load()}
				require.Zero(t, o.n)
				o.n = inside
			}
			require.Equal(t, 1, o.n, "the first Stop counts the hour-long timer")
			require.EqualValues(t, 1, o.cRan, "the outside Stop returned before C ran")
			requireStoppedBooks(t, w, 1)
			require.Equal(t, uint64(c.workers+1), w.Stats().Fired)
		})
	}
}

// TestStopOutsideWaitsForAdvancerCallbackAfterInsideStop: with WithWorkers(0), X and Y fire in one
// batch of an Advance and run on its goroutine. X calls Stop, which returns the count at once; Y,
// fired with X, runs after it. A Stop from outside, called while Y runs, returns 0 only once Y has
// returned and the Advance is over.
func TestStopOutsideWaitsForAdvancerCallbackAfterInsideStop(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)

	var n atomic.Int32
	firstRet := make(chan int, 1)
	yIn, yRelease := make(chan struct{}), make(chan struct{})
	var yDone atomic.Bool
	f := func() {
		if n.Add(1) == 1 {
			firstRet <- w.Stop()
			return
		}
		close(yIn)
		<-yRelease
		yDone.Store(true)
	}
	for range 2 {
		_, err = w.AfterFunc(time.Millisecond, f)
		require.NoError(t, err)
	}
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(advanced) }()
	stopWait(t, yIn, "Y to start on the advancer")
	require.Equal(t, 1, stopWait(t, firstRet, "X's Stop"))

	type result struct {
		n     int
		yDone bool
	}
	later := make(chan result, 1)
	go func() { n := w.Stop(); later <- result{n, yDone.Load()} }()
	select {
	case <-later:
		t.Fatal("a Stop from outside returned while Y, running when it was called, ran on")
	case <-time.After(20 * time.Millisecond): // let the outside Stop reach its wait
	}
	close(yRelease)
	r := stopWait(t, later, "the Stop from outside")
	require.Zero(t, r.n)
	require.True(t, r.yDone, "a Stop from outside returned while Y, running when it was called, ran on")
	stopWait(t, advanced, "the Advance")
	requireStoppedBooks(t, w, 1)
}

// TestStopOtherWheelFromCallbackWaitsForItsCallbacks: two wheels on one ManualClock. Wheel A has
// no workers (its callbacks run on the Advance caller); wheel B has one, running Y. A's callback X
// stops B: X is not one of B's callbacks, so for B its Stop is one from outside: it waits for Y
// to end and for B's worker to exit, returns B's pending count, and deadlocks nothing; A's
// Advance goes on, and A keeps firing.
func TestStopOtherWheelFromCallbackWaitsForItsCallbacks(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	clk := NewManualClock(time.Unix(0, 0))
	a, err := New(WithClock(clk), WithWorkers(0), WithShards(1))
	require.NoError(t, err)
	b, err := New(WithClock(clk), WithWorkers(1), WithShards(1))
	require.NoError(t, err)

	yIn := make(chan struct{})
	var yDone, yDoneAtX atomic.Bool
	_, err = b.AfterFunc(time.Millisecond, func() {
		close(yIn)
		time.Sleep(200 * time.Millisecond)
		yDone.Store(true)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	stopWait(t, yIn, "Y to start on B's worker")
	_, err = b.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	xRet := make(chan int, 1)
	var after atomic.Bool
	_, err = a.AfterFunc(time.Millisecond, func() {
		r := b.Stop()
		yDoneAtX.Store(yDone.Load())
		xRet <- r
	})
	require.NoError(t, err)
	_, err = a.AfterFunc(2*time.Millisecond, func() { after.Store(true) })
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(advanced) }()
	stopWait(t, advanced, "the Advance whose callback stops B")
	require.Equal(t, 1, stopWait(t, xRet, "X's Stop of B"))
	require.True(t, yDoneAtX.Load(), "B's Stop from A's callback returned before B's callback Y ended")
	require.True(t, isClosed(b.pool.done[0]), "B's Stop from A's callback returned before B's worker exited")
	clk.Advance(time.Millisecond)
	require.True(t, after.Load(), "A goes on")
	require.Zero(t, b.Stop())
	require.Zero(t, a.Stop())
	requireStoppedBooks(t, b, 1)
	requireStoppedBooks(t, a, 0)
}

// TestStopFromCallbackInSynctestBubble: on the system clock inside a testing/synctest bubble with
// two workers, B (due at 1 s) sleeps 10 s of the bubble's time on one worker; A (due at 2 s, run
// by the other) stops the wheel. A's Stop returns at once, with the one pending timer, while B
// still sleeps. A Stop from outside, called while B sleeps, returns only once B is done (the
// wheel's goroutines then block on channels only, so the bubble's time moves on to B's end);
// every worker has exited, and the books balance.
func TestStopFromCallbackInSynctestBubble(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithWorkers(2), WithShards(1))
		require.NoError(t, err)
		var bDone, bDoneAtA atomic.Bool
		var aRet atomic.Int64
		_, err = w.AfterFunc(time.Second, func() { time.Sleep(10 * time.Second); bDone.Store(true) })
		require.NoError(t, err)
		_, err = w.AfterFunc(2*time.Second, func() {
			aRet.Store(int64(w.Stop()))
			bDoneAtA.Store(bDone.Load())
		})
		require.NoError(t, err)
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		require.EqualValues(t, 1, aRet.Load(), "A's Stop counts the hour-long timer")
		require.False(t, bDoneAtA.Load(), "A's Stop waited for B, on the other worker")
		require.False(t, bDone.Load())
		require.Zero(t, w.Stop())
		require.True(t, bDone.Load(), "the outside Stop returned before B ended")
		requireWorkersExited(t, w)
		requireStoppedBooks(t, w, 1)
		require.Equal(t, uint64(2), w.Stats().Fired)
	})
}

// TestStopWorkerAndAdvancerCallbacksWaitForEachOther: with a manual clock, one worker, a queue of
// one task and CallerRuns, B runs on the worker, Q waits in the queue, and an Advance runs X on
// its own goroutine (no room in the queue). X stops the wheel and then waits for B's Stop to have
// returned; B, once the wheel is stopped, calls Stop and then waits for X's Stop to have returned.
// Neither Stop waits for the other callback, so both pass their waits: X's Stop counts the pending
// timer, B's returns 0, and Q runs once, after them, before a Stop from outside returns.
func TestStopWorkerAndAdvancerCallbacksWaitForEachOther(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1), WithFullPolicy(CallerRuns))
	require.NoError(t, err)
	bIn, xOut, bOut, bDone, xDone := make(chan struct{}), make(chan struct{}), make(chan struct{}),
		make(chan struct{}), make(chan struct{})
	var bSawX, xSawB, qRan, xOnAdvancer atomic.Bool
	var xRet, bRet atomic.Int64
	_, err = w.AfterFunc(time.Millisecond, func() { // B, on the worker
		defer close(bDone)
		close(bIn)
		for !w.closed.Load() {
			time.Sleep(50 * time.Microsecond)
		}
		bRet.Store(int64(w.Stop()))
		close(bOut)
		select {
		case <-xOut:
			bSawX.Store(true)
		case <-time.After(3 * time.Second):
		}
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	stopWait(t, bIn, "B to start on the worker")
	_, err = w.AfterFunc(time.Millisecond, func() { qRan.Store(true) }) // Q fills the queue
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, len(w.pool.queue), "Q waits in the queue")
	_, err = w.AfterFunc(time.Millisecond, func() { // X, on the advancer
		defer close(xDone)
		g := goid()
		xOnAdvancer.Store(!w.pool.isWorker(g) && w.advancer.Load() == g)
		xRet.Store(int64(w.Stop()))
		close(xOut)
		select {
		case <-bOut:
			xSawB.Store(true)
		case <-time.After(3 * time.Second):
		}
	})
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(advanced) }()
	stopWait(t, xDone, "X")
	stopWait(t, bDone, "B")
	stopWait(t, advanced, "the Advance")
	require.True(t, xOnAdvancer.Load(), "X ran on the Advance's goroutine, not on a worker")
	require.True(t, xSawB.Load(), "deadlock (3 s): X's Stop returned, and B's never did")
	require.True(t, bSawX.Load(), "deadlock (3 s): B's Stop returned, and X's never did")
	require.EqualValues(t, 1, xRet.Load())
	require.Zero(t, bRet.Load())
	require.Zero(t, w.Stop())
	require.True(t, qRan.Load(), "Q, queued before Stop, ran before the outside Stop returned")
	requireStoppedBooks(t, w, 1)
	require.Equal(t, uint64(3), w.Stats().Fired)
}

// TestStopInCallbackOfWorkersAdvance: a callback C1 on one worker calls ManualClock.Advance, which
// makes its worker the advancer: the queue being full (Z1, Z2), the callbacks of the round after
// (Y, then X) run on C1's goroutine. X calls Stop, which returns at once, as does the Stop of P, a
// callback on the other worker; P then waits for X's Stop to have returned, and C1, once its
// Advance returned, waits for P to have returned. Nothing deadlocks, whether X's Stop is the first
// (xFirst) or a Stop from outside, started by Y, is; nothing was pending, so every Stop returns 0;
// and the queued Z1 and Z2 run once, before a Stop from outside returns.
func TestStopInCallbackOfWorkersAdvance(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, xFirst := range []bool{false, true} {
		for range 3 {
			stopAdvanceOnWorkerRound(t, xFirst)
		}
	}
}

// stopAdvanceOnWorkerRound runs one round of TestStopInCallbackOfWorkersAdvance.
func stopAdvanceOnWorkerRound(t *testing.T, xFirst bool) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(2), WithShards(1), WithTick(time.Millisecond),
		WithQueueSize(2*maxTask))
	require.NoError(t, err)
	require.Equal(t, 2, cap(w.pool.queue))

	var (
		c1In, pIn   = make(chan struct{}), make(chan struct{})
		c1Out, pOut = make(chan struct{}), make(chan struct{})
		xOut        = make(chan struct{})
		released    = make(chan struct{}) // the test's Advance has let go of the clock
		first       = make(chan int, 1)
		c1SawP      atomic.Bool
		pSawX       atomic.Bool
		xOnWorker   atomic.Bool
		pRet, xRet  atomic.Int64
		zRan        atomic.Int32
		n           atomic.Int32
	)
	spin := func(cond func() bool) bool {
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(50 * time.Microsecond)
		}
		return true
	}
	// Z1, Z2 at 2 ms fill the queue; Y and X at 3 ms, one round: the first of them to run is Y.
	for range 2 {
		_, err = w.AfterFunc(2*time.Millisecond, func() { zRan.Add(1) })
		require.NoError(t, err)
	}
	for range 2 {
		_, err = w.AfterFunc(3*time.Millisecond, func() {
			if n.Add(1) == 1 { // Y
				if !xFirst {
					go func() { first <- w.Stop() }()
					spin(func() bool { return isClosed(w.stopped) })
				}
				return
			}
			defer close(xOut) // X
			g := goid()
			xOnWorker.Store(w.advancer.Load() == g && w.pool.isWorker(g))
			xRet.Store(int64(w.Stop()))
		})
		require.NoError(t, err)
	}
	// C1 and P at 1 ms, one on each worker.
	_, err = w.AfterFunc(time.Millisecond, func() { // C1
		close(c1In)
		defer close(c1Out)
		if !spin(func() bool { return isClosed(pIn) }) {
			return
		}
		<-released
		clk.Advance(2 * time.Millisecond) // to 3 ms, on this goroutine
		select {
		case <-pOut:
			c1SawP.Store(true)
		case <-time.After(3 * time.Second):
		}
	})
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Millisecond, func() { // P
		close(pIn)
		defer close(pOut)
		if !spin(func() bool { return isClosed(c1In) }) {
			return
		}
		spin(func() bool { return w.closed.Load() })
		pRet.Store(int64(w.Stop()))
		select { // this worker stays busy, so that X cannot run on it
		case <-xOut:
			pSawX.Store(true)
		case <-time.After(3 * time.Second):
		}
	})
	require.NoError(t, err)

	clk.Advance(time.Millisecond)
	close(released)
	stopWait(t, c1Out, "C1 to end")
	stopWait(t, pOut, "P to return")
	stopWait(t, xOut, "X's Stop to return")
	require.True(t, pSawX.Load(), "deadlock (3 s): P waited for X's Stop, which never returned")
	require.True(t, c1SawP.Load(), "deadlock (3 s): C1 waited for P, which never returned")
	if !xFirst {
		require.Zero(t, stopWait(t, first, "the Stop from outside, started by Y"))
	}
	require.Zero(t, w.Stop())
	require.True(t, xOnWorker.Load(), "X ran on C1's worker, the advancer")
	require.Zero(t, xRet.Load())
	require.Zero(t, pRet.Load())
	require.EqualValues(t, 2, zRan.Load(), "Z1 and Z2 ran once")
	requireStoppedBooks(t, w, 0)
	require.EqualValues(t, 6, w.Stats().Fired)
}

// TestStopInsideLeavesQueuedDeadlineContextToWorker: a deadline context's timer is a callback like
// any other. On a manual clock with one worker, K runs on the worker when the context's deadline
// fires: its end waits in the queue. A Stop from outside is under way (it dropped the one pending
// timer) when K calls Stop, which returns 0 at once, before the context's end runs (the context
// has not ended yet). That runs next, on the worker: the context ends with DeadlineExceeded before
// the outside Stop returns, which returns 1 (the deadline had fired before Stop: not counted).
func TestStopInsideLeavesQueuedDeadlineContextToWorker(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(4))
	require.NoError(t, err)

	kIn, kGo := make(chan struct{}), make(chan struct{})
	type result struct {
		n   int
		err error
	}
	kOut := make(chan result, 1)
	var ctxErr func() error
	_, err = w.AfterFunc(time.Millisecond, func() { // K, on the only worker
		close(kIn)
		<-kGo
		n := w.Stop()
		kOut <- result{n, ctxErr()}
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	stopWait(t, kIn, "K to start")
	ctx, cancel := w.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	ctxErr = ctx.Err
	clk.Advance(time.Millisecond) // the deadline fires: the context's end waits in the queue
	require.Equal(t, 1, len(w.pool.queue), "the context's end waits in the queue")
	require.NoError(t, ctx.Err(), "the context ended before its timer's callback ran")
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)

	type outsideResult struct {
		n   int
		err error
	}
	first := make(chan outsideResult, 1)
	go func() { n := w.Stop(); first <- outsideResult{n, ctx.Err()} }()
	stopUnderWay(t, w)
	close(kGo)
	r := stopWait(t, kOut, "K's Stop")
	require.Zero(t, r.n, "K's Stop came later")
	require.NoError(t, r.err, "K's Stop ran the context's end, queued behind K on the only worker")
	o := stopWait(t, first, "the outside Stop")
	require.Equal(t, 1, o.n)
	require.ErrorIs(t, o.err, context.DeadlineExceeded, "the outside Stop returned before the context's end ran")
	stopWait(t, ctx.Done(), "the context's end")
	requireStoppedBooks(t, w, 1)
	require.Equal(t, uint64(2), w.Stats().Fired)
}

// TestStopEveryRunThatStopsCountsNextRunOnce: an Every's run stops its own Timer and the wheel, in
// either order, or the wheel is stopped from outside while the run is in progress and the run then
// calls both; then the run may end in runtime.Goexit. On workers and on the manual advancer
// (WithWorkers(0)), the series' next run ends exactly one way: Timer.Stop first reports true and
// counts it as stopped (Wheel.Stop then counts only the pending timer); a Wheel.Stop first counts
// it as dropped, and Timer.Stop then reports false. Reset of a series whose run is in progress
// reports false; a later Stop returns 0; what the Stops return is Stats.Dropped; a Stop from
// outside returns once the run (and its goroutine) has ended; the books balance.
func TestStopEveryRunThatStopsCountsNextRunOnce(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, workers := range []int{2, 0} {
		for _, order := range []string{"timer-then-wheel", "wheel-then-timer", "outside-first"} {
			for _, goexit := range []bool{false, true} {
				t.Run(fmt.Sprintf("workers=%d/%s/goexit=%v", workers, order, goexit), func(t *testing.T) {
					stopEveryRunThatStops(t, workers, order, goexit)
				})
			}
		}
	}
}

// stopEveryRunThatStops runs one case of TestStopEveryRunThatStopsCountsNextRunOnce.
func stopEveryRunThatStops(t *testing.T, workers int, order string, goexit bool) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(workers), WithShards(1))
	require.NoError(t, err)
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	in, done := make(chan struct{}), make(chan struct{})
	var tm Timer
	var tmStop, reset atomic.Bool
	var ret atomic.Int64
	var runs atomic.Int32
	tm, err = w.Every(time.Millisecond, func() {
		if runs.Add(1) != 1 {
			return
		}
		defer close(done)
		close(in)
		if order == "outside-first" {
			for !isClosed(w.stopped) {
				time.Sleep(50 * time.Microsecond)
			}
		}
		reset.Store(tm.Reset(time.Millisecond))
		if order == "timer-then-wheel" {
			tmStop.Store(tm.Stop())
			ret.Store(int64(w.Stop()))
		} else {
			ret.Store(int64(w.Stop()))
			tmStop.Store(tm.Stop())
		}
		if goexit {
			runtime.Goexit()
		}
	})
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { defer close(advanced); clk.Advance(time.Millisecond) }()
	stopWait(t, in, "the Every's run")
	outside := make(chan int, 1)
	if order == "outside-first" {
		go func() { outside <- w.Stop() }()
	}
	stopWait(t, done, "the Every's f")
	if order != "outside-first" {
		go func() { outside <- w.Stop() }()
	}
	got := stopWait(t, outside, "the outside Stop")
	stopWait(t, advanced, "the Advance")
	require.Zero(t, w.Stop())
	require.False(t, reset.Load(), "Reset of a series whose run is in progress")
	require.EqualValues(t, 1, runs.Load())
	st := w.Stats()
	switch order {
	case "timer-then-wheel":
		require.True(t, tmStop.Load(), "Timer.Stop came first: it prevents the next run")
		require.EqualValues(t, 1, ret.Load(), "the run's Stop counts the hour-long timer only")
		require.Zero(t, got)
		require.Equal(t, uint64(1), st.Stopped)
	case "wheel-then-timer":
		require.False(t, tmStop.Load(), "Wheel.Stop counted the next run first")
		require.EqualValues(t, 2, ret.Load(), "the hour-long timer and the series' next run")
		require.Zero(t, got)
		require.Zero(t, st.Stopped)
	default:
		require.False(t, tmStop.Load(), "the outside Stop counted the next run first")
		require.Zero(t, ret.Load(), "the run's Stop came later")
		require.Equal(t, 2, got, "the hour-long timer and the series' next run")
		require.Zero(t, st.Stopped)
	}
	requireStoppedBooks(t, w, int(ret.Load())+got)
}
