package shardwheel

import (
	"log"
	"math"
	"runtime/debug"
	"sync"
	"time"

	"go.uber.org/atomic"
)

// The worker pool: a fixed number of goroutines that keep time, advance due shards and run
// callbacks (expiry.go says who does what when). Work that one worker cannot do at once (a due
// shard beyond its first, the shares of a flood) travels through one bounded channel of tasks,
// which idle workers take from. Workers block only on channels and their keeper timer, so a wheel
// inside a testing/synctest bubble is durably idle when nothing is due.
//
// The queue's bound is WithQueueSize callbacks: a task holds at most taskCap of them and the
// channel holds queueSize/taskCap tasks. A worker that finds it full runs the task itself (it is a
// worker: that is its wait for room). With a manual clock the caller of Advance dispatches and the
// FullPolicy applies (manual.go). Neither loses a callback.
type workerPool struct {
	queue   chan *task      // nil when workers == 0: the wheel's one goroutine runs everything
	taskCap int             // immutable
	done    []chan struct{} // done[i] is closed when worker i exits
	gids    []atomic.Int64  // gids[i] is worker i's goroutine id, for Wheel.Stop and Advance
	// slots[i] is worker i's; slots[len(done)] is the manual advancer's (the caller of
	// ManualClock.Advance that holds advMu, which runs callbacks with WithWorkers(0) or
	// CallerRuns). Stats sums their counters.
	slots []runSlot
}

// runSlot is what one goroutine that runs callbacks counts and reuses. Each field is written by
// that goroutine alone (the advancer's slot: by the holder of advMu); the counters and run are
// atomic because Stats and Wheel.Stop read them.
type runSlot struct {
	fired paddedCounter   // callbacks started (each Every run once)
	taken atomic.Uint64   // entries this goroutine's advance steps fired (taken from the wheel)
	late  atomicHistogram // how late each callback started
	// run is the entry of the Every whose run is in progress here, from just before the run's
	// start until its re-arm is in its ring (runPeriodic, endRun). Wheel.Stop reads it to drop
	// that series' next run (stop.go).
	run atomic.Pointer[entry]

	due   []*shard // the shards this worker took as keeper
	batch []ref    // what the current advance step fired
	// stride is lateClock's stride at the end of the slot's last batch on the system clock, where
	// the next batch starts from it.
	stride int
	timer  *time.Timer // the keeper's sleep, made on first use
	// watch is the watchdog yieldLater arms (expiry.go), made on first use; whether it is armed
	// is what its Stop reports (unwatch). Each worker arms and stops only its own, so one that
	// went off and handed the role over is never confused with the next keeper's.
	watch *time.Timer
	_     [cacheLineSize]byte
}

// paddedCounter is an atomic counter alone on its cache line.
type paddedCounter struct {
	n atomic.Uint64
	_ [cacheLineSize - 8]byte
}

// init sizes the pool: workers goroutines (at least one on the system clock, which keeps time;
// none with a manual clock and WithWorkers(0), where the caller of Advance runs the callbacks).
func (p *workerPool) init(workers, queueSize int, manual bool) {
	n := workers
	if n == 0 && !manual {
		n = 1
	}
	p.slots = make([]runSlot, n+1)
	p.done = make([]chan struct{}, n)
	p.gids = make([]atomic.Int64, n)
	for i := range p.done {
		p.done[i] = make(chan struct{})
	}
	p.taskCap = min(maxTask, queueSize)
	if workers > 0 {
		p.queue = make(chan *task, max(1, queueSize/p.taskCap))
	}
}

// advancerSlot is the slot of the manual advancer.
func (p *workerPool) advancerSlot() *runSlot { return &p.slots[len(p.slots)-1] }

// isWorker reports whether g is the goroutine id of one of the pool's workers.
func (p *workerPool) isWorker(g int64) bool {
	for i := range p.gids {
		if p.gids[i].Load() == g {
			return true
		}
	}
	return false
}

// totals sums the slots' counters: callbacks started, entries taken from the wheel, and the
// lateness histogram. Every taken entry's callback starts (fired) or is stopped before it starts
// (shard.stoppedFiring), so taken minus those is what waits (Stats.Queued).
func (p *workerPool) totals() (fired, taken uint64, late Histogram) {
	for i := range p.slots {
		sl := &p.slots[i]
		fired += sl.fired.n.Load()
		sl.late.addTo(&late)
	}
	for i := range p.slots {
		taken += p.slots[i].taken.Load()
	}
	return fired, taken, late
}

// isClosed reports whether c is closed.
func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// maxTask is the most callbacks that travel to a worker together.
const maxTask = 64

// task carries work to a worker in one channel operation: fired entries to run, or (adv non-nil)
// a due shard to advance to the reading now, which the sender took for the receiver (owner
// advancing). Pooled; once sent, it is the receiver's.
type task struct {
	n    int
	refs [maxTask]ref
	adv  *shard
	now  int64
}

var taskPool = sync.Pool{New: func() any { return new(task) }}

// newTask returns a pooled task holding refs (at most maxTask).
func newTask(refs []ref) *task {
	t := taskPool.Get().(*task)
	t.n = copy(t.refs[:], refs)
	return t
}

// putTask returns a task to its pool, holding nothing.
func putTask(t *task) {
	clear(t.refs[:t.n])
	t.n, t.adv = 0, nil
	taskPool.Put(t)
}

// offer puts a task in the queue if there is room, and reports whether it did. Never blocks.
func (w *Wheel) offer(t *task) bool {
	select {
	case w.pool.queue <- t: // a nil queue is never ready
		return true
	default:
		return false
	}
}

// runTaskRefs runs the callbacks of a task on slot sl and returns the task to its pool.
func (w *Wheel) runTaskRefs(t *task, sl *runSlot) {
	w.runBatch(t.refs[:t.n], sl)
	putTask(t)
}

// runBatch runs fired entries in order on slot sl, and returns the ones it frees to their slabs
// together.
func (w *Wheel) runBatch(refs []ref, sl *runSlot) {
	if len(refs) == 0 {
		return
	}
	var fb freeBatch
	w.runFrom(refs, sl, &fb)
	fb.flush()
}

// runFrom runs refs in order, freeing into fb. A callback that calls runtime.Goexit (t.FailNow in
// a test, say) ends this goroutine, as it would end a time.AfterFunc callback's own, but it must
// not take the callbacks fired with it along: the deferred call runs the rest of refs as the
// goroutine unwinds (each further Goexit among them unwinds through another runFrom), then returns
// fb's entries, which the caller's flush will not. A panic never gets here: call recovers it. What
// else the goroutine held is made safe further up: a worker is replaced (work), an Advance lets go
// of advMu (manualAdvance), an Every's run re-arms (runPeriodic), and no shard or keeper role is
// held while callbacks run (driveShard, keep).
func (w *Wheel) runFrom(refs []ref, sl *runSlot, fb *freeBatch) {
	i := 0
	defer func() {
		if i < len(refs) { // refs[i]'s callback called runtime.Goexit
			w.runFrom(refs[i+1:], sl, fb)
			fb.flush()
		}
	}()
	lc := lateClock{w: w, stride: sl.stride}
	for ; i < len(refs); i++ {
		w.runEntry(refs[i], sl, &lc, fb)
	}
	if w.manual == nil {
		sl.stride = lc.stride
	}
}

// runEntry starts an entry's callback unless a Stop got to it first. A one-shot entry is freed into
// fb before its callback starts (fb returns it to its slab after the batch); an Every's stays until
// its run is over. The start is counted in sl, with its lateness against lc's reading. f and arg
// are read only after the CAS that starts the callback: a Stop before it may be clearing them
// (Timer.stopFiring).
func (w *Wheel) runEntry(r ref, sl *runSlot, lc *lateClock, fb *freeBatch) {
	e := r.e
	when := e.when.Load() // the entry is firing: only a Reset's failed attempt may race
	for {
		s := e.state.Load()
		switch {
		case isState(s, stStopped):
			fb.add(&r.s.slab, r.i, e) // the Stop counted itself; no command refers to e
			return
		case isState(s, stLetGo):
			// A Stop is letting go of the callback: leave the entry to it (it frees it) rather
			// than wait, unless it moved on to stopped meanwhile (then look again).
			if e.state.CompareAndSwap(s, withState(s, stPassed)) {
				return
			}
		case isPeriodic(s):
			if e.state.CompareAndSwap(s, withState(s, stRunning)) {
				sl.late.observe(w.lateness(lc.start(), when))
				w.runPeriodic(r, e.arg.(*every), sl, fb)
				return
			}
		default: // firing
			if e.state.CompareAndSwap(s, withState(s, stFree)) {
				f, arg := e.f, e.arg
				fb.add(&r.s.slab, r.i, e)
				sl.fired.n.Inc()
				sl.late.observe(w.lateness(lc.start(), when))
				r.s.returnCredit() // to the timer's shard: WithMaxPending is striped (pending.go)
				w.call(f, arg)
				return
			}
		}
	}
}

// callFunc runs a func() stored as the argument: func values are pointer-shaped, so storing one in
// an interface allocates nothing.
func callFunc(arg any) { arg.(func())() }

// call runs a callback, recovering a panic: it is counted and handed to the panic handler, and the
// goroutine goes on with the next callback.
func (w *Wheel) call(f func(any), arg any) {
	defer func() {
		if r := recover(); r != nil {
			w.panics.Inc()
			w.handlePanic(r)
		}
	}()
	f(arg)
}

func (w *Wheel) handlePanic(r any) {
	defer func() {
		if r2 := recover(); r2 != nil {
			log.Printf("shardwheel: panic handler panicked: %v (handling %v)\n%s", r2, r, debug.Stack())
		}
	}()
	w.opts.onPanic(r)
}

// runPeriodic runs one run of an Every; runEntry has moved the entry from firing to running. It
// counts the run as fired and the next run as scheduled before f starts, so that a Stop during
// the run (running -> stopped, counted as stopped) keeps Scheduled == Fired + Stopped + Pending.
// After f, endRun re-arms the entry with the same gen, so the Timer stays valid.
//
// Wheel.Stop and a run. The run's goroutine publishes the entry in sl.run and then reads closed;
// Stop sets closed and then reads every slot's run (stop.go). So at least one sees the other:
//   - Stop sees the run: it drops the next run (running -> dropped) and counts it in what it
//     returns; this run then finds the entry dropped, counts the next run as scheduled (it was
//     pending when Stop came), and endRun frees the entry.
//   - this run sees closed (the run fired before Stop and starts after it): the series has no
//     next run; it drops the entry itself, uncounted, unless a Stop got there first and counted.
//
// The fixed rate: if a Reset moved this run (the state word's version or the entry's deadline
// differs from what the series armed), the series re-bases at the instant the run was due at.
func (w *Wheel) runPeriodic(r ref, ev *every, sl *runSlot, fb *freeBatch) {
	e, s := r.e, r.s
	sl.fired.n.Inc()
	sl.run.Store(e)
	if !w.closed.Load() || !dropFrom(e, stRunning) {
		s.scheduled.Inc()
	}
	if when := e.when.Load(); e.state.Load()&versionMask != ev.version || when != ev.when {
		ev.due = when // a Reset moved this run
	}
	// The run ends the same way whether f returns or calls runtime.Goexit (runFrom).
	defer w.endRun(r, ev, sl, fb)
	w.call(callFunc, ev.f)
}

// endRun ends a run of an Every after its f, on the goroutine that ran it: it re-arms the entry for
// the next run, due whole intervals after this one (the first such instant after one reading of
// the clock, nextStep), or frees it into fb if a Stop (the Timer's or the wheel's) came first.
// Arithmetic saturates at the end of time.
func (w *Wheel) endRun(r ref, ev *every, sl *runSlot, fb *freeBatch) {
	e, s := r.e, r.s
	defer sl.run.Store(nil) // after the re-arm's add is in the ring: Wheel.Stop waits for it
	if w.manual != nil && w.manual.elapsed.Load() == math.MaxInt64 {
		// A manual clock at the end of time cannot move again, and every deadline is due there:
		// re-arming would run the series forever inside one Advance. The series ends here, and
		// its next run, counted as scheduled when this run began, is taken back, with its
		// WithMaxPending place; unless a Stop got to the entry first and counted it.
		if dropFrom(e, stRunning) {
			s.scheduled.Dec()
			s.returnCredit()
		}
		fb.add(&s.slab, r.i, e)
		return
	}
	step := nextStep(ev.due, w.nanos(), int64(ev.interval))
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
		// Pending and queued: its add follows (entry.go).
		if e.state.CompareAndSwap(st, withState(st, stPending)|queuedBit) {
			gen = genOf(st)
			break
		}
	}
	if ok, _ := s.send(r.i, gen, opAdd); !ok {
		// The ring is closed. Wheel.Stop waits for a re-arm in progress before it closes rings
		// (stop.go), so this does not happen; if it did, the next run is dropped and counted,
		// never lost. An Every's entry is never a context's, so there is no one to tell.
		if dropFrom(e, stPending) {
			clearEntry(e)
			w.noteDropped(1)
		}
		return
	}
	// The user holds this timer's handle, so a Reset may have come between the CAS above and the
	// send, lowering the deadline; its command, if it went into the ring ahead of this add, found
	// the entry unlinked and was ignored. The add links the entry at the Reset's deadline, so that
	// is the one to note: the Reset stored it before it claimed its ring slot, which came before
	// this add's. At worst this notes a deadline earlier than needed, which costs a visit: so too
	// when a Stop came and the add freed the entry before this load, which then reads a free-stack
	// link or a later arming's deadline (TestEveryRearmResetEarlier).
	s.noteDeadline(min(when, e.when.Load()))
}

// noteDropped counts n timers that will never run because the wheel stopped, and gives their
// WithMaxPending places back.
func (w *Wheel) noteDropped(n int64) {
	w.dropped.Add(n)
	w.returnToReserve(n)
}

// lateClock is the reading of the clock that runFrom's callbacks are counted late against; it
// lives on runFrom's stack. A reading costs about 40 ns on the machine of BENCHMARKS.md, where
// firing a callback costs about 70: one per callback made the fire phase 60% slower. So a reading
// is shared by a stride of callbacks that start one after another, and the stride adapts: it is 1
// after any stride whose callbacks took lateQuick or more each on average, and it doubles, up to
// lateStride, after a stride of quicker ones. A batch starts with a reading, at the stride its
// slot's last batch ended with. Slow callbacks are read before each start; a flood of quick ones
// about once per lateStride. A callback's lateness may be read up to the run time of the
// lateStride-1 callbacks before it early: a slow callback among quick ones delays those after it
// in its stride without showing, and the next reading shows it. A manual clock is read on each
// start (a load).
type lateClock struct {
	w      *Wheel
	now    int64 // the reading, once read is set
	read   bool
	stride int // starts that share a reading
	left   int // starts that may still use now
}

const (
	lateStride = 16
	lateQuick  = int64(time.Microsecond)
)

// start returns the reading for a callback that starts now.
func (c *lateClock) start() int64 {
	if c.left > 0 {
		c.left--
		return c.now
	}
	now := c.w.nanos()
	switch {
	case c.w.manual != nil:
		c.stride = 1
	case !c.read: // the batch's first: the stride its slot's last batch ended with
		c.stride = max(c.stride, 1)
	case now-c.now >= int64(c.stride)*lateQuick:
		c.stride = 1
	default:
		c.stride = min(2*c.stride, lateStride)
	}
	c.now, c.read, c.left = now, true, c.stride-1
	return now
}

// lateness returns how late a callback starting at reading now is, as Stats.Lateness counts it:
// against its deadline when (ns) rounded up to the tick; 0 if it started before that (deadlines
// are exact, so most start within their tick) or for a deadline at the end of time.
func (w *Wheel) lateness(now, when int64) time.Duration {
	return time.Duration(max(0, now-w.ceil(when)))
}
