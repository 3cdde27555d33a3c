package shardwheel

import (
	"runtime"
	"time"

	"go.uber.org/atomic"
)

// The state word of an entry packs four fields into one uint64 so that every transition is one
// CAS that also proves the caller holds the current generation:
//
//	bits  0..3   state    (free, pending, firing, running, stopped, dropped, resetting, parked,
//	                      stopping, letting go, passed)
//	bit   4      queued   the arming's add command is in the ring: the shard has not taken it
//	bit   5      periodic the arming is an Every's: set by the producer with the gen, kept by
//	                      every transition, so that the worker tells a one-shot from a run
//	                      without reading f or arg (which a Stop may be clearing)
//	bits  6..25  version  bumped by every successful Reset (20 bits)
//	bits 26..63  gen      bumped each time the entry is taken from its slab (38 bits)
//
// A Timer remembers the gen it was armed with; any word with another gen belongs to a later
// owner of the entry, and the handle is inert. A gen repeats only after 2^38 armings of one
// entry: the slab hands entries out last in, first out, and a drain frees a ring's worth at a
// time, so in an arm-and-stop loop one entry is re-armed about once per ring of arms: at 15M
// pairs a second on one shard with the default ring (1024), 2^38 armings take about 200 days.
// Only a handle kept that long, and used at the wrong moment, could touch a later owner.
//
// The version makes a Reset visible to the shard's expiry CAS: the shard reads the word, then the
// deadline, then CASes the word it read, so a Reset that stored a new deadline in between makes
// that CAS fail and the shard re-reads. Reset first claims the entry (pending -> resetting): a
// handle that writes the deadline only while it holds its own gen in the word can never write
// into the entry's next owner.
//
// The queued bit is set by whoever sends an add (the producer, arming; the worker, re-arming an
// Every) with the move to pending, and cleared by the shard alone, when it takes that add (a
// CAS, in shard.takeAddLocked). No linked entry has it. It saves a Stop that comes before the
// shard took the add (the common case when a timer is stopped within a tick or so) the cancel
// command: the shard, taking the add, finds the entry stopped and frees it. Transitions keep the
// bit unless they say otherwise.
//
// Transitions, and who may make them:
//
//	free    -> pending  the producer, on an entry it just took from its slab (a store with the
//	                    next gen, queued; a freed entry is free, or still stopped if a Stop ended it)
//	queued  -> not queued  the shard, taking the add: the entry is linked if pending or held,
//	                    freed if stopped, left alone if stopping
//	pending -> resetting  Timer.Reset claims the entry, stores the deadline,
//	resetting -> pending  and releases it with version+1 (a CAS). Meanwhile Stop and Wheel.Stop
//	                      wait (yield), the shard keeps the entry linked and unfired.
//	resetting -> parked   the shard, which found the entry held when its bucket came due: it
//	                      links it where no advance looks (wheel.park) until the Reset's command
//	                      moves it. The Reset's release CAS then fails, so it knows to send one.
//	parked  -> pending    Timer.Reset, releasing it (a store), then sends its reset command
//	pending -> stopped  Timer.Stop, not queued; it then sends a cancel command, and the shard
//	                    frees the entry
//	pending -> stopping Timer.Stop, queued: it lets go of the callback (clearEntry), then
//	stopping -> stopped moves on with a CAS that keeps queued, and the shard frees the entry when
//	                    it takes the add. If the shard took the add in between (its CAS cleared
//	                    queued, and it left the entry unlinked), the CAS fails: the Stop stores
//	                    stopped and sends a cancel, as for an entry that was never queued.
//	pending -> firing   the shard, when the deadline is due; the entry leaves the wheel
//	pending -> dropped  Wheel.Stop; nobody frees the entry, the wheel is garbage
//	firing  -> letting go  Timer.Stop (the callback has not started): it lets go of the
//	letting go -> stopped  callback (clearEntry), then moves on with a CAS; the worker, coming to
//	                    the entry, frees it as any stopped one (review 32: a Stop that reported
//	                    true kept the callback reachable until the worker came to the entry)
//	letting go -> passed   the worker, which came to the entry between the Stop's two steps: it
//	passed  -> stopped  leaves the entry, and the Stop, whose CAS then fails, stores stopped and
//	                    frees it. Nobody else moves either word, and a handle finds both over.
//	firing  -> free     the worker, just before a one-shot callback starts; it reads f and arg
//	                    only after this CAS, which no Stop can follow
//	firing  -> running  the worker, just before a periodic (Every) callback starts
//	running -> stopped  Timer.Stop during a periodic run; the worker frees the entry after it
//	running -> pending  the worker, re-arming a periodic timer after its run (queued)
const (
	stFree uint64 = iota
	stPending
	stFiring
	stRunning
	stStopped
	stDropped
	stResetting
	stParked   // resetting, and parked by the shard: the Reset must send its command (see above)
	stStopping // a Stop of a queued entry, between its two steps (see above)
	stLetGo    // a Stop of a firing entry, letting go of its callback (see above)
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

// entry is one timer. Entries live in their shard's slab (pool.go) and are reused; the gen in
// the state word tells one use from the next.
//
// Ownership, field by field:
//   - state: atomic; transitions as in the table above.
//   - when: atomic; the deadline in nanoseconds on the wheel's clock. Written by the producer before the entry is published
//     and by Timer.Reset; read by the shard that holds the entry. While the entry is free it is
//     the free stack's link instead (pool.go).
//   - f, arg: written by the producer before the entry is published through the ring (the ring's
//     sequence store orders them), read by the worker that runs it; immutable between, until
//     cleared by the Stop that moves the entry from pending or firing (see Stop) or by whoever
//     frees it. A periodic entry (Every) has f nil, an *every as arg, and the periodic bit.
//   - next, prev: the entry's links in its bucket lane (wheel.go), by slab index; owned by the
//     shard goroutine (whoever holds shard.mu). prev is 0 exactly when the entry is not linked.
//
// Invariant while linked: the entry's bucket comes due at or before when, so the shard visits it
// no later than its deadline; or it is in the held bucket, where the shard parked it, and the
// Reset that found it parked (or, once that Reset released it, its command) moves it.
// Reset keeps it: a Reset that lowers when sends a reset command that moves the entry up; one
// that raises when sends none, and shard.expire re-inserts the entry at its new deadline when
// the old bucket comes due, unless the shard parked it meanwhile: then it sends one too.
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

// A Timer is the handle of a scheduled callback. It is a small value: copy it, compare it, keep it
// in a struct. The zero Timer is a timer that never fires: Stop and Reset report false.
//
// A Timer stays valid after its callback ran or it was stopped, and then does nothing: the entry
// behind it may serve another timer, and the generation it carries keeps it from touching that one.
type Timer struct {
	s   *shard
	i   uint32 // the entry's index in s's slab
	gen uint64
}

// Stop prevents the timer's callback from running. It reports true if and only if this call
// prevented it: false if the callback has started (or, for Every, if the series has ended), the
// timer was already stopped, Wheel.Stop found it pending (and counted it), or the handle is the
// zero Timer or stale. A timer that had fired, its callback not started yet, when Wheel.Stop was
// called from a callback of the same batch can still be stopped: that Stop reports true, and the
// callback does not run. Stop does not wait for a running callback. For a timer made by Every,
// true means no further run will start, also when Stop is called while a run is in progress.
//
// Stop does not wait for callbacks or for time: it is one CAS plus, for a timer still in the
// wheel, one command in its shard's ring so that the entry is freed promptly; for a timer whose
// add the shard has not taken yet, two CASes and no command (the shard frees the entry when it
// takes the add). Only when that ring is full does it take the shard's lock and drain the ring
// itself, which may wait for one advance step of the shard (stepBudget entries at most), and, if
// the ring's oldest command is claimed by a producer paused before it published it, for that
// producer (it yields meanwhile).
func (t Timer) Stop() bool {
	if t.s == nil {
		return false
	}
	e := t.s.slab.at(t.i)
	for {
		w := e.state.Load()
		if !isGen(w, t.gen) {
			return false
		}
		switch stateOf(w) {
		case stResetting, stParked:
			runtime.Gosched() // a Reset holds the entry for two stores
		case stPending, stFiring, stRunning:
			to := stStopped
			switch {
			case isQueued(w):
				to = stStopping // pending, and its add is still in the ring: see stopQueued
			case isState(w, stFiring):
				to = stLetGo // dispatched, not started: see stopFiring
			}
			if !e.state.CompareAndSwap(w, withState(w, to)) {
				continue // the word moved on: look again
			}
			t.s.stopped.Inc()
			t.s.releasePending(1) // the timer's own shard: WithMaxPending is striped (pending.go)
			switch {
			case isQueued(w):
				t.stopQueued(e, w)
			case isState(w, stFiring):
				t.stopFiring(e, w)
			case isState(w, stPending):
				// Let go of the callback now, not when the shard gets to the command below
				// (on a quiet shard, that may be the timer's deadline). No other goroutine
				// reads f or arg of this arming from here on: the shard reads only state and
				// when; no worker has the entry (a worker gets it only from the shard, which
				// moves it to firing, which our CAS rules out; the worker that re-armed an
				// Every read them before its CAS to pending, which ours read); and the entry is
				// freed, and so written by a next producer, only when the shard takes this
				// command, which the ring orders after these writes. (From firing, stopFiring
				// lets go of them; from running, the run in progress holds them until it ends.)
				clearEntry(e)
				// The shard took the add, so the entry is in the wheel; the shard unlinks and
				// frees it when it takes this command. If the ring was closed by Wheel.Stop,
				// nobody needs it.
				t.s.send(t.i, t.gen, opCancel)
			}
			// running: a periodic run is in progress; the worker will not re-arm it, and
			// frees the entry when the run is over.
			return true
		default:
			return false
		}
	}
}

// stopQueued is the rest of a Stop that moved a queued entry from word w to stopping: its add
// is in the ring, so the shard has not linked the entry, and no command but that add refers to
// it (a Reset's command may follow it; the gen and the state make that one harmless).
//  1. Let go of the callback. While the entry is stopping nobody else reads f or arg (no worker
//     has it, and the shard reads only state and when), and nobody frees it.
//  2. Hand the entry to the add (stopped, still queued): the shard, taking it, frees the entry,
//     and this CAS orders step 1 before that free.
//  3. Paused between 1 and 2, the entry waits stopping; a shard that takes the add meanwhile
//     clears queued and leaves the entry unlinked and unfreed, so the CAS of 2 fails. Nobody
//     else moves a stopping word, so the store is safe; the Stop finishes as a Stop of a taken
//     entry does, with a cancel command that frees it. (Paused between the store and the
//     send, the entry is stopped and freed by nobody yet; a Wheel.Stop meanwhile closes the
//     ring, the send fails, and the entry goes with the wheel.)
func (t Timer) stopQueued(e *entry, w uint64) {
	clearEntry(e) // 1.
	if e.state.CompareAndSwap(withState(w, stStopping), withState(w, stStopped)) {
		return // 2.
	}
	e.state.Store(withState(w&^queuedBit, stStopped)) // 3.
	t.s.send(t.i, t.gen, opCancel)
}

// stopFiring is the rest of a Stop that moved a firing entry from word w to letting go: the shard
// has handed it to a worker (or to an advancer) that has not started its callback.
//  1. Let go of the callback. While the entry is letting go nobody else reads f or arg: the
//     worker reads them only after its CAS from firing, which ours ruled out.
//  2. Hand the entry to the worker (stopped): coming to it, the worker frees it, and this CAS
//     orders step 1 before that free.
//  3. Paused between 1 and 2, the entry waits letting go; a worker that comes to it meanwhile
//     moves it to passed and leaves it (it does not wait for us), so the CAS of 2 fails. Then
//     the entry is ours alone: store stopped, as any stopped entry's word, and free it.
func (t Timer) stopFiring(e *entry, w uint64) {
	clearEntry(e) // 1.
	if e.state.CompareAndSwap(withState(w, stLetGo), withState(w, stStopped)) {
		return // 2.
	}
	e.state.Store(withState(w, stStopped)) // 3.
	t.s.slab.freeEntry(t.i, e)
}

// Reset re-arms a pending timer to fire d from now and reports true. If the timer has fired, is
// firing, was stopped, or the handle is zero or stale, Reset does nothing and reports false.
// d is read as in AfterFunc: never early, d <= 0 fires as soon as possible.
func (t Timer) Reset(d time.Duration) bool {
	s := t.s
	if s == nil {
		return false
	}
	e := s.slab.at(t.i)
	now := s.w.nanos()
	when := s.w.deadlineFrom(now, d)
	w, ok := t.claim(e)
	if !ok {
		return false
	}
	t.release(e, w, when)
	s.w.overdue(now)
	return true
}

// claim is Reset's step 1: it moves the entry from pending to resetting (waiting while another
// Reset holds it) and returns the word it claimed from, or false if the timer is not pending.
// From here until release nobody fires, stops, drops or frees the entry, so the deadline lands on
// this timer and never on a later owner of the entry.
func (t Timer) claim(e *entry) (uint64, bool) {
	for {
		w := e.state.Load()
		if !isGen(w, t.gen) {
			return 0, false
		}
		if isHeld(w) {
			runtime.Gosched() // another Reset of this timer holds it
			continue
		}
		if !isState(w, stPending) {
			return 0, false
		}
		if e.state.CompareAndSwap(w, withState(w, stResetting)) {
			return w, true
		}
	}
}

// release is the rest of Reset, on an entry claimed from word w. 2. Store the deadline. 3. Release
// it with a new version: a shard that read the old word and then the old deadline CASes that old
// word and fails, so it never fires on a deadline that a Reset was replacing, and never misses
// the new one. 4. Tell the shard, unless the entry can stay where it is.
func (t Timer) release(e *entry, w uint64, when int64) {
	old := e.when.Load()
	e.when.Store(when)
	// 3. Two moves of other goroutines may make the CAS fail: the shard took the entry's add
	// (it cleared queued: look again), or it parked the entry, which is linked and so not
	// queued (then only a command brings it back).
	held, parked := withState(w, stResetting), false
	for !e.state.CompareAndSwap(held, bumpVersion(withState(held, stPending))) {
		if held = e.state.Load(); isState(held, stParked) {
			e.state.Store(bumpVersion(withState(held, stPending)))
			parked = true
			break
		}
	}
	if when >= old && !parked {
		// 4. Later (a keep-alive): the entry stays where it is linked, which is never after its
		// deadline; when that bucket comes due the shard finds the new deadline and re-inserts
		// it (shard.expire). No command, as go-zero defers its moves until the slot is scanned.
		return
	}
	// 4. Earlier, or parked: tell the shard to move the entry to its deadline; a stale command
	// (the timer fired meanwhile and the entry was reused) carries the old gen and is ignored.
	// Paused here (after the store above, before the send), a parked entry is pending in the
	// held bucket, which no advance takes: this timer is late by the pause, and no other is
	// (a Stop meanwhile finds it pending and cancels it; a second Reset claims it and, if it
	// raises the deadline, sends nothing and leaves the move to this command).
	t.s.send(t.i, t.gen, opReset)
	t.s.noteDeadline(when)
}
