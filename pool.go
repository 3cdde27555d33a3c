package shardwheel

import "sync"

// Entries are pooled in a sync.Pool: per-P caches with no lock on the fast path, so taking and
// returning an entry costs no shared cache line, and AfterFuncArg + Stop allocate nothing in
// steady state. Who returns an entry to the pool:
//   - the shard, when it takes the cancel command of a timer stopped while pending;
//   - the worker, just before a one-shot callback starts, or after a stopped periodic one;
//   - the worker, for a timer stopped while it waited in the worker queue.
//
// Each is the single owner of the entry at that moment (timer.go's table), so an entry is never
// returned twice. An entry's gen survives the pool: newEntry bumps it, which makes every Timer
// that still points at the entry stale.
var entryPool = sync.Pool{New: func() any { return new(entry) }}

// newEntry takes an entry from the pool and arms it (gen+1, pending). The caller owns it until it
// publishes it with an add command.
func newEntry() (*entry, uint64) {
	e := entryPool.Get().(*entry)
	w := nextArming(e.state.Load())
	e.state.Store(w)
	return e, genOf(w)
}

// freeEntry clears an unlinked entry (so that it keeps no callback or argument alive) and returns
// it to the pool. The caller must be its single owner.
func freeEntry(e *entry) {
	e.f, e.arg, e.periodic = nil, nil, false
	e.state.Store(withState(e.state.Load(), stFree))
	entryPool.Put(e)
}

// maxChunk is the most callbacks that travel to a worker together.
const maxChunk = 64

// chunk carries expired entries to a worker in one channel operation. Chunks are pooled too.
type chunk struct {
	n  int
	es [maxChunk]*entry
}

var chunkPool = sync.Pool{New: func() any { return new(chunk) }}
