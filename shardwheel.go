// Package shardwheel schedules and cancels millions of timers per second on every core: a sharded,
// hierarchical timing wheel that replaces time.AfterFunc where timers are many and mostly stopped
// (a timeout per RPC, per idle connection, per lease).
//
// The design comes from the classic timing wheels. Each shard owns a hierarchical wheel after
// Varghese & Lauck (six levels of 64 slots, as in Tokio's wheel, plus an overflow bucket), whose
// non-empty buckets sit in a min-heap so that time jumps from one due bucket to the next, as
// Kafka's TimingWheel does with its DelayQueue; entries of a bucket that comes due are fired or
// re-inserted one level down. Commands reach a shard through a bounded lock-free MPSC ring
// (Vyukov's bounded queue), drained by whoever holds the shard, much as Netty's HashedWheelTimer
// drains its pending and cancelled queues on the tick thread. A fixed pool of workers keeps time:
// one of them at a time (the keeper) sleeps until the earliest deadline over groups of shards,
// and the worker that wakes advances the due shards and runs their callbacks itself, while idle
// workers take shards and chunks of a flood from it (expiry.go).
//
// Guarantees:
//   - Never early: a callback never starts before the moment of the call plus its delay, read
//     from the monotonic clock. Deadlines are exact: the tick is the width of a bucket, not a
//     rounding of the deadline.
//   - Exactly once: every accepted timer ends in exactly one of: its callback ran once, one
//     Timer.Stop reported true, or it was counted in the value Wheel.Stop returned.
//   - Bounded goroutines: WithWorkers workers (one with WithWorkers(0); none with a manual clock
//     and WithWorkers(0)), whatever the load.
//   - AfterFuncArg followed by Timer.Stop allocates nothing in steady state.
//
// One Wheel per process is the normal use: it is sharded already, and each Wheel owns goroutines.
package shardwheel

import (
	"errors"
	"sync"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
	"go.uber.org/atomic"
)

var (
	// ErrClosed is returned when scheduling on a Wheel that was stopped.
	ErrClosed = errors.New("shardwheel: wheel is stopped")
	// ErrTooManyTimers is what scheduling past WithMaxPending (or past what a shard's slab holds)
	// returns: wrapped in an error that names the limit, so test for it with errors.Is.
	ErrTooManyTimers = errors.New("shardwheel: too many pending timers (WithMaxPending reached)")
	// ErrNilFunc is returned when the callback is nil.
	ErrNilFunc = errors.New("shardwheel: callback func is nil")
)

// A Wheel schedules callbacks. It is safe for use by any number of goroutines. Create it with New
// and release its goroutines with Stop.
//
// Fields are immutable after New unless noted.
type Wheel struct {
	opts   options
	ticks  // the tick arithmetic (clock.go); deadlines are exact, the tick is a bucket's width
	shards []*shard
	pool   pool

	base       time.Time    // origin of the system clock's monotonic readings
	manual     *ManualClock // nil for the system clock
	manualBase int64        // manual.elapsed when the wheel started

	closed atomic.Bool // set once, by the Stop that wins its CAS; scheduling calls then fail fast
	pick   picker      // which shard a producer arms on (pick.go; pick_race.go under -race)

	creditBatch int64 // WithMaxPending credits a shard takes from the reserve at once (pending.go)

	// Above: read by every producer, written once. Below: written by the advancer at every
	// round; the pad keeps those writes off the producers' line.
	_ [cacheLineSize]byte

	// The manual advancer: the caller of ManualClock.Advance holding advMu.
	advMu    sync.Mutex   // serialises manual advances with each other and with Stop
	advancer atomic.Int64 // goroutine id of the manual advancer while it runs (for Stop from a callback)
	batch    []ref        // entries fired in the current round; owned by the manual advancer
	// trim gives idle chunks back (trim.go); owned by the advancer: the manual one, or the keeper
	// (one worker at a time; the role's hand-over, an atomic store and CAS, orders their uses).
	trim trimmer
	// trimDirty: a slab grew since the trimmer's last look (noteGrow). Set by producers, cleared
	// by the advancer at a look.
	trimDirty atomic.Bool

	// The system clock's expiry side (expiry.go). Every arm reads target on this line, and
	// signal reads keeper: both are written a few times per keeper wake, and nothing written
	// more often shares the line (idle, which every worker writes as it goes idle, is below).
	groups []group     // immutable slice; see group
	keeper atomic.Bool // held by the worker that keeps time (expiry.go)
	// target is the instant (ns) the keeper sleeps until, read by producers to decide whether to
	// signal (noteDeadline) and whether the keeper is overdue (overdue): awake while a keeper is
	// awake, while the role is free after release, and once a producer found the moment passed
	// (overdue moves it to awake with a CAS, then signals); the moment the keeper sleeps until
	// while it sleeps, and the watchdog's moment while the role is free after releaseLater
	// (expiry.go). Stored only by the worker that holds the role or is letting go of it; any
	// other goroutine only CASes a passed moment to awake (overdue), and then signals.
	target atomic.Int64
	wake   chan struct{} // producers signal the keeper: an earlier deadline, or overdue (cap 1)
	// nudge wakes an idle worker to try for the free role (cap 1): sent by release, the watchdog,
	// hurry, and signal while the role is free.
	nudge chan struct{}
	// quit is closed by Stop (finishStop): workers run what is left in the queue and exit. It is
	// closed only once nobody can put a chunk in the queue any more: on the system clock the
	// workers are the only senders, and each looks at the queue after its own last send; with a
	// manual clock the advancer sends only while it holds advMu, and finishStop runs once Stop
	// holds advMu (or on the advancer itself, after its advance), or a later Stop on the
	// advancer closes it once closing is closed, from when the advancer queues nothing
	// (laterStop).
	quit chan struct{}

	// Stop: the first call wins closed (CAS) and runs stop; closing is closed as it starts, so
	// that a manual advancer blocked on a full queue stops waiting for room (dispatch): it cannot
	// be quit, since workers must still empty the queue after that advancer's last send. stopped
	// is closed once the first Stop has finished. Later calls wait on stopped, unless they run
	// on one of the goroutines the first Stop may be waiting for (a worker, or the manual
	// advancer): those wait for the other callbacks (laterStop).
	closing chan struct{}
	stopped chan struct{}
	// quitOnce closes quit: in finishStop, or earlier in a later Stop on the manual advancer
	// (laterStop), which holds advMu and so would otherwise wait for the first Stop's step 1.
	quitOnce sync.Once
	// advOver is closed (advancesOver, once) when, the wheel closed, no manual advance runs
	// callbacks any more and none will: by the first Stop once it holds advMu, or, when that
	// Stop runs in a callback of the advance (on the advancer), by advanceManual as that advance
	// ends, the rest of its batch run. On the system clock it is closed as Stop starts.
	advOver     chan struct{}
	advOverOnce sync.Once
	// What the goroutines that run callbacks are inside of, for later Stops from callbacks, which
	// wait for every other callback but not for those inside a Stop (laterStop, stopwait.go).
	// frames[i] is the stack of Stops and drained chunks on worker i's goroutine,
	// frames[len(pool.done)] on the manual advancer's, innermost last; excused[i]: a Stop with
	// nothing below it on that stack returned, excusing the rest of the callback that called it
	// and of its batch (review 44), until worker i next takes a chunk from the queue (batchOver,
	// work). The advancer's excused is never cleared: it is set only once closing is closed,
	// and from then on the advancer runs only the rest of its batch (dispatch runs every chunk
	// itself, advance stops at closed, and no advance starts again). stopChanged is closed, and
	// replaced, at every change that may make a slot quiet or excused (stopwait.go). All
	// guarded by stopMu.
	stopMu      sync.Mutex
	frames      [][]stopFrame
	excused     []bool
	stopChanged chan struct{}
	// stopHandoff: a callback of finishStop's drain on a worker called runtime.Goexit, so the
	// first Stop never returns; that worker's replacement (work) runs the rest of the queue and
	// closes stopped as it exits, the last of the workers. Set by the dying goroutine before
	// it starts the replacement (the go statement orders it); read by the worker that exits.
	stopHandoff atomic.Bool
	// rerun: ManualClock.Advance was called from a worker's callback while another goroutine
	// held advMu; the holder advances again before it lets go (clock.go, advanceManual).
	rerun atomic.Bool

	// Counters off the producers' path, all rare events (fires are counted in pool.fired).
	rejected, panics, dropped *xsync.Counter
	// credit is WithMaxPending's reserve (pending.go): atomic, touched only when a shard's own
	// stock runs dry or overflows, and by Stop.
	credit atomic.Int64

	// idle counts the followers blocked waiting for queued work or the keeper role (work,
	// expiry.go). It is an estimate, read to decide whether to offer work: a follower counts
	// itself just before its select and uncounts just after, so a share offered to one paused
	// in between waits in the queue until it (or any worker's next look at the queue) takes it.
	// Here, off target's line: every worker writes it at each idle spell.
	idle atomic.Int32

	// Wheels are allocated one by one: this keeps the fields above off the line of whatever the
	// allocator puts next.
	_ [cacheLineSize]byte
}

// New starts a Wheel and its workers (one with WithWorkers(0) on the system clock, which runs
// the callbacks; none with a ManualClock and WithWorkers(0), where Advance runs them). An
// invalid option returns a nil Wheel and an error that names the option and the value.
func New(opts ...Option) (*Wheel, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	w := &Wheel{
		opts:     o,
		closing:  make(chan struct{}),
		stopped:  make(chan struct{}),
		advOver:  make(chan struct{}),
		rejected: xsync.NewCounter(),
		panics:   xsync.NewCounter(),
		dropped:  xsync.NewCounter(),
	}
	if m, ok := o.clock.(*ManualClock); ok {
		w.manual = m
		w.manualBase = m.elapsed.Load()
	} else {
		w.base = time.Now()
	}
	w.ticks = newTicks(int64(o.tick), w.manual != nil)
	if o.maxPending > 0 {
		w.credit.Store(int64(o.maxPending))
		w.creditBatch = creditBatch(o.maxPending, o.shards)
	}
	w.target.Store(awake) // no keeper yet; with a manual clock never one: Advance drives the wheel
	w.wake = make(chan struct{}, 1)
	w.nudge = make(chan struct{}, 1)
	w.quit = make(chan struct{})
	w.shards = make([]*shard, o.shards)
	for i := range w.shards {
		w.shards[i] = new(shard)
	}
	w.groups = newGroups(w.shards)
	for _, s := range w.shards {
		s.init(w, o.ringSize)
	}
	w.pool.init(o.workers, o.queueSize, w.manual != nil)
	w.frames = make([][]stopFrame, len(w.pool.done)+1)
	w.excused = make([]bool, len(w.pool.done)+1)
	w.stopChanged = make(chan struct{})
	w.startWorkers()
	if w.manual != nil {
		w.manual.attach(w)
	}
	return w, nil
}

// AfterFunc schedules f to run once, d from now, on the worker pool, and returns its Timer.
// It never runs f early: not before the moment of the call plus d, on the monotonic clock.
// d <= 0 runs f as soon as possible; any d up to math.MaxInt64 is accepted. It returns ErrNilFunc
// if f is nil, ErrClosed after Stop, ErrTooManyTimers past WithMaxPending (or when the caller's
// shard holds 2^31-1 timers, 96 GiB of them); nothing is scheduled then. It does not wait for
// callbacks or for time; when its shard's ring is full it drains the ring itself (Timer.Stop
// says what that costs), and if the ring's oldest command is claimed by a producer that has not
// published it yet, it yields until that producer does (review 32).
func (w *Wheel) AfterFunc(d time.Duration, f func()) (Timer, error) {
	if f == nil {
		return w.reject(ErrNilFunc)
	}
	return w.schedule(callFunc, f, d)
}

// callFunc runs a func() stored as the argument: func values are pointer-shaped, so storing one
// in an interface allocates nothing.
func callFunc(arg any) { arg.(func())() }

// AfterFuncArg is AfterFunc for f(arg). It exists so that callers can schedule without allocating:
// reuse one func value and pass a pointer as arg, and AfterFuncArg followed by Timer.Stop
// allocates nothing in steady state.
func (w *Wheel) AfterFuncArg(d time.Duration, f func(arg any), arg any) (Timer, error) {
	if f == nil {
		return w.reject(ErrNilFunc)
	}
	return w.schedule(f, arg, d)
}

func (w *Wheel) reject(err error) (Timer, error) {
	w.rejected.Inc()
	return Timer{}, err
}

// schedule arms an entry on the caller's P's shard and publishes it. The steps: take an entry
// from the shard's slab (arming bumps its gen), fill it, read the clock, publish the add command
// (the ring orders the plain writes before it), count it, and note its deadline so that the
// keeper wakes if it is the earliest. A periodic entry has f nil and an *every as arg.
func (w *Wheel) schedule(f func(any), arg any, d time.Duration) (Timer, error) {
	if w.closed.Load() {
		return w.reject(ErrClosed)
	}
	s := w.takeShard()
	if s.limited && !s.reservePending() { // on the shard line this arm writes anyway
		return w.reject(errMaxPending{w.opts.maxPending})
	}
	i, e, gen := s.slab.newEntry(f == nil) // only an Every arms a nil f (its arg runs it)
	if e == nil {
		s.releasePending(1)
		return w.reject(slabFull())
	}
	e.f, e.arg = f, arg
	now := w.nanos()
	when := w.deadlineFrom(now, d)
	e.when.Store(when)
	if f == nil {
		// An Every's first run: the deadline it is armed for, by which runPeriodic tells that a
		// Reset moved it even when 2^20 Resets brought the version round again (review 34).
		// Written before the add, which publishes it with the entry.
		arg.(*every).when = when
	}
	ok, contended := s.send(i, gen, opAdd)
	if contended {
		w.noteContention(s) // another P may share this shard: see picker
	}
	if !ok {
		// Stop closed the ring after the check above: not accepted.
		s.slab.freeEntry(i, e)
		s.releasePending(1)
		return w.reject(ErrClosed)
	}
	s.scheduled.Inc()
	s.noteDeadline(when)
	w.overdue(now)
	return Timer{s: s, i: i, gen: gen}, nil
}

// noteDropped counts n timers that will never run because the wheel stopped.
func (w *Wheel) noteDropped(n int64) {
	w.dropped.Add(n)
	w.releasePending(n)
}

// Len returns the number of pending timers: scheduled, and neither started nor stopped. A timer
// whose callback waits in the worker queue is still pending. After Stop, Len is 0.
func (w *Wheel) Len() int { return w.Stats().Pending }

// Stats is a snapshot of a Wheel's counters. Each counter is read on its own, so a snapshot
// taken while timers move may be off by those in flight; once the wheel is quiet,
// Scheduled == Fired + Stopped + Dropped + Pending (and Dropped is 0 until Stop).
type Stats struct {
	Pending   int    // as Len
	Scheduled uint64 // accepted by AfterFunc, AfterFuncArg and the helpers; each Every run once
	Fired     uint64 // callbacks started (counted when they start running)
	Stopped   uint64 // timers for which Timer.Stop reported true
	Rejected  uint64 // scheduling calls that returned an error
	Panics    uint64 // callbacks that panicked
	Dropped   uint64 // timers pending at Wheel.Stop, which never run (the sum of what Stop returned)
	Shards    int    // number of shards
	Workers   int    // number of worker goroutines (one with WithWorkers(0) on the system clock)
	Queued    int    // callbacks handed to the worker pool and not yet started
	// HeldBytes is the memory the wheel holds for timers: entry chunks in use, or kept for
	// reuse until the slab gives them back after a quiet spell (see trim.go).
	HeldBytes int64
	// Lateness counts how late each callback started, against its deadline rounded up to the
	// tick: every start once (each run of an Every, each context deadline, each Keyed fire), so
	// that once the wheel is quiet Lateness.Count() == Fired. On the system clock a reading of
	// the clock may serve up to 16 quick callbacks that start one after another, so the delay a
	// slow callback causes may be missed in up to 15 of those after it (see README).
	Lateness Histogram
}

// Stats returns a snapshot of the counters. It takes no lock.
func (w *Wheel) Stats() Stats {
	fired, queued, late := w.pool.totals()
	st := Stats{
		Fired:    fired,
		Queued:   queued,
		Lateness: late,
		Rejected: uint64(w.rejected.Value()),
		Panics:   uint64(w.panics.Value()),
		Dropped:  uint64(w.dropped.Value()),
		Shards:   len(w.shards),
		Workers:  len(w.pool.done),
	}
	st.HeldBytes = w.heldBytes()
	for _, s := range w.shards {
		st.Scheduled += s.scheduled.Load()
		st.Stopped += s.stopped.Load()
	}
	p := int64(st.Scheduled) - int64(st.Fired) - int64(st.Stopped) - int64(st.Dropped)
	if p < 0 || w.closed.Load() && isClosed(w.stopped) {
		p = 0
	}
	st.Pending = int(p)
	return st
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Stop stops the wheel and returns how many timers were pending and will now never run. Pending
// timers never fire; callbacks already running, or already handed to the worker pool, run to
// their end before Stop returns, and every goroutine the wheel started has exited by then (but,
// from a callback, those running the callbacks Stop does not wait for, as below: each exits once
// they return). A deadline context whose timer Stop dropped is handed to a runtime timer
// (time.AfterFunc, as context.WithDeadline arms), which ends it at its deadline, after Stop has
// returned.
// Safe to call more than once and from several goroutines: later calls return 0, once the first
// has finished and every worker has exited (the first may be a callback's). Called from inside
// a callback, Stop (the first call or a later one) waits for every other callback but not for
// the one it is called from, nor for callbacks that are themselves inside a Stop (two callbacks
// that each waited for the other would never return; a callback that called ManualClock.Advance
// is inside a Stop that a callback of that advance called), nor for the rest of them and of the
// callbacks that fired with them after that Stop returns; the callbacks that fired with it and
// were to run after it on the same goroutine still run after Stop returns. After Stop,
// scheduling returns ErrClosed and Len is 0.
func (w *Wheel) Stop() int {
	if w.closed.CompareAndSwap(false, true) {
		return w.stop()
	}
	self := goid()
	mine, adv := w.workerIndex(self), w.manual != nil && w.advancer.Load() == self
	if mine < 0 && !adv {
		// The first Stop may run in a callback: on a worker, which exits only after it
		// returns, or on the manual advancer, whose batch goes on after it (advOver).
		<-w.stopped
		for _, done := range w.pool.done {
			<-done
		}
		<-w.advOver
		return 0
	}
	w.laterStop(self, mine, adv)
	return 0
}

// laterStop is a later Stop called from a callback on goroutine self, on worker mine (-1 if
// none) or on the manual advancer (adv), or both (a worker's callback that called Advance). It
// cannot wait for stopped, since the first Stop waits for this goroutine (its worker's exit, or
// advMu); it waits for what stopped stands for, less what Stop's doc excepts. A goroutine
// counts as done with (quiet, stopwait.go) once it exited, or it is inside a Stop and not in a
// callback that Stop runs, or a Stop that the callback it runs called has returned (what it ran
// inside has ended; the rest of that callback and what fired with it are excepted, also for a
// Stop called after, and waiting for them could deadlock: reviews 44, 47 and 50). The slot of
// a worker whose callback called Advance is inside the Stops that callbacks of that advance call
// on it: waiting for the callback below the advance would deadlock the same way (review 46).
//  0. An Every whose run is in progress on this goroutine counts its next run now, as the first
//     Stop's step 3 does: once this Stop has returned, the first may return without waiting for
//     what this goroutine runs after (finishStop), before that run's re-arm would count it
//     (review 49).
//  1. Off the advancer, the advancer is quiet, or no advance runs callbacks any more (advOver).
//  2. Every other worker is quiet.
//  3. It runs what is left in the queue itself, as finishStop does: callbacks handed to the
//     pool run before Stop returns. By then nobody queues any more: the workers not inside a
//     Stop have exited or are quiet, a worker offers the shares of an advance step before it
//     runs its own (offerFired) and begins no step once closed is set, and the manual advancer
//     runs every chunk itself once closing is closed.
//  4. Another Stop may have taken a chunk from the queue before this one came to it: it waits
//     once more for every other worker to be quiet, which a worker running a drained callback
//     is not (review 43), and, off the advancer, for the advancer (its Stops drain too: review
//     45). No Stop waits for this one then: it is marked, and runs nothing.
//
// Why it cannot deadlock. It marks its goroutine inside a Stop before it waits, so nobody who
// waits in laterStop waits for it; the first Stop waits for nobody in laterStop but through
// their exit, which follows their return. The workers exit once quit is closed, which the first
// Stop does after step 1 without waiting for anyone in laterStop, unless step 1 waits for advMu
// and the advancer is here, in a callback of its advance: then the advancer closes quit itself.
// That keeps quit's rule (closed once nobody can queue a chunk): with a manual clock only the
// advancer queues, and once closing is closed (the first Stop closes it as it starts) it runs
// every chunk itself (dispatch); its last send came before the callback we are in started, and
// the workers drain the queue before they exit.
func (w *Wheel) laterStop(self int64, mine int, adv bool) {
	advSlot := len(w.pool.done)
	w.enterStop(mine, adv)
	returned := false // a callback this Stop drains may call runtime.Goexit
	defer func() { w.leaveStop(mine, adv, returned) }()
	if n := w.dropOwnRuns(self); n > 0 { // step 0
		w.noteDropped(int64(n))
	}
	if adv {
		<-w.closing // the first Stop closes it as it starts: from then on dispatch queues nothing
		w.quitWorkers()
	} else {
		w.awaitSlot(advSlot, w.advOver, w.quietLocked)
	}
	others := func() {
		for j, done := range w.pool.done {
			if j != mine {
				w.awaitSlot(j, done, w.quietLocked)
			}
		}
	}
	others()
	k, wk := advSlot, w.pool.other()
	if mine >= 0 {
		k, wk = mine, &w.pool.ws[mine]
	}
	w.drainQueue(k, wk)
	others()
	if !adv {
		w.awaitSlot(advSlot, w.advOver, w.quietLocked) // step 4, the advancer (review 45)
	}
	returned = true
}

// quitWorkers closes quit (once).
func (w *Wheel) quitWorkers() { w.quitOnce.Do(func() { close(w.quit) }) }

// advancesOver closes advOver (once).
func (w *Wheel) advancesOver() { w.advOverOnce.Do(func() { close(w.advOver) }) }

// drainQueue runs what is in the queue on this goroutine, a Stop's, in slot wk (index k in
// inStop) until the queue is empty. A shard to advance is dropped: after Stop nothing is
// advanced (and advanceShard, on this goroutine, would take wk.batch, which a runFrom up this
// stack may be running).
func (w *Wheel) drainQueue(k int, wk *worker) {
	for w.drainOne(k, wk) {
	}
}

// drainOne takes one chunk from the queue and runs it; false if the queue was empty. The slot
// counts as running a drained chunk (quietLocked) from before it looks at the queue until the
// chunk has run, also if a callback of it calls runtime.Goexit: marked only after the receive,
// a chunk just taken would let a waiter find the slot quiet and the queue empty (review 45).
func (w *Wheel) drainOne(k int, wk *worker) bool {
	w.pushDrain(k)
	defer w.popDrain(k)
	select {
	case c := <-w.pool.queue:
		if c.adv != nil {
			c.adv = nil
			chunkPool.Put(c)
			return true
		}
		w.runChunk(c, wk, true)
		return true
	default:
		return false
	}
}

// stop runs the shutdown; the caller won closed.
func (w *Wheel) stop() int {
	close(w.closing)
	self := goid()
	onAdvancer := w.manual != nil && w.advancer.Load() == self
	// Called from a callback (on a worker, or on the manual advancer), this goroutine is inside
	// a Stop: later Stops from callbacks do not wait for it (laterStop).
	returned := false // a callback that finishStop drains may call runtime.Goexit
	inCallback := false
	if mine := w.workerIndex(self); mine >= 0 || onAdvancer {
		inCallback = true
		w.enterStop(mine, onAdvancer)
		defer func() { w.leaveStop(mine, onAdvancer, returned) }()
	}

	// 1. With a manual clock, wait for a running Advance (unless Stop is called from a callback
	// that it runs, WithWorkers(0) or CallerRuns: the advance is up this goroutine's stack in
	// the middle of a batch; it runs the rest of that batch itself, queueing nothing once
	// closing is closed (dispatch), and stops after it, since advance checks closed). On the
	// system clock, workers that advance a shard see closed before their next step.
	if w.manual != nil {
		w.manual.detach(w)
		defer w.manual.forget(w) // after finishStop: its workers have exited
		if !onAdvancer {
			w.advMu.Lock()
			defer w.advMu.Unlock()
			w.advancesOver() // detached: no advance will take advMu for this wheel again
		} // else advanceManual closes advOver as the advance up this stack ends
	} else {
		w.advancesOver()
	}

	// 2. Close every ring and drop what is pending. A push that claimed its slot before the
	// close is accepted and is dropped here; one after it returns ErrClosed. An advancer holds
	// mu for one bounded step at a time; what that step fired is no longer pending and runs.
	n := 0
	for _, s := range w.shards {
		s.mu.Lock()
		n += s.dropLocked()
		s.mu.Unlock()
	}
	// 3. An Every whose run is in progress on this goroutine (Stop from its f) would find the
	// ring closed only after this Stop returned: its next run is dropped here.
	n += w.dropOwnRuns(self)
	w.noteDropped(int64(n))

	// 4. Every other callback runs to its end, and every worker exits.
	w.finishStop(self, inCallback)
	// An Every whose run was in progress on another goroutine found its ring closed and counted
	// itself in dropped before its worker exited; one whose run starts from now on has no next
	// run to count (runPeriodic). Nothing else counts in dropped.
	returned = true
	return int(w.dropped.Value())
}

// dropOwnRuns drops the next run of each Every whose run is in progress on the goroutine self,
// in the worker slot it runs callbacks in (a worker's own, and the shared one if it is the
// manual advancer), and returns how many it dropped. Slot.run is written only by the goroutine
// that runs the slot's callbacks, which is self, so reading it here needs no synchronisation. A
// Timer.Stop of the series that came first counted itself (dropFrom finds it stopped).
func (w *Wheel) dropOwnRuns(self int64) int {
	n := 0
	drop := func(wk *worker) {
		if e := wk.run; e != nil && dropFrom(e, stRunning) {
			n++
		}
	}
	for i := range w.pool.gids {
		if w.pool.gids[i].Load() == self {
			drop(&w.pool.ws[i])
		}
	}
	if w.manual != nil && w.advancer.Load() == self {
		drop(w.pool.other())
	}
	return n
}

// finishStop tells the workers to finish what was handed to them and waits for them to exit
// (not for the goroutine self, when Stop runs on a worker: it exits after its callback
// returns), then releases later Stop calls. Called from a callback (inCallback), it does not
// wait for a worker whose callback was inside a later Stop that returned, with nothing left on
// its stack, until that worker is back in its loop: what that worker runs after it is not
// waited for (stopwait.go), and waiting for its exit would deadlock a callback that, its Stop
// returned, waits for this one (review 48). That later Stop emptied the queue before it
// returned, and with a manual clock nothing is queued since (this Stop holds advMu, or runs on
// the advancer, which queues nothing once closing is closed); on the system clock a worker
// queues only shares of an advance step (offerFired), all before it runs its own share, where
// that later Stop's callback is, and begins no step once closed is set (review 49 looked).
//
// On a worker, what is left in the queue once the others have exited is this Stop's to run: the
// others drain the queue before they exit, but with one worker nobody else would, and those
// callbacks were handed to the pool before Stop, so they run before it returns (review 28).
// Nothing is queued after quit is closed: producers are refused, a manual advance runs its
// chunks itself once closing is closed (dispatch), and a worker that advances stops at closed.
// If one of them calls runtime.Goexit, this goroutine ends and the first Stop never returns:
// the deferred call hands the rest over to this worker's replacement, which runs what is left
// in the queue and only then, as the last worker to exit, releases later Stop calls (work;
// review 30), so that they still return only once every callback handed to the pool has run.
func (w *Wheel) finishStop(self int64, inCallback bool) {
	w.quitWorkers()
	mine := -1
	for i, done := range w.pool.done {
		if w.pool.gids[i].Load() == self {
			mine = i
			continue
		}
		if inCallback {
			w.awaitSlot(i, done, w.excusedLocked)
		} else {
			<-done
		}
	}
	if mine < 0 {
		close(w.stopped)
		return
	}
	drained := false
	defer func() {
		if drained {
			close(w.stopped)
			return
		}
		w.stopHandoff.Store(true) // before work's deferred call starts the replacement
	}()
	w.drainQueue(mine, &w.pool.ws[mine])
	drained = true
}
