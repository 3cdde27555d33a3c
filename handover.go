package shardwheel

import "time"

// Letting go of the keeper role (expiry.go): at once, to a worker nudged awake (yield), or only if
// the advance that made the keeper let go runs long (yieldLater's watchdog, hurry).

// yield lets go of the keeper role and nudges an idle worker to take it. target is awake already
// (no producer signals a keeper that is not there; the next one reads every group).
func (w *Wheel) yield() {
	w.keeper.Store(false)
	w.nudgeIdle()
}

// yieldLater lets go of the keeper role like yield but, unless something earlier than its watchdog
// is already known (step 2), nudges nobody yet: it arms the worker's watchdog to nudge an idle
// worker at the keeper's next target or a tick after first, the deadline that made the shard due,
// whichever is sooner (the first whole number of ticks after first that is after now, if the wake
// came that late), if the role is still free then. Ticks after first, not after now: an
// Every(tick)'s next run is due whole intervals after the run it re-arms from, and a watchdog later
// than that would have the re-arm signal, waking a second goroutine every run. Less one grain if
// that is still after now, since the shard's next may be rounded up past the deadline by up to a
// grain (timingWheel.nextDue).
//
// The keeper calls it when one shard is due: its advance is usually over well within a tick, and
// keep then takes the role back. If the advance or its callbacks run longer, the watchdog hands
// time over as yield would have. A deadline earlier than the watchdog does not wait for it: one
// noted before collect read its group is in next; one noted after that read and before the role is
// free is seen by step 2's read of the groups; one noted after that signals (target holds the
// watchdog's moment), and signal nudges while the role is free. A step that leaves more to do, or
// fires more than a few callbacks, hands the role over at once (hurry).
func (w *Wheel) yieldLater(sl *runSlot, now, next, first int64) {
	// 1. target before the role is free: a producer that reads it and finds its deadline
	//    earlier signals, and signal nudges (the watchdog would come too late for it).
	at := satAddNanos(first, w.tick)
	if at <= now && now < never-w.tick {
		at += ((now-at)/w.tick + 1) * w.tick // a late wake: its re-arm skips to the first after now
	}
	if at-w.grain > now {
		at -= w.grain // first may be a grain late (timingWheel.nextDue)
	}
	at = min(at, next)
	w.target.Store(at)
	w.keeper.Store(false)
	if testHookYielded != nil {
		testHookYielded(w) // tests only: paused with the role free, before the read of the groups
	}
	// 2. Read every group once more. A producer that noted a deadline after collect read its
	//    group did not nudge if it read target before the store in 1 (awake: no signal), or read
	//    it after but still saw the role held (signal then only leaves a token): either way its
	//    g.next store came before a load that came before a store above, so this read sees it.
	if w.minGroups() < at {
		w.nudgeIdle()
		return
	}
	// 3. Otherwise the watchdog, or a nudge now if the moment has come already.
	d := time.Duration(at - w.nanos())
	if d <= 0 {
		w.nudgeIdle()
		return
	}
	if sl.watch == nil {
		sl.watch = time.AfterFunc(d, w.watchdog)
	} else {
		sl.watch.Reset(d)
	}
}

// hurry nudges an idle worker now if this worker's watchdog is still armed (yieldLater, neither
// gone off nor stopped yet): the advance may well outlast a tick, and the nudged worker can take
// the next tick's work on another core meanwhile. A watchdog that went off has nudged already.
func (w *Wheel) hurry(sl *runSlot) {
	if w.unwatch(sl) {
		w.nudgeIdle()
	}
}

// unwatch stops this worker's watchdog and reports whether it was still armed.
func (w *Wheel) unwatch(sl *runSlot) bool {
	return sl.watch != nil && sl.watch.Stop()
}

// watchdog runs when a worker's watch goes off, on a goroutine of the runtime's that exits at
// once: if the role is still free when the time it was armed for came, someone must keep time.
func (w *Wheel) watchdog() {
	if !w.keeper.Load() {
		w.nudgeIdle()
	}
}
