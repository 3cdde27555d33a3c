package shardwheel

import (
	"log"
	"runtime/debug"
	"time"

	"go.uber.org/atomic"
)

// The worker pool: a fixed number of goroutines that keep time, advance due shards and run
// callbacks (expiry.go says who does what when). Work that one worker cannot do at once (a due
// shard beyond its first, the chunks of a flood) travels through one bounded channel of chunks,
// which idle workers take from. Workers block only on channels and their keeper timer, so a wheel
// inside a testing/synctest bubble is durably idle when nothing is due.
//
// The queue's bound is WithQueueSize callbacks: chunks hold at most chunkCap callbacks and the
// channel holds queueSize/chunkCap chunks. A worker that finds it full runs the chunk itself
// (it is a worker: that is the wait for room). With a manual clock the Advance caller dispatches
// and the FullPolicy applies: Block waits, CallerRuns runs the chunk on the caller. Neither loses
// a callback.
type pool struct {
	queue    chan *chunk     // nil when workers == 0: the wheel's one goroutine runs everything
	chunkCap int             // immutable
	done     []chan struct{} // done[i] is closed when worker i exits
	gids     []atomic.Int64  // gids[i] is worker i's goroutine id, for Wheel.Stop
	// ws[i] is worker i's own counters and buffers; ws[len(done)] is shared by every other
	// goroutine that runs callbacks (the Advance caller, a caller-runs dispatch, a Stop that
	// helps). Stats sums the counters.
	ws []worker
}

// worker holds what one worker goroutine counts and reuses. The counters are atomic because
// Stats reads them; each is written by one goroutine (the "other" slot: by one at a time, in
// practice), so counting touches no shared line. The rest is owned by the worker's goroutine.
type worker struct {
	fired  paddedCounter   // callbacks started
	pushed atomic.Uint64   // callbacks this goroutine put in the queue
	taken  atomic.Uint64   // callbacks of chunks from the queue that this goroutine started or found stopped
	late   atomicHistogram // how late each callback started; written by the worker, read by Stats

	due   []*shard // the shards the keeper claimed; owned by the worker
	batch []ref    // what the current advance step fired; owned by the worker
	// run is the entry of the Every whose run is in progress in this slot (runPeriodic to
	// endRun), for a Stop called from its f (dropOwnRuns). Written and read only by the
	// goroutine that runs the slot's callbacks: the worker, or the manual advancer for the last.
	run *entry
	// stride is lateClock's stride at the end of the slot's last batch on the system clock, where
	// the next batch starts from it. Owned like run; a manual clock never uses it.
	stride int
	timer  *time.Timer // the keeper's sleep, made on first use; owned by the worker
	// watch is the watchdog releaseLater arms (expiry.go), made on first use; whether it is
	// armed is what its Stop reports (unwatch). Owned by the worker: each worker arms and stops
	// only its own, so one that went off and handed the role over is never confused with the
	// next keeper's.
	watch *time.Timer
	_     [cacheLineSize]byte
}

// paddedCounter is an atomic counter alone on its cache line.
type paddedCounter struct {
	n atomic.Uint64
	_ [cacheLineSize - 8]byte
}

// init sizes the pool: goroutines workers that run callbacks (at least one on the system clock,
// which keeps time; none with a manual clock and WithWorkers(0), where Advance's caller runs them).
func (p *pool) init(workers, queueSize int, manual bool) {
	n := workers
	if n == 0 && !manual {
		n = 1
	}
	p.ws = make([]worker, n+1)
	p.done = make([]chan struct{}, n)
	p.gids = make([]atomic.Int64, n)
	for i := range p.done {
		p.done[i] = make(chan struct{})
	}
	p.chunkCap = min(maxChunk, queueSize)
	if workers > 0 {
		p.queue = make(chan *chunk, max(1, queueSize/p.chunkCap))
	}
}

func (w *Wheel) startWorkers() {
	for i := range w.pool.done {
		go w.work(i)
	}
}

// isWorker reports whether the goroutine with id g is one of the pool's workers.
func (w *Wheel) isWorker(g int64) bool { return w.workerIndex(g) >= 0 }

// workerIndex returns the index of the worker whose goroutine is g, or -1.
func (w *Wheel) workerIndex(g int64) int {
	for i := range w.pool.gids {
		if w.pool.gids[i].Load() == g {
			return i
		}
	}
	return -1
}

// other is the counters' slot of goroutines other than the workers.
func (p *pool) other() *worker { return &p.ws[len(p.ws)-1] }

// totals sums the counters of every slot: callbacks started, queued and not yet started (a
// chunk's entries leave Queued one at a time, as the worker that took it comes to each), and the
// lateness histogram.
func (p *pool) totals() (fired uint64, queued int, late Histogram) {
	var pushed, taken uint64
	for i := range p.ws {
		wk := &p.ws[i]
		fired += wk.fired.n.Load()
		pushed += wk.pushed.Load()
		taken += wk.taken.Load()
		wk.late.addTo(&late)
	}
	if pushed > taken {
		queued = int(pushed - taken)
	}
	return fired, queued, late
}

// offer puts a chunk in the queue if there is room and reports whether it did. Never blocks.
func (w *Wheel) offer(wk *worker, c *chunk) bool {
	if w.pool.queue == nil {
		return false
	}
	n := uint64(c.n) // once sent, the chunk is the taker's
	select {
	case w.pool.queue <- c:
		wk.pushed.Add(n)
		return true
	default:
		return false
	}
}

// dispatch hands a batch of firing entries to the workers, or runs them here with WithWorkers(0).
// Only a manual clock's Advance calls it, with no lock held. A batch is cut into chunks so that
// each worker gets a share: one entry per chunk when few timers fire, up to chunkCap in a flood.
func (w *Wheel) dispatch(batch []ref, onWorker bool) {
	other := w.pool.other()
	if w.pool.queue == nil {
		w.runRefs(batch, other, false)
		return
	}
	// Block waits for room, unless this advance runs on a worker (onWorker: Advance from a
	// callback, which may be the only one there to make room), and until Stop begins (the Stop
	// may run in a worker's callback and wait for advMu, which this advance holds). Otherwise,
	// and with CallerRuns, a chunk the queue has no room for runs here. Once Stop has begun,
	// every chunk runs here: the Stop may be one of this batch's own callbacks, run here, which
	// returned only once the workers had exited (finishStop).
	wait := w.opts.policy == Block && !onWorker
	per := max(1, min(w.pool.chunkCap, len(batch)/len(w.pool.done)))
	// batch[next:] is neither handed out nor run. A callback of a chunk run here that calls
	// runtime.Goexit ends this goroutine after the rest of its chunk ran (runFrom); the deferred
	// call runs the rest of the batch here too, as the goroutine unwinds (review 28).
	next := 0
	defer func() {
		if next < len(batch) {
			w.runRefs(batch[next:], other, false)
		}
	}()
	for i := 0; i < len(batch); i += per {
		next = min(i+per, len(batch))
		c := newChunk(batch[i:next])
		if isClosed(w.closing) {
			w.runChunk(c, other, false)
			continue
		}
		if !wait {
			if !w.offer(other, c) {
				w.runChunk(c, other, false)
			}
			continue
		}
		n := uint64(c.n) // once sent, the chunk is the taker's
		select {
		case w.pool.queue <- c:
			other.pushed.Add(n)
		case <-w.closing:
			w.runChunk(c, other, false)
		}
	}
}

// newChunk returns a pooled chunk holding refs (at most maxChunk).
func newChunk(refs []ref) *chunk {
	c := chunkPool.Get().(*chunk)
	c.n = copy(c.es[:], refs)
	return c
}

// runChunk runs the entries of a chunk on worker slot wk and returns the chunk to its pool.
// queued says that the chunk came from the queue (a worker took it): each entry then leaves
// Stats.Queued as it starts (wk.taken), not when the chunk was taken (review 33).
func (w *Wheel) runChunk(c *chunk, wk *worker, queued bool) {
	w.runRefs(c.es[:c.n], wk, queued)
	clear(c.es[:c.n])
	c.n = 0
	chunkPool.Put(c)
}

// runRefs runs fired entries in order, and returns the ones it frees to their slabs together.
// queued: they came in a chunk from the queue (runFrom).
func (w *Wheel) runRefs(refs []ref, wk *worker, queued bool) {
	if len(refs) == 0 {
		return
	}
	var fb freeBatch
	w.runFrom(refs, wk, queued, &fb)
	fb.flush()
}

// runFrom runs refs in order, freeing into fb. A callback that calls runtime.Goexit (t.FailNow
// in a test, say) ends this goroutine, as it would end a time.AfterFunc callback's own, but it
// cannot take the callbacks fired with it along: the deferred call runs the rest of refs as the
// goroutine unwinds (each further Goexit among them unwinds through another runFrom), then
// returns fb's entries, which the caller's flush will not. A panic never gets here: call
// recovers it. What else the goroutine held is made safe further up: a worker is replaced (work),
// an Advance lets go of the clock (advanceManual), an Every's run re-arms (runPeriodic), and a
// shard or the keeper role are never held while callbacks run (claimRunning, keep).
//
// queued: refs came in a chunk from the queue, and each leaves Stats.Queued (wk.taken) as it is
// come to. Lateness is read on the clock as callbacks start (lateClock), so that a slow
// callback's delay of those after it shows in Stats.Lateness (review 33).
func (w *Wheel) runFrom(refs []ref, wk *worker, queued bool, fb *freeBatch) {
	i := 0
	defer func() {
		if i < len(refs) { // refs[i]'s callback called runtime.Goexit
			w.runFrom(refs[i+1:], wk, queued, fb)
			fb.flush()
		}
	}()
	lc := lateClock{w: w, stride: wk.stride}
	for ; i < len(refs); i++ {
		if queued {
			wk.taken.Inc()
		}
		w.runEntry(refs[i], wk, &lc, fb)
	}
	if w.manual == nil {
		wk.stride = lc.stride
	}
}

// lateClock is the reading of the clock that runFrom's callbacks are counted late against (it
// lives on runFrom's stack, owned by its goroutine). A reading costs about 40 ns on the machine
// of BENCHMARKS.md, where firing a callback costs about 70: one per callback made the fire phase
// 60% slower. So a reading is shared by a stride of callbacks that start one after another, and
// the stride adapts: it is 1 after any stride whose callbacks took lateQuick or more each on
// average, and it doubles, up to lateStride, after a stride of quicker ones. A batch starts with
// a reading, at the stride its slot's last batch ended with (1 for a new worker). Slow callbacks
// are read before each start; a flood of quick ones about once per lateStride. A callback's
// lateness is read at most the run time of the lateStride-1 callbacks before it early: a slow
// callback among quick ones delays those after it in its stride without showing, and the next
// reading shows it. A manual clock is read on each start (a load).
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
// against its deadline when (ns) rounded up to the tick, 0 if it started before that (deadlines
// are exact, so most start within their tick) or for a deadline at the end of time, which
// ticks.ceil saturates.
func (w *Wheel) lateness(now, when int64) time.Duration {
	return time.Duration(max(0, now-w.ceil(when)))
}

// runEntry starts an entry's callback unless a Stop got to it first. A one-shot entry is freed
// into fb before its callback starts (fb returns it to its slab after the chunk); a periodic one
// stays until its run is over (every.go). The start is counted in wk, with its lateness against
// lc's reading of the clock. f and arg are read only after the CAS that starts the callback: a
// Stop before it may be clearing them (Timer.stopFiring).
func (w *Wheel) runEntry(r ref, wk *worker, lc *lateClock, fb *freeBatch) {
	e := r.e
	when := e.when.Load() // the entry is firing: only a Reset's failed attempt may race
	for {
		s := e.state.Load()
		switch {
		case isState(s, stStopped):
			fb.add(&r.s.slab, r.i, e) // the Stop that got here counted itself; no command refers to e
			return
		case isState(s, stLetGo):
			// A Stop is letting go of the callback: leave the entry to it (it frees it) rather
			// than wait for it, unless it moved on to stopped meanwhile (then look again).
			if e.state.CompareAndSwap(s, withState(s, stPassed)) {
				return
			}
		case isPeriodic(s):
			if e.state.CompareAndSwap(s, withState(s, stRunning)) {
				wk.late.observe(w.lateness(lc.start(), when))
				w.runPeriodic(r, e.arg.(*every), wk, fb)
				return
			}
		default: // firing
			if e.state.CompareAndSwap(s, withState(s, stFree)) {
				f, arg := e.f, e.arg
				fb.add(&r.s.slab, r.i, e)
				wk.fired.n.Inc()
				wk.late.observe(w.lateness(lc.start(), when))
				r.s.releasePending(1) // to the timer's shard: WithMaxPending is striped (pending.go)
				w.call(f, arg)
				return
			}
		}
	}
}

// call runs a callback, recovering a panic: it is counted and handed to the panic handler, and
// the goroutine goes on with the next callback.
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
