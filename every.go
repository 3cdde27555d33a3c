package shardwheel

import (
	"fmt"
	"math"
	"time"
)

// every is the argument of a periodic entry: the user's func and its interval. Immutable after
// Every. The shard a run re-arms on is the one the entry lives in (ref.s).
type every struct {
	f        func()
	interval time.Duration
}

// Every runs f every interval until the returned Timer is stopped; the first run is due one
// interval from now. The delay is fixed from the start of the previous run: the next run is due
// one interval after the previous run started, and is armed only when that run has returned, so
// runs of one Every never overlap and never pile up behind a slow f (a run that took longer than
// the interval is followed at once by the next).
//
// The Timer's Stop reports true if it prevented a run that was still to come, also while a run is
// in progress (that run completes; no other starts). Reset moves the next run while the series
// waits for it. Every returns an error naming the value for an interval <= 0, ErrNilFunc for a nil
// f, and as AfterFunc after Stop or past WithMaxPending. In Stats, each run counts once in
// Scheduled and once in Fired, so the balance holds.
func (w *Wheel) Every(interval time.Duration, f func()) (Timer, error) {
	if f == nil {
		return w.reject(ErrNilFunc)
	}
	if interval <= 0 {
		w.rejected.Inc()
		return Timer{}, fmt.Errorf("shardwheel: Every(%v): interval must be positive", durationArg(interval))
	}
	return w.schedule(nil, &every{f: f, interval: interval}, interval)
}

// runPeriodic runs one run of an Every; the worker has moved the entry from firing to running.
// It counts the run as fired and the next run as scheduled before f starts, so that a Stop during
// the run (running -> stopped, counted as stopped) keeps Scheduled == Fired + Stopped + Pending.
// After f it re-arms the entry (running -> pending) with the same gen, so the Timer stays valid,
// unless a Stop came first; then it frees the entry into fb, which nothing else refers to.
func (w *Wheel) runPeriodic(r ref, ev *every, fired *paddedCounter, fb *freeBatch) {
	e, s := r.e, r.s
	fired.n.Inc()
	s.scheduled.Inc()
	start := w.nanos()
	w.call(callFunc, ev.f)
	when := w.deadlineFrom(start, ev.interval)
	if w.manual != nil && w.manual.elapsed.Load() == math.MaxInt64 {
		// A manual clock at the end of time cannot move again, and every deadline is due there:
		// re-arming would run the series forever inside one Advance. The series ends here and
		// its next run counts as dropped, as if Wheel.Stop had ended it.
		if dropFrom(e, stRunning) { // else a Stop during this run got it first and counted it
			w.noteDropped(1)
		}
		fb.add(&s.slab, r.i, e)
		return
	}
	var gen uint64
	for {
		st := e.state.Load()
		if isState(st, stStopped) {
			fb.add(&s.slab, r.i, e)
			return
		}
		e.when.Store(when)
		if e.state.CompareAndSwap(st, withState(st, stPending)) {
			gen = genOf(st)
			break
		}
	}
	if ok, _ := s.send(r.i, gen, opAdd); !ok {
		// Wheel.Stop closed the ring during the run: the next run will never happen. A Reset
		// may hold the entry meanwhile; dropFrom waits for it rather than lose the count.
		if dropFrom(e, stPending) {
			w.noteDropped(1)
		}
		return
	}
	s.noteDeadline(when)
}
