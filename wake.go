package shardwheel

import (
	"math"

	"go.uber.org/atomic"
)

// How a deadline reaches the keeper on the system clock (the keeper's side is expiry.go).
//
// Each shard publishes a lower bound of its next deadline (shard.next); each group of up to
// groupSize shards a lower bound of its shards' (group.next); the keeper sleeps until the
// earliest group's, an instant it publishes in Wheel.target. A producer whose deadline is
// earlier than what it finds lowers the shard's and the group's bound with a CAS-min and, if its
// deadline is before the target, signals the keeper (noteDeadline). So the keeper's cost per wake
// is one read per group (a sixty-fourth of the shards) plus the shards of the groups that are due.

// awake is the target while no keeper sleeps: producers never signal then.
const awake = math.MinInt64

// groupSize is the most shards one group summarises.
const groupSize = 64

// group is the keeper's summary of consecutive shards.
type group struct {
	// next is a lower bound of the next of every shard of the group that no worker has taken to
	// advance (ns). Atomic: lowered by CAS-min by producers (noteDeadline), by advancers as they
	// let go of a shard (publishGroup) and by the keeper's collect; stored (never) only by the
	// keeper, in collect, before it reads the shards.
	next   atomic.Int64
	shards []*shard // immutable
	_      [cacheLineSize - 8 - 24]byte
}

// newGroups makes the groups of shards.
func newGroups(shards []*shard) []group {
	gs := make([]group, (len(shards)+groupSize-1)/groupSize)
	for i := range gs {
		g := &gs[i]
		g.next.Store(never)
		g.shards = shards[i*groupSize : min((i+1)*groupSize, len(shards))]
		for _, s := range g.shards {
			s.g = g
		}
	}
	return gs
}

// noteDeadline lowers s.next to when (ns), then the group's next, and wakes the keeper if when is
// earlier than the moment it sleeps until. A producer calls it after its command is published; a
// drain outside an advance with the wheel's next due moment (shard.drainNoteLocked); kick with 0.
//
// Why no wake-up is lost (the keeper's steps are in Wheel.keep and collect):
//  1. s.next before g.next: the keeper, recomputing a group, first stores never in g.next and
//     then reads each s.next. A producer whose s.next store that read missed makes its CAS on
//     g.next after the keeper's store, so the lower value stays in g.next.
//  2. If s.next was already at or below when, so is g.next; or the producer that lowered s.next
//     is about to lower g.next too; or the shard is being advanced or its group recomputed, and
//     both of those publish s.next into g.next when they finish.
//  3. g.next before target: the keeper stores the target it will sleep until and then reads every
//     g.next once more. If this producer read an older target, its CAS on g.next came before
//     that second read, which sees it; otherwise it reads the final target and signals if it is
//     earlier. While nobody keeps time the target is awake and nobody is signalled: the next
//     keeper reads every g.next before it sleeps. If a keeper lets go of the role for later
//     (yieldLater), it stores the watchdog's moment in target and then, with the role free,
//     reads every g.next once more: a producer that read awake before that store, or read the
//     watchdog's moment but saw the role still held, is seen there; one that saw the role free
//     signals, and signal nudges an idle worker. Target is also awake once a producer found it
//     passed (overdue): that producer has signalled or is about to, and until it does the
//     keeper's timer or the watchdog is still armed.
//
// The common case, a deadline no earlier than the shard's next, is one load, here, so that it
// inlines into every arm; lowerDeadline is the rest.
func (s *shard) noteDeadline(when int64) {
	if when < s.next.Load() {
		s.lowerDeadline(when)
	}
}

// lowerDeadline is noteDeadline past its first load: when may be below s.next.
func (s *shard) lowerDeadline(when int64) {
	if !lowerTo(&s.next, when) || !lowerTo(&s.g.next, when) {
		return
	}
	if when < s.w.target.Load() {
		s.w.signal()
	}
}

// lowerTo lowers v to when if it is above, and reports whether it did.
func lowerTo(v *atomic.Int64, when int64) bool {
	for {
		n := v.Load()
		if when >= n {
			return false
		}
		if v.CompareAndSwap(n, when) {
			return true
		}
	}
}

// publishGroup lowers the group's next to the shard's as the shard's advancer lets go of it, and
// signals the keeper if that is earlier than its target.
func (w *Wheel) publishGroup(s *shard) {
	n := s.next.Load()
	if lowerTo(&s.g.next, n) && n < w.target.Load() {
		w.signal()
	}
}

// minGroups returns the earliest next over all groups.
func (w *Wheel) minGroups() int64 {
	m := int64(never)
	for gi := range w.groups {
		m = min(m, w.groups[gi].next.Load())
	}
	return m
}

// signal wakes the keeper if it sleeps. Any goroutine may call it. While the role is free after
// yieldLater, target holds the watchdog's moment, so a producer whose deadline is earlier
// signals; nobody sleeps on wake then, so the signal nudges an idle worker to take the role (the
// next keeper spends the token at its first look).
func (w *Wheel) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
	if !w.keeper.Load() {
		w.nudgeIdle()
	}
}

// nudgeIdle wakes an idle worker to try for the keeper role. The channel holds one token: if it
// is full, a worker will take that token after this call, and so try for the role after it.
func (w *Wheel) nudgeIdle() {
	select {
	case w.nudge <- struct{}{}:
	default:
	}
}

// overdue wakes the keeper if the moment it sleeps until has passed at now, a producer's reading
// of the clock. AfterFunc and Reset call it with the reading they took for the deadline, so it
// costs one load of target on the common path.
//
// Why: the keeper sleeps on one runtime timer, which lives in the heap of the P that armed it.
// The runtime runs an idle P's timers only when an M wakes for them, and while another P is busy
// that can be milliseconds late (2.9 ms in a trace of the sustained load, the producers running
// on the other P throughout). Every arm is one more look, as every schedule is for the runtime's
// own timers. One producer signals per target: it moves target to awake with a CAS (the keeper
// stores awake itself when it wakes, so a CAS after that fails), and the others then find awake.
//
// Nothing is lost. Awake while a keeper still sleeps: the token this signal leaves is in wake,
// and the keeper's select takes it and reads every group. A CAS that lands while the role is free
// after yieldLater makes that a hand-over: signal nudges an idle worker; and if that signal still
// saw the role held, its load came before yieldLater's store that freed the role, so yieldLater's
// later reading of the clock (monotonic across cores) is past target too, and it nudges rather
// than arm the watchdog. Paused between its CAS and its signal, a producer leaves target awake
// with no token yet: a deadline noted meanwhile does not signal, and waits for the keeper's own
// timer or the watchdog, both still armed (TestExpiryOverdueGapCovered).
func (w *Wheel) overdue(now int64) {
	if t := w.target.Load(); t != awake && now >= t && w.target.CompareAndSwap(t, awake) {
		w.signal()
	}
}
