package shardwheel

// Advancing the shards a keeper took, on the system clock, and running what they fire.

// stepBudget bounds the entries one advance step visits under shard.mu, so that a producer that
// finds its ring full (and drains it itself under mu) never waits behind a whole flood.
const stepBudget = 4 * maxTask

// minShare is the fewest callbacks that offerFired hands to another worker together.
const minShare = 8

// driveDue advances the shards the keeper took, sl.due, to the reading now. All but the first go
// to idle workers while there are some (a shard offered to a busy pool would wait, owned, in the
// queue); this worker takes the rest a step each, and only the last may go on with more steps: the
// others are let go of, still due, for the next keeper to hand out again, so one shard's flood
// never holds up the shards taken with it.
//
// A shard kept for later waits its turn as ownerRunning, published into its group, as a shard
// whose advancer runs callbacks does: the steps before it run callbacks that may block, and a
// keeper (a worker that came free meanwhile) must be able to take it over. Its turn comes only if
// this worker can take it back (CAS running -> advancing).
func (w *Wheel) driveDue(sl *runSlot, now int64) {
	mine := sl.due[:1]
	for _, s := range sl.due[1:] {
		if len(w.pool.queue) < int(w.idle.Load()) {
			t := taskPool.Get().(*task)
			t.adv, t.now = s, now
			if w.offer(t) {
				continue
			}
			putTask(t)
		}
		s.owner.Store(ownerRunning)
		w.publishGroup(s)
		mine = append(mine, s) // overwrites an element the loop has read already
	}
	for i, s := range mine {
		if i > 0 && !s.owner.CompareAndSwap(ownerRunning, ownerAdvancing) {
			continue // a keeper took it over
		}
		w.driveShard(sl, s, now, i == len(mine)-1)
	}
}

// driveShard advances a shard that the caller owns (advancing) to the reading now, in steps of
// stepBudget entries, each under one hold of s.mu; more says it may take more than one step.
//
// Each step's callbacks run on this goroutine right after the step made them (their entries are in
// this core's cache), but for shares offered to idle workers (offerFired). While they run the shard
// is ownerRunning and its next is published into its group, so a slow callback never holds the
// shard up: a keeper that sees it due takes it over. Afterwards this goroutine takes the shard back
// (CAS running -> advancing) and goes on with the next step, unless work waits in the queue or
// another shard is due with nobody to see it (letGo): then it lets the shard go and returns, and
// the next keeper takes the shard again with the others. The owner word is the only arbiter:
// whoever moved it to advancing advances until the shard is done or lets go and publishes, so no
// due step is left with nobody to take it, and none is taken twice. After Stop it advances no
// further: what fired already runs; what is pending is Stop's.
//
// Each step after the first reads the clock again and advances to the later reading. A step that
// ran out of budget left a bucket half taken, and a step's callbacks take time: with the first
// reading kept, a cascade of a big bucket (a million entries re-inserted one level down, about 20
// ms on one core) relinked everything in it for a deadline a few ticks on, and its first callback
// waited for the whole cascade. With a fresh reading, once that deadline has come the rest of the
// bucket fires as it is taken. A later reading is always safe to fire by.
func (w *Wheel) driveShard(sl *runSlot, s *shard, now int64, more bool) {
	for step := 0; ; step++ {
		done := true
		if !w.closed.Load() {
			if step > 0 {
				now = max(now, w.nanos())
			}
			s.mu.Lock()
			done = s.advanceLocked(now, stepBudget)
			sl.batch, s.fired = s.fired, sl.batch[:0] // sl.batch is empty: cleared after each run
			s.mu.Unlock()
			sl.taken.Add(uint64(len(sl.batch)))
		}
		goOn := !done && more
		if goOn && len(sl.batch) == 0 {
			// A step that only cascaded: nothing runs, so the shard stays advancing and is not
			// published (which would wake the keeper to take over a shard nobody waits for).
			w.hurry(sl)
			if w.letGo(s) {
				s.owner.Store(ownerNone)
				w.publishGroup(s)
				return
			}
			continue
		}
		if !w.runStep(sl, s, goOn) {
			return
		}
	}
}

// runStep runs what one step of driveShard fired (sl.batch), with the shard published as running
// (goOn: there is more to do) or let go of (ownerNone), and reports whether the caller owns the
// shard again (advancing) to take its next step.
func (w *Wheel) runStep(sl *runSlot, s *shard, goOn bool) bool {
	rest := w.offerFired(sl.batch)
	// After the offer, which counts idle workers: one nudged before it would still count as idle
	// and be handed a share instead of keeping time.
	if goOn || len(sl.batch) > minShare {
		w.hurry(sl) // more than a few callbacks: let an idle worker keep time meanwhile
	}
	if goOn {
		s.owner.Store(ownerRunning)
	} else {
		s.owner.Store(ownerNone)
	}
	w.publishGroup(s)
	w.runBatch(rest, sl)
	clear(sl.batch)
	sl.batch = sl.batch[:0]
	if !goOn {
		return false
	}
	if w.letGo(s) {
		if s.owner.CompareAndSwap(ownerRunning, ownerNone) {
			w.publishGroup(s)
		}
		return false
	}
	return s.owner.CompareAndSwap(ownerRunning, ownerAdvancing) // false: a keeper took it over
}

// letGo reports whether the advancer of s should let it go rather than take its next step: work
// waits in the queue, or another shard may be due with nobody advancing it and nobody keeping time
// to see it.
func (w *Wheel) letGo(s *shard) bool {
	return len(w.pool.queue) > 0 || !w.keeper.Load() && w.unownedDue(s)
}

// unownedDue reports whether a shard other than s may be due with nobody advancing it: a due shard
// of s's group that nobody owns, or any other group whose lower bound is due. It reads the clock,
// so that an advancer that goes on for long still sees shards that came due meanwhile.
func (w *Wheel) unownedDue(s *shard) bool {
	now := w.nanos()
	for gi := range w.groups {
		g := &w.groups[gi]
		if g != s.g {
			if g.next.Load() <= now {
				return true
			}
			continue
		}
		for _, o := range g.shards {
			if o != s && o.next.Load() <= now && o.owner.Load() == ownerNone {
				return true
			}
		}
	}
	return false
}

// offerFired offers what one advance step fired to idle workers, in shares of up to taskCap
// entries and no fewer than minShare (a few timers run here rather than pay a hand-off each), and
// returns what is left for the caller to run: at least the last share, and everything the idle
// workers are not there to take. A share handed to a busy pool would only wait in the queue while
// its entries' cache lines go cold; the caller runs it sooner.
func (w *Wheel) offerFired(refs []ref) []ref {
	if w.pool.queue == nil {
		return refs
	}
	per := min(w.pool.taskCap, max(minShare, len(refs)/len(w.pool.done)))
	for len(refs) > per && len(w.pool.queue) < int(w.idle.Load()) {
		t := newTask(refs[:per])
		if !w.offer(t) {
			putTask(t)
			break
		}
		refs = refs[per:]
	}
	return refs
}
