package shardwheel

import (
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"go.uber.org/atomic"
)

// Entries live in a per-shard slab: blocks of blockLen entries, addressed by a 32-bit index. The
// index is what lets an entry be 48 bytes: with two 8-byte pointer links it would need 56, which a
// heap object rounds up to the 64-byte size class. The timing wheel links entries by index
// (wheel.go). A block is one 48 KiB object whose only pointers are each entry's callback and
// argument: the garbage collector scans blocks and follows no links.
//
// Free entries form a lock-free stack (Treiber's) per shard. Its head packs a 32-bit tag, bumped by
// every push and pop so that a CAS never succeeds on a head that was popped and pushed back
// meanwhile (ABA), and the index of the top entry (0: empty). A free entry's link to the next one
// is kept in its when field, which is atomic, so a pop that loses its race and reads the link of an
// entry someone has just armed reads it atomically and then fails its CAS. Who frees an entry:
//   - the shard, taking the cancel command of a timer stopped while pending, or the add of one
//     stopped before the shard took it;
//   - the worker, for a one-shot callback it is about to start, a timer stopped while it waited
//     to run, or an Every whose series ended during its run; each goes into a freeBatch and
//     returns to its slab after the batch;
//   - the Timer.Stop of a fired timer whose worker passed it (Timer.stopFiring).
//
// Each is the single owner of the entry at that moment (entry.go's table), so an entry is never
// freed twice. An entry's gen survives freeing: arming bumps it, which makes every Timer that still
// names the entry stale.
//
// Blocks come and go. A burst grows the slab; once the shard has been quiet for trimQuiet, the
// trimmer (trim.go) gives back every block whose entries are all free, and pushes the rest back
// lowest block first, so that new timers fill the low blocks and the high ones drain for the next
// trim (the runtime's mcentral prefers partly used spans for the same reason). The invariants that
// keep handles and commands safe across a release:
//   - Every index on the free stack names an entry of a live block: trim takes a block's entries
//     off the stack before it releases the block, and only the owner of a live entry frees it.
//   - A released block's slot in the table names deadBlock, never nil: at(i) is always a valid
//     entry, so a stale Timer, a stale reset command or a pop that lost its race reads a real
//     state word there (gen 0, which no Timer holds: an entry's first arming is gen 1) and does
//     nothing. deadBlock is never written.
//   - Generations never repeat: trim raises genFloor to the highest gen in each block it releases,
//     and grow starts every entry of a new block at genFloor.
//   - The table is copy-on-write under growMu (grow, trim): a reader holding an old table reads an
//     old block, which the garbage collector keeps while it is read; its entries hold only gens of
//     past armings, so a handle acting on it finds them over and does nothing.
const (
	blockBits = 10
	blockLen  = 1 << blockBits
	blockMask = blockLen - 1

	// maxEntries bounds a shard's slab: link values with the top bit set name bucket lanes
	// (wheel.go), and index 0 means none.
	maxEntries = 1 << 31
)

// slabCap is the most entries a shard's slab grows to: maxEntries, lowered only by tests.
var slabCap uint64 = maxEntries

// errSlabFull is what scheduling returns when its shard's slab cannot grow: about two billion
// timers pending on one shard (96 GiB of entries). It is an ErrTooManyTimers.
type errSlabFull struct{ limit uint64 }

// slabFull returns the error for the current slabCap: whole blocks, less index 0, never used.
func slabFull() error { return errSlabFull{limit: slabCap&^blockMask - 1} }

func (e errSlabFull) Error() string {
	return fmt.Sprintf("shardwheel: too many pending timers: a shard holds at most %d", e.limit)
}

func (errSlabFull) Unwrap() error { return ErrTooManyTimers }

type slabBlock [blockLen]entry

// blockBytes is the memory one block holds: what Stats.HeldBytes counts per block.
const blockBytes = int64(unsafe.Sizeof(slabBlock{}))

// deadBlock stands in for every released block (see the invariants above). Read-only.
var deadBlock slabBlock

// slab is a shard's entries. free is used by producers and freers; the rest by grow and trim under
// growMu (held is read by Stats).
type slab struct {
	free   atomic.Uint64                // tag<<32 | index of the top free entry
	blocks atomic.Pointer[[]*slabBlock] // block b holds indices b<<blockBits ...; copy-on-write
	growMu sync.Mutex                   // serialises grow and trim
	// genFloor is at least every gen of every entry of every block released so far; guarded by
	// growMu. held is blockBytes times the live blocks: written under growMu, read by Stats.
	genFloor uint64
	held     atomic.Int64
	// onGrow is called as each grow ends, its entries pushed (the trimmer looks again: New sets
	// it to Wheel.noteGrow). Immutable.
	onGrow func()
}

// at returns the entry with index i (i != 0, handed out by alloc). Any goroutine may call it: the
// block table is replaced, never modified, so a stale table is still a valid one.
func (sl *slab) at(i uint32) *entry {
	return &(*sl.blocks.Load())[i>>blockBits][i&blockMask]
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
			if next != 0 {
				sl.touch(next)
			}
			return i, e
		}
	}
}

// touch loads the free-stack link of entry i, the next pop's, and discards it: a load that the
// processor starts now and nothing waits for, so that its cache miss overlaps the rest of this
// arm rather than stalling the next pop. A free stack that a mass of stops left behind spans
// tens of megabytes, and without it each pop of a flood armed on top of it waited for memory
// (about 200 ns a pop against 10 on a hot stack). The link may be a later owner's deadline by
// the time it is read; nothing uses it.
func (sl *slab) touch(i uint32) { _ = sl.at(i).when.Load() }

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

// grow adds a block, pushes all of its entries but one and returns that one; or returns a nil
// entry if the free stack is no longer empty (another goroutine grew the slab), or a nil entry and
// full if the slab is at slabCap.
func (sl *slab) grow() (i uint32, e *entry, full bool) {
	sl.growMu.Lock()
	defer sl.growMu.Unlock()
	if uint32(sl.free.Load()) != 0 {
		return 0, nil, false
	}
	var cur []*slabBlock
	if p := sl.blocks.Load(); p != nil {
		cur = *p
	}
	// The lowest slot that trim emptied, else a new one at the end: keep the slab low.
	n := len(cur)
	if k := slices.Index(cur, &deadBlock); k >= 0 {
		n = k
	}
	if n == len(cur) && uint64(n+1)<<blockBits > slabCap {
		return 0, nil, true
	}
	b := new(slabBlock)
	if sl.genFloor != 0 {
		for j := range b { // free, at the floor: the first arming is above any released gen
			b[j].state.Store(sl.genFloor << genShift)
		}
	}
	var next []*slabBlock
	if n == len(cur) {
		// append may write past the old slice's length in its backing array; readers holding
		// the old table never index past their length, so they are unaffected.
		next = append(cur, b)
	} else {
		next = slices.Clone(cur) // readers of cur may be reading slot n: never write it
		next[n] = b
	}
	sl.blocks.Store(&next)
	sl.held.Add(blockBytes)
	base := uint32(n) << blockBits
	first := max(base, 1) // index 0 means none; the first entry of the first block stays unused
	for i := first + 1; i < base+blockLen-1; i++ {
		b[i&blockMask].when.Store(int64(i + 1))
	}
	if first+1 < base+blockLen {
		sl.freeList(first+1, &b[blockLen-1])
	}
	// After the push, which moves the free stack's tag: a trimmer look that clears the grow's
	// note then sees the new tag and watches the slab (TestTrimLookRightAfterGrow).
	if sl.onGrow != nil {
		sl.onGrow()
	}
	return first, &b[first&blockMask], false
}

// newEntry takes an entry from the slab and arms it (gen+1, pending, queued; periodic for an
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

// freeEntry clears an unlinked entry and returns it to the slab. The caller must be its single
// owner.
func (sl *slab) freeEntry(i uint32, e *entry) {
	clearEntry(e)
	sl.freeList(i, e)
}

// freeBatch collects entries freed by one goroutine, so that they return to their slab with one
// CAS. Plain data, owned by its goroutine.
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

// ref names a fired entry on its way to a callback: its shard (whose slab gets it back) and its
// index. e is s.slab.at(i), carried so that the runner does not look it up again.
type ref struct {
	s *shard
	e *entry
	i uint32
}
