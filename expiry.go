package shardwheel

import (
	"time"

	"go.uber.org/atomic"
)

// The expiry side on the system clock: who sleeps, who advances, who runs callbacks.
//
// A Wheel has a fixed set of workers (WithWorkers of them, one with WithWorkers(0)) and no other
// goroutine, but for the moment a watchdog below goes off (time.AfterFunc runs it on a goroutine
// that exits at once). At any moment at most one worker is the keeper (Wheel.keeper): it sleeps
// until the earliest deadline of any group of shards, or until a producer signals an earlier
// one. When something is due, it claims the due shards (shard.claim), gives up the role so that
// an idle worker can keep time while it works, and becomes the advancer of those shards. With
// several shards due the next keeper is nudged awake at once (release); with one, only if the
// advance still goes on at the next tick, a step leaves more to do or fires more than minShare
// callbacks, work is queued, or a producer arms an earlier deadline (releaseLater arms a
// watchdog), since it is usually over within microseconds and the worker then takes the role
// back itself: a wake costs one goroutine wake-up, not two. The advancer offers all but the
// first shard to idle workers through the queue, and advances its own in bounded steps
// (stepBudget entries per hold of shard.mu), running what each step fired itself, on the core
// whose cache holds those entries, and offering shares of it only to workers that are idle
// (Wheel.idle). While the callbacks run, the claim says so (claimRunning), so the next keeper
// can take the shard over and advance its next step itself.
// The keeper's sleep is one runtime timer, in the heap of the P that armed it, and the runtime
// can run it late while that P is idle and another is busy; so producers look too: an arm or a
// Reset that finds the keeper's target passed wakes it (overdue).
// So a deadline is one goroutine wake-up from its callback, no goroutine or channel sits on the
// path of every expired timer, and a flood spreads over every worker (the runtime runs a P's
// timers on that P; Tokio a worker's wheel on that worker; here any idle worker takes the next
// step or a share).
//
// A wake looks at groups, not shards: each group summarises up to groupSize shards with a lower
// bound of their next deadlines (group.next), kept by producers and advancers with a CAS-min
// (shard.noteDeadline, publishGroup) and recomputed by the keeper when the group comes due
// (collect). The keeper's cost per wake grows with the number of groups, a sixty-fourth of the
// shards, plus the shards of the groups that are due.
//
// With a manual clock there is no keeper: ManualClock.Advance advances every shard on its
// caller's goroutine (clock.go) and the workers only run the chunks it dispatches.

// testHookReleased, testHookSleep and testHookCollected, set only by tests, run in releaseLater
// right after the role is let go (before its read of the groups), in keep right before the
// keeper's select, and in keep right after collect claimed something due (with what it
// claimed): a goroutine paused there.
var (
	testHookReleased, testHookSleep func(*Wheel)
	testHookCollected               func(w *Wheel, due []*shard)
)

// groupSize is the most shards one group summarises.
const groupSize = 64

// stepBudget bounds the entries one advance step visits under shard.mu, so that a producer that
// finds its ring full (and drains it itself under mu) never waits behind a whole flood.
const stepBudget = 4 * maxChunk

// group is the keeper's summary of consecutive shards.
type group struct {
	// next is a lower bound of the next of every shard of the group that is not claimed (ns).
	// Atomic: lowered by CAS-min by producers (noteDeadline), advancers (publishGroup) and the
	// keeper's collect (the recomputed minimum); stored (never) only by the keeper, in collect,
	// before it reads the shards.
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

// signal wakes the keeper if it sleeps. Any goroutine may call it.
//
// While the role is free after releaseLater, target holds the watchdog's moment, so a producer
// whose deadline is earlier signals; nobody sleeps on wake then, so the signal nudges an idle
// worker to take the role (the next keeper spends the token in wake at its first look).
func (w *Wheel) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
	if !w.keeper.Load() {
		w.nudgeIdle()
	}
}

// overdue wakes the keeper if the moment it sleeps until has passed at now, a producer's reading
// of the clock. Any goroutine may call it; AfterFunc and Reset do, with the reading they took
// for the deadline, so it costs one load of target on the common path (target's line is written
// only a few times per keeper wake: shardwheel.go).
//
// Why: the keeper sleeps on one runtime timer, which lives in the heap of the P that armed it.
// The runtime runs a P's timers when that P schedules; those of an idle P only when an M wakes
// for them in the netpoller or sysmon notices, and while another P is busy that can be
// milliseconds late (a trace of the sustained load showed 2.9 ms, the producers running on the
// other P throughout). Every arm is one more look, as every schedule is for the runtime's own
// timers. One producer signals per target: it moves target to awake with a CAS (the keeper
// stores awake itself when it wakes, so a CAS after that fails), and the others then find awake
// and do not signal.
//
// Why nothing is lost. Awake while a keeper still sleeps: the token this signal leaves is in
// wake (or one already was), and the keeper's select takes it and reads every group. A CAS that
// lands while the role is free after releaseLater makes that a release: signal nudges an idle
// worker; and if that signal still saw the role held, its load came before releaseLater's store
// that freed the role, so releaseLater's later reading of the clock (monotonic across cores) is
// past target too, and it nudges rather than arm the watchdog. Paused between its CAS and its
// signal, a producer leaves target awake with no token yet: a deadline noted meanwhile does not
// signal, and waits for the keeper's own timer or the watchdog, both still armed, which is what
// it waited for before producers looked (TestReview24OverdueGapCovered).
func (w *Wheel) overdue(now int64) {
	if t := w.target.Load(); t != awake && now >= t && w.target.CompareAndSwap(t, awake) {
		w.signal()
	}
}

// work is worker i's loop. It takes queued work first; else it tries to become the keeper; else
// it sleeps until work is queued or the keeper lets go of the role. Once Stop has closed quit it
// runs what is left in the queue and exits: every chunk a worker queues is queued before that
// worker's own last look at the queue, so nothing handed to the pool is left behind.
//
// A callback that calls runtime.Goexit ends the goroutine, not the worker: by the time the
// deferred call below runs, the callbacks fired with it have run (runFrom), and the goroutine
// held no claim and not the keeper role; it starts worker i again on a new goroutine, which
// takes over wk. So the number of workers stays fixed, and done[i] is closed once, by the last.
func (w *Wheel) work(i int) {
	wk := &w.pool.ws[i]
	exited := true // until the loop returns: unwinding with it still set is runtime.Goexit
	defer func() {
		if exited {
			// A Goexit may unwind out of keep between releaseLater's arming of the watchdog
			// and keep's unwatch or hurry: stop it here, or it would go off after Stop returned
			// (a goroutine of the wheel's after Stop, and a nudge nobody takes). Nothing is
			// lost: the role is free, and the goroutine below (or Stop) is there to see it.
			w.unwatch(wk)
		}
		switch {
		case !exited: // the loop returned: quit
			close(w.pool.done[i])
			if w.stopHandoff.Load() {
				close(w.stopped) // finishStop's drain ended in a Goexit: the last worker releases Stop
			}
		case isClosed(w.stopped):
			// A Goexit after a Stop on this goroutine (from a callback of the batch that
			// runFrom's deferred call runs) finished the shutdown: the queue is empty, and
			// nothing may start after Stop returned.
			close(w.pool.done[i])
		default: // a Goexit: another goroutine takes the worker's place
			w.batchOver(i)
			clear(wk.batch)
			wk.batch = wk.batch[:0]
			clear(wk.due)
			wk.due = wk.due[:0]
			go w.work(i)
		}
	}()
	w.pool.gids[i].Store(goid())
	for {
		// Once Stop began, a Stop called from the batch this worker ran may have excused it
		// (stopwait.go); what it takes from the queue from here on is in no Stop. The excuse
		// ends before the receive: a worker paused between a receive and the end of its excuse
		// would hold a chunk that a waiter reads as excused.
		if w.closed.Load() {
			w.batchOver(i)
		}
		select {
		case c := <-w.pool.queue: // a nil queue (WithWorkers(0)) is never ready
			w.runTask(wk, c)
			continue
		default:
		}
		if isClosed(w.quit) {
			for {
				w.batchOver(i) // as above, before each receive (review 51)
				select {
				case c := <-w.pool.queue:
					w.runTask(wk, c)
					continue
				default:
				}
				exited = false
				return
			}
		}
		// Once Stop has begun nothing is advanced (advanceShard), so nobody keeps time: a
		// keeper would find the same shards due and go round until quit is closed.
		if w.manual == nil && !w.closed.Load() && w.keeper.CompareAndSwap(false, true) {
			w.keep(wk)
			continue
		}
		w.idle.Add(1)
		select {
		case c := <-w.pool.queue:
			w.idle.Add(-1)
			w.runTask(wk, c)
		case <-w.nudge:
			w.idle.Add(-1)
		case <-w.quit:
			w.idle.Add(-1)
		}
	}
}

// runTask runs one chunk taken from the queue: a due shard to advance, or callbacks.
func (w *Wheel) runTask(wk *worker, c *chunk) {
	if s := c.adv; s != nil {
		now := c.now
		c.adv = nil
		chunkPool.Put(c)
		w.advanceShard(wk, s, now, true)
		return
	}
	w.runChunk(c, wk, true)
}

// keep is the keeper's loop; the caller holds the role (w.keeper). It returns having let go of
// the role: after it advanced what came due, if another worker took the role meanwhile (it gives
// up the role before it advances, so time is kept while it works), after it took work from the
// queue, or once Stop has closed quit.
//
// The sleep (numbered for noteDeadline's argument, shard.go):
//  1. target is awake: producers do not signal. A token already in wake is spent: step 2 reads
//     every group, and a signaller's note is in its group before its send.
//  2. collect claims what is due now; if anything is, release (or releaseLater) and advance it,
//     then take the role back (CAS) and go round, unless another worker holds it.
//  3. store target = the earliest group.next, then read every group.next once more: a producer
//     that lowered one before step 3's store is seen by that read; one after it reads the
//     target and signals. If anything is earlier than the target, or due already, go round.
//  4. sleep until the target, a signal, queued work or quit; then back to 1.
func (w *Wheel) keep(wk *worker) {
	for {
		w.target.Store(awake)
		// Step 1's spent token (a producer that found the timer's moment passed while this
		// keeper was waking up, overdue, leaves one; it would cost a second round at once).
		select {
		case <-w.wake:
		default:
		}
		// Give idle chunks back (trim.go): the keeper is the trimmer's advancer. It looks at the
		// slabs at most once a second, also while timers keep coming due.
		// One reading for both: a trim may take a while, and a reading from before it is only
		// early, which the firing side may be (it fires later, never sooner).
		now := w.nanos()
		trimAt := w.trimIdle(now)
		var next, first int64
		if wk.due, next, first = w.collect(now, wk.due[:0]); len(wk.due) > 0 {
			if testHookCollected != nil {
				testHookCollected(w, wk.due) // tests only: paused between collect and the release
			}
			if len(wk.due) > 1 {
				w.release()
			} else {
				w.releaseLater(wk, now, next, first)
			}
			w.advanceDue(wk, now)
			clear(wk.due)
			// Take the role back unless someone took it meanwhile; stop the watchdog only
			// then, so that there is no moment with the role free and nobody to be nudged.
			// With work queued, or after Stop, back to work's loop, which takes the queue
			// first (as it did before it was keeper) and sees quit: hand the role over first.
			if !w.closed.Load() && len(w.pool.queue) == 0 {
				if w.keeper.CompareAndSwap(false, true) {
					w.unwatch(wk)
					continue
				}
				w.unwatch(wk)
				return
			}
			w.hurry(wk)
			return
		}
		next = min(next, trimAt)
		w.target.Store(next)
		if w.minGroups() < next {
			continue
		}
		cur := w.nanos()
		if next <= cur {
			continue
		}
		var fire <-chan time.Time
		if next != never { // else nothing is due before the end of time
			d := time.Duration(next - cur)
			if wk.timer == nil {
				wk.timer = time.NewTimer(d)
			} else {
				wk.timer.Reset(d)
			}
			fire = wk.timer.C
		}
		if testHookSleep != nil {
			testHookSleep(w) // tests only: a keeper paused before its select
		}
		var c *chunk
		select {
		case <-fire:
		case <-w.wake:
		case c = <-w.pool.queue:
		case <-w.quit:
		}
		w.stopTimer(wk)
		if c != nil || isClosed(w.quit) {
			w.target.Store(awake)
			w.release()
			if c != nil {
				w.runTask(wk, c)
			}
			return
		}
	}
}

// stopTimer stops the keeper's timer of wk, if it has one. Since Go 1.23 a stopped timer's
// channel never delivers a stale value, so nothing needs draining.
func (w *Wheel) stopTimer(wk *worker) {
	if wk.timer != nil {
		wk.timer.Stop()
	}
}

// release lets go of the keeper role and nudges an idle worker to take it. target is awake
// already (no producer signals a keeper that is not there; the next one reads every group).
// The nudge channel holds one token: if it is full, a worker will take that token after this
// release, and so try for the role after it.
func (w *Wheel) release() {
	w.keeper.Store(false)
	w.nudgeIdle()
}

// releaseLater lets go of the keeper role like release, but, unless something earlier than its
// watchdog is already known (step 2), nudges nobody yet: it arms the worker's watchdog to
// nudge an idle worker at the keeper's next target or a tick after first, the deadline that made
// the shard due, whichever is sooner (the first whole number of ticks after first that is after
// now, if the wake came that late), if the role is still free then. Ticks after first, not after
// now: an Every(tick)'s next run is due whole intervals after the run it re-arms from, and a
// watchdog later than that would have the re-arm signal, waking a second goroutine every run.
// Less one grain if that is still after now, since the shard's next may have been rounded up
// past the deadline by up to a grain (wheel.nextDue).
//
// The keeper calls it when one shard is due: its advance is usually over well within a tick, and
// keep then takes the role back, so a wake costs one goroutine wake-up, not two. If the advance
// or its callbacks run longer, the watchdog hands time over as release would have. A deadline
// earlier than the watchdog does not wait for it: one noted before collect read its group is in
// next; one noted after that read and before the role is free (whatever target it read) is seen
// by step 2's read of the groups; one noted after that signals (target holds the watchdog's
// moment), and signal nudges while the role is free. Step 2 nudges and returns without a
// watchdog: the nudge comes after the role is free, so the worker that takes the token tries for
// the role after that. A wake token left in wake is the next keeper's: its first look spends it. A
// step that leaves more to do, or fires more than a few callbacks, hands the role over at once
// (hurry).
func (w *Wheel) releaseLater(wk *worker, now, next, first int64) {
	// 1. target before the role is free: a producer that reads it and finds its deadline
	//    earlier signals, and signal nudges (the watchdog would come too late for it).
	at := satAddNanos(first, w.tick)
	if at <= now && now < never-w.tick {
		at += ((now-at)/w.tick + 1) * w.tick // a late wake: its re-arm skips to the first after now
	}
	if at-w.grain > now {
		at -= w.grain // first may be a grain late (wheel.nextDue)
	}
	at = min(at, next)
	w.target.Store(at)
	w.keeper.Store(false)
	if testHookReleased != nil {
		testHookReleased(w) // tests only: paused with the role free, before the read of the groups
	}
	// 2. Read every group once more. A producer that noted a deadline after collect read its
	//    group did not nudge if it read target before the store in 1 (awake: no signal), or
	//    read it after but still saw the role held (signal then only leaves a token): either
	//    way its g.next store came before a load that came before a store above, so this read
	//    sees it, and nudges if it is earlier than the watchdog. (The token, if any, stays for
	//    the next keeper: it may be another worker's that took the role since.)
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
	if wk.watch == nil {
		wk.watch = time.AfterFunc(d, w.watchdog)
	} else {
		wk.watch.Reset(d)
	}
}

// hurry nudges an idle worker now if this worker's watchdog is still armed (releaseLater, and
// neither gone off nor stopped yet): an advance step left more to do, or fired more than
// minShare callbacks, so the advance may well outlast a tick (and the nudged worker can take the
// next tick's work on another core meanwhile). A watchdog that went off has nudged already.
func (w *Wheel) hurry(wk *worker) {
	if w.unwatch(wk) {
		w.nudgeIdle()
	}
}

// unwatch stops this worker's watchdog and reports whether it was still armed: the advance is
// over (or hurry nudges instead). One that went off already has nudged, or found the role taken.
func (w *Wheel) unwatch(wk *worker) bool {
	return wk.watch != nil && wk.watch.Stop()
}

// watchdog runs when a worker's watch goes off, on a goroutine of the runtime's (it exits at
// once): the role is still free when the time it was armed for came, so someone must keep time.
func (w *Wheel) watchdog() {
	if !w.keeper.Load() {
		w.nudgeIdle()
	}
}

// nudgeIdle wakes an idle worker to try for the keeper role. The channel holds one token.
func (w *Wheel) nudgeIdle() {
	select {
	case w.nudge <- struct{}{}:
	default:
	}
}

// collect appends to due the shards that are due at the reading now and that it could claim,
// recomputes the next of every group it looked into, and returns the earliest next over all
// groups as it leaves them (next) and the earliest next of the shards it claimed (first, never
// if none).
// Only the keeper calls it.
//
// For each group that may be due: 1. store never in g.next; 2. read each shard's next: a due
// shard is claimed (a shard that is already claimed is its advancer's, which publishes its next
// when it is done), a later one counts toward the minimum; 3. lower g.next to that minimum.
// A producer or advancer that lowers a shard's next after step 2 read it lowers g.next after
// step 1 (noteDeadline), so step 3's CAS-min keeps the lower value.
func (w *Wheel) collect(now int64, due []*shard) (_ []*shard, next, first int64) {
	next, first = never, never
	for gi := range w.groups {
		g := &w.groups[gi]
		if n := g.next.Load(); n > now {
			next = min(next, n)
			continue
		}
		g.next.Store(never)
		m := int64(never)
		for _, s := range g.shards {
			n := s.next.Load()
			if n > now {
				m = min(m, n)
				continue
			}
			// A due shard whose advancer runs callbacks (claimRunning) is taken over: its
			// next step goes to an idle worker rather than wait for those callbacks.
			if s.claim.CompareAndSwap(claimFree, claimAdvancing) ||
				s.claim.CompareAndSwap(claimRunning, claimAdvancing) {
				due = append(due, s)
				first = min(first, n)
			}
		}
		lowerTo(&g.next, m)
		next = min(next, g.next.Load())
	}
	return due, next, first
}

// minGroups returns the earliest next over all groups.
func (w *Wheel) minGroups() int64 {
	m := int64(never)
	for gi := range w.groups {
		m = min(m, w.groups[gi].next.Load())
	}
	return m
}

// advanceDue advances the shards the keeper claimed, wk.due, to the reading now. All but the first go
// to idle workers while there are some (a shard offered to a busy pool would wait, claimed, in
// the queue); this one takes the rest a step each, and only the last may go on with more steps:
// the others are let go of, still due, for the next keeper to hand out again, so one shard's
// flood never holds up the shards claimed with it.
//
// A shard kept for later waits its turn as claimRunning, published into its group, as a shard
// whose advancer runs callbacks does: the steps before it run callbacks that may block, and a
// keeper (a worker that came free meanwhile) must be able to take it over. Its turn comes only
// if this goroutine can take it back (CAS running -> advancing).
func (w *Wheel) advanceDue(wk *worker, now int64) {
	mine := wk.due[:1]
	for _, s := range wk.due[1:] {
		if len(w.pool.queue) < int(w.idle.Load()) {
			c := chunkPool.Get().(*chunk)
			c.adv, c.now = s, now
			if w.offer(wk, c) {
				continue
			}
			c.adv = nil
			chunkPool.Put(c)
		}
		s.claim.Store(claimRunning)
		w.publishGroup(s)
		mine = append(mine, s) // overwrites an element the loop has read already
	}
	for i, s := range mine {
		if i > 0 && !s.claim.CompareAndSwap(claimRunning, claimAdvancing) {
			continue // a keeper took it over
		}
		w.advanceShard(wk, s, now, i == len(mine)-1)
	}
}

// Values of shard.claim.
const (
	claimFree int32 = iota
	claimAdvancing
	claimRunning
)

// advanceShard advances a shard that the caller claimed to the reading now, in steps of stepBudget
// entries, each under one hold of s.mu.
//
// Each step's callbacks run on this goroutine, right after the step made them (their entries
// are in this core's cache), except for shares offered to idle workers when there are some
// (offerFired). While they run the shard is claimRunning and its next is published into its
// group, so a slow callback never holds the shard up: a keeper that sees it due takes it over
// and hands its next step to another worker. Afterwards this goroutine takes the shard back
// (CAS running -> advancing) and goes on with the next step, unless more is unset, work waits in
// the queue, or another shard is due that nobody advances and nobody keeps time to see
// (unownedDue): then it lets the shard go (CAS running -> free, published) and returns, to take
// the queued work or the keeper role; the next keeper claims the shard again with the others.
// The claim is the only arbiter: whoever moved it to advancing advances until the shard is done
// or lets go and publishes, so no due step is left with nobody to take it, and none is taken
// twice.
// After Stop it advances no further: what fired already runs, what is pending is Stop's.
//
// Each step after the first reads the clock again and advances to the later reading. A step
// that ran out of budget left a bucket half taken, and a step's callbacks take time: with the
// first reading kept, a cascade of a big bucket (a million entries re-inserted one level down,
// about 20 ms on one core) relinked everything in it for a deadline a few ticks on, and its
// first callback waited for the whole cascade. With a fresh reading, once that deadline has come
// the rest of the bucket fires as it is taken. A later reading is always safe to fire by (it is
// still no later than the true time), and the wheel takes any reading that does not go back.
func (w *Wheel) advanceShard(wk *worker, s *shard, now int64, more bool) {
	for step := 0; ; step++ {
		done := true
		if !w.closed.Load() {
			if step > 0 {
				now = max(now, w.nanos())
			}
			s.mu.Lock()
			done = s.advanceLocked(now, stepBudget)
			wk.batch, s.fired = s.fired, wk.batch[:0] // wk.batch is empty: cleared after each run
			s.mu.Unlock()
		}
		goOn := !done && more
		if goOn && len(wk.batch) == 0 {
			w.hurry(wk)
			// A step that only cascaded: nothing runs, so the claim stays advancing and is
			// not published (which would wake the keeper to take over a shard nobody waits
			// for); the same test as below decides whether to go on.
			if w.letGo(s) {
				s.claim.Store(claimFree)
				w.publishGroup(s)
				return
			}
			continue
		}
		rest := w.offerFired(wk, wk.batch)
		// After the offer, which counts idle workers: one nudged before it would still count
		// as idle and be handed a share instead of keeping time.
		if goOn || len(wk.batch) > minShare {
			w.hurry(wk) // more than a few callbacks: let an idle worker keep time meanwhile
		}
		if goOn {
			s.claim.Store(claimRunning)
		} else {
			s.claim.Store(claimFree)
		}
		w.publishGroup(s)
		w.runRefs(rest, wk, false)
		clear(wk.batch)
		wk.batch = wk.batch[:0]
		if !goOn {
			return
		}
		if w.letGo(s) {
			if s.claim.CompareAndSwap(claimRunning, claimFree) {
				w.publishGroup(s)
			}
			return
		}
		if !s.claim.CompareAndSwap(claimRunning, claimAdvancing) {
			return // a keeper took it over
		}
	}
}

// letGo reports whether the advancer of s should let it go rather than take its next step: work
// waits in the queue, or another shard may be due that nobody advances and nobody keeps time to
// see.
func (w *Wheel) letGo(s *shard) bool {
	return len(w.pool.queue) > 0 || !w.keeper.Load() && w.unownedDue(s)
}

// unownedDue reports whether a shard other than s may be due with nobody advancing it: a free
// due shard of s's group, or any other group whose lower bound is due. It reads the clock, so
// that an advancer that goes on for long still sees shards that came due meanwhile.
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
			if o != s && o.next.Load() <= now && o.claim.Load() == claimFree {
				return true
			}
		}
	}
	return false
}

// publishGroup lowers the group's next to the shard's, after the shard's advancer let go of it,
// and signals the keeper if that is earlier than its target.
func (w *Wheel) publishGroup(s *shard) {
	n := s.next.Load()
	if lowerTo(&s.g.next, n) && n < w.target.Load() {
		w.signal()
	}
}

// offerFired offers what one advance step fired to idle workers, in shares of up to chunkCap
// entries and no fewer than minShare (a few timers run here rather than pay a hand-off each),
// and returns what is left for the caller to run: at least the last share, and everything the
// idle workers are not there to take. A share handed to a busy pool would only wait in the queue
// while its entries' cache lines go cold; the caller runs it sooner.
func (w *Wheel) offerFired(wk *worker, refs []ref) []ref {
	if w.pool.queue == nil {
		return refs
	}
	per := min(w.pool.chunkCap, max(minShare, len(refs)/len(w.pool.done)))
	for len(refs) > per && len(w.pool.queue) < int(w.idle.Load()) {
		c := newChunk(refs[:per])
		if !w.offer(wk, c) {
			c.n = 0
			clear(c.es[:per])
			chunkPool.Put(c)
			break
		}
		refs = refs[per:]
	}
	return refs
}

// minShare is the fewest callbacks that offerFired hands to another worker together.
const minShare = 8
