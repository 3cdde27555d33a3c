package shardwheel

import (
	"runtime"

	"go.uber.org/atomic"
)

// The state word of an entry packs four fields into one uint64, so that every transition is one
// CAS that also proves the caller holds the current generation:
//
//	bits  0..3   state    (free, pending, firing, running, stopped, dropped, resetting, parked,
//	                      stopping, letting go, passed)
//	bit   4      queued   the arming's add command is in the ring: the shard has not taken it
//	bit   5      periodic the arming is an Every's: set with the gen and kept by every
//	                      transition, so that a worker tells a run from a one-shot without
//	                      reading f or arg (which a Stop may be clearing)
//	bits  6..25  version  bumped by every successful Reset (20 bits)
//	bits 26..63  gen      bumped each time the entry is taken from its slab (38 bits)
//
// A Timer remembers the gen it was armed with; a word with another gen belongs to a later owner
// of the entry, and the handle is inert. A gen repeats only after 2^38 armings of one entry: at 15M
// pairs a second re-arming one entry about once per ring of arms (the slab is last in, first out),
// that is about 200 days. Only a handle kept that long, and used at the wrong moment, could touch
// a later owner.
//
// The version makes a Reset visible to the shard's expiry CAS: the shard reads the word, then the
// deadline, then CASes the word it read, so a Reset that stored a new deadline in between makes
// that CAS fail and the shard reads again (shard.expire).
//
// The queued bit is set by whoever sends an add (the producer arming, or the worker re-arming an
// Every) with the move to pending, and cleared only by the shard as it takes that add. It saves a
// Stop that comes before the shard took the add (the common case: a timer stopped within a tick)
// the cancel command: the shard, taking the add, finds the entry stopped and frees it.
// Transitions keep the bit unless they say otherwise.
//
// Transitions, and who may make them:
//
//	free      -> pending    the producer, on an entry it took from its slab (a store: the next
//	                        gen, queued)
//	queued    -> not queued the shard, taking the add: it links a pending or resetting entry,
//	                        frees a stopped one, leaves a stopping one to its Stop
//	pending   -> resetting  Timer.Reset holds the entry while it stores the deadline,
//	resetting -> pending    and lets go with version+1 (a CAS). Meanwhile Stop and Wheel.Stop
//	                        yield, and the shard keeps the entry linked and unfired.
//	resetting -> parked     the shard, which found the entry held when its bucket came due: it
//	                        links it where no advance looks (timingWheel.park). The Reset's CAS
//	                        then fails, so it knows to send a command that moves the entry.
//	parked    -> pending    Timer.Reset, letting go (a store), before it sends that command
//	pending   -> stopped    Timer.Stop, not queued; it then sends a cancel, and the shard frees
//	                        the entry
//	pending   -> stopping   Timer.Stop, queued: it lets go of the callback, then
//	stopping  -> stopped    moves on with a CAS that keeps queued; the shard frees the entry as
//	                        it takes the add. If the shard took the add in between, the CAS
//	                        fails: Stop stores stopped and sends a cancel (Timer.stopQueued).
//	pending   -> firing     the shard, when the deadline is due; the entry leaves the wheel
//	pending   -> dropped    Wheel.Stop. Nobody frees a dropped entry: the wheel is garbage.
//	firing    -> letting go Timer.Stop of a callback not started: it lets go of the callback,
//	letting go-> stopped    then moves on with a CAS; the worker frees the entry as it comes to it
//	letting go-> passed     the worker, which came to the entry between the Stop's two steps: it
//	passed    -> stopped    leaves the entry, and the Stop, whose CAS failed, frees it
//	                        (Timer.stopFiring)
//	firing    -> free       the worker, just before a one-shot callback starts; it reads f and
//	                        arg only after this CAS, which no Stop can follow
//	firing    -> running    the worker, just before an Every's run starts
//	running   -> stopped    Timer.Stop during a run; the worker frees the entry after the run
//	running   -> dropped    Wheel.Stop during a run (its next run is dropped), or the worker, for a
//	                        run that starts after Wheel.Stop (there is no next run)
//	running   -> pending    the worker, re-arming an Every after its run (queued)
const (
	stFree uint64 = iota
	stPending
	stFiring
	stRunning
	stStopped
	stDropped
	stResetting
	stParked   // resetting, and parked by the shard: the Reset must send a command
	stStopping // a Stop of a queued entry, between its two steps
	stLetGo    // a Stop of a firing entry, letting go of its callback
	stPassed   // a letting-go entry that the worker came to and left to the Stop to free

	stateBits    = 4
	stateMask    = 1<<stateBits - 1
	queuedBit    = 1 << stateBits
	periodicBit  = 1 << (stateBits + 1)
	versionShift = stateBits + 2
	versionBits  = 20
	versionOne   = 1 << versionShift
	versionMask  = (1<<versionBits - 1) << versionShift
	genShift     = versionShift + versionBits
)

func stateOf(w uint64) uint64       { return w & stateMask }
func genOf(w uint64) uint64         { return w >> genShift }
func isGen(w, gen uint64) bool      { return genOf(w) == gen }
func isState(w, s uint64) bool      { return stateOf(w) == s }
func isHeld(w uint64) bool          { return isState(w, stResetting) || isState(w, stParked) }
func isQueued(w uint64) bool        { return w&queuedBit != 0 }
func isPeriodic(w uint64) bool      { return w&periodicBit != 0 }
func withState(w, s uint64) uint64  { return w&^stateMask | s }
func bumpVersion(w uint64) uint64   { return w&^versionMask | (w+versionOne)&versionMask }
func nextArming(prev uint64) uint64 { return (genOf(prev)+1)<<genShift | queuedBit | stPending }

// entry is one timer. Entries live in their shard's slab (pool.go) and are reused; the gen in the
// state word tells one use from the next.
//
// Ownership, field by field:
//   - state: atomic; the transitions above.
//   - when: atomic; the deadline, in nanoseconds on the wheel's clock. Written by the producer
//     before the entry is published and by Timer.Reset; read by the shard that holds the entry.
//     While the entry is free it is the free stack's link instead (pool.go).
//   - f, arg: written by the producer before it publishes the entry through the ring (the ring's
//     sequence store orders them), read by the worker that runs it; unchanged between, until a
//     Stop clears them (from pending or firing) or whoever frees the entry does. An Every's
//     entry has f nil, an *every as arg, and the periodic bit.
//   - next, prev: the entry's links in its bucket lane, by slab index (wheel.go); owned by the
//     holder of shard.mu. prev is 0 exactly when the entry is not linked.
//
// While linked, the entry's bucket comes due at or before when, so the shard visits it no later
// than its deadline; or it is in the held bucket, and the Reset that parked it moves it. A Reset
// that lowers when sends a command that moves the entry up; one that raises it sends none, and
// shard.expire links the entry at its new deadline when the old bucket comes due.
//
// 48 bytes, with no padding: a million pending timers are 48 MB of entries.
type entry struct {
	state atomic.Uint64
	when  atomic.Int64
	next  uint32
	prev  uint32
	f     func(arg any)
	arg   any
}

// linked reports whether the entry is in a bucket. Owned by the holder of shard.mu.
func (e *entry) linked() bool { return e.prev != 0 }

// clearEntry lets go of an entry's callback and argument, so that the entry keeps nothing alive.
// Its state word stays: it tells a handle of this arming that the timer is over.
func clearEntry(e *entry) { e.f, e.arg = nil, nil }

// dropFrom moves e from state from (pending, or running for an Every's run) to dropped and
// reports whether it did; false if another transition came first (a Stop, the end of a run). It
// yields while a Reset holds the entry (two stores), so a timer being reset is dropped, never
// skipped. The caller counts what it dropped.
func dropFrom(e *entry, from uint64) bool {
	for {
		w := e.state.Load()
		switch stateOf(w) {
		case stResetting, stParked:
			runtime.Gosched()
		case from:
			if e.state.CompareAndSwap(w, withState(w, stDropped)) {
				return true
			}
		default:
			return false
		}
	}
}

// dropNotified is what an entry's argument implements when it must learn that Wheel.Stop dropped
// its timer: a deadline context, which then keeps its deadline on a runtime timer (context.go).
// Only the package's own argument types implement it, so a user's argument is never told.
type dropNotified interface{ timerDropped() }

// letGoDropped lets go of the callback and argument of e, which the caller has just moved to
// dropped (dropFrom), so that the stopped wheel, which lives on while anyone holds the *Wheel,
// keeps nothing they refer to; and tells the argument if it asks to be told. Nobody else reads or
// writes f and arg of a dropped arming: a worker reads them only of a firing or running entry, a
// Stop clears them only after its own CAS from pending or firing, and nobody frees a dropped entry.
func letGoDropped(e *entry) {
	n, _ := e.arg.(dropNotified)
	clearEntry(e)
	if n != nil {
		n.timerDropped()
	}
}
