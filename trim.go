package shardwheel

import (
	"slices"
	"time"
)

// Giving memory back. A burst of timers grows a shard's slab (pool.go) by 48 KiB blocks; once
// those timers are over, their entries sit on the free stack. The trimmer gives the blocks back
// to the Go heap when their shard has been quiet for trimQuiet: no entry taken from or returned
// to its slab, as told by the free stack's tag, which every push and pop bumps. So a shard in
// steady use keeps its blocks (its next timers reuse them; AfterFuncArg + Stop allocates nothing),
// and a burst's blocks go back seconds after the last of its timers ended.
//
// The trimmer runs on the advancer, after an advance (the keeper in keep, manualAdvance): it looks at
// every slab at most once per trimLook, reading one word each, so it costs nothing on the
// producers' path and next to nothing on the advancer's. While some slab has changed since it
// was last trimmed, the keeper sleeps at most until the next look; once every slab is
// trimmed and unchanged, it sleeps as before (an idle wheel stays idle). So a burst's blocks are
// back within trimQuiet + 2*trimLook after its last timer ended (7 s), and the cost of a trim,
// one walk of the shard's free list, is paid at most once per trimQuiet of quiet.
//
// What a trim costs: about 8 ms per million free entries (measured on the 2-core test machine,
// ring drain included). A producer that finds the free stack empty meanwhile waits in grow for
// growMu; since a trim runs only on a shard quiet for trimQuiet, that is the first producer after
// a quiet spell, once.

// trimQuiet and trimLook: see above. Variables only so that tests can shorten them
// (export_test.go); they are not changed while a wheel runs.
var (
	trimQuiet    = 5 * time.Second
	trimLook     = time.Second
	trimIdleLook = 30 * time.Second
)

// trimmer is the advancer's view of the slabs. Owned by the advancer.
type trimmer struct {
	last  int64       // w.nanos() of the last look
	next  int64       // w.nanos() of the next look; 0 before the first
	slabs []slabWatch // one per shard, made at the first look
}

// slabWatch follows one slab's free-stack tag. Owned by the advancer.
type slabWatch struct {
	tag     uint32 // the tag at the last look
	since   int64  // w.nanos() of the look that first saw this tag
	trimmed bool   // tag is the one the last trim left: nothing to give back since
}

// trimIdle looks at the slabs if trimLook has passed since the last look, trims those that have
// been quiet for trimQuiet, and returns the instant at which it wants to look again (never if every
// slab is trimmed and unchanged). now is the caller's reading of w.nanos(). Only the advancer
// calls it, with no lock held.
func (w *Wheel) trimIdle(now int64) int64 {
	t := &w.trim
	if t.slabs == nil {
		t.slabs = make([]slabWatch, len(w.shards))
		for i := range t.slabs {
			t.slabs[i].trimmed = true // an empty slab: tag 0, nothing held
		}
	}
	if now < t.next {
		// A slab that grew since the last look (noteGrow) is looked at within trimLook of it.
		if due := t.last + int64(trimLook); w.trimDirty.Load() && due < t.next {
			if now < due {
				return due
			}
		} else {
			return t.next
		}
	}
	w.trimDirty.Store(false) // before the look: a grow after this store is seen by the next call
	t.last = now
	t.next = now + int64(trimLook) // may wrap near the end of time: see the end
	watching := false
	for i, s := range w.shards {
		sw := &t.slabs[i]
		if tag := uint32(s.slab.free.Load() >> 32); tag != sw.tag {
			sw.tag, sw.since, sw.trimmed = tag, now, false
		}
		if sw.trimmed {
			continue
		}
		if now-sw.since >= int64(trimQuiet) {
			// The tag the trim left: any other push or pop, also one during the trim, changes it.
			// Not ok: the shard is in use right now (see shard.trim); looked at again next time.
			if _, tag, ok := s.trim(); ok {
				sw.tag, sw.since, sw.trimmed = tag, now, true
				continue
			}
		}
		watching = true
	}
	if !watching {
		// Every slab is trimmed and unchanged: look again only after trimIdleLook (a shard whose
		// timers all ended without a grow is found then), or within trimLook of a grow. An idle
		// wheel wakes once per trimIdleLook, not once per trimLook: each wake of an idle process
		// costs more CPU than it looks (the runtime's own sysmon wakes with it).
		t.next = now + int64(trimIdleLook)
	}
	if t.next < now {
		t.next = never // a manual clock near the end of time
	}
	return t.next
}

// noteGrow records that a slab grew, and wakes the keeper so that the trimmer watches it: only
// a slab that grew can come to hold more blocks than its timers need (trim gave back all it
// could at its last trim). Called by a producer in slab.grow, rarely (once per new block).
func (w *Wheel) noteGrow() {
	w.trimDirty.Store(true)
	w.signal()
}

// trim drains the shard's ring, so that the cancels waiting there free their entries, and gives
// back the slab's blocks whose entries are all free. It returns what slab.trim does. Any
// goroutine may call it; it takes s.mu for the drain, then growMu.
//
// It waits for neither lock: it reports ok false if either is held. The trimmer runs on the
// keeper, which must never wait for a goroutine that may be paused while it holds one of them (a
// producer in grow or draining a full ring, preempted or assisting the GC): every shard's timers
// would wait with it. A held lock means the shard is in use, so there is nothing to trim there
// anyway.
func (s *shard) trim() (freed int64, tag uint32, ok bool) {
	if !s.mu.TryLock() {
		return 0, 0, false
	}
	s.drainNoteLocked()
	s.mu.Unlock()
	return s.slab.trim()
}

// trim gives back to the Go heap every block all of whose entries are on the free stack, and
// pushes the others' free entries back lowest block first. It returns the bytes given back and the
// tag its own CASes would leave if nobody else touched the stack meanwhile; so the tag differs from
// it if a push or pop came between, also one during the trim (whose entries count as in use here,
// and whose blocks the next trim must look at). Any goroutine may call it; ok is false if growMu
// was held (a grow or another trim is under way). The steps:
//  1. Under growMu, so that no grow or other trim changes the table meanwhile.
//  2. Take the whole free stack with one CAS (which bumps the tag, so a pop that read the old head
//     fails its CAS). The taken entries are now the trimmer's alone. Producers that find the stack
//     empty meanwhile wait in grow for growMu, and then find it refilled; entries freed meanwhile
//     are pushed onto the empty stack and count as in use here (their block is kept until the
//     next trim).
//  3. Walk the taken list once, moving each entry onto a list of its own block and counting.
//  4. Release each block whose entries were all taken: raise genFloor to its highest gen, and
//     point its slot at deadBlock in a new table (copy-on-write: see pool.go's invariants).
//  5. Push the kept blocks' lists back, lowest block on top.
func (sl *slab) trim() (freed int64, tag uint32, ok bool) {
	if !sl.growMu.TryLock() { // 1
		return 0, 0, false
	}
	defer sl.growMu.Unlock()
	p := sl.blocks.Load()
	if p == nil {
		return 0, uint32(sl.free.Load() >> 32), true
	}
	tbl := *p
	var top uint32
	for { // 2
		h := sl.free.Load()
		tag = uint32(h>>32) + 1
		if sl.free.CompareAndSwap(h, uint64(tag)<<32) {
			top = uint32(h)
			break
		}
	}
	lists := sortFree(tbl, top)        // 3
	freed = sl.releaseFull(tbl, lists) // 4
	if sl.pushLists(lists) {           // 5
		tag++ // the push's own bump: any other push or pop since step 2 makes the tag differ
	}
	return freed, tag, true
}

// blockList is a list of free entries of one block, linked through their when fields.
type blockList struct {
	head  uint32
	tail  *entry
	count uint32
}

// sortFree moves the free entries of the list that starts at top onto one list per block of tbl.
// The caller holds growMu and owns every entry of the list.
func sortFree(tbl []*slabBlock, top uint32) []blockList {
	lists := make([]blockList, len(tbl))
	for i := top; i != 0; {
		b := i >> blockBits
		if tbl[b] == &deadBlock {
			panic("shardwheel: a free entry in a released block") // pool.go's first invariant
		}
		e := &tbl[b][i&blockMask]
		next := uint32(e.when.Load())
		l := &lists[b]
		if l.head == 0 {
			l.tail = e
		}
		e.when.Store(int64(l.head))
		l.head = i
		l.count++
		i = next
	}
	return lists
}

// releaseFull releases every block of tbl whose entries are all on its list, empties those lists,
// and returns the bytes given back. The caller holds growMu.
func (sl *slab) releaseFull(tbl []*slabBlock, lists []blockList) (freed int64) {
	var released []*slabBlock
	for b := range tbl {
		full := uint32(blockLen)
		if b == 0 {
			full-- // index 0 is never used
		}
		if lists[b].count != full {
			continue
		}
		for j := range tbl[b] {
			sl.genFloor = max(sl.genFloor, genOf(tbl[b][j].state.Load()))
		}
		if released == nil {
			released = slices.Clone(tbl)
		}
		released[b] = &deadBlock
		lists[b] = blockList{}
		freed += blockBytes
	}
	if released != nil {
		sl.blocks.Store(&released)
		sl.held.Add(-freed)
	}
	return freed
}

// pushLists pushes the non-empty lists back onto the free stack with one CAS, the lowest block's
// entries on top, and reports whether there was anything to push.
func (sl *slab) pushLists(lists []blockList) bool {
	var first uint32
	var last *entry
	for b := len(lists) - 1; b >= 0; b-- {
		l := lists[b]
		if l.head == 0 {
			continue
		}
		if last == nil {
			last = l.tail
		} else {
			l.tail.when.Store(int64(first))
		}
		first = l.head
	}
	if last == nil {
		return false
	}
	sl.freeList(first, last)
	return true
}

// heldBytes returns the memory the wheel holds for timers: its live blocks, in use or free.
func (w *Wheel) heldBytes() int64 {
	n := int64(0)
	for _, s := range w.shards {
		n += s.slab.held.Load()
	}
	return n
}
