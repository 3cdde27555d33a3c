package shardwheel

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"go.uber.org/atomic"
)

// never is the instant of "no deadline": an empty shard's next, an idle keeper's target.
// It doubles as the end of time (the clock saturates there), so a timer at the end of time fires
// when a manual clock is advanced that far.
const never = math.MaxInt64

// awake is the target while no keeper sleeps: producers never signal then.
const awake = math.MinInt64

// A Clock is the time source of a Wheel. Its method set is the package's own: the system's
// monotonic clock (the default) and *ManualClock are the implementations, and WithClock accepts
// only those (a type that embeds a *ManualClock has the method set too, and is refused).
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	isClock()
}

// systemClock is the default Clock: time.Now for Now, and for the wheel the monotonic reading
// time.Since(base), which costs one vDSO read (time.Now costs two). A change of the system's
// wall clock changes nothing: only monotonic readings decide firing.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
func (systemClock) isClock()       {}

// ManualClock is a Clock that moves only when Advance is called, for deterministic tests. A
// Wheel built WithClock(m) reads time only from m and has no keeper: Advance itself
// advances the wheels, on the caller's goroutine.
type ManualClock struct {
	start   time.Time
	elapsed atomic.Int64 // nanoseconds since start; saturates at math.MaxInt64

	mu     sync.Mutex // guards wheels, leaving and inAdvance
	wheels []*Wheel
	// leaving holds the wheels whose Stop has detached them and not yet returned: their workers
	// may still run callbacks, which count as on the clock for inCallback (review 35).
	leaving []*Wheel
	// inAdvance counts, per goroutine (goid), the Advance calls in progress on it: a call on a
	// goroutine already inside Advance is a callback's, and returns at once (review 35: the
	// wheel whose advance runs the callback may have been stopped and detached by it).
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
// wheel on this clock whose deadline is at or before the new time, in order of deadline rounded
// up to the tick (ties in any order), across wheels too: each round takes the earliest instant
// any wheel has due, and gives every wheel due by then its round. With WithWorkers(0) those
// callbacks have also run, on this goroutine. Advance(0) dispatches timers that are already due
// (d <= 0). A jump of years costs one step per non-empty bucket, not per tick. The clock
// saturates at math.MaxInt64 nanoseconds past its start, the end of time, where every timer is
// due.
//
// Advance panics if d is negative: time does not go backwards. Called from a callback while
// another Advance of the wheel (or of another wheel on this clock) is in progress, it moves the
// clock and returns at once; the Advance in progress goes on to the new time before it returns.
// A timer armed with d <= 0 by a callback of this Advance is due at the clock's new time: it
// fires in this Advance if the callback ran in a round at an earlier instant, and at the next
// Advance if it ran in the round at the new time (else a callback that re-arms itself would keep
// Advance from returning).
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
		// part of) re-reads the clock and goes on to the new time before it returns.
		c.mu.Unlock()
		return
	}
	if c.inAdvance == nil {
		c.inAdvance = make(map[int64]int)
	}
	c.inAdvance[self]++
	ws := append([]*Wheel(nil), c.wheels...)
	c.mu.Unlock()
	defer c.leave(self) // also as a callback's runtime.Goexit unwinds this goroutine
	if len(ws) == 1 {
		ws[0].advanceManual(never, self)
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

// attached returns the number of wheels on the clock.
func (c *ManualClock) attached() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.wheels)
}

// rounds advances several wheels on this clock in rounds, so that their timers fire in order of
// deadline across wheels (review 33: advanced one after another, a wheel's later timers ran
// before another's earlier ones, and a timer that a later wheel's callback armed at once on an
// earlier wheel waited for the next Advance). Each round reads the clock (T) and each wheel's
// next round instant (nextRound, on the clock's scale), takes the earliest (R), and advances
// every wheel due by R to R (advanceManual's limit). As within one wheel, a round never takes
// the instant of the round before it again unless the clock moved since: what is due there then
// was armed at once by the round's own callbacks, and waits for the next Advance. The wheels are
// looked up afresh each round: a callback may make one, or stop one.
//
// A wheel whose due timers another goroutine's Advance has already taken into its batch looks
// idle here. So, once nothing is due, if another Advance is in progress, each wheel's advMu is
// taken once more (advanceManual), which waits for that batch, and what is due by then is
// dispatched: as with one wheel, Advance returns only when everything due has been (review 35).
// A callback's Advance (a worker's) does not wait: it returned counting on the holder.
func (c *ManualClock) rounds(self int64) {
	lastR, lastT := int64(-1), int64(-1)
	for {
		c.mu.Lock()
		ws := append([]*Wheel(nil), c.wheels...)
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
					w.advanceManual(never, self)
				}
			}
			return
		}
		lastR, lastT = r, t
		for _, w := range ws {
			if x, ok := w.nextRound(); ok && x <= r {
				w.advanceManual(r, self)
			}
		}
	}
}

// nextRound returns the instant, on its manual clock's scale (nanoseconds since the clock's
// start), of the wheel's next round of advance (advance: its earliest next rounded up to the
// tick, or the clock's time if that is sooner), and false if nothing is due by the clock's time
// or the wheel is stopped.
func (w *Wheel) nextRound() (int64, bool) {
	if w.closed.Load() {
		return 0, false
	}
	now, m := w.nanos(), w.minNext()
	if m > now || m == never && now != never {
		// Nothing due; but at the end of time a wheel whose timers saturated there (and left
		// next at never) is due (review 35), as advance takes it with one wheel.
		return 0, false
	}
	return satAddNanos(min(now, w.ceil(m)), w.manualBase), true
}

// inCallback reports whether goroutine g may be running a callback of a wheel on this clock (or
// of one whose Stop is in progress), as one of its workers: an Advance there must not wait for
// another wheel's advMu, whose holder may be waiting for room in the queue that g's wheel's
// workers empty, or for g itself; nor for room in another wheel's queue (advanceManual's
// onWorker).
func (c *ManualClock) inCallback(g int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ws := range [2][]*Wheel{c.wheels, c.leaving} {
		for _, w := range ws {
			if w.isWorker(g) {
				return true
			}
		}
	}
	return false
}

func (c *ManualClock) attach(w *Wheel) {
	c.mu.Lock()
	c.wheels = append(c.wheels, w)
	c.mu.Unlock()
}

// detach takes a stopping wheel off the clock: Advance no longer advances it. It stays in leaving
// until its Stop has finished (forget), while its workers may still run callbacks.
func (c *ManualClock) detach(w *Wheel) {
	c.mu.Lock()
	if i := slices.Index(c.wheels, w); i >= 0 {
		c.wheels = slices.Delete(c.wheels, i, i+1) // clears the vacated slot: no reference kept
		c.leaving = append(c.leaving, w)
	}
	c.mu.Unlock()
}

// forget drops a stopped wheel from leaving: its workers have exited.
func (c *ManualClock) forget(w *Wheel) {
	c.mu.Lock()
	if i := slices.Index(c.leaving, w); i >= 0 {
		c.leaving = slices.Delete(c.leaving, i, i+1)
	}
	c.mu.Unlock()
}

// nanos returns the monotonic time since the wheel started, in nanoseconds, saturating at
// math.MaxInt64.
//
// Where a coarse reading is safe and where it is not: the firing side may use a stale (early)
// reading, since that only fires later; so the keeper reads the time once per wake. A
// producer must never compute a deadline from a stale reading (that fires early, and with no
// empty ticks the keeper may have slept for an hour), so AfterFunc and Reset read the
// monotonic clock themselves.
func (w *Wheel) nanos() int64 {
	if w.manual != nil {
		e := w.manual.elapsed.Load()
		if e == math.MaxInt64 {
			// The clock's end of time is every wheel's, also of one made after the clock had
			// moved (manualBase > 0): there every deadline, which saturates at math.MaxInt64,
			// is due (Advance's doc).
			return math.MaxInt64
		}
		return e - w.manualBase
	}
	return int64(time.Since(w.base))
}

// deadlineFrom returns the instant (ns on the wheel's clock) at which a timer armed at the
// reading now with delay d comes due: now+d, never early; a d <= 0 is due at once, and the next
// advance takes it. Any d up to math.MaxInt64 is accepted; a deadline past the end of time
// (math.MaxInt64 ns after the wheel started) saturates there, where a manual clock can reach
// it. AfterFunc and Reset pass a reading of their own (nanos), which they also hand to overdue.
func (w *Wheel) deadlineFrom(now int64, d time.Duration) int64 {
	if d <= 0 {
		return now
	}
	return satAddNanos(now, int64(d)) // the end of time, never a wrap
}

// satAddNanos adds two non-negative nanosecond counts, saturating at math.MaxInt64, the end of
// time.
func satAddNanos(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// advanceManual advances the wheel to its manual clock's time, or to limit (an instant on the
// clock's scale) if that is sooner: rounds gives each wheel its rounds one instant at a time.
// self is the calling goroutine, which is inside Advance and never the advancer of a wheel: a
// callback's Advance on the advancer's goroutine returned at once (inAdvance), and the deferred
// rerun below runs after advancer was cleared.
//
// A call from a worker's callback (of any wheel on the clock) while another goroutine advances
// must not wait for advMu either: that advance may be blocked handing a batch to the very worker
// (Block policy), or to a worker that waits for this one. It sets rerun and returns; whoever
// holds advMu advances again before it lets go, and after letting go takes advMu back if rerun
// was set meanwhile (if TryLock fails, the new holder sees rerun).
func (w *Wheel) advanceManual(limit, self int64) {
	if !w.advMu.TryLock() {
		if w.manual.inCallback(self) {
			w.rerun.Store(true)
			if !w.advMu.TryLock() {
				return // the holder sees rerun before it lets go, or after (below)
			}
		} else {
			w.advMu.Lock()
		}
	}
	// A callback that calls runtime.Goexit on this goroutine (WithWorkers(0), or a chunk that
	// CallerRuns runs here) ends it inside advance, after the rest of its batch ran (runFrom).
	// The deferred call lets go of what the advance held, so that the next Advance and Stop do
	// not wait for it, and empties w.batch, whose entries ran (dispatch, runFrom) and must not
	// be dispatched again. What is still due fires at the next Advance, or now, on this
	// goroutine as it unwinds, if a worker's Advance asked for a rerun meanwhile (it returned
	// counting on this holder, as below).
	held := true // advMu is held
	defer func() {
		if !held {
			return
		}
		clear(w.batch)
		w.batch = w.batch[:0]
		w.advancer.Store(0)
		if w.closed.Load() {
			w.advancesOver() // a Stop in a callback of this advance waits no more for it
		}
		w.advMu.Unlock()
		if w.rerun.Load() && !w.closed.Load() {
			// To the clock's time, not limit: the rounds that would have gone on from limit
			// end with this goroutine (review 35).
			w.advanceManual(never, self)
		}
	}()
	onWorker := w.manual.inCallback(self) // a worker of any wheel on the clock (review 35)
	for {
		w.rerun.Store(false)
		if !w.closed.Load() {
			w.advancer.Store(self)
			w.advance(onWorker, limit)
			w.trimIdle(w.nanos()) // issue 11: give idle chunks back (trim.go)
			w.advancer.Store(0)
		}
		if w.closed.Load() {
			// Stop began: the rest of the batch ran, and no advance of this wheel runs
			// callbacks again (a Stop on this goroutine did not close advOver: shardwheel.go).
			w.advancesOver()
		}
		if w.rerun.Load() && !w.closed.Load() {
			continue
		}
		held = false
		w.advMu.Unlock()
		if !w.rerun.Load() || w.closed.Load() || !w.advMu.TryLock() {
			return
		}
		held = true
	}
}

// advance fires every timer due by the manual clock's time. Each round reads the clock, takes
// the earliest instant m that any shard may have due, rounds it up to the tick (r, or the clock's
// time if that is sooner), advances every shard whose next is at or before r to r, and dispatches
// what fired; so timers fire in order of their deadline rounded up to the tick across shards (m
// is a lower bound of every pending deadline, so all that a round fires round up to r's tick).
// One round per tick, not per deadline: deadlines are exact, and a round per distinct deadline
// made an Advance over 100k timers spread over 100 ms about 20x slower. A round that
// finds nothing (a stale next) costs one lock per such shard; none are taken when nothing is
// due. Only the manual advancer (Advance under advMu) calls it; the system clock's expiry side
// is expiry.go.
//
// A round never takes the instant of the round before it again unless the clock has moved since:
// what is due there then was armed by the round's own callbacks (d <= 0), and it waits for the
// next Advance, so that a callback that re-arms itself at once cannot keep Advance from
// returning. A shard kicked by a late publish (next set to 0) gets its drain round in between.
// onWorker says that the caller is one of the wheel's workers (Advance from a callback), which
// must never wait for room in the queue that it alone may be there to empty (dispatch). No
// round goes past limit, an instant on the clock's scale (never: no limit).
func (w *Wheel) advance(onWorker bool, limit int64) {
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
		r := min(now, w.ceil(m))
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
		if len(w.batch) == 0 && m == never {
			return // at the end of time, empty shards look due: nothing is
		}
		if len(w.batch) > 0 {
			w.dispatch(w.batch, onWorker)
			clear(w.batch)
			w.batch = w.batch[:0]
		}
		if w.closed.Load() {
			return // Stop drops what is left
		}
	}
}

// ticks is the tick arithmetic of a Wheel: instants (ns on its clock) against ticks, saturating
// at the end of time. Immutable; the Wheel and each shard's wheel hold the same value.
type ticks struct {
	tick      int64 // nanoseconds per tick: the width of a bucket of level 0
	lastStart int64 // the last tick whose start is below the end of time, math.MaxInt64/tick
	// grain is what a wake for a deadline inside a tick is rounded up to: tick/grainsPerTick on
	// the system clock, so that a bucket is visited at most about grainsPerTick times in its
	// tick however its deadlines are spread (wheel.nextDue); 1 on a manual clock, whose Advance
	// fires everything at or before its time.
	grain int64
}

// newTicks returns the arithmetic of a tick of that many nanoseconds, on a manual clock or not.
func newTicks(tick int64, manual bool) ticks {
	k := ticks{tick: tick, lastStart: math.MaxInt64 / tick, grain: max(tick/grainsPerTick, 1)}
	if manual {
		k.grain = 1
	}
	return k
}

// start returns the instant at which tick t begins, saturating at the end of time.
func (k ticks) start(t int64) int64 {
	if t > k.lastStart {
		return math.MaxInt64
	}
	return t * k.tick
}

// end returns the instant at which tick t ends (the start of the next), saturating.
func (k ticks) end(t int64) int64 {
	if t >= k.lastStart {
		return math.MaxInt64
	}
	return k.start(t + 1)
}

// ceil returns deadline ns rounded up to the tick: the start of the tick it rounds up to (ns
// itself on a tick boundary), saturating at the end of time.
func (k ticks) ceil(ns int64) int64 {
	t := ns / k.tick
	if ns%k.tick != 0 {
		t++
	}
	return k.start(t)
}

// minNext returns the earliest next over all shards.
func (w *Wheel) minNext() int64 {
	m := int64(never)
	for _, s := range w.shards {
		if n := s.next.Load(); n < m {
			m = n
		}
	}
	return m
}
