package shardwheel

import (
	"fmt"
	"math/rand"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 36: the expiry side on the system clock (expiry.go, workers.go) against Timer.Stop and
// Reset, Every's re-arm and Wheel.Stop: the keeper role's hand-overs (release, releaseLater and
// its watchdog, hurry), the claims, the queue and the idle workers. The system clock runs inside
// testing/synctest bubbles, so that fake time makes lateness exact: a deadline that waits for a
// watchdog, a trim look or a keeper's timer shows as whole ticks, not as noise.

// drainNudge36 empties the nudge channel and reports whether it held a token.
func drainNudge36(w *Wheel) bool {
	select {
	case <-w.nudge:
		return true
	default:
		return false
	}
}

// TestReview36FixedWatchdogOutlivesStopAfterGoexit: Stop's contract (API.md, Wheel.Stop's doc) is
// that "every goroutine the wheel started has exited when Stop returns", and expiry.go's header
// allows the wheel no goroutine but its workers, "but for the moment a watchdog below goes off".
// A callback that calls runtime.Goexit breaks that: the interleaving (one worker, one shard):
//  1. the keeper wakes for one due shard and lets go of the role with releaseLater, which arms
//     its watchdog (wk.watch) a tick after the deadline (expiry.go:380, releaseLater step 3);
//  2. the shard's one callback calls runtime.Goexit: the goroutine unwinds out of advanceDue
//     (expiry.go:251) and keep without reaching keep's unwatch/hurry (expiry.go:259-265), and
//     work's deferred call starts the replacement (expiry.go:153-158, the "a Goexit" branch),
//     which clears wk.batch and wk.due but leaves wk.watch armed;
//  3. Stop: the replacement worker exits and Stop returns; the watchdog is still armed, and a
//     tick later the runtime starts a goroutine that runs w.watchdog on the stopped wheel (it
//     finds the role free and sends a nudge nobody will ever take).
//
// Seen here as the nudge token that appears after Stop returned and its token was drained: no
// goroutine of the wheel is left to send it. (goleak cannot see it: when Stop returns there is
// only an armed runtime timer, and the goroutine it starts exits at once.) Failed 5 of 5 on
// 988d9b7; fixed since: work's deferred call stops the unwound goroutine's watchdog (unwatch), as
// keep does, before it starts the replacement or finishes the shutdown.
func TestReview36FixedWatchdogOutlivesStopAfterGoexit(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithWorkers(1), WithShards(1), WithTick(10*time.Millisecond))
		require.NoError(t, err)
		entered := make(chan struct{})
		_, err = w.AfterFunc(time.Second, func() { close(entered); runtime.Goexit() })
		require.NoError(t, err)
		<-entered
		synctest.Wait() // the replacement worker keeps time; fake time has not moved
		require.Zero(t, w.Stop())
		drainNudge36(w) // the keeper's release on quit leaves one
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		require.False(t, drainNudge36(w),
			"a watchdog armed before the callback's Goexit went off after Stop had returned")
	})
}

// TestReview36PinWatchdogDisarmedWhenStopWaitsForCallback: the same hand-over without Goexit. The
// callback blocks (one callback: releaseLater armed the watchdog, nobody was nudged) while Stop
// begins; Stop waits for it, the worker then leaves keep through hurry, which stops the watchdog,
// and nothing of the wheel runs after Stop returns. The pending timer behind the blocked one is
// counted in Stop's result, and the books balance.
func TestReview36PinWatchdogDisarmedWhenStopWaitsForCallback(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithWorkers(1), WithShards(1), WithTick(10*time.Millisecond))
		require.NoError(t, err)
		entered, release := make(chan struct{}), make(chan struct{})
		_, err = w.AfterFunc(time.Second, func() { close(entered); <-release })
		require.NoError(t, err)
		_, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
		require.NoError(t, err)
		<-entered
		synctest.Wait()
		require.False(t, w.keeper.Load(), "the role is free while the callback blocks")
		stopped := make(chan int)
		go func() { stopped <- w.Stop() }()
		synctest.Wait() // Stop waits for the worker
		require.True(t, w.closed.Load())
		close(release)
		require.Equal(t, 1, <-stopped)
		drainNudge36(w)
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		require.False(t, drainNudge36(w), "a watchdog went off after Stop returned")
		st := w.Stats()
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
		require.Zero(t, st.Queued)
	})
}

// TestReview36PinStopWhileReleasingKeeper: the keeper, having claimed one due shard, is paused in
// releaseLater with the role free and before its read of the groups (testHookYielded), and a
// Wheel.Stop runs all the way to waiting for the workers meanwhile. The keeper then goes on: it
// arms its watchdog, advances nothing (closed), and leaves through hurry. The due timer, pending
// when Stop dropped the shard, is counted in what Stop returns and never runs; no nudge or
// watchdog outlives Stop.
func TestReview36PinStopWhileReleasingKeeper(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		var paused atomic.Bool
		stopped := make(chan int, 1)
		var w *Wheel
		testHookYielded = func(w *Wheel) {
			if !paused.CompareAndSwap(false, true) {
				return
			}
			go func() { stopped <- w.Stop() }()
			for !isClosed(w.quit) { // Stop has dropped every shard and waits for this worker
				runtime.Gosched()
			}
		}
		defer func() { testHookYielded = nil }()
		var err error
		w, err = New(WithWorkers(2), WithShards(2), WithTick(10*time.Millisecond))
		require.NoError(t, err)
		var ran atomic.Int32
		armOn(t, w, 0, time.Second, func(any) { ran.Add(1) }, nil)
		armOn(t, w, 1, time.Hour, func(any) { ran.Add(1) }, nil)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.True(t, paused.Load(), "the hook never ran")
		require.Equal(t, 2, <-stopped, "both timers were pending when Stop dropped the shards")
		require.Zero(t, ran.Load())
		drainNudge36(w)
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		require.False(t, drainNudge36(w), "a watchdog went off after Stop returned")
		st := w.Stats()
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	})
}

// TestReview36PinResetEarlierWhileKeeperBlocks: the worker that kept time blocks in the one
// callback of the shard it advanced, having let go of the role with releaseLater (watchdog a
// tick on: 10ms). A Timer.Reset that moves a timer of another shard from an hour to 100µs must
// not wait for that watchdog: Reset notes the earlier deadline (noteDeadline), target holds the
// watchdog's moment, so it signals, and signal nudges the idle worker while the role is free.
// Also through the other door: a Reset of a timer whose add the shard has taken already.
func TestReview36PinResetEarlierWhileKeeperBlocks(t *testing.T) {
	for _, taken := range []bool{false, true} {
		t.Run(fmt.Sprintf("taken=%v", taken), func(t *testing.T) {
			defer goleak.VerifyNone(t)
			synctest.Test(t, func(t *testing.T) {
				w, err := New(WithWorkers(2), WithShards(2), WithTick(10*time.Millisecond))
				require.NoError(t, err)
				defer w.Stop()
				var firedAt atomic.Int64
				var resetAt time.Time
				tm := armOn(t, w, 1, time.Hour, func(any) { firedAt.Store(int64(time.Since(resetAt))) }, nil)
				if taken {
					takeRing(w.shards[1])
					require.False(t, isQueued(w.shards[1].slab.at(tm.i).state.Load()))
				}
				entered, release := make(chan struct{}), make(chan struct{})
				armOn(t, w, 0, time.Second, func(any) { close(entered); <-release }, nil)
				<-entered
				synctest.Wait()
				require.False(t, w.keeper.Load(), "the role is free while the callback blocks")
				require.Greater(t, w.target.Load(), w.deadline(time.Millisecond), "the watchdog's moment, a tick on")
				resetAt = time.Now()
				require.True(t, tm.Reset(100*time.Microsecond))
				time.Sleep(5 * time.Millisecond)
				synctest.Wait()
				got := time.Duration(firedAt.Load())
				close(release)
				require.NotZero(t, got, "the reset timer waited for the watchdog")
				require.LessOrEqual(t, got, time.Millisecond, "fired %v after the Reset", got)
			})
		})
	}
}

// probe36 is one timer of TestReview36PinProbesOnTimeBesideBlockedWorkers.
type probe36 struct {
	mu      sync.Mutex
	due     time.Time
	fired   int
	firedAt time.Time
	stopped bool
	tm      Timer
}

// TestReview36PinProbesOnTimeBesideBlockedWorkers: liveness of the role's hand-overs with real
// (fake) time. WithWorkers(W), and W-1 goroutines that each keep one blocking callback (1 to 50
// ms) armed on a shard of its own, so that at most W-1 workers block and one is always free to
// keep time; three producers arm, reset and stop timers (0 to 20ms) on the other shards. Every
// such timer must run exactly once (never if its Stop reported true), never early, and no later
// than one tick after its deadline: a lost hand-over would make one wait for a blocked callback
// or a watchdog, which shows in fake time. One and zero workers, with no blockers, too, and one
// shard, and more than one group of shards.
func TestReview36PinProbesOnTimeBesideBlockedWorkers(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, c := range []struct{ workers, shards int }{
		{0, 1}, {1, 3}, {2, 2}, {2, 70}, {3, 4}, {3, 130}, {4, 5},
	} {
		for seed := int64(0); seed < 2; seed++ {
			t.Run(fmt.Sprintf("workers=%d/shards=%d/seed=%d", c.workers, c.shards, seed), func(t *testing.T) {
				probes36(t, c.workers, c.shards, seed)
			})
		}
	}
}

func probes36(t *testing.T, workers, shards int, seed int64) {
	const tick = time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithWorkers(workers), WithShards(shards), WithTick(tick))
		require.NoError(t, err)
		defer w.Stop()
		blockers := min(max(workers-1, 0), shards-1)
		var (
			mu     sync.Mutex
			probes []*probe36
			wg     sync.WaitGroup
			quiet  atomic.Bool
		)
		for b := range blockers {
			wg.Add(1)
			r := rand.New(rand.NewSource(seed*100 + int64(b)))
			go func() {
				defer wg.Done()
				for !quiet.Load() {
					done := make(chan struct{})
					d, block := time.Duration(r.Intn(20000))*time.Microsecond, time.Duration(r.Intn(50)+1)*time.Millisecond
					armOn(t, w, b, d, func(any) { time.Sleep(block); close(done) }, nil)
					<-done
				}
			}()
		}
		var producers sync.WaitGroup
		for p := range 3 {
			producers.Add(1)
			r := rand.New(rand.NewSource(seed*10 + int64(p)))
			go func() {
				defer producers.Done()
				for range 150 {
					pr := &probe36{}
					d := time.Duration(r.Intn(20000)) * time.Microsecond
					k := blockers + r.Intn(shards-blockers)
					pr.mu.Lock()
					pr.due = time.Now().Add(d)
					pr.tm = armOn(t, w, k, d, func(any) {
						pr.mu.Lock()
						pr.fired++
						pr.firedAt = time.Now()
						pr.mu.Unlock()
					}, nil)
					pr.mu.Unlock()
					mu.Lock()
					probes = append(probes, pr)
					mu.Unlock()
					switch r.Intn(8) {
					case 0:
						pr.mu.Lock()
						pr.stopped = pr.tm.Stop()
						pr.mu.Unlock()
					case 1:
						time.Sleep(time.Duration(r.Intn(3000)) * time.Microsecond)
						pr.mu.Lock()
						d2 := time.Duration(r.Intn(20000)) * time.Microsecond
						due := time.Now().Add(d2)
						if pr.tm.Reset(d2) {
							pr.due = due
						}
						pr.mu.Unlock()
					}
					if r.Intn(4) == 0 {
						time.Sleep(time.Duration(r.Intn(5000)) * time.Microsecond)
					}
				}
			}()
		}
		producers.Wait()
		time.Sleep(100 * time.Millisecond)
		quiet.Store(true)
		wg.Wait()
		synctest.Wait()
		var worst time.Duration
		for _, pr := range probes {
			pr.mu.Lock()
			switch {
			case pr.stopped:
				require.Zero(t, pr.fired, "ran after its Stop reported true")
			default:
				require.Equal(t, 1, pr.fired, "runs of one timer")
				late := pr.firedAt.Sub(pr.due)
				require.GreaterOrEqual(t, late, time.Duration(0), "early")
				worst = max(worst, late)
			}
			pr.mu.Unlock()
		}
		require.LessOrEqual(t, worst, tick, "a timer beside the blocked workers waited")
		st := w.Stats()
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+uint64(st.Pending), "%+v", st)
		require.Zero(t, st.Queued)
		require.Equal(t, st.Fired, st.Lateness.Count())
	})
}

// TestReview36PinTinyQueueFloodBooks: floods that fire together on the system clock with a queue of
// one callback (WithQueueSize(1): chunks of one, a channel of one), shares offered to idle
// workers while some of the flood is stopped from outside and from its own callbacks, and an
// Every that runs through it. Every timer runs once or has one Stop that reported true, and once
// quiet the books balance: Queued is 0, Fired + Stopped == Scheduled, Lateness counts every start.
func TestReview36PinTinyQueueFloodBooks(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, workers := range []int{1, 3} {
		t.Run(fmt.Sprintf("workers=%d", workers), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w, err := New(WithWorkers(workers), WithShards(2), WithQueueSize(1), WithTick(time.Millisecond))
				require.NoError(t, err)
				defer w.Stop()
				const n = 600
				var (
					runs  [n]atomic.Int32
					stops [n]atomic.Bool
					tmsMu sync.Mutex
					tms   [n]Timer
				)
				var everyRuns atomic.Int32
				ev, err := w.Every(time.Millisecond, func() { everyRuns.Add(1) })
				require.NoError(t, err)
				for i := range n {
					tm, err := w.AfterFunc(time.Duration(i%3)*time.Millisecond, func() {
						runs[i].Add(1)
						if i%11 != 0 {
							return
						}
						j := (i + 7) % n
						tmsMu.Lock()
						tj := tms[j]
						tmsMu.Unlock()
						if tj.Stop() { // a zero Timer (not armed yet) reports false
							stops[j].Store(true)
						}
					})
					require.NoError(t, err)
					tmsMu.Lock()
					tms[i] = tm
					tmsMu.Unlock()
				}
				for i := 0; i < n; i += 13 {
					tmsMu.Lock()
					tm := tms[i]
					tmsMu.Unlock()
					if tm.Stop() {
						stops[i].Store(true)
					}
				}
				time.Sleep(10 * time.Millisecond)
				require.True(t, ev.Stop())
				synctest.Wait()
				for i := range n {
					if stops[i].Load() {
						require.Zero(t, runs[i].Load(), "timer %d ran after its Stop reported true", i)
					} else {
						require.EqualValues(t, 1, runs[i].Load(), "runs of timer %d", i)
					}
				}
				require.NotZero(t, everyRuns.Load())
				st := w.Stats()
				require.Zero(t, st.Queued, "%+v", st)
				require.Zero(t, st.Pending, "%+v", st)
				require.Equal(t, st.Scheduled, st.Fired+st.Stopped, "%+v", st)
				require.Equal(t, st.Fired, st.Lateness.Count())
			})
		})
	}
}

// TestReview36PinReleaseNudgesTheNextKeeper pins the nudge of release, which review 36 found no
// test would miss: two shards come due at once, so the keeper lets go of the role with release
// (not releaseLater: no watchdog), advances one and queues the other; both callbacks block. Of
// three workers, the third must become the keeper, by release's nudge, so that a timer on a third
// shard fires on time. Without the nudge it waited for a blocked callback (95 ms here).
func TestReview36PinReleaseNudgesTheNextKeeper(t *testing.T) {
	defer goleak.VerifyNone(t)
	const tick = time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithWorkers(3), WithShards(3), WithTick(tick))
		require.NoError(t, err)
		defer w.Stop()
		for k := range 2 {
			armOn(t, w, k, 5*time.Millisecond, func(any) { time.Sleep(100 * time.Millisecond) }, nil)
		}
		start := time.Now()
		ran := make(chan time.Duration, 1)
		armOn(t, w, 2, 10*time.Millisecond, func(any) { ran <- time.Since(start) }, nil)
		late := <-ran - 10*time.Millisecond
		require.GreaterOrEqual(t, late, time.Duration(0))
		require.LessOrEqual(t, late, 2*tick, "the third shard's timer waited for a blocked callback")
	})
}
