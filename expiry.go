package shardwheel

import "time"

// The expiry side on the system clock: who sleeps, who advances, who runs callbacks.
//
// A Wheel has a fixed set of workers (WithWorkers of them, one with WithWorkers(0)) and no other
// goroutine, but for the moment a watchdog below goes off (time.AfterFunc runs it on a goroutine
// that exits at once). At any moment at most one worker is the keeper (Wheel.keeper): it sleeps
// until the earliest deadline of any group of shards (wake.go), or until a producer signals an
// earlier one. When something is due, it takes the due shards (shard.owner), lets go of the role
// so that an idle worker can keep time while it works, and advances them (advance.go). With
// several shards due the next keeper is nudged awake at once (yield); with one, only if the
// advance goes on into the next tick (yieldLater arms a watchdog), a step leaves more to do or
// fires more than minShare callbacks, work is queued, or a producer arms an earlier deadline: the
// advance is usually over within microseconds, and the worker then takes the role back itself, so
// a wake costs one goroutine wake-up, not two.
//
// The keeper's sleep is one runtime timer, in the heap of the P that armed it, and the runtime can
// run it late while that P is idle and another is busy; so producers look too: an arm or a Reset
// that finds the keeper's target passed wakes it (overdue, wake.go). So a deadline is one
// goroutine wake-up from its callback, no goroutine or channel sits on the path of every expired
// timer, and a flood spreads over every worker.
//
// With a manual clock there is no keeper: ManualClock.Advance advances every shard on its caller's
// goroutine (manual.go), and the workers only run the tasks it queues.

// testHookYielded, testHookSleep and testHookCollected, set only by tests, run in yieldLater right
// after the role is let go (before its read of the groups), in keep right before the keeper's
// select, and in keep right after collect took something due (with what it took).
var (
	testHookYielded, testHookSleep func(*Wheel)
	testHookCollected              func(w *Wheel, due []*shard)
)

// testHookQueueEmpty, set only by tests, runs in loop after the worker found the queue empty and
// before it acts on what it read of quit.
var testHookQueueEmpty func(*Wheel)

// startWorkers starts the pool's goroutines.
func (w *Wheel) startWorkers() {
	for i := range w.pool.done {
		go w.work(i)
	}
}

// work is worker i's goroutine. A callback that calls runtime.Goexit ends the goroutine, not the
// worker: by the time the deferred call runs, the callbacks fired with it have run (runFrom), and
// the goroutine held no shard and not the keeper role; it starts worker i again on a new
// goroutine, which takes over the slot. So the number of workers stays fixed, and done[i] is
// closed once, by the last.
func (w *Wheel) work(i int) {
	sl := &w.pool.slots[i]
	gid := goid()
	w.pool.gids[i].Store(gid)
	if w.manual != nil {
		w.manual.workers.add(gid)
	}
	exited := false
	defer func() {
		// A Goexit may unwind out of keep between yieldLater's arming of the watchdog and
		// keep's unwatch: stop it here, or it would go off after the wheel stopped.
		w.unwatch(sl)
		if w.manual != nil {
			w.manual.workers.remove(gid)
		}
		if exited {
			close(w.pool.done[i])
			return
		}
		clear(sl.batch)
		sl.batch = sl.batch[:0]
		clear(sl.due)
		sl.due = sl.due[:0]
		go w.work(i)
	}()
	w.loop(sl)
	exited = true
}

// loop is a worker's loop. It takes queued work first; else it tries to become the keeper; else it
// sleeps until work is queued or the keeper lets go of the role. Once Stop has closed quit, it runs
// what is left in the queue and returns. Every task is queued before quit is closed (on the system
// clock by a worker, before its own next pass here; on a manual clock by the holder of advMu,
// before it closes quit), and each pass reads quit before it looks at the queue: so the look of
// the pass that sees quit closed finds every task there is. (Read after the look, quit could
// close between the two with a task queued in between, left to nobody.)
func (w *Wheel) loop(sl *runSlot) {
	for {
		quit := isClosed(w.quit)
		select {
		case t := <-w.pool.queue: // a nil queue (WithWorkers(0)) is never ready
			w.runTask(sl, t)
			continue
		default:
		}
		if testHookQueueEmpty != nil {
			testHookQueueEmpty(w) // tests only: a worker paused after it found the queue empty
		}
		if quit {
			return
		}
		// Once Stop has begun nothing is advanced (driveShard), so nobody keeps time: a keeper
		// would find the same shards due and go round until quit is closed.
		if w.manual == nil && !w.closed.Load() && w.keeper.CompareAndSwap(false, true) {
			w.keep(sl)
			continue
		}
		w.idle.Add(1)
		select {
		case t := <-w.pool.queue:
			w.idle.Add(-1)
			w.runTask(sl, t)
		case <-w.nudge:
			w.idle.Add(-1)
		case <-w.quit:
			w.idle.Add(-1)
		}
	}
}

// runTask runs one task taken from the queue: a due shard to advance, or callbacks.
func (w *Wheel) runTask(sl *runSlot, t *task) {
	if s := t.adv; s != nil {
		now := t.now
		putTask(t)
		w.driveShard(sl, s, now, true)
		return
	}
	w.runTaskRefs(t, sl)
}

// keep is the keeper's loop; the caller holds the role (w.keeper). It returns having let go of the
// role: after it advanced what came due, if another worker took the role meanwhile (it lets go
// before it advances, so time is kept while it works), after it took work from the queue, or once
// Stop has closed quit.
//
// The sleep (numbered for noteDeadline's argument, wake.go):
//  1. target is awake: producers do not signal. A token already in wake is spent: step 2 reads
//     every group, and a signaller's note is in its group before its send.
//  2. collect takes what is due now; if anything is, yield (or yieldLater) and advance it, then
//     take the role back (CAS) and go round, unless another worker holds it.
//  3. store target = the earliest group.next, then read every group.next once more: a producer
//     that lowered one before the store is seen by that read; one after it reads the target and
//     signals. If anything is earlier than the target, or due already, go round.
//  4. sleep until the target, a signal, queued work or quit; then back to 1.
func (w *Wheel) keep(sl *runSlot) {
	for {
		w.target.Store(awake)
		select { // 1.
		case <-w.wake:
		default:
		}
		// Give idle blocks back (trim.go): the keeper is the trimmer. One reading for both: a
		// trim may take a while, and a reading from before it is only early, which the firing
		// side may be (it fires later, never sooner).
		now := w.nanos()
		trimAt := w.trimIdle(now)
		var next, first int64
		if sl.due, next, first = w.collect(now, sl.due[:0]); len(sl.due) > 0 { // 2.
			if !w.keepAfterAdvance(sl, now, next, first) {
				return
			}
			continue
		}
		next = min(next, trimAt)
		w.target.Store(next) // 3.
		if w.minGroups() < next {
			continue
		}
		if !w.sleep(sl, next) { // 4.
			return
		}
	}
}

// keepAfterAdvance is keep's step 2 with something due: it lets go of the role, advances what
// collect took, and reports whether it took the role back.
func (w *Wheel) keepAfterAdvance(sl *runSlot, now, next, first int64) bool {
	if testHookCollected != nil {
		testHookCollected(w, sl.due) // tests only: paused between collect and the yield
	}
	if len(sl.due) > 1 {
		w.yield()
	} else {
		w.yieldLater(sl, now, next, first)
	}
	w.driveDue(sl, now)
	clear(sl.due)
	// Take the role back unless someone took it meanwhile; stop the watchdog only then, so that
	// there is no moment with the role free and nobody to be nudged. With work queued, or after
	// Stop, back to the worker's loop, which takes the queue first and sees quit: hand the role
	// over first.
	if !w.closed.Load() && len(w.pool.queue) == 0 {
		took := w.keeper.CompareAndSwap(false, true)
		w.unwatch(sl)
		return took
	}
	w.hurry(sl)
	return false
}

// sleep is keep's step 4: it sleeps until next (ns), a signal, queued work or quit. It reports
// whether the worker is still the keeper; if not, it has let go of the role, and run the task it
// took from the queue.
func (w *Wheel) sleep(sl *runSlot, next int64) bool {
	cur := w.nanos()
	if next <= cur {
		return true
	}
	var fire <-chan time.Time
	if next != never { // else nothing is due before the end of time
		d := time.Duration(next - cur)
		if sl.timer == nil {
			sl.timer = time.NewTimer(d)
		} else {
			sl.timer.Reset(d)
		}
		fire = sl.timer.C
	}
	if testHookSleep != nil {
		testHookSleep(w) // tests only: a keeper paused before its select
	}
	var t *task
	select {
	case <-fire:
	case <-w.wake:
	case t = <-w.pool.queue:
	case <-w.quit:
	}
	if sl.timer != nil {
		sl.timer.Stop() // since Go 1.23 a stopped timer's channel delivers nothing stale
	}
	if t == nil && !isClosed(w.quit) {
		return true
	}
	w.target.Store(awake)
	w.yield()
	if t != nil {
		w.runTask(sl, t)
	}
	return false
}

// collect appends to due the shards that are due at the reading now and that it could take (owner
// none or running -> advancing), recomputes the next of every group it looked into, and returns
// the earliest next over all groups as it leaves them (next) and the earliest next of the shards it
// took (first, never if none). Only the keeper calls it.
//
// For each group that may be due: 1. store never in g.next; 2. read each shard's next: a due shard
// is taken (one owned by an advancer is that advancer's, which publishes its next when it lets go),
// a later one counts toward the minimum; 3. lower g.next to that minimum. A producer or advancer
// that lowers a shard's next after step 2 read it lowers g.next after step 1 (noteDeadline), so
// step 3's CAS-min keeps the lower value.
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
			// A due shard whose advancer runs callbacks (ownerRunning) is taken over: its next
			// step goes to this worker rather than wait for those callbacks.
			if s.owner.CompareAndSwap(ownerNone, ownerAdvancing) ||
				s.owner.CompareAndSwap(ownerRunning, ownerAdvancing) {
				due = append(due, s)
				first = min(first, n)
			}
		}
		lowerTo(&g.next, m)
		next = min(next, g.next.Load())
	}
	return due, next, first
}
