package shardwheel

import (
	"runtime"
	"time"
)

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
// zero Timer or stale. A timer that has fired but whose callback has not started (it waits behind
// another callback, or in the worker queue, also after Wheel.Stop) can still be stopped: that Stop
// reports true, and the callback does not run. Stop does not wait for a running callback. For a timer made by Every,
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
			t.s.returnCredit() // the timer's own shard: WithMaxPending is striped (pending.go)
			switch {
			case isQueued(w):
				t.stopQueued(e, w)
			case isState(w, stFiring):
				t.s.stoppedFiring.Inc() // its callback will not start: out of Stats.Queued now
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
	w, ok := t.hold(e)
	if !ok {
		return false
	}
	t.finishReset(e, w, when)
	s.w.overdue(now)
	return true
}

// hold is Reset's step 1: it moves the entry from pending to resetting (waiting while another
// Reset holds it) and returns the word it held it from, or false if the timer is not pending.
// From here until finishReset nobody fires, stops, drops or frees the entry, so the deadline lands
// on this timer and never on a later owner of the entry.
func (t Timer) hold(e *entry) (uint64, bool) {
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

// finishReset is the rest of Reset, on an entry held from word w. 2. Store the deadline. 3. Let go
// of it with a new version: a shard that read the old word and then the old deadline CASes that
// old word and fails, so it never fires on a deadline that a Reset was replacing, and never misses
// the new one. 4. Tell the shard, unless the entry can stay where it is.
func (t Timer) finishReset(e *entry, w uint64, when int64) {
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
	// (a Stop meanwhile finds it pending and cancels it; a second Reset holds it and, if it
	// raises the deadline, sends nothing and leaves the move to this command).
	t.s.send(t.i, t.gen, opReset)
	t.s.noteDeadline(when)
}
