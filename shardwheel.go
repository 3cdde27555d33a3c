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
// workers take shards and shares of a flood from it.
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
//
// # Reading the code
//
// Each path reads in one direction, every file calling only files further down it:
//   - Submission: shardwheel.go (schedule) → pick.go (the caller's shard) → pending.go
//     (WithMaxPending's credits) → pool.go (the slab of entries) → shard.go (send) → ring.go,
//     and on the shard's side shard.go (drain, expire) → wheel.go → heap.go. timer.go (Stop,
//     Reset) and wake.go (the keeper's deadline) join it; entry.go holds the state word that
//     every transition goes through.
//   - Expiry on the system clock: expiry.go (the worker loop, the keeper) → advance.go (advancing
//     the due shards) → workers.go (running callbacks, Every's runs) → shard.go. trim.go gives
//     memory back.
//   - Expiry on a manual clock: manual.go (ManualClock.Advance) → workers.go → shard.go.
//   - Shutdown: stop.go. The helpers (context.go, keyed.go, expvar.go) use only the public API.
//
// Locks, in the only order in which any goroutine holds two: Wheel.advMu, then shard.mu, then a
// deadline context's mu (Wheel.Stop tells a dropped context under shard.mu). slab.growMu and
// ManualClock.mu are only ever held alone. No lock is held while a callback runs.
package shardwheel

import (
	"errors"
	"fmt"
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
	pool   workerPool

	base       time.Time    // origin of the system clock's monotonic readings
	manual     *ManualClock // nil for the system clock
	manualBase int64        // manual.elapsed when the wheel started

	closed atomic.Bool // set once, by the Stop that wins its CAS; scheduling calls then fail fast
	pick   picker      // which shard a producer arms on (pick.go; pick_race.go under -race)

	creditBatch int64 // WithMaxPending credits a shard takes from the reserve at once (pending.go)

	// Above: read by every producer, written once. Below: written by the advancer at every
	// round; the pad keeps those writes off the producers' line.
	_ [cacheLineSize]byte

	// The manual advancer: the caller of ManualClock.Advance that holds advMu (manual.go).
	advMu    sync.Mutex   // serialises manual advances with each other, and with Stop's wait
	advancer atomic.Int64 // goroutine id of the manual advancer while it advances, for Stop
	// rerun: ManualClock.Advance was called from a worker's callback while another goroutine held
	// advMu; the holder advances again before it lets go (manualAdvance).
	rerun atomic.Bool
	batch []ref // entries fired in the current manual round; owned by the holder of advMu
	// trim gives idle blocks back (trim.go); owned by the advancer: the holder of advMu, or the
	// keeper (one worker at a time; the role's hand-over, an atomic store and CAS, orders their
	// uses).
	trim trimmer
	// trimDirty: a slab grew since the trimmer's last look (noteGrow). Set by producers, cleared
	// by the advancer at a look.
	trimDirty atomic.Bool

	// The system clock's expiry side (expiry.go, wake.go). Every arm reads target on this line,
	// and signal reads keeper: both are written a few times per keeper wake, and nothing written
	// more often shares the line (idle, which every worker writes as it goes idle, is below).
	groups []group     // immutable slice; see group
	keeper atomic.Bool // held by the worker that keeps time
	// target is the instant (ns) the keeper sleeps until, read by producers to decide whether to
	// signal (noteDeadline) and whether the keeper is overdue (overdue): awake while a keeper is
	// awake, while the role is free after yield, and once a producer found the moment passed
	// (overdue moves it to awake with a CAS, then signals); the moment the keeper sleeps until
	// while it sleeps, and the watchdog's moment while the role is free after yieldLater. Stored
	// only by the worker that holds the role or is letting go of it; any other goroutine only
	// CASes a passed moment to awake (overdue).
	target atomic.Int64
	wake   chan struct{} // producers signal the keeper: an earlier deadline, or overdue (cap 1)
	// nudge wakes an idle worker to try for the free role (cap 1): sent by yield, the watchdog,
	// hurry, and signal while the role is free.
	nudge chan struct{}

	// Stopping (stop.go). stopped is closed by the first Stop once it has dropped what was
	// pending. quit is closed, once (closeQuit), when nobody will queue work any more: the
	// workers then run what is left in the queue and exit, each closing its done channel.
	stopped  chan struct{}
	quit     chan struct{}
	quitOnce sync.Once

	// Counters off the producers' path, all rare events (fires are counted in the run slots).
	rejected, panics, dropped *xsync.Counter
	// credit is WithMaxPending's reserve (pending.go): atomic, touched only when a shard's own
	// stock runs dry or overflows, and by Stop.
	credit atomic.Int64

	// idle counts the workers blocked waiting for queued work or the keeper role (loop). It is an
	// estimate, read to decide whether to offer work: a worker counts itself just before its
	// select and uncounts just after, so a share offered to one paused in between waits in the
	// queue until it (or any worker's next look at the queue) takes it. Here, off target's line:
	// every worker writes it at each idle spell.
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
		stopped:  make(chan struct{}),
		quit:     make(chan struct{}),
		wake:     make(chan struct{}, 1),
		nudge:    make(chan struct{}, 1),
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
	w.shards = make([]*shard, o.shards)
	for i := range w.shards {
		w.shards[i] = new(shard)
	}
	w.groups = newGroups(w.shards)
	for _, s := range w.shards {
		s.init(w, o.ringSize)
		s.slab.onGrow = w.noteGrow
	}
	w.pool.init(o.workers, o.queueSize, w.manual != nil)
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
// published it yet, it yields until that producer does.
func (w *Wheel) AfterFunc(d time.Duration, f func()) (Timer, error) {
	if f == nil {
		return w.reject(ErrNilFunc)
	}
	return w.schedule(callFunc, f, d)
}

// AfterFuncArg is AfterFunc for f(arg). It exists so that callers can schedule without allocating:
// reuse one func value and pass a pointer as arg, and AfterFuncArg followed by Timer.Stop
// allocates nothing in steady state.
func (w *Wheel) AfterFuncArg(d time.Duration, f func(arg any), arg any) (Timer, error) {
	if f == nil {
		return w.reject(ErrNilFunc)
	}
	return w.schedule(f, arg, d)
}

// Every runs f every interval until the returned Timer is stopped, at a fixed rate, as
// time.Ticker does: the k-th run is due k intervals after the call, and never starts earlier, so
// the series does not drift by the time a run takes to start. Runs of one Every never overlap and
// never pile up: the next run is armed when the previous one has returned, and if later runs came
// due meanwhile (f took longer than the interval, or the run started late), they are skipped, and
// the next run is the first one due after the previous run ended.
//
// The Timer's Stop reports true if it prevented a run that was still to come, also while a run is
// in progress (that run completes; no other starts). Reset(d) moves the next run to d from now
// while the series waits for it, and the series then keeps its rate from there: the runs after it
// are due whole intervals after the instant that run was due at (d from the Reset, or the Reset
// itself for d <= 0). To change the interval, Stop the Timer and call Every again.
//
// Every returns an error naming the value for an interval <= 0, ErrNilFunc for a nil f, and as
// AfterFunc after Stop or past WithMaxPending. In Stats, each run counts once in Scheduled and once
// in Fired, so the balance holds. Wheel.Stop says what becomes of a run in progress.
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
	if s.limited && !s.takeCredit() { // on the shard line this arm writes anyway
		return w.reject(errMaxPending{w.opts.maxPending})
	}
	i, e, gen := s.slab.newEntry(f == nil) // only an Every arms a nil f (its arg runs it)
	if e == nil {
		s.returnCredit()
		return w.reject(slabFull())
	}
	e.f, e.arg = f, arg
	now := w.nanos()
	when := w.deadlineFrom(now, d)
	e.when.Store(when)
	if f == nil {
		// An Every's first run: the deadline it is armed for, by which runPeriodic tells that a
		// Reset moved it even when 2^20 Resets brought the version round again. Written before
		// the add, which publishes it with the entry.
		arg.(*every).when = when
	}
	ok, contended := s.send(i, gen, opAdd)
	if contended {
		w.noteContention(s) // another P may share this shard: see picker
	}
	if !ok {
		// Stop closed the ring after the check above: not accepted.
		s.slab.freeEntry(i, e)
		s.returnCredit()
		return w.reject(ErrClosed)
	}
	s.scheduled.Inc()
	s.noteDeadline(when)
	w.overdue(now)
	return Timer{s: s, i: i, gen: gen}, nil
}

// Len returns the number of pending timers: scheduled, and neither started nor stopped. A timer
// whose callback is due but has not started (one of Stats.Queued) is still pending. After Stop,
// Len is 0.
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
	// Queued counts callbacks that are due and taken from the wheel but not started yet: waiting
	// for a worker, or behind a running callback on the goroutine that holds them (not those a
	// Timer.Stop stopped meanwhile). Once the wheel is quiet it is 0.
	Queued int
	// HeldBytes is the memory the wheel holds for timers: entry blocks in use, or kept for reuse
	// until the slab gives them back after a quiet spell (see trim.go).
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
	var stoppedFiring uint64
	for _, s := range w.shards {
		stoppedFiring += s.stoppedFiring.Load()
	}
	// stoppedFiring and fired are read before taken (totals reads taken last), so a start or a
	// Stop that comes between the reads is seen as still waiting, which it just was, never
	// subtracted without its entry counted. One gap stays: an advance step counts what it fired
	// (taken) just after the step; a Stop of one of those entries in between makes Queued one low
	// until that count lands (never below 0).
	fired, taken, late := w.pool.totals()
	st := Stats{
		Fired:    fired,
		Queued:   int(max(0, int64(taken)-int64(fired)-int64(stoppedFiring))),
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
