package shardwheel

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// spinFor keeps the goroutine busy on its core for d (a callback that computes, not one that
// sleeps).
func spinFor(d time.Duration) {
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

// TestExpiryFloodDoesNotStarveOtherShards: a flood on shard 0 whose callbacks keep the workers
// busy, and one timer on shard 1 due shortly after the flood starts. An advancer of shard 0 that
// took it back after each step's callbacks regardless would never return to its loop: nobody
// would keep time, and shard 1 would wait for the whole flood. An advancer goes on only while
// another worker keeps time or nothing else is due, and nothing is queued (letGo), so the
// sentinel on shard 1 fires long before the flood is over, whatever the number of workers.
func TestExpiryFloodDoesNotStarveOtherShards(t *testing.T) {
	for _, workers := range []int{1, 2, 4} {
		t.Run(fmt.Sprint("workers=", workers), func(t *testing.T) {
			w, err := New(WithWorkers(workers), WithShards(2))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			const flood = 4000
			var ran atomic.Int64
			var wg sync.WaitGroup
			wg.Add(flood + 1)
			f := func(any) { spinFor(50 * time.Microsecond); ran.Add(1); wg.Done() }
			for i := 0; i < flood; i++ {
				armOn(t, w, 0, 5*time.Millisecond, f, nil)
			}
			// Count from the moment the sentinel is armed: on a loaded machine the arming
			// goroutine may lose its core while the flood runs, which is not the wheel's doing.
			var atArm, atSentinel atomic.Int64
			atArm.Store(ran.Load())
			armOn(t, w, 1, 10*time.Millisecond, func(any) { atSentinel.Store(ran.Load()); wg.Done() }, nil)
			wg.Wait()
			// With one worker the order is the wheel's alone: a step of the flood, then the
			// sentinel's shard. With more, the Go scheduler interleaves the workers' time
			// slices too (they outnumber the Ps here), so only "before the flood is over" is
			// the wheel's promise.
			limit := int64(flood / 2)
			if workers > 1 {
				limit = flood * 9 / 10
			}
			if n := atSentinel.Load() - atArm.Load(); n > limit {
				t.Errorf("the timer on shard 1 fired after %d more of the %d flood callbacks on shard 0", n, flood)
			}
		})
	}
}

// TestExpiryKeptShardNotStuckBehindCallbacks: the keeper takes two due shards at one tick while no
// worker is idle, keeps both, and runs the first one's step, whose callback blocks. The second
// shard waits for its turn as ownerRunning, published into its group (driveDue), which a keeper
// may take over, not as ownerAdvancing, which none may: the worker that comes free meanwhile
// takes it over, and its timer does not wait for the blocked callback.
func TestExpiryKeptShardNotStuckBehindCallbacks(t *testing.T) {
	w, err := New(WithWorkers(2), WithShards(2))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	startedA, relA := make(chan struct{}), make(chan struct{})
	armOn(t, w, 1, 0, func(any) { close(startedA); <-relA }, nil)
	<-startedA // one worker is held: the other, the keeper, finds nobody idle
	startedB, relB := make(chan struct{}), make(chan struct{})
	doneC := make(chan struct{})
	armOn(t, w, 0, 20*time.Millisecond, func(any) { close(startedB); <-relB }, nil)
	armOn(t, w, 1, 20*time.Millisecond, func(any) { close(doneC) }, nil)
	<-startedB  // the keeper runs shard 0's callback, which blocks it
	close(relA) // the first worker comes free
	select {
	case <-doneC:
	case <-time.After(5 * time.Second):
		t.Error("the timer on shard 1 waited for a blocked callback of shard 0 with a worker free")
	}
	close(relB)
	<-doneC
}

// TestExpiryCascadeDueBeforeDeadlines: timers that a drain outside an advance links above level 0
// are cascaded at their bucket's start, so on the system clock the shard's next must be no later
// than that start, not only the deadlines the producers noted: else the keeper sleeps until a
// flood comes due and only then re-inserts it one level down, one entry at a time, before the
// first callback can run (a million timers armed 1.5s ahead would start firing 10 to 18ms late).
// Two such drains: a producer's whose ring is full, and the trimmer's.
func TestExpiryCascadeDueBeforeDeadlines(t *testing.T) {
	for _, tc := range []struct {
		name  string
		arms  int
		drain func(s *shard)
	}{
		{"full ring", 100, func(*shard) {}}, // more than the ring holds: the producer drains it itself
		{"trim", 5, func(s *shard) {
			for i := 0; ; i++ { // a lock held a moment (the keeper's own trimmer): try again
				if _, _, ok := s.trim(); ok {
					return
				}
				if i == 1000 {
					t.Fatal("trim found a lock held 1000 times")
				}
				time.Sleep(time.Millisecond)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := New(WithShards(1), WithRingSize(8))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			s := w.shards[0]
			// An hour out is above level 0 from any elapsed tick, in a bucket that starts
			// minutes before it: nothing comes due while the test runs, so the keeper leaves
			// the shard alone.
			for i := 0; i < tc.arms; i++ {
				armOn(t, w, 0, time.Hour, func(any) {}, nil)
			}
			tc.drain(s)
			s.mu.Lock()
			due := s.tw.nextDue()
			deadline := w.deadline(time.Hour)
			s.mu.Unlock()
			if due >= deadline-60_000 {
				t.Fatalf("the wheel's next bucket starts at tick %d, not minutes before the deadlines near %d (the test's premise)", due, deadline)
			}
			if next := s.next.Load(); next > due {
				t.Errorf("shard next is tick %d, after the cascade due at tick %d", next, due)
			}
		})
	}
}

// TestExpiryYieldLaterLeavesWakeToTheKeeper: W1 lets go of the role with yieldLater and pauses
// (testHookYielded); W2 takes the role and pauses before its select; a producer arms a deadline
// earlier than W2's target, and its signal lands in wake's buffer without a nudge (the role is
// held). yieldLater never takes a token from wake, so W2 finds it and fires the timer on time; a
// W1 that took it would leave W2 asleep until its own target (here seconds).
func TestExpiryYieldLaterLeavesWakeToTheKeeper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		released, goOn1 := make(chan struct{}), make(chan struct{})
		sleeping, goOn2 := make(chan struct{}), make(chan struct{})
		var phase atomic.Int32
		testHookYielded = func(w *Wheel) {
			if phase.CompareAndSwap(1, 2) {
				w.nudgeIdle() // a stale token: W2 wakes and takes the free role
				released <- struct{}{}
				<-goOn1
			}
		}
		testHookSleep = func(w *Wheel) {
			if phase.CompareAndSwap(2, 3) {
				sleeping <- struct{}{}
				<-goOn2
			}
		}
		defer func() { testHookYielded, testHookSleep = nil, nil }()
		w, err := New(WithWorkers(2), WithShards(2))
		require.NoError(t, err)
		defer w.Stop()
		armOn(t, w, 0, time.Second, func(any) {}, nil)
		armOn(t, w, 1, 10*time.Second, func(any) {}, nil)
		synctest.Wait()
		phase.Store(1)
		<-released
		<-sleeping
		start := time.Now()
		var firedAt atomic.Int64
		armOn(t, w, 1, 5*time.Millisecond, func(any) { firedAt.Store(int64(time.Since(start))) }, nil)
		close(goOn1)
		synctest.Wait()
		close(goOn2)
		time.Sleep(3 * time.Second)
		got := time.Duration(firedAt.Load())
		require.NotZero(t, got, "the 5ms timer never fired")
		require.LessOrEqual(t, got, 10*time.Millisecond, "the 5ms timer fired after %v", got)
	})
}

// TestExpiryDeadlineNotedWhileKeeperReleases: the keeper takes one due shard and, between collect
// and yieldLater's store of target, a producer arms an earlier deadline on another shard. That
// producer reads target awake and does not signal; the keeper's callback then blocks (one
// callback: no hurry). yieldLater reads every group once more after its store and nudges the
// other worker, which fires the new timer on time, not at the watchdog a tick later.
func TestExpiryDeadlineNotedWhileKeeperReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		block := make(chan struct{})
		var (
			once    atomic.Bool
			armedAt time.Time
			firedAt atomic.Int64
		)
		var w *Wheel
		start := time.Now()
		testHookCollected = func(_ *Wheel, due []*shard) {
			if time.Since(start) >= time.Second && len(due) == 1 && once.CompareAndSwap(false, true) { // the wake for shard 0's timer
				armedAt = time.Now()
				armOn(t, w, 1, 100*time.Microsecond, func(any) { firedAt.Store(int64(time.Since(armedAt))) }, nil)
			}
		}
		defer func() { testHookCollected = nil }()
		var err error
		w, err = New(WithWorkers(2), WithShards(2), WithTick(time.Millisecond))
		require.NoError(t, err)
		defer w.Stop()
		armOn(t, w, 1, time.Hour, func(any) {}, nil)            // shard 1's slab has grown: no grow signal later
		armOn(t, w, 0, time.Second, func(any) { <-block }, nil) // the keeper blocks in it
		time.Sleep(time.Second + 10*time.Millisecond)
		got := time.Duration(firedAt.Load())
		close(block)
		require.True(t, once.Load(), "the hook never ran")
		require.NotZero(t, got, "the 100µs timer never fired")
		require.Less(t, got, 500*time.Microsecond, "the 100µs timer waited for the watchdog: fired %v after it was armed", got)
	})
}

// TestExpiryArmWakesOverdueKeeper: the runtime runs the keeper's timer late (as it does when the
// keeper's P is idle and another P is busy), simulated by a target in the past while the keeper
// sleeps on a timer a second out. An arm that notes no earlier deadline (an hour out) still
// reads the clock past the target, and wakes the keeper: it goes round once and sleeps again
// until its true target. A Reset does the same. Without the producers' look the keeper sleeps on.
func TestExpiryArmWakesOverdueKeeper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sleeps atomic.Int32
		testHookSleep = func(*Wheel) { sleeps.Add(1) }
		defer func() { testHookSleep = nil }()
		w, err := New(WithWorkers(1), WithShards(1))
		require.NoError(t, err)
		defer w.Stop()
		_, err = w.AfterFunc(time.Second, func() {})
		require.NoError(t, err)
		synctest.Wait()
		target := w.target.Load()
		require.Equal(t, w.shards[0].next.Load(), target, "the keeper sleeps until the second")
		time.Sleep(10 * time.Millisecond) // a reading past the target below
		late := func(what string, arm func()) {
			t.Helper()
			before := sleeps.Load()
			w.target.Store(1) // the keeper's timer is overdue: its P did not run it
			arm()
			synctest.Wait()
			require.Equal(t, before+1, sleeps.Load(), "%s: the keeper went round once", what)
			require.Equal(t, target, w.target.Load(), "%s: and sleeps until its true target", what)
		}
		var tm Timer
		late("AfterFunc", func() {
			tm, err = w.AfterFunc(time.Hour, func() {})
			require.NoError(t, err)
		})
		late("Reset", func() { require.True(t, tm.Reset(2*time.Hour)) })

		// A target that has not come yet: nobody signals.
		before := sleeps.Load()
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
		synctest.Wait()
		require.Equal(t, before, sleeps.Load(), "an arm before the target woke the keeper")
	})
}

// TestExpiryStaleWakeTokenSpent: a token left in wake while the keeper is awake (a producer found
// its target passed just as its timer woke it, overdue) is spent by the keeper's next look,
// which reads every group anyway: the keeper sleeps once after its advance, not once more at once.
func TestExpiryStaleWakeTokenSpent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sleeps, after atomic.Int32
		var fired atomic.Bool
		testHookSleep = func(*Wheel) {
			sleeps.Add(1)
			if fired.Load() {
				after.Add(1)
			}
		}
		testHookCollected = func(w *Wheel, _ []*shard) {
			w.signal() // a token while the keeper is awake
		}
		defer func() { testHookSleep, testHookCollected = nil, nil }()
		w, err := New(WithWorkers(1), WithShards(1))
		require.NoError(t, err)
		defer w.Stop()
		_, err = w.AfterFunc(time.Second, func() { fired.Store(true) })
		require.NoError(t, err)
		time.Sleep(time.Second + time.Millisecond) // before the trimmer's next look, a second on
		synctest.Wait()
		require.True(t, fired.Load())
		require.Equal(t, int32(1), after.Load(), "sleeps after the advance (all: %d)", sleeps.Load())
	})
}

// TestExpiryPublishGroupSignalsEarlierNext: an advancer that lets go of a shard publishes the
// shard's next into its group and signals the keeper if that is earlier than its target
// (publishGroup): a keeper that collected while the shard was owned left the shard out of its
// summary, and sleeps until its target; nothing else tells it about the shard's earlier next.
// Driven on a manual-clock wheel with no goroutines, with the target set as a sleeping keeper's:
// an earlier next leaves a token in wake, a later one leaves none.
func TestExpiryPublishGroupSignalsEarlierNext(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, _ := newManualWheel(t, WithShards(1), WithWorkers(0))
	s := w.shards[0]
	const target = int64(time.Hour)
	t.Cleanup(func() { w.target.Store(awake) })

	// A later next: lowered into the group, no signal.
	w.target.Store(target)
	s.next.Store(2 * target)
	w.publishGroup(s)
	require.Equal(t, 2*target, s.g.next.Load())
	require.Equal(t, 0, len(w.wake), "a next after the keeper's target signalled it")

	// An earlier next: lowered into the group, and the keeper is woken.
	s.next.Store(target / 2)
	w.publishGroup(s)
	require.Equal(t, target/2, s.g.next.Load())
	require.Equal(t, 1, len(w.wake), "a next before the keeper's target did not wake it")
	<-w.wake

	w.target.Store(awake)
	s.next.Store(never)
	s.g.next.Store(never)
}

// TestExpiryCascadeInBubble runs the system clock's expiry side (keeper, shard owners, budgeted
// steps, take-overs) in a synctest bubble over a cascade that takes many steps: 3000 timers in
// one level-2 bucket, a tenth of them due at its start (so steps fire callbacks, the shard goes
// ownerRunning and may be taken over), and callbacks that arm short timers and Stop or Reset
// timers still in the bucket, so commands reach entries sitting in casc. Every timer not stopped
// runs once and never early; the wheel ends empty and its invariants hold. (Fake time does not
// move while the cascade runs, so this checks correctness, not latency.)
func TestExpiryCascadeInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithShards(1), WithWorkers(2), WithTick(time.Millisecond))
		require.NoError(t, err)
		defer w.Stop()
		start := time.Now()
		const n = 3000
		type rec struct {
			due  time.Duration // from start
			runs []time.Duration
			tm   Timer
		}
		var mu sync.Mutex
		recs := map[int]*rec{}
		stopped := map[int]bool{}
		var sawCasc atomic.Bool // a callback ran between two steps of the cascade
		next := 0
		arm := func(d time.Duration, f func()) {
			mu.Lock()
			k := next
			next++
			r := &rec{due: time.Since(start) + d}
			recs[k] = r
			tm, err := w.AfterFunc(d, func() {
				mu.Lock()
				r.runs = append(r.runs, time.Since(start))
				mu.Unlock()
				if f != nil {
					f()
				}
			})
			r.tm = tm
			mu.Unlock()
			require.NoError(t, err)
		}
		// Level 2 from elapsed 0: ticks 4096-8191. A tenth at its very start.
		for k := 0; k < n; k++ {
			if k%10 != 0 {
				arm(4200*time.Millisecond+time.Duration(k)*time.Millisecond, nil)
				continue
			}
			arm(4096*time.Millisecond+time.Duration(k%7)*time.Microsecond, func() {
				sh := w.shards[0]
				sh.mu.Lock()
				if !sh.tw.casc.empty() {
					sawCasc.Store(true)
				}
				sh.mu.Unlock()
				arm(time.Millisecond, nil)
				arm(0, nil)
				victim := (k*7 + 13) % n
				if victim%10 == 0 {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				r := recs[victim]
				if k%20 == 0 {
					if r.tm.Stop() {
						stopped[victim] = true
					}
					return
				}
				nd := time.Duration(victim%50) * time.Millisecond
				now := time.Since(start)
				if r.tm.Reset(nd) {
					r.due = now + nd
				}
			})
		}
		time.Sleep(4096 * time.Millisecond)
		synctest.Wait()
		require.NoError(t, w.Verify())
		time.Sleep(8300*time.Millisecond - 4096*time.Millisecond)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		require.NotEmpty(t, stopped)
		require.True(t, sawCasc.Load(), "no callback ran while a cascade was in progress")
		for k, r := range recs {
			if stopped[k] {
				require.Empty(t, r.runs, "timer %d was stopped", k)
				continue
			}
			require.Len(t, r.runs, 1, "timer %d", k)
			require.GreaterOrEqual(t, r.runs[0], r.due, "timer %d ran early", k)
		}
		require.Zero(t, w.Len())
		require.NoError(t, w.Verify())
	})
}

// TestExpiryOverdueGapLosesNoWake: the window inside overdue between a producer's CAS of target to
// awake and its signal (the producer paused there: preemption, GC). Meanwhile target is awake, so
// a producer that notes an earlier deadline does not signal, and no token is in wake yet. No
// wake-up is lost, because the CAS disarms nothing: a sleeping keeper still has its own timer, and
// a role let go of by yieldLater still has its watchdog. The deadline waits at most until one of
// them runs (or the paused producer resumes), and the late signal then costs one more round, not
// a loop. The runtime's lateness that overdue is for is simulated by a target in the past.
func TestExpiryOverdueGapLosesNoWake(t *testing.T) {
	t.Run("keeper sleeps", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var sleeps atomic.Int32
			testHookSleep = func(*Wheel) { sleeps.Add(1) }
			defer func() { testHookSleep = nil }()
			w, err := New(WithWorkers(1), WithShards(2), WithTick(time.Millisecond))
			require.NoError(t, err)
			defer w.Stop()
			armOn(t, w, 1, time.Hour, func(any) {}, nil) // shard 1's slab has grown: no grow signal later
			armOn(t, w, 0, time.Second, func(any) {}, nil)
			synctest.Wait()
			require.Equal(t, w.shards[0].next.Load(), w.target.Load(), "the keeper sleeps until the second")
			time.Sleep(10 * time.Millisecond)
			// P read a target that had passed (its runtime timer late) and won the CAS; it is
			// paused before its signal.
			passed := int64(5 * time.Millisecond)
			w.target.Store(passed)
			require.True(t, w.target.CompareAndSwap(passed, awake))
			start := time.Now()
			var firedAt atomic.Int64
			armOn(t, w, 1, 10*time.Millisecond, func(any) { firedAt.Store(int64(time.Since(start))) }, nil)
			time.Sleep(time.Second)
			got := time.Duration(firedAt.Load())
			require.NotZero(t, got, "a deadline noted in the gap was lost")
			require.LessOrEqual(t, got, time.Second, "it waits at most for the keeper's own timer: %v", got)
			// P resumes: its token is one more look, and the keeper sleeps again.
			before := sleeps.Load()
			w.signal()
			synctest.Wait()
			require.Equal(t, before+1, sleeps.Load(), "the late signal: one more round")
			require.NotEqual(t, int64(awake), w.target.Load(), "and a target to sleep until")
		})
	})

	t.Run("role free after yieldLater", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var (
				w    *Wheel
				at   atomic.Int64
				done atomic.Bool
			)
			start := time.Now()
			testHookYielded = func(w *Wheel) {
				if time.Since(start) >= time.Second && done.CompareAndSwap(false, true) {
					// P read the watchdog's moment passed and won the CAS; it is paused
					// before its signal. yieldLater goes on and arms its watchdog.
					at.Store(w.target.Load())
					if !w.target.CompareAndSwap(at.Load(), awake) {
						panic("target moved under a paused yieldLater")
					}
				}
			}
			defer func() { testHookYielded = nil }()
			var err error
			w, err = New(WithWorkers(2), WithShards(2), WithTick(time.Millisecond))
			require.NoError(t, err)
			defer w.Stop()
			started, block := make(chan struct{}), make(chan struct{})
			armOn(t, w, 1, time.Hour, func(any) {}, nil)
			armOn(t, w, 0, time.Second, func(any) { close(started); <-block }, nil) // one callback: no hurry
			<-started
			require.True(t, done.Load(), "the hook never ran")
			require.Equal(t, int64(awake), w.target.Load())
			require.False(t, w.keeper.Load(), "the role is free while the callback blocks")
			// Q notes a deadline earlier than the watchdog: target is awake, so no signal.
			armedAt := time.Now()
			require.Less(t, w.deadline(100*time.Microsecond), at.Load(), "the test's premise")
			var firedAt atomic.Int64
			armOn(t, w, 1, 100*time.Microsecond, func(any) { firedAt.Store(int64(time.Since(armedAt))) }, nil)
			time.Sleep(10 * time.Millisecond)
			got := time.Duration(firedAt.Load())
			close(block)
			require.NotZero(t, got, "a deadline noted in the gap was lost")
			require.LessOrEqual(t, got, 2*time.Millisecond, "it waits at most for the watchdog (a tick): %v", got)
		})
	})
}

// expiryDrainNudge empties the nudge channel and reports whether it held a token.
func expiryDrainNudge(w *Wheel) bool {
	select {
	case <-w.nudge:
		return true
	default:
		return false
	}
}

// TestExpiryWatchdogStoppedWhenKeeperGoexits: every goroutine the wheel started has exited when
// Stop returns (API.md), and the wheel has no goroutine but its workers, but for the moment a
// watchdog goes off (expiry.go). A callback that calls runtime.Goexit must not leave a watchdog
// armed behind: one worker, one shard, the keeper wakes for the one due shard and lets go of the
// role with yieldLater, which arms its watchdog a tick on; the shard's one callback calls
// runtime.Goexit, unwinding the goroutine out of keep before keep's unwatch. work's deferred call
// stops the watchdog (unwatch) before it starts the replacement. Were the watchdog left armed, a
// tick after Stop returned it would run on the stopped wheel and send a nudge nobody takes,
// which is what this test looks for after draining the one token the keeper's yield on quit
// leaves. (goleak cannot see it: when Stop returns there is only an armed runtime timer, and the
// goroutine it starts exits at once.)
func TestExpiryWatchdogStoppedWhenKeeperGoexits(t *testing.T) {
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
		expiryDrainNudge(w) // the keeper's yield on quit leaves one
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		require.False(t, expiryDrainNudge(w),
			"a watchdog armed before the callback's Goexit went off after Stop had returned")
	})
}

// TestExpiryWatchdogDisarmedWhenStopWaitsForCallback: the same hand-over without Goexit. The
// callback blocks (one callback: yieldLater armed the watchdog, nobody was nudged) while Stop,
// called from outside the wheel, begins; Stop waits for it, the worker then leaves keep through
// hurry, which stops the watchdog, and nothing of the wheel runs after Stop returns. The pending
// timer behind the blocked one is counted in Stop's result, and the books balance.
func TestExpiryWatchdogDisarmedWhenStopWaitsForCallback(t *testing.T) {
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
		expiryDrainNudge(w)
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		require.False(t, expiryDrainNudge(w), "a watchdog went off after Stop returned")
		st := w.Stats()
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
		require.Zero(t, st.Queued)
	})
}

// TestExpiryStopWhileKeeperYields: the keeper, having taken one due shard, is paused in yieldLater
// with the role free and before its read of the groups (testHookYielded), and a Wheel.Stop from
// another goroutine runs all the way to waiting for the workers meanwhile. The keeper then goes
// on: it arms its watchdog, advances nothing (closed), and leaves through hurry. The due timer,
// pending when Stop dropped the shard, is counted in what Stop returns and never runs; no nudge
// or watchdog outlives Stop.
func TestExpiryStopWhileKeeperYields(t *testing.T) {
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
		expiryDrainNudge(w)
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		require.False(t, expiryDrainNudge(w), "a watchdog went off after Stop returned")
		st := w.Stats()
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	})
}

// TestExpiryResetEarlierWhileKeeperBlocks: the worker that kept time blocks in the one callback of
// the shard it advanced, having let go of the role with yieldLater (watchdog a tick on: 10ms). A Timer.Reset that moves a timer of another shard from an hour to 100µs must
// not wait for that watchdog: Reset notes the earlier deadline (noteDeadline), target holds the
// watchdog's moment, so it signals, and signal nudges the idle worker while the role is free.
// Also through the other door: a Reset of a timer whose add the shard has taken already.
func TestExpiryResetEarlierWhileKeeperBlocks(t *testing.T) {
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

// expiryProbe is one timer of TestExpiryProbesOnTimeBesideBlockedWorkers.
type expiryProbe struct {
	mu      sync.Mutex
	due     time.Time
	fired   int
	firedAt time.Time
	stopped bool
	tm      Timer
}

// TestExpiryProbesOnTimeBesideBlockedWorkers: liveness of the role's hand-overs with real (fake)
// time. WithWorkers(W), and W-1 goroutines that each keep one blocking callback (1 to 50ms) armed
// on a shard of its own, so that at most W-1 workers block and one is always free to keep time; three producers arm, reset and stop timers (0 to 20ms) on the other shards. Every
// such timer must run exactly once (never if its Stop reported true), never early, and no later
// than one tick after its deadline: a lost hand-over would make one wait for a blocked callback
// or a watchdog, which shows in fake time. One and zero workers, with no blockers, too, and one
// shard, and more than one group of shards.
func TestExpiryProbesOnTimeBesideBlockedWorkers(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, c := range []struct{ workers, shards int }{
		{0, 1}, {1, 3}, {2, 2}, {2, 70}, {3, 4}, {3, 130}, {4, 5},
	} {
		for seed := int64(0); seed < 2; seed++ {
			t.Run(fmt.Sprintf("workers=%d/shards=%d/seed=%d", c.workers, c.shards, seed), func(t *testing.T) {
				expiryProbes(t, c.workers, c.shards, seed)
			})
		}
	}
}

// expiryProbes runs TestExpiryProbesOnTimeBesideBlockedWorkers' scenario with workers workers and
// shards shards.
func expiryProbes(t *testing.T, workers, shards int, seed int64) {
	const tick = time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithWorkers(workers), WithShards(shards), WithTick(tick))
		require.NoError(t, err)
		defer w.Stop()
		blockers := min(max(workers-1, 0), shards-1)
		var (
			mu     sync.Mutex
			probes []*expiryProbe
			wg     sync.WaitGroup
			quiet  atomic.Bool
		)
		for b := range blockers {
			wg.Add(1)
			r := rand.New(rand.NewPCG(uint64(seed*100+int64(b)), 0))
			go func() {
				defer wg.Done()
				for !quiet.Load() {
					done := make(chan struct{})
					d, block := time.Duration(r.IntN(20000))*time.Microsecond, time.Duration(r.IntN(50)+1)*time.Millisecond
					armOn(t, w, b, d, func(any) { time.Sleep(block); close(done) }, nil)
					<-done
				}
			}()
		}
		var producers sync.WaitGroup
		for p := range 3 {
			producers.Add(1)
			r := rand.New(rand.NewPCG(uint64(seed*10+int64(p)), 0))
			go func() {
				defer producers.Done()
				for range 150 {
					pr := &expiryProbe{}
					d := time.Duration(r.IntN(20000)) * time.Microsecond
					k := blockers + r.IntN(shards-blockers)
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
					switch r.IntN(8) {
					case 0:
						pr.mu.Lock()
						pr.stopped = pr.tm.Stop()
						pr.mu.Unlock()
					case 1:
						time.Sleep(time.Duration(r.IntN(3000)) * time.Microsecond)
						pr.mu.Lock()
						d2 := time.Duration(r.IntN(20000)) * time.Microsecond
						due := time.Now().Add(d2)
						if pr.tm.Reset(d2) {
							pr.due = due
						}
						pr.mu.Unlock()
					}
					if r.IntN(4) == 0 {
						time.Sleep(time.Duration(r.IntN(5000)) * time.Microsecond)
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

// TestExpiryYieldNudgesTheNextKeeper: two shards come due at once, so the keeper lets go of the
// role with yield (not yieldLater: no watchdog), and their two callbacks block two of the three
// workers. The third must become the keeper, by yield's nudge, so that a timer on a third shard
// fires on time (within a tick or two), not after a blocked callback (95ms).
func TestExpiryYieldNudgesTheNextKeeper(t *testing.T) {
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

// TestExpiryGoexitKeeperLosesNoWake: work stops the unwound goroutine's watchdog on a Goexit (so
// that none outlives Stop), and the watchdog is what hands time over while the role is free
// (yieldLater); with it stopped, the replacement goroutine must take the role at once. Two
// workers: W1 is held in a callback that waits for a later timer's callback (so it can neither
// keep time nor take a nudge), and the keeper's own callback calls runtime.Goexit right after
// yieldLater freed the role. The later timer must still fire on time (fake time, exact: within a
// tick of its deadline), or W1 would wait for it forever.
func TestExpiryGoexitKeeperLosesNoWake(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		const tick = 10 * time.Millisecond
		w, err := New(WithWorkers(2), WithShards(1), WithTick(tick))
		require.NoError(t, err)
		fired, free := make(chan struct{}), make(chan struct{})
		defer func() { close(free); w.Stop() }()
		held := make(chan struct{})
		_, err = w.AfterFunc(100*time.Millisecond, func() {
			close(held)
			select { // the worker is held until the later timer fired
			case <-fired:
			case <-free:
			}
		})
		require.NoError(t, err)
		<-held
		synctest.Wait()
		t0 := time.Now()
		_, err = w.AfterFunc(100*time.Millisecond, func() { runtime.Goexit() })
		require.NoError(t, err)
		var at time.Duration
		_, err = w.AfterFunc(400*time.Millisecond, func() { at = time.Since(t0); close(fired) })
		require.NoError(t, err)
		select {
		case <-fired:
		case <-time.After(time.Minute):
			t.Fatal("the timer after the Goexit never fired: nobody kept time")
		}
		require.GreaterOrEqual(t, at, 400*time.Millisecond)
		require.LessOrEqual(t, at, 400*time.Millisecond+tick, "fired %v late", at-400*time.Millisecond)
		require.Zero(t, w.Stop())
		st := w.Stats()
		require.Equal(t, uint64(3), st.Fired, "%+v", st)
		require.Equal(t, st.Fired, st.Lateness.Count())
	})
}
