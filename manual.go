package shardwheel

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/atomic"
)

// ManualClock is a Clock that moves only when Advance is called, for deterministic tests. A Wheel
// built WithClock(m) reads time only from m and has no keeper: Advance itself advances the wheels,
// on the caller's goroutine.
type ManualClock struct {
	start   time.Time
	elapsed atomic.Int64 // nanoseconds since start; saturates at math.MaxInt64

	// workers holds the goroutine ids of the workers of every wheel made on this clock, from their
	// start to their exit (also after their wheel stopped): an Advance on one of them is a
	// callback's, which must never wait for another goroutine's advance (inCallback).
	workers goroutineSet

	mu     sync.Mutex // guards wheels and inAdvance; taken alone, never with another lock
	wheels []*Wheel   // the wheels Advance advances: made on this clock and not stopped
	// inAdvance counts, per goroutine id, the Advance calls in progress on it: a call on a
	// goroutine already inside Advance is a callback's, and returns at once.
	inAdvance map[int64]int
}

// NewManualClock returns a manual clock that reads start until it is advanced.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{start: start}
}

// Now returns the start time plus every duration passed to Advance.
func (c *ManualClock) Now() time.Time { return c.start.Add(time.Duration(c.elapsed.Load())) }

func (c *ManualClock) isClock() {}

// Advance moves the clock forward by d and, before it returns, dispatches every timer of every
// wheel on this clock whose deadline is at or before the new time, in order of deadline rounded up
// to the tick (ties in any order), across wheels too: each round takes the earliest instant any
// wheel has due, and gives every wheel due by then its round. With WithWorkers(0) those callbacks
// have also run, on this goroutine. Advance(0) dispatches timers that are already due (d <= 0). A
// jump of years costs one step per non-empty bucket, not per tick. The clock saturates at
// math.MaxInt64 nanoseconds past its start, the end of time, where every timer is due.
//
// Advance panics if d is negative: time does not go backwards. Called from a callback while another
// Advance of the wheel (or of another wheel on this clock) is in progress, it moves the clock and
// returns at once; the Advance in progress goes on to the new time before it returns. A timer
// armed with d <= 0 by a callback of this Advance is due at the clock's new time: it fires in this
// Advance if the callback ran in a round at an earlier instant, and at the next Advance if it ran
// in the round at the new time (else a callback that re-arms itself would keep Advance from
// returning).
func (c *ManualClock) Advance(d time.Duration) {
	if d < 0 {
		panic(fmt.Sprintf("shardwheel: ManualClock.Advance(%v): duration must not be negative", d))
	}
	for {
		old := c.elapsed.Load()
		if c.elapsed.CompareAndSwap(old, satAddNanos(old, int64(d))) {
			break
		}
	}
	self := goid()
	c.mu.Lock()
	if c.inAdvance[self] > 0 {
		// A callback that an Advance on this goroutine runs: that Advance (and the rounds it is
		// part of) reads the clock again and goes on to the new time before it returns.
		c.mu.Unlock()
		return
	}
	if c.inAdvance == nil { // a zero ManualClock is a clock at the zero time, as NewManualClock's
		c.inAdvance = map[int64]int{}
	}
	c.inAdvance[self]++
	ws := slices.Clone(c.wheels)
	c.mu.Unlock()
	defer c.leave(self) // also as a callback's runtime.Goexit unwinds this goroutine
	if len(ws) == 1 {
		ws[0].manualAdvance(never, self)
		if c.attached() == 1 {
			return
		}
		// A callback made another wheel on this clock meanwhile: it gets its rounds too.
	}
	c.rounds(self)
}

// leave ends an Advance on goroutine g.
func (c *ManualClock) leave(g int64) {
	c.mu.Lock()
	if c.inAdvance[g]--; c.inAdvance[g] == 0 {
		delete(c.inAdvance, g)
	}
	c.mu.Unlock()
}

// attached returns the number of wheels Advance advances.
func (c *ManualClock) attached() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.wheels)
}

// rounds advances several wheels on this clock in rounds, so that their timers fire in order of
// deadline across wheels, and a timer that one wheel's callback arms at once on another fires in
// the same Advance. Each round reads the clock (T) and each wheel's next round instant (nextRound,
// on the clock's scale), takes the earliest (R), and advances every wheel due by R to R. As within
// one wheel, a round never takes the instant of the round before it again unless the clock moved
// since: what is due there then was armed at once by the round's own callbacks, and waits for the
// next Advance. The wheels are looked up afresh each round: a callback may make one, or stop one.
//
// A wheel whose due timers another goroutine's Advance has already taken into its batch looks
// idle here. So, once nothing is due, if another Advance is in progress, each wheel's advMu is
// taken once more, which waits for that batch, and what is due by then is dispatched: Advance
// returns only when everything due has been. A callback's Advance (a worker's) does not wait: it
// returned counting on the holder.
func (c *ManualClock) rounds(self int64) {
	lastR, lastT := int64(-1), int64(-1)
	for {
		c.mu.Lock()
		ws := slices.Clone(c.wheels)
		others := len(c.inAdvance) > 1
		c.mu.Unlock()
		t := c.elapsed.Load()
		r, due := int64(never), false
		for _, w := range ws {
			if x, ok := w.nextRound(); ok && x <= r {
				r, due = x, true
			}
		}
		if !due || r == lastR && t == lastT {
			if others && !c.inCallback(self) {
				for _, w := range ws {
					w.manualAdvance(never, self)
				}
			}
			return
		}
		lastR, lastT = r, t
		for _, w := range ws {
			if x, ok := w.nextRound(); ok && x <= r {
				w.manualAdvance(r, self)
			}
		}
	}
}

// nextRound returns the instant, on its manual clock's scale (nanoseconds since the clock's start),
// of the wheel's next round (its earliest next rounded up to the tick, or the clock's time if that
// is sooner), and false if nothing is due by the clock's time or the wheel is stopped.
func (w *Wheel) nextRound() (int64, bool) {
	if w.closed.Load() {
		return 0, false
	}
	now, m := w.nanos(), w.minNext()
	if m > now || m == never && now != never {
		// Nothing due; but at the end of time a wheel whose timers saturated there (and left
		// next at never) is due, as an advance takes it with one wheel.
		return 0, false
	}
	return satAddNanos(min(now, w.ceil(m)), w.manualBase), true
}

// minNext returns the earliest next over all shards.
func (w *Wheel) minNext() int64 {
	m := int64(never)
	for _, s := range w.shards {
		m = min(m, s.next.Load())
	}
	return m
}

// inCallback reports whether goroutine g is a worker of a wheel on this clock, and so may be
// running a callback: an Advance there must not wait for another goroutine's advance, which may
// be waiting for room in a queue that g's wheel's workers empty, or for g itself.
func (c *ManualClock) inCallback(g int64) bool { return c.workers.has(g) }

func (c *ManualClock) attach(w *Wheel) {
	c.mu.Lock()
	c.wheels = append(c.wheels, w)
	c.mu.Unlock()
}

// detach takes a stopping wheel off the clock: Advance no longer advances it.
func (c *ManualClock) detach(w *Wheel) {
	c.mu.Lock()
	if i := slices.Index(c.wheels, w); i >= 0 {
		c.wheels = slices.Delete(c.wheels, i, i+1) // clears the vacated slot: no reference kept
	}
	c.mu.Unlock()
}

// manualAdvance advances the wheel to its manual clock's time, or to limit (an instant on the
// clock's scale) if that is sooner: rounds gives each wheel its rounds one instant at a time. self
// is the calling goroutine, inside Advance.
//
// A call from a worker's callback (of any wheel on the clock) while another goroutine holds advMu
// must not wait for it: that advance may be waiting for room in the queue that this very worker
// empties. It sets rerun and returns; the holder advances again before it lets go, or after
// (unlockAdvance).
func (w *Wheel) manualAdvance(limit, self int64) {
	if !w.advMu.TryLock() {
		if !w.manual.inCallback(self) {
			w.advMu.Lock()
		} else {
			w.rerun.Store(true)
			if !w.advMu.TryLock() {
				return // the holder sees rerun before it lets go, or after
			}
		}
	}
	w.advanceHeld(limit, self)
}

// advanceHeld is manualAdvance with advMu held; it returns having let go of it. A callback that
// calls runtime.Goexit on this goroutine (WithWorkers(0), or a task run here) ends it inside the
// advance, after the rest of its batch ran (runFrom, dispatch); the deferred call lets go of
// advMu, so that the next Advance and Stop do not wait for it, and runs what a worker's Advance
// asked for meanwhile, to the clock's time (the rounds that would have gone on from limit end with
// this goroutine).
func (w *Wheel) advanceHeld(limit, self int64) {
	onWorker := w.manual.inCallback(self)
	held := true
	defer func() {
		if held {
			w.advancer.Store(0)
			clear(w.batch)
			w.batch = w.batch[:0]
			if w.unlockAdvance() {
				w.advanceHeld(never, self)
			}
		}
	}()
	for {
		w.rerun.Store(false)
		if !w.closed.Load() {
			w.advancer.Store(self)
			w.manualRounds(onWorker, limit)
			w.advancer.Store(0)
			w.trimIdle(w.nanos())
		}
		if w.rerun.Load() && !w.closed.Load() {
			continue
		}
		held = false
		if !w.unlockAdvance() {
			return
		}
		held = true
	}
}

// unlockAdvance lets go of advMu, and reports whether it took it back to advance again: a worker's
// Advance asked for a rerun and found advMu held, and this goroutine is the one to see it.
//
// Once the wheel is closed, it closes quit: the workers then run what is left in the queue and
// exit. With a manual clock only the holder of advMu queues work (dispatch), and no advance runs
// after Stop, so quit may close once a holder of advMu has seen closed. That is the holder that
// lets go after Stop's CAS: each holder looks at closed again after its Unlock, and if the wheel
// closed meanwhile, takes advMu back to close quit unless another goroutine holds it, which will
// look in turn; Stop itself takes advMu if it is free (stop.go). With the wheel closed it never
// reports true.
func (w *Wheel) unlockAdvance() bool {
	for {
		if w.closed.Load() {
			w.closeQuit()
		}
		w.advMu.Unlock()
		if w.closed.Load() {
			if isClosed(w.quit) || !w.advMu.TryLock() {
				return false
			}
			continue
		}
		return w.rerun.Load() && w.advMu.TryLock()
	}
}

// closeQuit closes quit, once.
func (w *Wheel) closeQuit() { w.quitOnce.Do(func() { close(w.quit) }) }

// manualRounds fires every timer due by the manual clock's time, or by limit, an instant on the
// clock's scale (never: no limit). Each round reads the clock, takes the earliest instant m that any
// shard may have due, rounds it up to the tick (r, or the clock's time if that is sooner), advances
// every shard whose next is at or before r to r, and dispatches what fired; so timers fire in order
// of their deadline rounded up to the tick across shards (m is a lower bound of every pending
// deadline, so all that a round fires round up to r's tick). One round per tick, not per deadline:
// a round per distinct deadline made an Advance over 100k timers spread over 100 ms about 20x
// slower. Only the holder of advMu calls it.
//
// A round never takes the instant of the round before it again unless the clock has moved since:
// what is due there then was armed by the round's own callbacks (d <= 0), and it waits for the next
// Advance, so that a callback that re-arms itself at once cannot keep Advance from returning. A
// shard kicked by a late publish (next set to 0) gets its drain round in between. onWorker says
// that the caller is a worker (Advance from a callback), which must never wait for room in the
// queue that it alone may be there to empty (dispatch).
func (w *Wheel) manualRounds(onWorker bool, limit int64) {
	lastNow, lastM := int64(-1), int64(-1)
	for {
		now := w.nanos()
		if limit != never {
			now = min(now, limit-w.manualBase)
		}
		m := w.minNext()
		if m > now || m == lastM && now == lastNow {
			return
		}
		lastNow, lastM = now, m
		w.takeRound(min(now, w.ceil(m)))
		if len(w.batch) == 0 && m == never {
			return // at the end of time, empty shards look due: nothing is
		}
		if len(w.batch) > 0 {
			w.pool.advancerSlot().taken.Add(uint64(len(w.batch)))
			w.dispatch(w.batch, onWorker)
			clear(w.batch)
			w.batch = w.batch[:0]
		}
		if w.closed.Load() {
			return // Stop drops what is left
		}
	}
}

// takeRound advances every shard whose next is at or before r to r, into w.batch.
func (w *Wheel) takeRound(r int64) {
	for _, s := range w.shards {
		if s.next.Load() > r {
			continue
		}
		s.mu.Lock()
		s.advanceLocked(r, 0)
		w.batch = append(w.batch, s.fired...)
		clear(s.fired)
		s.fired = s.fired[:0]
		s.mu.Unlock()
	}
}

// dispatch hands a batch of fired entries to the workers, or runs them here with WithWorkers(0).
// Only manualRounds calls it, with no lock held but advMu. A batch is cut into tasks so that each
// worker gets a share: one entry per task when few timers fire, up to taskCap in a flood.
//
// A task the queue has no room for runs here with CallerRuns, on a worker (onWorker: Advance from
// a callback, whose worker may be the only one there to make room), and once the wheel has
// stopped (a callback waiting for another that is in this batch, both having called Stop, must
// not wait for room that the first one's worker would make). Otherwise, with Block, dispatch
// waits for room.
func (w *Wheel) dispatch(batch []ref, onWorker bool) {
	sl := w.pool.advancerSlot()
	if w.pool.queue == nil {
		w.runBatch(batch, sl)
		return
	}
	wait := w.opts.policy == Block && !onWorker
	per := max(1, min(w.pool.taskCap, len(batch)/len(w.pool.done)))
	// batch[next:] is neither handed out nor run. A callback of a task run here that calls
	// runtime.Goexit ends this goroutine after the rest of its task ran (runFrom); the deferred
	// call runs the rest of the batch here too, as the goroutine unwinds.
	next := 0
	defer func() {
		if next < len(batch) {
			w.runBatch(batch[next:], sl)
		}
	}()
	for i := 0; i < len(batch); i += per {
		next = min(i+per, len(batch))
		t := newTask(batch[i:next])
		if w.offer(t) {
			continue
		}
		if !wait || isClosed(w.stopped) {
			w.runTaskRefs(t, sl)
			continue
		}
		select {
		case w.pool.queue <- t:
		case <-w.stopped:
			w.runTaskRefs(t, sl)
		}
	}
}
