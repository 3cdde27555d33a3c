package shardwheel

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// armOn is schedule on shard k (internal tests): the tests choose the shard instead of the P's token.
func armOn(t *testing.T, w *Wheel, k int, d time.Duration, f func(any), arg any) Timer {
	s := w.shards[k]
	i, e, gen := s.slab.newEntry(false)
	if e == nil {
		t.Fatal("slab full")
	}
	e.f, e.arg = f, arg
	when := w.deadline(d)
	e.when.Store(when)
	if ok, _ := s.send(i, gen, opAdd); !ok {
		t.Fatal("closed")
	}
	s.scheduled.Inc()
	s.noteDeadline(when)
	return Timer{s: s, i: i, gen: gen}
}

func spinFor(d time.Duration) {
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

// TestExpiryFloodDoesNotStarveOtherShards (found by review): a flood on shard 0 whose callbacks
// keep the workers busy, and one timer on shard 1 due shortly after the flood starts. An
// advancer of shard 0 that claimed it again after each step's callbacks whenever the claim was
// free (it nearly always is: the step is short, the callbacks long) never went back to its loop:
// nobody kept time, and shard 1 waited for the whole flood. Now an advancer goes on only while
// another worker keeps time and nothing is queued, so the sentinel fires long before the flood
// is over, whatever the number of workers.
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

// TestExpiryKeptShardNotStuckBehindCallbacks (found by review): the keeper claims two shards at
// one tick while no worker is idle, keeps both, and runs the first one's step, whose callback
// blocks. The second shard waited for its turn claimed as advancing, which no keeper may take
// over: a worker that came free meanwhile could not reach it, and its timer waited for the
// blocked callback. It now waits as running, published, and the free worker takes it over.
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
// are cascaded at their bucket's start, so on the system clock the shard's next has to say so.
// It said only what the producers noted, their deadlines: the keeper then slept until a flood
// came due and only then re-inserted it one level down, one entry at a time, before the first
// callback could run (a million timers armed 1.5 s ahead started firing 10 to 18 ms late). Two
// such drains: a producer's whose ring is full, and the trimmer's (found by review).
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

// TestManualCallbackArmedDueNowWaitsWithStaleShard (found by review): with a manual clock a
// d <= 0 timer armed by a callback fires at the next Advance, not in the same one. A producer's
// own drain on a shard idle since tick 0 used to note the start of a level-2 bucket (4096) in
// next, below the tick of the round that ran the callback (4106): Advance took a round at 4096,
// and then one at 4106 again, which ran the new timer.
func TestManualCallbackArmedDueNowWaitsWithStaleShard(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clock), WithShards(2), WithRingSize(8), WithWorkers(0))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	fired := false
	armOn(t, w, 0, 4106*time.Millisecond, func(any) {
		armOn(t, w, 1, 0, func(any) { fired = true }, nil)
		for i := 0; i < 20; i++ { // fill shard 1's ring: its producer drains it
			armOn(t, w, 1, 100*time.Millisecond, func(any) {}, nil)
		}
	}, nil)
	clock.Advance(4106 * time.Millisecond)
	if fired {
		t.Errorf("a d=0 timer armed by a callback of this Advance fired in the same Advance")
	}
	clock.Advance(0)
	if !fired {
		t.Errorf("the d=0 timer did not fire at the next Advance")
	}
}

// TestExpiryReleaseLaterLeavesWakeToTheKeeper (a review's repro): W1 lets go of the role with
// releaseLater and pauses before it looks at wake; W2 takes the role and pauses before its
// select; a producer arms a deadline earlier than W2's target, and its signal lands in wake's
// buffer without a nudge (the role is held). W1 once found that token and took it, and W2 slept
// until its own target (here seconds) and fired the timer late; now releaseLater never takes a
// token, and W2 finds it.
func TestExpiryReleaseLaterLeavesWakeToTheKeeper(t *testing.T) {
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

// TestExpiryDeadlineNotedWhileKeeperReleases (a review's finding): the keeper claims one due
// shard and, between collect and releaseLater's store of target, a producer arms an earlier
// deadline on another shard. That producer reads target awake and does not signal; the keeper's
// callback then blocks (one callback: no hurry), so nobody would keep time until the watchdog, a
// tick later. releaseLater reads every group once more after its store and nudges the other
// worker, which fires the new timer on time.
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
