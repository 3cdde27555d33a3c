package shardwheel

import (
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"go.uber.org/atomic"
)

// Entries live in a per-shard slab: chunks of slabChunkLen entries, addressed by a 32-bit index.
// The index is what lets an entry be 48 bytes: with two 8-byte pointer links it needs 56, which a
// heap object rounds up to the 64-byte size class. The wheel links entries by index (wheel.go). A
// chunk is one 48 KiB object whose only pointers are each entry's callback and argument: the
// garbage collector scans chunks and follows no links.
//
// Free entries form a lock-free stack (Treiber's) per shard. Its head packs a 32-bit tag, bumped
// by every push and pop so that a CAS can never succeed on a head that was popped and pushed
// back meanwhile (ABA), and the index of the top entry (0: empty). A free entry's link to the
// next free one is kept in its when field, which is atomic, so a pop that loses the race and
// reads the link of an entry someone else has just armed reads it atomically and then fails its
// CAS. Who frees an entry:
//   - the shard, when it takes the cancel command of a timer stopped while pending;
//   - the worker, for a one-shot callback it is about to start, a timer stopped while it waited
//     in the worker queue, or a periodic series that ended during its run; each goes into the
//     chunk's freeBatch and returns to its slab after the chunk;
//   - the Timer.Stop of a fired timer whose worker came to the entry while the Stop was letting
//     go of its callback (stopFiring: the worker passed it on).
//
// Each is the single owner of the entry at that moment (timer.go's table), so an entry is never
// freed twice. An entry's gen survives freeing: arming bumps it, which makes every Timer that
// still names the entry stale.
//
// Chunks come and go. A burst grows the slab; once the shard has been quiet for trimQuiet, the
// trimmer (trim.go) takes the whole free stack, gives back to the Go heap every chunk all of whose
// entries were on it, and pushes the rest back lowest chunk first, so that new timers fill the
// low chunks and the high ones drain for the next trim (the runtime's mcentral prefers partly
// used spans for the same reason). Between trims, AfterFuncArg + Stop allocates nothing. The
// invariants that keep handles and commands safe across a release:
//   - Every index on the free stack names an entry of a live chunk: trim takes a chunk's entries
//     off the stack before it releases the chunk, and only the owner of a live entry frees it.
//   - A released chunk's slot in the table names deadChunk, never nil: at(i) is always a valid
//     entry, so a stale Timer, a stale reset command or a pop that lost its race reads a real
//     state word there (gen 0, which no Timer holds: the first arming of an entry is gen 1) and
//     does nothing. deadChunk is never written.
//   - Generations never repeat: trim raises genFloor to the highest gen in each chunk it
//     releases, and grow starts every entry of a new chunk at genFloor, so every gen a new chunk
//     hands out is above every gen a Timer into a released one may hold.
//   - The table is copy-on-write under growMu (grow, trim): a reader holding an old table reads
//     an old chunk, which the garbage collector keeps while it is read; its entries hold only
//     gens of past armings, so a handle acting on it finds them over and does nothing.
const (
	slabChunkBits = 10
	slabChunkLen  = 1 << slabChunkBits
	slabChunkMask = slabChunkLen - 1

	// maxEntries bounds a shard's slab: link values with the top bit set name bucket lanes
	// (wheel.go), and index 0 means none.
	maxEntries = 1 << 31
)

// slabCap is the most entries a shard's slab grows to: maxEntries, lowered only by tests.
var slabCap uint64 = maxEntries

// errSlabFull is what scheduling returns when its shard's slab cannot grow: about two billion
// timers pending on one shard (96 GiB of entries). It is an ErrTooManyTimers.
type errSlabFull struct{ limit uint64 }

// slabFull returns the error for the current slabCap: whole chunks, less index 0, never used.
func slabFull() error { return errSlabFull{limit: slabCap&^slabChunkMask - 1} }

func (e errSlabFull) Error() string {
	return fmt.Sprintf("shardwheel: too many pending timers: a shard holds at most %d", e.limit)
}

func (errSlabFull) Unwrap() error { return ErrTooManyTimers }

type slabChunk [slabChunkLen]entry

// chunkBytes is the memory one chunk holds: what Stats.HeldBytes counts per chunk.
const chunkBytes = int64(unsafe.Sizeof(slabChunk{}))

// deadChunk stands in for every released chunk (see the invariants above). Read-only.
var deadChunk slabChunk

// slab is a shard's entries. free is touched by producers and freers; the rest by grow and trim
// under growMu (held is read by Stats).
type slab struct {
	free   atomic.Uint64                // tag<<32 | index of the top free entry
	chunks atomic.Pointer[[]*slabChunk] // chunk c holds indices c<<slabChunkBits ...; copy-on-write
	growMu sync.Mutex                   // serialises grow and trim
	// genFloor is at least every gen of every entry of every chunk released so far; guarded by
	// growMu. held is chunkBytes times the live chunks: written under growMu, read by Stats.
	genFloor uint64
	held     atomic.Int64
	onGrow   func() // called as each grow ends, its entries pushed: the trimmer looks again (trim.go); immutable
}

// at returns the entry with index i (i != 0, handed out by alloc). Any goroutine may call it.
// The chunk table is replaced, never modified, so a stale table is still a valid one.
func (sl *slab) at(i uint32) *entry {
	return &(*sl.chunks.Load())[i>>slabChunkBits][i&slabChunkMask]
}

// alloc pops a free entry, growing the slab when none is free. The caller owns the entry. It
// returns a nil entry only when none is free and the slab is at slabCap.
func (sl *slab) alloc() (uint32, *entry) {
	for {
		h := sl.free.Load()
		i := uint32(h)
		if i == 0 {
			i, e, full := sl.grow()
			if e != nil || full {
				return i, e
			}
			continue // another goroutine grew the slab meanwhile
		}
		e := sl.at(i)
		next := uint32(e.when.Load())
		if sl.free.CompareAndSwap(h, (h>>32+1)<<32|uint64(next)) {
			return i, e
		}
	}
}

// freeList pushes a list of free entries, first to last, linked through their when fields; last's
// link is set here. The caller owns them all until this returns.
func (sl *slab) freeList(first uint32, last *entry) {
	for {
		h := sl.free.Load()
		last.when.Store(int64(uint32(h)))
		if sl.free.CompareAndSwap(h, (h>>32+1)<<32|uint64(first)) {
			return
		}
	}
}

// grow adds a chunk, pushes all of its entries but one and returns that one; or returns a nil
// entry if the free stack is no longer empty (another goroutine grew the slab), or a nil entry
// and full if the slab is at slabCap.
func (sl *slab) grow() (i uint32, e *entry, full bool) {
	sl.growMu.Lock()
	defer sl.growMu.Unlock()
	if uint32(sl.free.Load()) != 0 {
		return 0, nil, false
	}
	var cur []*slabChunk
	if p := sl.chunks.Load(); p != nil {
		cur = *p
	}
	// The lowest slot that trim emptied, else a new one at the end: keep the slab low.
	n := len(cur)
	if k := slices.Index(cur, &deadChunk); k >= 0 {
		n = k
	}
	if n == len(cur) && uint64(n+1)<<slabChunkBits > slabCap {
		return 0, nil, true
	}
	c := new(slabChunk)
	if sl.genFloor != 0 {
		for j := range c { // free, at the floor: the first arming is above any released gen
			c[j].state.Store(sl.genFloor << genShift)
		}
	}
	var next []*slabChunk
	if n == len(cur) {
		// append may write past the old slice's length in its backing array; readers holding
		// the old table never index past their length, so they are unaffected.
		next = append(cur, c)
	} else {
		next = slices.Clone(cur) // readers of cur may be reading slot n: never write it
		next[n] = c
	}
	sl.chunks.Store(&next)
	sl.held.Add(chunkBytes)
	base := uint32(n) << slabChunkBits
	first := base
	if first == 0 {
		first = 1 // index 0 means none; the first entry of the first chunk stays unused
	}
	for i := first + 1; i < base+slabChunkLen-1; i++ {
		c[i&slabChunkMask].when.Store(int64(i + 1))
	}
	if first+1 < base+slabChunkLen {
		sl.freeList(first+1, &c[slabChunkLen-1])
	}
	// After the push, which moves the free stack's tag: a trimmer look that clears the grow's
	// note sees the new tag and watches the slab. Before it, a look that came in between found
	// the tag of a full, trimmed slab and slept for trimIdleLook (TestTrimLookRightAfterGrow).
	if sl.onGrow != nil {
		sl.onGrow()
	}
	return first, &c[first&slabChunkMask], false
}

// newEntry takes an entry from the shard's slab and arms it (gen+1, pending, periodic for an
// Every's). The caller owns it until it publishes it with an add command. A nil entry means the
// slab is full.
func (sl *slab) newEntry(periodic bool) (uint32, *entry, uint64) {
	i, e := sl.alloc()
	if e == nil {
		return 0, nil, 0
	}
	w := nextArming(e.state.Load())
	if periodic {
		w |= periodicBit
	}
	e.state.Store(w)
	return i, e, genOf(w)
}

// freeEntry clears an unlinked entry (so that it keeps no callback or argument alive) and returns
// it to its slab. The caller must be its single owner.
func (sl *slab) freeEntry(i uint32, e *entry) {
	clearEntry(e)
	sl.freeList(i, e)
}

// clearEntry drops an entry's callback, ready for freeList. Its state word stays as it is (free
// after a one-shot run, stopped after a Stop): either way it tells a handle of this arming that
// the timer is over, and the next arming replaces it with a new gen.
func clearEntry(e *entry) {
	e.f, e.arg = nil, nil
}

// freeBatch collects entries freed by one goroutine so that they return to their slab with one
// CAS. It is plain data owned by its goroutine.
type freeBatch struct {
	sl    *slab
	first uint32 // the most recently added entry: the head of the list
	last  *entry // the first added: the tail, whose link flush sets
}

// add clears e and queues it; a batch for another slab is flushed first.
func (b *freeBatch) add(sl *slab, i uint32, e *entry) {
	clearEntry(e)
	if b.sl != sl {
		b.flush()
		b.sl = sl
	}
	if b.last == nil {
		b.last = e
	} else {
		e.when.Store(int64(b.first))
	}
	b.first = i
}

// flush returns the queued entries to their slab.
func (b *freeBatch) flush() {
	if b.last != nil {
		b.sl.freeList(b.first, b.last)
	}
	*b = freeBatch{}
}

// maxChunk is the most callbacks that travel to a worker together.
const maxChunk = 64

// ref names a fired entry on its way to a worker: its shard (whose slab gets it back) and index.
// e is s.slab.at(i), carried so that the worker's loop does not look it up again.
type ref struct {
	s *shard
	e *entry
	i uint32
}

// chunk carries work to a worker in one channel operation: expired entries to run, or (adv
// non-nil) a due shard to advance to tick now, which the sender claimed for the taker. Pooled.
type chunk struct {
	n   int
	es  [maxChunk]ref
	adv *shard
	now int64
}

var chunkPool = sync.Pool{New: func() any { return new(chunk) }}
