package shardwheel

import (
	"log"
	"runtime/debug"

	"go.uber.org/atomic"
)

// The worker pool: a fixed number of goroutines that take chunks of expired entries from one
// bounded channel and run their callbacks. A flood of a million expiring timers runs on these
// goroutines, never on one goroutine per timer. Workers block only on the channel, so a wheel
// inside a testing/synctest bubble is durably idle when nothing is due.
//
// The queue's bound is WithQueueSize callbacks: chunks hold at most chunkCap callbacks and the
// channel holds queueSize/chunkCap chunks. When it is full the FullPolicy applies: Block waits,
// CallerRuns runs the chunk on the dispatching goroutine. Neither loses a callback.
type pool struct {
	queue    chan *chunk     // nil when workers == 0
	chunkCap int             // immutable
	done     []chan struct{} // done[i] is closed when worker i exits
	gids     []atomic.Int64  // gids[i] is worker i's goroutine id, for Wheel.Stop
	// fired[i] counts the callbacks started by worker i; fired[workers] those started by any
	// other goroutine (the advancer, a caller-runs dispatch, a Stop that helps). Each is written
	// mostly by one goroutine, so counting a fire touches no shared line; Stats sums them.
	fired []paddedCounter
}

// paddedCounter is an atomic counter alone on its cache line.
type paddedCounter struct {
	n atomic.Uint64
	_ [cacheLineSize - 8]byte
}

func (p *pool) init(workers, queueSize int) {
	p.fired = make([]paddedCounter, workers+1)
	if workers == 0 {
		return
	}
	p.chunkCap = min(maxChunk, queueSize)
	p.queue = make(chan *chunk, max(1, queueSize/p.chunkCap))
	p.done = make([]chan struct{}, workers)
	p.gids = make([]atomic.Int64, workers)
	for i := range p.done {
		p.done[i] = make(chan struct{})
	}
}

func (w *Wheel) startWorkers() {
	for i := range w.pool.done {
		go w.work(i)
	}
}

// work is worker i's loop. It exits when Wheel.Stop closes the queue and the queue is empty.
func (w *Wheel) work(i int) {
	defer close(w.pool.done[i])
	w.pool.gids[i].Store(goid())
	fired := &w.pool.fired[i]
	for c := range w.pool.queue {
		w.runChunk(c, fired)
	}
}

// isWorker reports whether the goroutine with id g is one of the pool's workers.
func (w *Wheel) isWorker(g int64) bool {
	for i := range w.pool.gids {
		if w.pool.gids[i].Load() == g {
			return true
		}
	}
	return false
}

// dispatch hands a batch of firing entries to the workers, or runs them here with WithWorkers(0).
// Only the advancer calls it, with no lock held. A batch is cut into chunks so that each worker
// gets a share: one entry per chunk when few timers fire, up to chunkCap in a flood.
func (w *Wheel) dispatch(batch []ref) {
	fired := w.pool.otherFired()
	if w.pool.queue == nil {
		w.runRefs(batch, fired)
		return
	}
	per := max(1, min(w.pool.chunkCap, len(batch)/len(w.pool.done)))
	for i := 0; i < len(batch); i += per {
		c := chunkPool.Get().(*chunk)
		c.n = copy(c.es[:per], batch[i:])
		if w.opts.policy == CallerRuns {
			select {
			case w.pool.queue <- c:
			default:
				w.runChunk(c, fired)
			}
			continue
		}
		w.pool.queue <- c
	}
}

// otherFired is the counter of fires on goroutines other than the workers.
func (p *pool) otherFired() *paddedCounter { return &p.fired[len(p.fired)-1] }

// firedTotal sums the fired counters.
func (p *pool) firedTotal() uint64 {
	var n uint64
	for i := range p.fired {
		n += p.fired[i].n.Load()
	}
	return n
}

// runChunk runs the entries of a chunk, counting fires in fired, and returns the chunk to its pool.
func (w *Wheel) runChunk(c *chunk, fired *paddedCounter) {
	w.runRefs(c.es[:c.n], fired)
	clear(c.es[:c.n])
	c.n = 0
	chunkPool.Put(c)
}

// runRefs runs fired entries in order and returns the ones it frees to their slabs together.
func (w *Wheel) runRefs(refs []ref, fired *paddedCounter) {
	var fb freeBatch
	for _, r := range refs {
		w.runEntry(r, fired, &fb)
	}
	fb.flush()
}

// runEntry starts an entry's callback unless a Stop got to it first. A one-shot entry is freed
// into fb before its callback starts (fb returns it to its slab after the chunk); a periodic one
// stays until its run is over (every.go).
func (w *Wheel) runEntry(r ref, fired *paddedCounter, fb *freeBatch) {
	e := r.e
	ev, periodic := e.arg.(*every) // a periodic entry has an *every as its argument (timer.go)
	for {
		s := e.state.Load()
		switch {
		case isState(s, stStopped):
			fb.add(&r.s.slab, r.i, e) // the Stop that got here counted itself; no command refers to e
			return
		case periodic:
			if e.state.CompareAndSwap(s, withState(s, stRunning)) {
				w.runPeriodic(r, ev, fired, fb)
				return
			}
		default:
			f, arg := e.f, e.arg
			if e.state.CompareAndSwap(s, withState(s, stFree)) {
				fb.add(&r.s.slab, r.i, e)
				fired.n.Inc()
				w.releasePending(1)
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
