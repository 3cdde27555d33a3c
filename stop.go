package shardwheel

import "runtime"

// Stop stops the wheel and returns how many timers were pending and will now never run. Pending
// timers never fire; callbacks already running, or already taken from the wheel to run (fired,
// waiting for a worker or behind another callback), still run to their end. After Stop,
// AfterFunc, AfterFuncArg and Every return ErrClosed, Len is 0, and a deadline context whose timer
// Stop dropped ends at its deadline on a runtime timer, as context.WithDeadline's would. Stop is
// safe to call more than once and from several goroutines; later calls return 0.
//
// Called from a goroutine that is not running one of this wheel's callbacks, Stop returns once
// every callback has returned (those that called Stop themselves included) and every goroutine
// the wheel started has exited, so a goleak check after it passes. Called from inside one of this
// wheel's callbacks (on a worker, or on the goroutine of a ManualClock.Advance that runs
// callbacks), it does all of the above but the waiting: it returns once the pending timers are
// dropped (by it, or by a Stop in progress elsewhere, whose drop waits for no callback), without
// waiting for any callback or goroutine; the wheel's goroutines finish the callbacks they hold
// and exit on their own. So no arrangement of callbacks that call Stop and wait for one another
// can deadlock. (Like http.Server.Shutdown, a wait from inside would wait for itself; unlike it,
// this Stop does not hang.)
//
// An Every whose run is in progress when the wheel stops finishes that run, and its next run never
// starts: it counts as pending, and Stop counts it in what it returns. A run that had fired before
// Stop but starts after it has no next run. So each run of an Every, as each timer, ends in exactly
// one of: it ran, a Timer.Stop reported true, or a Wheel.Stop counted it; and once the wheel is
// quiet, Stats.Scheduled == Fired + Stopped + Dropped.
func (w *Wheel) Stop() int {
	inside := w.inCallback()
	n := 0
	if w.closed.CompareAndSwap(false, true) {
		n = w.shutdown()
	} else {
		// The first Stop's drop is over: Len is 0. Also from inside a callback: the drop waits
		// for no callback (shutdown), so a callback never waits for itself here.
		<-w.stopped
	}
	if !inside {
		w.awaitGoroutines()
	}
	return n
}

// inCallback reports whether the caller is one of the goroutines that run this wheel's callbacks:
// a worker, or the manual advancer while it advances. It reads the goroutine id (about a
// microsecond), which is why only Stop asks.
func (w *Wheel) inCallback() bool {
	g := goid()
	return w.pool.isWorker(g) || w.manual != nil && w.advancer.Load() == g
}

// shutdown is the first Stop's: the caller won closed. In order:
//  1. Drop the next run of every Every whose run is in progress (dropRunning).
//  2. Close every ring and drop what is pending in it or in the wheel. A push that claimed its
//     slot before the close is accepted and dropped here; one after it returns ErrClosed. An
//     advancer holds mu for one bounded step at a time; what that step fired is no longer pending,
//     and runs.
//  3. Close stopped: later Stops may return, Len is 0, and a manual dispatch that waits for room
//     in the queue runs its tasks itself from now on.
//  4. Close quit once nobody can queue work any more: the workers run what is left in the queue
//     and exit. On the system clock only workers queue, and each looks at the queue after its own
//     last send; with a manual clock only the holder of advMu does, and unlockAdvance closes quit.
//
// It waits for no callback: only, in 1, for a re-arm in progress between two of its steps, and in
// 2, for a push between its claim and its publish, as the ring's consumer always does.
func (w *Wheel) shutdown() int {
	n := w.dropRunning()
	for _, s := range w.shards {
		s.mu.Lock()
		n += s.dropLocked()
		s.mu.Unlock()
	}
	w.noteDropped(int64(n))
	close(w.stopped)
	if w.manual == nil {
		w.closeQuit()
		return n
	}
	w.manual.detach(w)
	if w.advMu.TryLock() {
		w.unlockAdvance() // closes quit; with the wheel closed it does not take advMu back
	}
	return n
}

// dropRunning drops the next run of every Every whose run is in progress, on any goroutine that
// runs callbacks (runSlot.run), and returns how many it dropped. Such a run's next run is pending
// (counted as scheduled when the run began) but in no ring or wheel, where step 2 of shutdown
// would find it.
//
// For each slot, by the state of the entry its run names:
//   - running: the run is in progress; drop its next run (running -> dropped). The run's endRun
//     finds the entry dropped and frees it. A Timer.Stop that came first counted it as stopped.
//   - pending: the run is over and its endRun is re-arming it, between its CAS and the moment its
//     add is in the ring, after which it clears run. Wait for that (it runs no user code): the
//     add then reaches the ring before step 2 closes it, and step 2 drops the entry there.
//   - held by a Reset: wait for it (two stores).
//   - anything else: nothing of this series to drop.
//
// A run that starts after this read of its slot sees closed and has no next run (runPeriodic): its
// goroutine stores run before it reads closed, and Stop set closed before it reads run. A stale
// run (a slot's entry reused by another series since) is harmless: a running periodic entry's run
// is always in progress somewhere, and dropping it once is right; anything else is left alone.
func (w *Wheel) dropRunning() int {
	n := 0
	for i := range w.pool.slots {
		run := &w.pool.slots[i].run
		for e := run.Load(); e != nil; {
			st := e.state.Load()
			if isState(st, stRunning) {
				if e.state.CompareAndSwap(st, withState(st, stDropped)) {
					n++
					break
				}
				continue
			}
			if !isState(st, stPending) && !isHeld(st) {
				break
			}
			runtime.Gosched()
			if next := run.Load(); next != e {
				e = next
			}
		}
	}
	return n
}

// awaitGoroutines waits for every callback and goroutine of a stopped wheel: the manual advance in
// progress (it runs callbacks with WithWorkers(0) or CallerRuns, and closes quit as it lets go of
// advMu, unless this does), and every worker's exit.
func (w *Wheel) awaitGoroutines() {
	if w.manual != nil {
		w.advMu.Lock()
		w.unlockAdvance()
	}
	for _, done := range w.pool.done {
		<-done
	}
}
