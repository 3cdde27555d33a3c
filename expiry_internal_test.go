package shardwheel

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// armOn is schedule on shard k (internal tests): the tests choose the shard instead of the P's token.
func armOn(t *testing.T, w *Wheel, k int, d time.Duration, f func(any), arg any) Timer {
	s := w.shards[k]
	i, e, gen := s.slab.newEntry()
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
