package shardwheel_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Concurrency faults. Each test accounts for every accepted timer exactly once: its callback ran
// once, or one Stop reported true, or it was counted in what Wheel.Stop returned; and it
// cross-checks with Stats at the end (Scheduled == Fired + Stopped + Dropped). Waits are for
// behaviour (a count reached), with a generous cap only so that a lost timer fails instead of
// hanging; no test asserts how long anything took.

const fltPatience = 60 * time.Second // a liveness cap, not a performance threshold

// fltBook records what happened to each timer of a test, by id.
type fltBook struct {
	runs    []atomic.Int32
	stopped []atomic.Int32
}

func newFltBook(n int) *fltBook {
	return &fltBook{runs: make([]atomic.Int32, n), stopped: make([]atomic.Int32, n)}
}

func (b *fltBook) ran(id int)  { b.runs[id].Add(1) }
func (b *fltBook) stop(id int) { b.stopped[id].Add(1) }

// totals returns how many timers ran and how many were stopped, among ids below n.
func (b *fltBook) totals(n int) (ran, stopped int) {
	for i := 0; i < n; i++ {
		ran += int(b.runs[i].Load())
		stopped += int(b.stopped[i].Load())
	}
	return
}

// check requires that each of the first n ids ended at most once, and that those that ended
// neither way number exactly dropped.
func (b *fltBook) check(t testing.TB, n, dropped int) {
	t.Helper()
	neither := 0
	for i := 0; i < n; i++ {
		r, s := b.runs[i].Load(), b.stopped[i].Load()
		require.LessOrEqual(t, r+s, int32(1), "timer %d: ran %d times, stopped %d times", i, r, s)
		if r+s == 0 {
			neither++
		}
	}
	require.Equal(t, dropped, neither, "timers that neither ran nor were stopped, against Wheel.Stop's count")
}

// fltWaitQuiet waits until every accepted timer of w has fired or been stopped.
func fltWaitQuiet(t testing.TB, w *sw.Wheel, want func() bool) {
	t.Helper()
	require.Eventually(t, want, fltPatience, time.Millisecond, "timers lost: %+v", w.Stats())
}

// fltBalance checks the counters once the wheel is stopped.
func fltBalance(t testing.TB, w *sw.Wheel, scheduled, fired, stopped, dropped int) {
	t.Helper()
	st := w.Stats()
	assert.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	assert.Equal(t, uint64(scheduled), st.Scheduled, "%+v", st)
	assert.Equal(t, uint64(fired), st.Fired, "%+v", st)
	assert.Equal(t, uint64(stopped), st.Stopped, "%+v", st)
	assert.Equal(t, uint64(dropped), st.Dropped, "%+v", st)
	assert.Equal(t, 0, st.Pending)
}

// fltGoid returns the calling goroutine's id, to tell which goroutine ran a callback.
func fltGoid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = b[len("goroutine "):]
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	id, _ := strconv.ParseInt(string(b[:i]), 10, 64)
	return id
}

// TestFaultPanickingCallbacks: most callbacks panic (with a string, an error, nil); each panic is
// counted once, reaches the custom handler once, and the workers go on running the rest.
func TestFaultPanickingCallbacks(t *testing.T) {
	for _, workers := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			n := 4000
			if testing.Short() {
				n = 1000
			}
			var handled atomic.Int64
			clock := sw.NewManualClock(time.Unix(0, 0))
			opts := []sw.Option{sw.WithWorkers(workers), sw.WithPanicHandler(func(r any) { handled.Add(1) })}
			if workers == 0 {
				opts = append(opts, sw.WithClock(clock))
			}
			w, err := sw.New(opts...)
			require.NoError(t, err)
			defer w.Stop()
			book := newFltBook(n + 1)
			wantPanics := 0
			for i := 0; i < n; i++ {
				var f func()
				switch i % 4 {
				case 0:
					f = func() { book.ran(i); panic("boom " + strconv.Itoa(i)) }
				case 1:
					f = func() { book.ran(i); panic(errors.New("an error")) }
				case 2:
					f = func() { book.ran(i); panic(nil) } // recovered as *runtime.PanicNilError
				default:
					f = func() { book.ran(i) }
				}
				if i%4 != 3 {
					wantPanics++
				}
				_, err := w.AfterFunc(time.Duration(i%50)*20*time.Microsecond, f)
				require.NoError(t, err)
			}
			clock.Advance(time.Millisecond) // no-op unless the wheel is on the manual clock
			fltWaitQuiet(t, w, func() bool { r, _ := book.totals(n); return r == n })
			// The pool still works after all that: one more timer fires.
			done := make(chan struct{})
			_, err = w.AfterFunc(0, func() { book.ran(n); close(done) })
			require.NoError(t, err)
			clock.Advance(0)
			<-done
			require.Eventually(t, func() bool { return handled.Load() == int64(wantPanics) }, fltPatience, time.Millisecond)
			require.Equal(t, 0, w.Stop())
			book.check(t, n+1, 0)
			require.Equal(t, int64(wantPanics), handled.Load())
			require.Equal(t, uint64(wantPanics), w.Stats().Panics)
			fltBalance(t, w, n+1, n+1, 0, 0)
		})
	}
}

// TestFaultBlockingCallbacksFullQueue: callbacks block until the worker queue is full. Under
// Block, Advance cannot return while the queue is full (it waits for room, losing nothing); under
// CallerRuns, the dispatching goroutine runs callbacks itself. Both run every callback once.
func TestFaultBlockingCallbacksFullQueue(t *testing.T) {
	for _, policy := range []sw.FullPolicy{sw.Block, sw.CallerRuns} {
		for _, workers := range []int{1, 2} {
			t.Run(fmt.Sprintf("%v/workers=%d", policy, workers), func(t *testing.T) {
				clock := sw.NewManualClock(time.Unix(0, 0))
				w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(workers), sw.WithQueueSize(4),
					sw.WithFullPolicy(policy), sw.WithShards(2))
				require.NoError(t, err)
				defer w.Stop()
				const n = 200
				book := newFltBook(n)
				gate := make(chan struct{})
				var started, onCaller atomic.Int64
				var caller atomic.Int64
				for i := 0; i < n; i++ {
					_, err := w.AfterFunc(time.Duration(i%3)*time.Millisecond/2, func() {
						started.Add(1)
						if fltGoid() == caller.Load() {
							onCaller.Add(1)
						}
						<-gate
						book.ran(i)
					})
					require.NoError(t, err)
				}
				advanced := make(chan struct{})
				go func() {
					caller.Store(fltGoid())
					clock.Advance(time.Millisecond)
					close(advanced)
				}()
				if policy == sw.Block {
					// Every worker is stuck in a callback and the queue cannot take the rest of
					// 200 callbacks: Advance waits for room.
					require.Eventually(t, func() bool { return started.Load() == int64(workers) }, fltPatience, time.Millisecond)
					select {
					case <-advanced:
						t.Fatal("Advance returned while every worker was blocked and the queue full: callbacks lost or run elsewhere")
					default:
					}
				} else {
					// The queue filled, so Advance's goroutine ran a callback itself.
					require.Eventually(t, func() bool { return onCaller.Load() > 0 }, fltPatience, time.Millisecond)
				}
				close(gate)
				<-advanced
				fltWaitQuiet(t, w, func() bool { r, _ := book.totals(n); return r == n })
				require.Equal(t, 0, w.Stop())
				book.check(t, n, 0)
				fltBalance(t, w, n, n, 0, 0)
				t.Logf("callbacks run by the Advance goroutine: %d", onCaller.Load())
			})
		}
	}
}

// TestFaultSlowCallbacksSystemClock: on the system clock, a tiny queue and slow callbacks keep the
// queue full while producers schedule and stop; nothing is lost under either policy.
func TestFaultSlowCallbacksSystemClock(t *testing.T) {
	for _, policy := range []sw.FullPolicy{sw.Block, sw.CallerRuns} {
		t.Run(policy.String(), func(t *testing.T) {
			w, err := sw.New(sw.WithWorkers(1), sw.WithQueueSize(2), sw.WithFullPolicy(policy))
			require.NoError(t, err)
			defer w.Stop()
			n := 4000
			if testing.Short() {
				n = 1000
			}
			book := newFltBook(n)
			var wg sync.WaitGroup
			var stoppedTrue atomic.Int64
			for g := 0; g < 2; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 9))
					for i := g; i < n; i += 2 {
						tm, err := w.AfterFunc(time.Duration(rng.IntN(2000))*time.Microsecond, func() {
							fltSpin(20 * time.Microsecond)
							book.ran(i)
						})
						if !assert.NoError(t, err) {
							return
						}
						if rng.IntN(4) == 0 && tm.Stop() {
							book.stop(i)
							stoppedTrue.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			fltWaitQuiet(t, w, func() bool { r, s := book.totals(n); return r+s == n })
			require.Equal(t, 0, w.Stop())
			book.check(t, n, 0)
			s := int(stoppedTrue.Load())
			fltBalance(t, w, n, n-s, s, 0)
		})
	}
}

// fltSpin burns about d of CPU without sleeping (a sleep is much longer than 20µs on most kernels).
func fltSpin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// TestFaultTinyRing: a ring of 2 commands per shard and many producers, so that producers find
// the ring full nearly every time and drain it themselves; schedules, stops and resets all arrive.
func TestFaultTinyRing(t *testing.T) {
	for _, shards := range []int{1, 2} {
		for _, manual := range []bool{false, true} {
			t.Run(fmt.Sprintf("shards=%d/manual=%v", shards, manual), func(t *testing.T) {
				clock := sw.NewManualClock(time.Unix(0, 0))
				opts := []sw.Option{sw.WithRingSize(2), sw.WithShards(shards), sw.WithWorkers(2)}
				if manual {
					opts = append(opts, sw.WithClock(clock))
				}
				w, err := sw.New(opts...)
				require.NoError(t, err)
				defer w.Stop()
				producers, per := 8, 1500
				if testing.Short() {
					per = 400
				}
				n := producers * per
				book := newFltBook(n)
				var stoppedTrue atomic.Int64
				var wg sync.WaitGroup
				for g := 0; g < producers; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(uint64(g), 1))
						var prev sw.Timer
						prevID := -1
						for k := 0; k < per; k++ {
							id := g*per + k
							tm, err := w.AfterFuncArg(time.Duration(rng.IntN(3000))*time.Microsecond,
								func(a any) { book.ran(a.(int)) }, id)
							if !assert.NoError(t, err) {
								return
							}
							switch rng.IntN(6) {
							case 0:
								if tm.Stop() {
									book.stop(id)
									stoppedTrue.Add(1)
								}
							case 1:
								tm.Reset(time.Duration(rng.IntN(2000)) * time.Microsecond)
							case 2:
								if prevID >= 0 && prev.Stop() { // possibly already fired: then false
									book.stop(prevID)
									stoppedTrue.Add(1)
								}
							}
							prev, prevID = tm, id
						}
					}()
				}
				wg.Wait()
				if manual {
					clock.Advance(time.Second)
				}
				fltWaitQuiet(t, w, func() bool { r, s := book.totals(n); return r+s == n })
				require.Equal(t, 0, w.Stop())
				book.check(t, n, 0)
				s := int(stoppedTrue.Load())
				fltBalance(t, w, n, n-s, s, 0)
			})
		}
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
			// The rest of the stopper's batch (and, with one worker, chunks queued behind it) may
			// still run after its callback returns; wait for them, then account for everyone.
			fltWaitQuiet(t, w, func() bool { ran, _ := book.totals(n); return ran+r.n == scheduled })
			require.Equal(t, 0, w.Stop())
			book.check(t, n, r.n)
			ran, _ := book.totals(n)
			fltBalance(t, w, scheduled, ran, 0, r.n)
		})
	}
}

// TestFaultCallbackTouchesTimers: from inside a callback, Stop and Reset of its own timer report
// false (it has started) and do nothing; Stop and Reset of another pending timer work; new timers
// can be scheduled (a chain); an Every can stop itself, and then runs no more.
func TestFaultCallbackTouchesTimers(t *testing.T) {
	for _, workers := range []int{0, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			clock := sw.NewManualClock(time.Unix(0, 0))
			w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(workers), sw.WithShards(2))
			require.NoError(t, err)
			defer w.Stop()
			tick := time.Millisecond
			var mu sync.Mutex
			var events []string
			note := func(s string) { mu.Lock(); events = append(events, s); mu.Unlock() }

			ready := make(chan struct{})
			var self, victim, moved sw.Timer
			var victimRan, movedRan atomic.Int32
			self, err = w.AfterFunc(tick, func() {
				<-ready
				note(fmt.Sprintf("self.Stop=%v self.Reset=%v victim.Stop=%v moved.Reset=%v",
					self.Stop(), self.Reset(tick), victim.Stop(), moved.Reset(0)))
			})
			require.NoError(t, err)
			victim, err = w.AfterFunc(5*tick, func() { victimRan.Add(1) })
			require.NoError(t, err)
			moved, err = w.AfterFunc(time.Hour, func() { movedRan.Add(1) })
			require.NoError(t, err)

			// A chain: each link schedules the next, one tick later.
			const links = 100
			var chain, armedLinks atomic.Int32
			var link func()
			link = func() {
				if chain.Add(1) < links {
					_, err := w.AfterFunc(tick, link)
					assert.NoError(t, err)
					armedLinks.Add(1)
				}
			}
			_, err = w.AfterFunc(tick, link)
			require.NoError(t, err)
			armedLinks.Add(1)

			// An Every that stops itself on its third run.
			var every sw.Timer
			var everyRuns atomic.Int32
			every, err = w.Every(tick, func() {
				<-ready
				if everyRuns.Add(1) == 3 {
					note(fmt.Sprintf("every.Stop=%v", every.Stop()))
				}
			})
			require.NoError(t, err)
			close(ready)

			// Walk the clock tick by tick; before each step, wait until the last link ran and armed
			// the next (with workers it runs asynchronously), so that each step fires one link.
			for i := 0; chain.Load() < links; i++ {
				require.Eventually(t, func() bool { return armedLinks.Load() == chain.Load()+1 || chain.Load() == links },
					fltPatience, 50*time.Microsecond)
				clock.Advance(tick)
				if i == 0 { // the self callback ran at the first tick, before the victim's (5th)
					require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(events) > 0 }, fltPatience, time.Millisecond)
				}
			}
			require.Eventually(t, func() bool {
				clock.Advance(tick)
				return chain.Load() == links && movedRan.Load() == 1 && everyRuns.Load() == 3
			}, fltPatience, time.Millisecond)
			clock.Advance(10 * tick) // the Every stays stopped
			time.Sleep(time.Millisecond)
			mu.Lock()
			require.Contains(t, events, "self.Stop=false self.Reset=false victim.Stop=true moved.Reset=true")
			require.Contains(t, events, "every.Stop=true")
			mu.Unlock()
			require.Equal(t, int32(0), victimRan.Load())
			require.Equal(t, int32(3), everyRuns.Load())
			require.Equal(t, 0, w.Stop())
			st := w.Stats()
			require.Equal(t, st.Scheduled, st.Fired+st.Stopped, "%+v", st)
			require.Equal(t, uint64(2), st.Stopped, "%+v", st)
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

// TestFaultStaleResetRacesReuse: a Reset of a timer that is firing at that very moment must not
// touch the timer that reuses its pooled entry. Producers arm a timer due at once and Reset it
// (a stale handle as soon as it fires), while they keep arming timers an hour out; an hour timer
// that fires, or whose Stop reports false, was corrupted by a stale Reset.
func TestFaultStaleResetRacesReuse(t *testing.T) {
	w, err := sw.New(sw.WithWorkers(2), sw.WithShards(2))
	require.NoError(t, err)
	defer w.Stop()
	iters := 100_000
	if raceEnabled || testing.Short() {
		iters = 20_000
	}
	var hourFired, hourStopFalse atomic.Int64
	hourCB := func(any) { hourFired.Add(1) }
	nowCB := func(any) {}
	var wg sync.WaitGroup
	const producers = 8
	for g := 0; g < producers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hours := make([]sw.Timer, 0, 64)
			for i := 0; i < iters/producers; i++ {
				a, err := w.AfterFuncArg(0, nowCB, nil)
				if !assert.NoError(t, err) {
					return
				}
				// Re-arm it until it fires: the last Reset races with the firing, and the entry
				// goes back to the pool for the next timer (often the hour timer below).
				for k := 0; k < 20 && a.Reset(0); k++ {
				}
				h, err := w.AfterFuncArg(time.Hour, hourCB, nil)
				if !assert.NoError(t, err) {
					return
				}
				hours = append(hours, h)
				if len(hours) == cap(hours) {
					for _, h := range hours {
						if !h.Stop() {
							hourStopFalse.Add(1)
						}
					}
					hours = hours[:0]
				}
			}
			for _, h := range hours {
				if !h.Stop() {
					hourStopFalse.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.Zero(t, hourFired.Load(), "timers armed an hour out fired within the test")
	require.Zero(t, hourStopFalse.Load(), "Stop of a pending hour-out timer reported false")
	fltWaitQuiet(t, w, func() bool { return w.Len() == 0 }) // the timers due at once
	require.Equal(t, 0, w.Stop())
	require.Zero(t, hourFired.Load())
}
