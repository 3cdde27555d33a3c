package shardwheel

import (
	"fmt"

	"go.uber.org/atomic"
)

// WithMaxPending's bound, striped over the shards so that no producer writes a counter shared by
// all of them (a pair wrote one twice when the bound was a single counter).
//
// The bound is a stock of credits: maxPending of them, each held by a pending timer, or free.
// A free credit sits in the Wheel's reserve (w.credit) or in one shard's stock (s.credit). A
// producer takes one from its shard's stock (one atomic add on the shard's producer line); a
// timer that ends (fires, is stopped or dropped) gives its credit back to its own shard's stock.
// A shard whose stock is empty refills it from the reserve, a batch at a time, and a shard whose
// stock has grown past two batches gives the surplus back. Only when both are empty does it
// collect free credits from every other shard's stock (steal), and only then may it refuse.
//
// Invariant: reserve + the sum of every stock + the timers holding a credit == maxPending, at all
// times, counting a credit in flight (taken from one counter, not yet added to another) as held.
// A credit is only ever taken by an operation that proves it was there (see take), so at most
// maxPending timers are ever pending: the bound is exact, with no slack. What may happen is the
// reverse, a refusal while fewer than maxPending are pending: for an instant, credits that another
// goroutine is moving from one counter to another are seen by neither; once the wheel is quiet,
// maxPending timers are always accepted.
//
// Any goroutine may pause between any two steps: a paused goroutine holds the credits it has
// taken, which is what the invariant counts, and nothing waits for it.

// errMaxPending is what scheduling past WithMaxPending returns: an ErrTooManyTimers that names
// the bound.
type errMaxPending struct{ limit int }

func (e errMaxPending) Error() string {
	return fmt.Sprintf("shardwheel: too many pending timers: WithMaxPending(%d) reached", e.limit)
}

func (errMaxPending) Unwrap() error { return ErrTooManyTimers }

// creditBatch is how many credits a shard takes from the reserve at once: a quarter of a fair
// share, at most 256, so that the stocks hold little of the bound while timers churn.
func creditBatch(maxPending, shards int) int64 {
	return min(max(int64(maxPending)/int64(4*shards), 1), 256)
}

// takeCredit takes one credit for a timer about to be scheduled on s; false if none is free.
// Only with WithMaxPending (s.limited): its caller, schedule, tests that first, inline.
//
// The fast path is one atomic add. A result below zero means the stock was empty: the add is
// undone (so a stock may read negative for an instant; take treats that as empty) and the slow
// path runs.
func (s *shard) takeCredit() bool {
	if s.credit.Dec() >= 0 {
		return true
	}
	s.credit.Inc()
	return s.takeCreditSlow()
}

// takeCreditSlow refills s's stock from the reserve, or from the other shards' stocks, keeping one
// credit for the caller.
func (s *shard) takeCreditSlow() bool {
	w := s.w
	batch := w.creditBatch
	if k := take(&w.credit, batch); k > 0 {
		s.credit.Add(k - 1)
		return true
	}
	for _, o := range w.shards { // rare: the bound is near
		if k := take(&o.credit, batch); k > 0 {
			s.credit.Add(k - 1)
			return true
		}
	}
	return false
}

// take removes up to n credits from c, only as many as it holds, and returns how many it took.
// It reads c and CASes it down: it takes k only from a value v >= k, and a value is never above
// the credits truly there (an add that found the stock empty makes it read lower, never higher),
// so the credits it takes exist.
func take(c *atomic.Int64, n int64) int64 {
	for {
		v := c.Load()
		if v <= 0 {
			return 0
		}
		k := min(v, n)
		if c.CompareAndSwap(v, v-k) {
			return k
		}
	}
}

// returnCredit gives back the credit of a timer of s that ended (fired or stopped). Without
// WithMaxPending it does nothing, and is small enough to inline into Timer.Stop's path.
func (s *shard) returnCredit() {
	if s.limited {
		s.returnCredits(1)
	}
}

// returnCredits gives back n credits to s's stock, with WithMaxPending set. A stock grown past two batches
// returns the surplus to the reserve, so that credits freed on one shard serve producers on the
// others.
func (s *shard) returnCredits(n int64) {
	w := s.w
	if v := s.credit.Add(n); v > 2*w.creditBatch {
		if k := take(&s.credit, v-w.creditBatch); k > 0 {
			w.credit.Add(k)
		}
	}
}

// returnToReserve gives back the credits of n timers that ended without a shard at hand (those
// Wheel.Stop dropped): to the reserve.
func (w *Wheel) returnToReserve(n int64) {
	if w.opts.maxPending != 0 {
		w.credit.Add(n)
	}
}
