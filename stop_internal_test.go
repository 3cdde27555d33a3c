package shardwheel

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestReview22WheelStopDropsCasc: Wheel.Stop while a cascade is in progress drops (and counts)
// the timers in casc: it returns every timer that never ran.
func TestReview22WheelStopDropsCasc(t *testing.T) {
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

// TestReview26StopInsideEveryCountsNextRun: Wheel.Stop called from an Every's own callback
// returns n, the timers it dropped from the shards; the series' next run (counted in Scheduled
// when the run began, so pending in Len during the run) is dropped after Stop returned, when
// runPeriodic's re-arm finds the ring closed (every.go:113-118), and lands in Stats.Dropped only.
// Stats.Dropped is documented as "the sum of what Stop returned" and the exactly-once rule says
// every accepted timer is counted in what Stop returned if it neither ran nor was stopped.
// A Stop from outside the callback counts that same run (shardwheel.go:382).
func TestReview26StopInsideEveryCountsNextRun(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(1), WithTick(time.Millisecond))
	require.NoError(t, err)
	got, runs := -1, 0
	var pendingInRun int
	_, err = w.Every(time.Millisecond, func() {
		runs++
		pendingInRun = w.Len()
		got = w.Stop()
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, runs)
	require.Equal(t, 1, pendingInRun, "during the run, the next run is pending")
	require.Zero(t, w.Stop())
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	require.EqualValues(t, st.Dropped, got,
		"Wheel.Stop from inside the Every returned %d, but the series' next run was pending and was dropped (Stats %+v)", got, st)
}

// The same on the system clock: the callback runs on a worker, Stop (shardwheel.go:383) reads
// w.dropped before its own callback returns and runPeriodic counts the dropped next run.
func TestReview26StopInsideEveryCountsNextRunSystem(t *testing.T) {
	w, err := New(WithWorkers(1), WithShards(1))
	require.NoError(t, err)
	got := make(chan int, 1)
	var once sync.Once
	_, err = w.Every(time.Millisecond, func() { once.Do(func() { got <- w.Stop() }) })
	require.NoError(t, err)
	var n int
	select {
	case n = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the Every never ran")
	}
	w.Stop() // waits for the first Stop, which finished on the worker
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	require.EqualValues(t, st.Dropped, n, "Wheel.Stop's return misses the Every's dropped next run (Stats %+v)", st)
}

// TestReview26LenAfterStopInsideCallback: API.md says "After Stop ... Len is 0". Called from a
// callback that the manual advancer runs (WithWorkers(0)), Stop returns before finishStop closes
// w.stopped (shardwheel.go:377-379), so Stats (shardwheel.go:311) does not force Pending to 0,
// and a timer that fired with this one and has not started yet still counts as pending: Len is
// 1 right after Stop returned. (On a worker, finishStop closes stopped before Stop returns.)
func TestReview26LenAfterStopInsideCallback(t *testing.T) {
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

// TestReview26StopCountsEndOfTimeSeries: an Every whose run came at the end of a manual clock's
// time ends there and counts its next run as dropped (every.go:85-93), so Len is 0 and the
// handle's Stop reports false. A later Wheel.Stop, which drops nothing, still returns 1: it
// returns w.dropped.Value() (shardwheel.go:383), the wheel's total, not "how many timers were
// pending" (API.md). On the advancer path (Stop from a callback) it returns n instead
// (shardwheel.go:379): the two paths disagree.
func TestReview26StopCountsEndOfTimeSeries(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(1), WithTick(time.Millisecond))
	require.NoError(t, err)
	runs := 0
	ev, err := w.Every(time.Hour, func() { runs++ })
	require.NoError(t, err)
	clk.Advance(time.Duration(1<<63 - 1))
	require.Equal(t, 1, runs)
	require.Zero(t, w.Len(), "the series ended at the end of time")
	require.False(t, ev.Stop())
	require.Zero(t, w.Stop(), "nothing was pending at Wheel.Stop")
}

// TestReview26WheelStopUnderLoad races Wheel.Stop (from outside any callback) with arms,
// Resets, Stops, Every series (some slow, some panicking) and Keyed Sets/Moves/Removes on the
// system clock (a pin): every accepted timer ends exactly once (Scheduled == Fired + Stopped +
// what Stop returned), no callback starts after Stop returned, calls after Stop report ErrClosed
// or false, and Len is 0.
func TestReview26WheelStopUnderLoad(t *testing.T) {
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
								panic("review26")
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
	review28Balance(t, w, 0)
}

// TestReview28StopDropsRunsOfBothSlots (pin): an Every A runs on the only worker; its f calls
// Advance, which makes the worker the advancer, and the queue being full, a second Every B runs
// on it too, in the shared slot (dispatch, CallerRuns). B's f stops the wheel. Both series have
// a run in progress on Stop's own goroutine, in two slots: dropOwnRuns (shardwheel.go:390-406)
// drops the next run of each, so Stop returns them with the three pending timers, that is
// Stats.Dropped, and the books balance.
func TestReview28StopDropsRunsOfBothSlots(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(1), WithWorkers(1), WithQueueSize(1), WithFullPolicy(CallerRuns))
	require.NoError(t, err)
	defer w.Stop()
	for range 3 {
		_, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
		require.NoError(t, err)
	}
	goOn := make(chan struct{})
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
			got = w.Stop()
		}); err != nil {
			panic(err)
		}
		clock.Advance(time.Millisecond) // B is due: it runs here
	})
	require.NoError(t, err)
	clock.Advance(10 * time.Millisecond)
	close(goOn)
	<-aDone
	require.Eventually(t, func() bool { return yRan.Load() == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 1, aRuns)
	require.Equal(t, 1, bRuns)
	require.Equal(t, 5, got, "three pending, and the next run of A and of B")
	require.Zero(t, w.Stop())
	review28Balance(t, w, got)
}

// TestReview28EveryRunAfterStopUncounted (pin): an Every's run fired before Stop and waiting in
// the queue starts once Stop has begun, on the other worker, which Stop waits for. It runs (it
// was handed to the pool), and its next run, which was never pending, is not in what Stop returns
// (runPeriodic, every.go:87-89): Stop returns the two pending timers, which is Stats.Dropped.
func TestReview28EveryRunAfterStopUncounted(t *testing.T) {
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
	require.Equal(t, int32(1), eRuns.Load(), "the queued run ran before Stop returned")
	require.Equal(t, 2, got)
	require.False(t, e.Stop())
	review28Balance(t, w, got)
}

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

// TestReview33PinConcurrentStops: Stop from many goroutines at once: one returns how many were
// pending, the others 0, each only once the wheel is stopped (its workers gone, Len 0).
func TestReview33PinConcurrentStops(t *testing.T) {
	w, err := New(WithWorkers(2), WithShards(2))
	require.NoError(t, err)
	for i := 0; i < 50; i++ {
		_, err := w.AfterFunc(time.Hour, func() {})
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
		}()
	}
	wg.Wait()
	total, nonzero := 0, 0
	for _, n := range res {
		total += n
		if n != 0 {
			nonzero++
		}
	}
	require.Equal(t, 50, total, "%v", res)
	require.Equal(t, 1, nonzero, "%v", res)
	_, err = w.Every(time.Second, func() {})
	require.True(t, errors.Is(err, ErrClosed))
}

// TestReview38PinStopFromCallbackThenStopBatchOnWorkers: Timer.Stop's new doc (timer.go:160-162)
// on the system clock with workers: a batch of 20 timers due together, shared between the keeper
// and an idle worker (offerFired); the first callback to start stops the wheel and then stops
// every other timer of the batch, plus one far timer. Each timer ends exactly one way: ran, or
// its Stop reported true (those still firing on the Stop caller's goroutine, which never run), or
// counted in Wheel.Stop (the far one only: a fired timer is no longer pending); and the books
// balance (Scheduled == Fired + Stopped + Dropped, Lateness.Count() == Fired).
func TestReview38PinStopFromCallbackThenStopBatchOnWorkers(t *testing.T) {
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
