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

// TestFullQueue blocks one of two workers, with a queue of one callback, under both policies:
// the other worker keeps time and runs what the queue has no room for, so every other callback
// runs while the first is stuck, and every callback runs once.
func TestFullQueue(t *testing.T) {
	for _, policy := range []sw.FullPolicy{sw.Block, sw.CallerRuns} {
		t.Run(policy.String(), func(t *testing.T) {
			w, err := sw.New(sw.WithWorkers(2), sw.WithQueueSize(1), sw.WithFullPolicy(policy))
			require.NoError(t, err)
			var ran atomic.Int64
			started, release := armStuck(t, w, 0, func() { ran.Add(1) })
			<-started
			const n = 200
			var wg sync.WaitGroup
			wg.Add(n)
			for i := 0; i < n; i++ {
				_, err := w.AfterFunc(time.Duration(i%5)*time.Millisecond, func() { ran.Add(1); wg.Done() })
				require.NoError(t, err)
			}
			// The free worker runs what does not fit while the other is stuck; at most the one
			// callback the queue holds could wait for the stuck one.
			for ran.Load() < n-1 {
				time.Sleep(time.Millisecond)
			}
			close(release)
			wg.Wait()
			require.Zero(t, w.Stop())
			require.EqualValues(t, n+1, ran.Load())
			requireBalance(t, w)
		})
	}
}

// TestPanickingCallback: a panicking callback is recovered and handed to the panic handler, counted
// in Stats.Panics and as fired; the wheel keeps working and runs the next callback.
func TestPanickingCallback(t *testing.T) {
	var got []any
	var mu sync.Mutex
	w, clk := manualWheel(t, sw.WithPanicHandler(func(r any) { mu.Lock(); got = append(got, r); mu.Unlock() }))
	var ran atomic.Int32
	_, err := w.AfterFunc(time.Millisecond, func() { panic("boom") })
	require.NoError(t, err)
	_, err = w.AfterFunc(2*time.Millisecond, func() { ran.Add(1) })
	require.NoError(t, err)
	clk.Advance(time.Second)
	require.Equal(t, []any{"boom"}, got)
	require.EqualValues(t, 1, ran.Load(), "the wheel keeps working after a panic")
	require.Equal(t, uint64(1), w.Stats().Panics)
	require.Equal(t, uint64(2), w.Stats().Fired)
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

// TestFaultGoexitCallbacks: on the system clock, every fifth callback calls runtime.Goexit. Every
// callback runs once, the wheel still fires a timer afterwards, it runs as many worker goroutines
// as before, and Stop accounts for everything.
func TestFaultGoexitCallbacks(t *testing.T) {
	for _, workers := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			w, err := sw.New(sw.WithWorkers(workers))
			require.NoError(t, err)
			defer w.Stop()
			want := max(workers, 1) // WithWorkers(0) on the system clock: one, which keeps time
			require.Eventually(t, func() bool { return sw.WorkerGoroutines(w) == want }, fltPatience, time.Millisecond)

			const n = 400
			book := newFltBook(n + 1)
			for i := range n {
				// Many share a deadline, so a batch holds several Goexits and the callbacks after them.
				_, err := w.AfterFunc(time.Duration(i%20)*100*time.Microsecond, func() {
					book.ran(i)
					if i%5 == 0 {
						runtime.Goexit()
					}
				})
				require.NoError(t, err)
			}
			fltWaitQuiet(t, w, func() bool { r, _ := book.totals(n); return r == n })

			done := make(chan struct{})
			_, err = w.AfterFunc(time.Millisecond, func() { book.ran(n); close(done) })
			require.NoError(t, err)
			select {
			case <-done:
			case <-time.After(fltPatience):
				t.Fatalf("the wheel stopped keeping time after its callbacks called runtime.Goexit: %+v", w.Stats())
			}
			require.Eventually(t, func() bool { return sw.WorkerGoroutines(w) == want }, fltPatience, time.Millisecond,
				"worker goroutines: want %d", want)

			require.Equal(t, 0, w.Stop())
			book.check(t, n+1, 0)
			fltBalance(t, w, n+1, n+1, 0, 0)
		})
	}
}

// TestFaultGoexitInAdvance: with a manual clock and WithWorkers(0), a callback that calls
// runtime.Goexit ends the goroutine that called Advance, as a Goexit anywhere in it would. The
// callbacks of that batch still run, once, on it, before it ends; the next Advance, from another
// goroutine, does not wait for the first and fires what is due then, and nothing runs twice.
func TestFaultGoexitInAdvance(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithWorkers(0), sw.WithClock(clock))
	require.NoError(t, err)
	defer w.Stop()
	const n = 10
	book := newFltBook(n + 1)
	var advancer atomic.Int64
	var elsewhere atomic.Int32 // callbacks that ran on another goroutine than the advancer
	for i := range n {
		_, err := w.AfterFunc(time.Millisecond, func() {
			book.ran(i)
			if fltGoid() != advancer.Load() {
				elsewhere.Add(1)
			}
			if i == 3 || i == 7 {
				runtime.Goexit()
			}
		})
		require.NoError(t, err)
	}
	ended, returned := make(chan struct{}), false
	go func() {
		defer close(ended)
		advancer.Store(fltGoid())
		clock.Advance(time.Millisecond)
		returned = true
	}()
	<-ended
	require.False(t, returned, "Advance returned although a callback on its goroutine called runtime.Goexit")
	ran, _ := book.totals(n)
	require.Equal(t, n, ran, "every callback of the batch runs before the goroutine ends")
	require.Zero(t, elsewhere.Load())

	// The clock is free: Advance from this goroutine fires the next timer, and what ran does
	// not run again.
	advancer.Store(fltGoid())
	_, err = w.AfterFunc(time.Millisecond, func() { book.ran(n) })
	require.NoError(t, err)
	clock.Advance(time.Millisecond)
	clock.Advance(time.Hour)
	require.Equal(t, int32(1), book.runs[n].Load())
	require.Equal(t, 0, w.Stop())
	book.check(t, n+1, 0)
	fltBalance(t, w, n+1, n+1, 0, 0)
}

// TestFaultGoexitAfterStopInAdvance: a callback run by Advance (WithWorkers(0), or WithWorkers(1)
// with the queue full and CallerRuns) stops the wheel and then calls runtime.Goexit. Its Stop
// returns at once with the five pending timers, though the worker still runs a callback that
// waits; the Advance goroutine ends, a Stop from another goroutine returns (once the worker's
// callbacks are over), and no worker goroutine is left.
func TestFaultGoexitAfterStopInAdvance(t *testing.T) {
	for _, workers := range []int{0, 1} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			clock := sw.NewManualClock(time.Unix(0, 0))
			opts := []sw.Option{sw.WithWorkers(workers), sw.WithClock(clock)}
			if workers > 0 {
				opts = append(opts, sw.WithQueueSize(1), sw.WithFullPolicy(sw.CallerRuns))
			}
			w, err := sw.New(opts...)
			require.NoError(t, err)
			defer w.Stop()
			release := make(chan struct{})
			if workers > 0 {
				// Occupy the worker, then fill the queue, so that the next callback runs on the
				// Advance caller.
				started := make(chan struct{})
				_, err := w.AfterFunc(0, func() { close(started); <-release })
				require.NoError(t, err)
				clock.Advance(0)
				<-started
				_, err = w.AfterFunc(0, func() { <-release })
				require.NoError(t, err)
				clock.Advance(0)
			}
			var advancer, stopped atomic.Int64
			stopped.Store(-1)
			stopping := make(chan struct{})
			_, err = w.AfterFunc(time.Millisecond, func() {
				if fltGoid() != advancer.Load() {
					return // not on the Advance caller: not the case under test (stopped stays -1)
				}
				close(stopping)
				stopped.Store(int64(w.Stop()))
				runtime.Goexit()
			})
			require.NoError(t, err)
			for range 5 {
				_, err := w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
				require.NoError(t, err)
			}
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				advancer.Store(fltGoid())
				clock.Advance(time.Millisecond)
			}()
			select {
			case <-stopping:
			case <-time.After(fltPatience):
				t.Fatal("the callback never ran on the Advance caller")
			}
			// The Stop from the callback waits for nothing: not for the worker, which waits for
			// release.
			require.Eventually(t, func() bool { return stopped.Load() >= 0 }, fltPatience, time.Millisecond,
				"the callback's Stop waited for the worker")
			require.Equal(t, int64(5), stopped.Load(), "the callback's Stop drops the five pending an hour out")
			close(release)
			select {
			case <-ended:
			case <-time.After(fltPatience):
				t.Fatal("the Advance goroutine did not end")
			}
			again := make(chan int)
			go func() { again <- w.Stop() }()
			select {
			case n := <-again:
				require.Equal(t, 0, n)
			case <-time.After(fltPatience):
				t.Fatal("Stop waits for an Advance that a runtime.Goexit ended")
			}
			// A worker's goroutine may still be in its last instructions after Stop saw it exit.
			require.Eventually(t, func() bool { return sw.WorkerGoroutines(w) == 0 }, fltPatience, time.Millisecond)
		})
	}
}

// TestFaultGoexitInEvery: an Every whose second run calls runtime.Goexit goes on with its third,
// on the manual clock and on the system clock.
func TestFaultGoexitInEvery(t *testing.T) {
	t.Run("manual", func(t *testing.T) {
		clock := sw.NewManualClock(time.Unix(0, 0))
		w, err := sw.New(sw.WithWorkers(0), sw.WithClock(clock))
		require.NoError(t, err)
		defer w.Stop()
		var runs atomic.Int32
		_, err = w.Every(10*time.Millisecond, func() {
			if runs.Add(1) == 2 {
				runtime.Goexit()
			}
		})
		require.NoError(t, err)
		clock.Advance(10 * time.Millisecond)
		require.Equal(t, int32(1), runs.Load())
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			clock.Advance(10 * time.Millisecond)
		}()
		<-ended
		require.Equal(t, int32(2), runs.Load())
		for k := int32(3); k <= 5; k++ {
			clock.Advance(10 * time.Millisecond)
			require.Equal(t, k, runs.Load(), "run %d", k)
		}
		require.Equal(t, 1, w.Stop(), "the series' next run is pending")
	})
	t.Run("system", func(t *testing.T) {
		w, err := sw.New(sw.WithWorkers(1))
		require.NoError(t, err)
		defer w.Stop()
		var runs atomic.Int32
		_, err = w.Every(time.Millisecond, func() {
			runs.Add(1)
			runtime.Goexit() // every run: each ends the worker's goroutine
		})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return runs.Load() >= 20 }, fltPatience, time.Millisecond)
		// A goroutine that is ending may still show beside the one that replaced it.
		require.Eventually(t, func() bool { return sw.WorkerGoroutines(w) == 1 }, fltPatience, time.Millisecond)
		// The next run is pending (1), or its run fired just before Stop and starts after it,
		// with no next run (0): either way Stop's count is the books'.
		n := w.Stop()
		require.LessOrEqual(t, n, 1)
		st := w.Stats()
		require.EqualValues(t, n, st.Dropped, "%+v", st)
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	})
}

// TestFaultGoexitKeepsRerun: while a callback on the Advance caller runs, a worker's callback
// calls Advance, which returns at once and leaves the new time to the holder (rerun); then the
// caller's callback calls runtime.Goexit. The timer due at the new time still fires, with no
// further Advance.
func TestFaultGoexitKeepsRerun(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(1), sw.WithQueueSize(1), sw.WithFullPolicy(sw.CallerRuns))
	require.NoError(t, err)
	defer w.Stop()
	started, release, asked := make(chan struct{}), make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(0, func() { // on the worker
		close(started)
		<-release
		clock.Advance(time.Millisecond) // the holder is busy: this asks it to advance again
		close(asked)
	})
	require.NoError(t, err)
	clock.Advance(0)
	<-started
	_, err = w.AfterFunc(0, func() {}) // fills the queue
	require.NoError(t, err)
	clock.Advance(0)
	var advancer atomic.Int64
	onCaller := make(chan bool, 1)
	_, err = w.AfterFunc(0, func() {
		onCaller <- fltGoid() == advancer.Load()
		close(release)
		<-asked
		runtime.Goexit()
	})
	require.NoError(t, err)
	late := make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() { close(late) })
	require.NoError(t, err)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		advancer.Store(fltGoid())
		clock.Advance(0)
	}()
	require.True(t, <-onCaller, "the queue was full: the callback runs on the Advance caller")
	<-ended
	select {
	case <-late:
	case <-time.After(fltPatience):
		t.Fatal("the worker's Advance was lost with the goroutine that held the clock")
	}
	require.Equal(t, 0, w.Stop())
}
