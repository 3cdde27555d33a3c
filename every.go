package shardwheel

import (
	"fmt"
	"math"
	"time"
)

// every is the argument of a periodic entry: the user's func, its interval, and where the series
// stands. The shard a run re-arms on is the one the entry lives in (ref.s).
//
// f and interval are immutable. due, when and version are written by Every before the entry is
// published, and then only by runPeriodic, on the goroutine that holds the entry in state
// running: exactly one goroutine wins firing -> running, runs of one Every never overlap, and the
// entry goes back to pending (a CAS, then the add command through the ring) only after those
// writes, so the next run's goroutine, which reaches the entry through that CAS and the ring,
// sees them. Timer.Reset never touches them: a Reset shows in the entry itself (a new version in
// the state word and a new deadline in when), which runPeriodic compares with version and when.
type every struct {
	f        func()
	interval time.Duration

	// due is the instant, in nanoseconds on the wheel's clock and not rounded to the tick, the
	// current run is due at: Every's reading plus the interval for the first run, and then whole
	// intervals later (the fixed rate), unless a Reset moved the run (see runPeriodic).
	due int64
	// when is the deadline the current run was armed for: by schedule, from its own reading of
	// the clock, for the first run (before the add publishes the entry), then by runPeriodic.
	when int64
	// version is the version of the state word when the current run was armed (a new arming
	// starts at 0); a Reset bumps it.
	version uint64
}

// Every runs f every interval until the returned Timer is stopped, at a fixed rate, as
// time.Ticker does: the k-th run is due k intervals after the call, and never starts earlier, so
// the series does not drift by the time a run takes to start. Runs of one Every never overlap and never pile
// up: the next run is armed when the previous one has returned, and if later runs came due
// meanwhile (f took longer than the interval, or the run started late), they are skipped, and
// the next run is the first one due after the previous run ended.
//
// The Timer's Stop reports true if it prevented a run that was still to come, also while a run is
// in progress (that run completes; no other starts). Reset(d) moves the next run to d from now
// while the series waits for it, and the series then keeps its rate from there: the runs after
// it are due whole intervals after the instant that run was due at (d from the Reset, or the
// Reset itself for d <= 0).
//
// Every returns an error naming the value for an interval <= 0, ErrNilFunc for a nil f, and as
// AfterFunc after Stop or past WithMaxPending. In Stats, each run counts once in Scheduled and
// once in Fired, so the balance holds.
func (w *Wheel) Every(interval time.Duration, f func()) (Timer, error) {
	if f == nil {
		return w.reject(ErrNilFunc)
	}
	if interval <= 0 {
		w.rejected.Inc()
		return Timer{}, fmt.Errorf("shardwheel: Every(%v): interval must be positive", durationArg(interval))
	}
	// schedule reads the clock again, no earlier than here: the first run is due no earlier
	// than due.
	ev := &every{f: f, interval: interval, due: satAddNanos(w.nanos(), int64(interval))}
	return w.schedule(nil, ev, interval)
}

// runPeriodic runs one run of an Every; the worker has moved the entry from firing to running.
// It counts the run as fired and the next run as scheduled before f starts, so that a Stop during
// the run (running -> stopped, counted as stopped) keeps Scheduled == Fired + Stopped + Pending.
// After f it re-arms the entry (running -> pending) with the same gen, so the Timer stays valid,
// unless a Stop came first; then it frees the entry into fb, which nothing else refers to.
//
// The fixed rate. 1. Before f: if a Reset moved this run (the state word's version or the entry's
// deadline differs from what the series armed), the series re-bases at the instant the run was
// due at. 2. After f, one clock reading: the next run is due whole intervals after this one, the
// first such instant strictly after that reading (those at or before it are skipped, as
// time.Ticker drops the ticks a slow receiver missed). All arithmetic saturates at the end of
// time (math.MaxInt64 ns).
//
// Wheel.Stop. A run that starts once Stop has begun (it fired before, and runs as fired callbacks
// do) has no next run: the entry is dropped before f, uncounted, so that what Stop returns is
// exact; unless a Timer.Stop got to it first, which counted the next run as stopped, and then it
// is counted as scheduled. A run in progress when Stop begins counts its next run in Stop's
// return: on another goroutine, which Stop waits for, its re-arm either reached the ring before
// Stop closed it (and Stop's drain drops the entry there) or finds the ring closed; on
// Stop's own (Stop from f), Stop drops it (dropOwnRuns, which finds the entry in wk.run).
func (w *Wheel) runPeriodic(r ref, ev *every, wk *worker, fb *freeBatch) {
	e, s := r.e, r.s
	wk.fired.n.Inc()
	if !w.closed.Load() || !dropFrom(e, stRunning) {
		s.scheduled.Inc()
	}
	if when := e.when.Load(); e.state.Load()&versionMask != ev.version || when != ev.when {
		ev.due = when // 1. a Reset moved this run
	}
	wk.run = e
	// The run ends the same way whether f returns or calls runtime.Goexit (runFrom).
	defer w.endRun(r, ev, wk, fb)
	w.call(callFunc, ev.f)
}

// endRun ends a run of an Every after its f, on the goroutine that ran it: it re-arms the entry
// for the next run (runPeriodic's 2.), or frees it into fb if a Stop (the Timer's or the
// wheel's) came before or during the run.
func (w *Wheel) endRun(r ref, ev *every, wk *worker, fb *freeBatch) {
	e, s := r.e, r.s
	wk.run = nil
	if w.manual != nil && w.manual.elapsed.Load() == math.MaxInt64 {
		// A manual clock at the end of time cannot move again, and every deadline is due there:
		// re-arming would run the series forever inside one Advance. The series ends here, and
		// its next run, counted as scheduled when this run began, is taken back: it will never
		// be, and it was not pending at any Stop. Unless a Stop (the Timer's, or the wheel's)
		// got to the entry first and counted it (and gave its WithMaxPending place back).
		if dropFrom(e, stRunning) {
			s.scheduled.Dec()
			s.releasePending(1) // the place the series held is free again (review 33)
		}
		fb.add(&s.slab, r.i, e)
		return
	}
	step := nextStep(ev.due, w.nanos(), int64(ev.interval)) // 2.
	when := w.deadlineFrom(ev.due, time.Duration(step))
	ev.due, ev.when = satAddNanos(ev.due, step), when
	var gen uint64
	for {
		st := e.state.Load()
		if isState(st, stStopped) || isState(st, stDropped) {
			fb.add(&s.slab, r.i, e)
			return
		}
		e.when.Store(when)
		ev.version = st & versionMask // the CAS below keeps it; only a Reset changes it
		// Pending and queued: its add follows (timer.go).
		if e.state.CompareAndSwap(st, withState(st, stPending)|queuedBit) {
			gen = genOf(st)
			break
		}
	}
	if ok, _ := s.send(r.i, gen, opAdd); !ok {
		// Wheel.Stop closed the ring during the run: the next run will never happen. A Reset
		// may hold the entry meanwhile; dropFrom waits for it rather than lose the count. A
		// dropped entry is never freed: it lets go of f and arg here, as dropLocked's do
		// (letGoDropped), so that the stopped wheel keeps nothing the series' f refers to
		// (review 29). The drop's CAS is exclusive with the Timer's Stop, the only other
		// writer; nobody reads them of a dropped entry.
		if dropFrom(e, stPending) {
			letGoDropped(e)
			w.noteDropped(1)
		}
		return
	}
	// The user holds this timer's handle, so a Reset may have come between the CAS above and
	// the send, lowering the deadline; its command, if it went into the ring ahead of this add,
	// found the entry unlinked and was ignored, and the advance that took it may have published
	// a later next meanwhile. The add links the entry at the Reset's deadline, so that is the
	// one to note: the Reset stored it before it claimed its slot, which came before this add's,
	// so this load sees it. (A Reset whose command follows the add moves the entry itself, and
	// noted its deadline.) At worst this notes a deadline earlier than needed, which costs a
	// visit: so too when a Stop came and the add freed the entry before this load, which then
	// reads its free-stack link, a small number, or a later arming's deadline. Found by review:
	// the run started up to an interval late (TestEveryRearmResetEarlier).
	s.noteDeadline(min(when, e.when.Load()))
}

// nextStep returns how far after due the next run of a series with the given interval is due:
// the smallest whole number of intervals, at least one, that lands strictly after end. It
// saturates at math.MaxInt64. due, end and interval are non-negative, interval > 0.
func nextStep(due, end, interval int64) int64 {
	k := int64(1)
	if end >= due {
		k = (end-due)/interval + 1
	}
	if k > math.MaxInt64/interval {
		return math.MaxInt64
	}
	return k * interval
}
