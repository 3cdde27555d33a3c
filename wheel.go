package shardwheel

import (
	"errors"
	"fmt"
	"math/bits"
)

// The hierarchical wheel (Varghese & Lauck), in ticks. Level l has 64 slots of 64^l ticks each:
//
//	Level 0: 64 x 1 tick          (64 ms at the default 1 ms tick)
//	Level 1: 64 x 64 ticks        (~4 s)
//	Level 2: 64 x 4096 ticks      (~4.4 min)
//	Level 3: 64 x 262144 ticks    (~4.7 h)
//	Level 4: 64 x 16777216 ticks  (~12.4 days)
//	Level 5: 64 x 1073741824 ticks (~2.2 years)
//	Overflow: one parking bucket for anything further, re-examined every wheelSpan ticks.
//
// 64 slots per level because a level's occupancy is then one uint64 bitmap. A deadline goes to
// the level of the highest 6-bit group in which it differs from the wheel's elapsed tick (as in
// Tokio's wheel), so every entry of one bucket shares the bucket's start tick. When time reaches
// that start the bucket is taken whole: entries that are due fire, the others are re-inserted one
// level or more down (Kafka's cascade); a cascade cut short by a step's budget keeps its rest
// aside (casc), and on the system clock a due bucket of a lower level goes before that rest, so
// a short timer never waits for a big cascade. Buckets are visited in order of their start through a
// min-heap (Kafka's DelayQueue), so time jumps from one non-empty bucket to the next: no empty
// ticks, and a jump of three years costs one visit per non-empty bucket.
//
// Deadlines are exact; the tick is only the width of a bucket. An entry's deadline (entry.when) is
// in nanoseconds, and it belongs to the tick in progress at that instant (when/tick, rounded
// down). So a bucket of level 0 holds deadlines anywhere in its tick, and is not due at its start
// but at its earliest deadline (min0, a lower bound kept per slot). Taking it fires what is due
// and moves the rest, the entries of the tick in progress whose moment has not come, to a soon
// bucket (stragglers), which comes due at its own earliest deadline. So a callback starts at its
// deadline plus the wake-up's delay, not up to a tick later: the runtime's precision, at the
// wheel's cost per timer. Two soon buckets, so that a budgeted take of one never meets the
// stragglers that its own walk puts into the other.
//
// The wheel is plain data owned by one goroutine at a time (the holder of its shard's mutex):
// no atomics and no locks here, except reading an entry's state and deadline through the
// expire callback that the shard passes in.
//
// Entries are linked by their 32-bit slab index (pool.go), not by pointer. A link is one of:
// 0 (none); an entry's index; or, only in the prev of a lane's first entry, a lane reference
// (laneRef: the top bit set, then the level, slot and lane). So an entry needs no fields for
// where it is linked: unlink finds the bucket through the lane reference when it removes a
// lane's first entry, and needs none otherwise.
const (
	slotBits   = 6
	numSlots   = 1 << slotBits
	slotMask   = numSlots - 1
	numLevels  = 6
	wheelBits  = slotBits * numLevels // 36
	wheelSpan  = int64(1) << wheelBits
	overflowLv = numLevels     // the level index of the parking bucket
	soonLv     = numLevels + 1 // the level in a laneRef to a soon bucket (slot 0 or 1); not in buckets
	heldLv     = numLevels + 2 // the level in a laneRef to the held bucket (slot 0); not in buckets
	cascLv     = numLevels + 3 // the level in a laneRef to the cascade's rest (slot 0); not in buckets

	// Each bucket is laneCount independent lists, filled round-robin. Taking a bucket walks
	// its lanes side by side, so the loads of laneCount next pointers are in flight at once:
	// a single list is a chain of dependent cache misses, and in a flood (thousands of
	// cache-cold entries per tick) that chain was most of the advancer's time.
	laneBits  = 3
	laneCount = 1 << laneBits
	laneMask  = laneCount - 1
)

// levelFor returns the level at which an entry due at tick when belongs, seen from tick elapsed
// (when >= elapsed): the highest 6-bit group in which the two differ, or overflowLv when they
// differ above the top level. An entry due at elapsed itself is at level 0.
func levelFor(elapsed, when int64) int {
	masked := uint64(elapsed^when) | slotMask
	lv := (63 - bits.LeadingZeros64(masked)) / slotBits
	if lv > overflowLv {
		lv = overflowLv
	}
	return lv
}

// slotFor returns the slot of tick when at a level below overflowLv.
func slotFor(when int64, level int) int {
	return int(uint64(when)>>(uint(level)*slotBits)) & slotMask
}

// bucketStart returns the tick at which the bucket holding when at level comes due: when with its
// bits below the level cleared. For the overflow level that is the start of when's 2^36-tick era,
// the first tick at which when is within the wheel's reach; the overflow bucket comes due at the
// earliest such start among its entries, so a timer years out costs one visit, not one per era.
func bucketStart(when int64, level int) int64 {
	if level == overflowLv {
		return when &^ (wheelSpan - 1)
	}
	return when &^ (int64(1)<<(uint(level)*slotBits) - 1)
}

// bucket is one slot: laneCount intrusive doubly-linked lists of entries.
type bucket struct {
	lanes  [laneCount]uint32 // the index of each lane's first entry, 0 if empty
	start  int64             // tick at which the bucket comes due; valid while the bucket is in the heap
	queued bool              // the heap holds a node for this bucket (possibly stale if it emptied since)
}

// empty reports whether no lane holds an entry.
func (b *bucket) empty() bool {
	for _, h := range b.lanes {
		if h != 0 {
			return false
		}
	}
	return true
}

// laneBit marks a link that names a bucket lane rather than an entry.
const laneBit = 1 << 31

// laneRef is the link to lane ln of bucket (lv, sl), stored in the prev of the lane's first entry.
func laneRef(lv, sl int, ln uint8) uint32 {
	return laneBit | uint32(lv*numSlots+sl)<<laneBits | uint32(ln)
}

// laneOf decodes a laneRef.
func laneOf(r uint32) (lv, sl int, ln uint8) {
	b := int(r&^laneBit) >> laneBits
	return b / numSlots, b % numSlots, uint8(r & laneMask)
}

// timingWheel is the hierarchical timing wheel of one shard. Owned by the holder of shard.mu.
type timingWheel struct {
	now      int64                           // the reading (ns) the running advance goes to (only meaningful during advance)
	elapsed  int64                           // ticks processed; never decreases
	count    int                             // entries linked, soon and held buckets included
	lane     uint8                           // the lane the next insert uses
	occupied [numLevels + 1]uint64           // bit s of level l set iff buckets[l][s] is non-empty
	buckets  [numLevels + 1][numSlots]bucket // level overflowLv uses slot 0 only
	// min0 is, for each non-empty bucket of level 0, a lower bound of its entries' deadlines
	// (ns): set by the insert that finds the bucket empty, lowered by later inserts, never raised
	// by unlink (an early bound only wakes the advancer early), and 0 after a put back.
	min0 [numSlots]int64
	// soon are the stragglers' buckets (see the top of this file): every entry in them belongs to
	// the tick in progress, elapsed, and is due by its end. soonFill is the one stragglers go
	// into; the other one is being taken in steps when it is not empty. soonMin is a lower
	// bound of each one's deadlines (ns), meaningful while it is not empty; 0 after a put back.
	soon     [2]bucket
	soonMin  [2]int64
	soonFill uint8
	// held holds the entries that an advance found held by a Reset (parked, timer.go): no
	// advance takes it; each such Reset sends a command that moves its entry out.
	held bucket
	// casc is the rest of a bucket of level cascLevel (1 or more) that a budgeted advance took in
	// part: a cascade in progress, whose start is casc.start (no heap node: advance takes it on
	// its own terms). The bucket's span, from casc.start for 64^cascLevel ticks, holds elapsed,
	// and every bucket of a lower level (whose entries share elapsed's bits above that level).
	// Its entries' ticks lie in that span, or later after a Reset (no command is sent when a
	// deadline moves later: expire links the entry at its new tick). With a manual clock advance
	// finishes it before any other bucket, as one unbounded advance would; with interleave (the
	// system clock) a due bucket of a lower level goes first: a cascade of a million entries
	// takes about 20 ms of one core, and short timers armed meanwhile, in the lower buckets of
	// that span, would otherwise wait for all of it. Entries of casc whose tick elapsed has
	// passed are due by then, and fire as they are taken (shard.expire).
	casc       bucket
	cascLevel  uint8 // the level of casc's bucket, meaningful while casc is not empty
	interleave bool  // set by the shard on the system clock; immutable
	heap       bucketHeap
	slab       *slab // where linked indices point; the shard's
	ticks            // the Wheel's tick arithmetic (clock.go); immutable
}

// init sets up an empty wheel at tick elapsed.
func (w *timingWheel) init(elapsed int64, k ticks, sl *slab) {
	w.elapsed, w.ticks, w.slab = elapsed, k, sl
}

// bucketAt returns the bucket a laneRef's level and slot name.
func (w *timingWheel) bucketAt(lv, sl int) *bucket {
	switch lv {
	case soonLv:
		return &w.soon[sl]
	case heldLv:
		return &w.held
	case cascLv:
		return &w.casc
	}
	return &w.buckets[lv][sl]
}

// insert links e, the entry with index i, for its deadline when (ns, at least 0): into the bucket
// of the tick in progress at when. A deadline in a tick before elapsed (a timer that was due
// while its command waited in the ring) goes to the bucket of elapsed itself, which the next
// advance takes first.
func (w *timingWheel) insert(i uint32, e *entry, when int64) { w.link(i, e, when/w.tick, when) }

// link is insert at tick t, with when the entry's deadline (or any earlier moment in t: the
// bucket's bound, min0, is lowered to it).
func (w *timingWheel) link(i uint32, e *entry, t, when int64) {
	if t < w.elapsed {
		t = w.elapsed
	}
	lv := levelFor(w.elapsed, t)
	sl := 0
	if lv != overflowLv {
		sl = slotFor(t, lv)
	}
	b := &w.buckets[lv][sl]
	if lv == 0 && (w.occupied[0]&(1<<uint(sl)) == 0 || when < w.min0[sl]) {
		w.min0[sl] = when
	}
	w.occupied[lv] |= 1 << uint(sl)
	// A level bucket's start is the same for all its entries (they share the bits above the
	// level with elapsed, and its start only changes once time passed it, which pops its node),
	// so one node per bucket. The overflow bucket's start is the earliest era start of its
	// entries: an earlier one pushes a new node, and the old node is dropped as stale when it
	// reaches the top. A start kept from an entry that left is early, which is safe: the visit
	// re-parks what is still out of reach.
	if start := bucketStart(t, lv); !b.queued || start < b.start {
		b.start = start
		b.queued = true
		w.heap.push(heapNode{start: start, level: uint8(lv), slot: uint8(sl)})
	}
	w.push(b, lv, sl, i, e)
}

// push links e, with index i, as the first entry of the next lane of bucket b, which is bucket
// (lv, sl).
func (w *timingWheel) push(b *bucket, lv, sl int, i uint32, e *entry) {
	ln := w.lane
	w.lane = (ln + 1) & laneMask
	head := b.lanes[ln]
	e.prev = laneRef(lv, sl, ln)
	e.next = head
	if head != 0 {
		w.slab.at(head).prev = i
	}
	b.lanes[ln] = i
	w.count++
}

// straggle links e, an entry of the tick in progress whose deadline when (ns) is after the
// running advance's reading, into the soon bucket that stragglers go into.
func (w *timingWheel) straggle(i uint32, e *entry, when int64) {
	f := w.soonFill
	b := &w.soon[f]
	if b.empty() || when < w.soonMin[f] {
		w.soonMin[f] = when
	}
	w.push(b, soonLv, int(f), i, e)
}

// park links e, with index i, an entry that a Reset holds, into the held bucket.
func (w *timingWheel) park(i uint32, e *entry) { w.push(&w.held, heldLv, 0, i, e) }

// unlink removes a linked entry from its bucket in O(1). The bucket's heap node stays and is
// discarded when it reaches the top.
func (w *timingWheel) unlink(e *entry) {
	p, n := e.prev, e.next
	if p&laneBit != 0 {
		lv, sl, ln := laneOf(p)
		b := w.bucketAt(lv, sl)
		b.lanes[ln] = n
		if n == 0 && lv <= overflowLv && b.empty() {
			w.occupied[lv] &^= 1 << uint(sl)
		}
	} else {
		w.slab.at(p).next = n
	}
	if n != 0 {
		w.slab.at(n).prev = p
	}
	e.next, e.prev = 0, 0
	w.count--
}

// nextDue returns the reading (ns) at which the wheel next has something to do: the earliest
// straggler's deadline, or the moment the earliest non-empty bucket comes due (dueAt), whichever
// is sooner; never if the wheel is empty. It drops stale heap nodes on the way.
func (w *timingWheel) nextDue() int64 {
	d := int64(never)
	for f := range w.soon {
		if !w.soon[f].empty() {
			d = min(d, w.soonMin[f])
		}
	}
	if d != never {
		d = min(w.roundUp(d), w.end(w.elapsed)) // every straggler is due by the end of elapsed
	}
	if !w.casc.empty() {
		d = min(d, w.start(w.elapsed)) // a cascade in progress: due now
	}
	for w.heap.len() > 0 {
		n := w.heap.top()
		if w.live(n) {
			return min(d, w.dueAt(n))
		}
		w.popNode()
	}
	return d
}

// dueAt returns the reading at which the bucket of a live node comes due: its start, or for a
// bucket of level 0 its earliest deadline if that is later (rounded up to the grain, and no later
// than the end of its tick, when all of it is due).
func (w *timingWheel) dueAt(n heapNode) int64 {
	at := w.start(n.start)
	if n.level != 0 {
		return at
	}
	if m := w.min0[n.slot]; m > at {
		return min(w.roundUp(m), w.end(n.start))
	}
	return at
}

// live reports whether a heap node still stands for a non-empty bucket due at its start.
func (w *timingWheel) live(n heapNode) bool {
	b := &w.buckets[n.level][n.slot]
	return b.queued && b.start == n.start && !b.empty()
}

// popNode removes the heap's top node; if it was its bucket's node, the bucket is no longer queued.
func (w *timingWheel) popNode() heapNode {
	n := w.heap.pop()
	if b := &w.buckets[n.level][n.slot]; b.start == n.start {
		b.queued = false
	}
	return n
}

// advance takes, in order of their start, every bucket that comes due at or before the reading now
// (ns), and hands each of its entries to expire with elapsed set to the bucket's start; first the
// stragglers whose deadline may have come (takeSoon). expire either fires the entry, re-inserts it
// (it is then linked into a lower level, never into the bucket being taken), or, for an entry of
// the tick in progress whose deadline is after now, hands it to straggle. The level-0 bucket of
// the tick in progress is taken only once its earliest deadline (min0) has come. If it reaches
// now, elapsed is now's tick and advance reports true.
//
// budget bounds the entries visited in one call (0: no bound), so that the holder of the shard's
// mutex can let go of it between steps of a flood. When the budget runs out first, advance
// reports false and the wheel is consistent at the bucket it was taking: what is left of a bucket
// of level 0 is put back (putBack), of a soon bucket into it, and of a bucket of a higher level
// into casc, the cascade in progress; elapsed is that bucket's start, and the next call goes on
// from there. The next call finishes casc before it takes any other bucket, except, with
// interleave, a due bucket of a lower level, which it takes first (moving elapsed on within the
// span of casc's bucket; if the budget cuts that one short too, its rest is put back, as a
// level-0 bucket's is, and taken first again in the next call). Those buckets leave casc at
// least a quarter of a step's budget (a budget under 10 leaves them nothing: see keep), so that
// a cascade goes on however many short timers come due meanwhile.
// The overflow bucket is always taken whole: a visit may re-park entries in it.
func (w *timingWheel) advance(now int64, expire func(i uint32, e *entry), budget int) bool {
	t := now / w.tick
	if t < w.elapsed {
		return true // time never goes backwards; a stale reading is simply early
	}
	w.now = now
	took, done := w.takeSoon(expire, budget)
	if !done {
		return false
	}
	left := budget - took
	// What a bucket that goes before casc (lowerDue) leaves of a budgeted step: casc's share, a
	// quarter, so that a cascade goes on however many short timers come due meanwhile, plus the
	// laneCount-1 entries by which takeLanes may pass its limit to finish a round of lanes. With
	// keep or less left, casc goes first.
	keep := 0
	if budget > 0 {
		keep = max(1, budget/4) + laneCount - 1
	}
	for {
		if !w.casc.empty() && !(w.interleave && (budget == 0 || left > keep) && w.lowerDue(t, now)) {
			if budget > 0 && left <= 0 {
				return false
			}
			left -= w.takeCasc(expire, max(0, left))
			if !w.casc.empty() {
				return false
			}
			continue
		}
		// Here casc is empty, or the heap's next bucket is a due one below casc's (lowerDue).
		if w.heap.len() == 0 {
			break
		}
		n := w.heap.top()
		if n.start > t {
			break
		}
		live := w.live(n)
		if live && n.level == 0 && w.min0[n.slot] > now {
			break // the bucket of the tick in progress, whose first deadline is yet to come
		}
		if budget > 0 && left <= 0 {
			return false
		}
		w.popNode()
		if !live {
			continue
		}
		limit := 0
		if budget > 0 && int(n.level) != overflowLv {
			limit = left
			if !w.casc.empty() {
				limit -= keep // at least 1: the bucket went first only with left > keep
			}
		}
		took, cut := w.takeBucket(n, expire, limit)
		if left -= took; cut {
			return false
		}
	}
	w.elapsed = t
	return true
}

// takeBucket takes the bucket of node n, which advance has just popped, handing at most about limit
// of its entries to expire (0: all), and returns how many it handed. If the limit left some, it
// keeps them where the next step finds them first: the rest of a higher level's bucket becomes the
// cascade in progress (casc) if there is none, and the step ends (cut); else the rest is put back
// into the bucket, and the step ends unless a cascade in progress still has its share of it.
func (w *timingWheel) takeBucket(n heapNode, expire func(i uint32, e *entry), limit int) (took int, cut bool) {
	b := &w.buckets[n.level][n.slot]
	w.elapsed = n.start
	cur := b.lanes
	b.lanes = [laneCount]uint32{}
	w.occupied[n.level] &^= 1 << n.slot
	took = w.takeLanes(&cur, expire, limit)
	if cur == ([laneCount]uint32{}) {
		return took, false
	}
	if n.level != 0 && w.casc.empty() {
		w.casc.start, w.cascLevel = n.start, n.level
		w.setLanes(&w.casc, cascLv, 0, &cur)
		return took, true
	}
	w.putBack(n, &cur)
	return took, w.casc.empty()
}

// lowerDue reports whether the heap's next live bucket is due at the reading now (tick t), as
// advance would take it, and of a level below casc's. Every bucket of a lower level lies in the
// span of casc's bucket, and every other one starts after that span: so the heap's next bucket
// is such a bucket if any is. It drops stale nodes on the way.
func (w *timingWheel) lowerDue(t, now int64) bool {
	for w.heap.len() > 0 {
		n := w.heap.top()
		if !w.live(n) {
			w.popNode()
			continue
		}
		return n.level < w.cascLevel && n.start <= t && (n.level != 0 || w.min0[n.slot] <= now)
	}
	return false
}

// takeCasc hands the entries of the cascade in progress (casc) to expire, at most about limit of
// them (0: all), and returns how many it handed. expire links what it re-inserts into buckets of
// lower levels (casc's entries share the span of its bucket with elapsed), never into casc.
func (w *timingWheel) takeCasc(expire func(i uint32, e *entry), limit int) int {
	cur := w.casc.lanes
	w.casc.lanes = [laneCount]uint32{}
	took := w.takeLanes(&cur, expire, limit)
	w.setLanes(&w.casc, cascLv, 0, &cur)
	return took
}

// setLanes makes the lists in cur the lanes of bucket b, which is empty and is bucket (lv, sl):
// each list's first entry links back to its lane.
func (w *timingWheel) setLanes(b *bucket, lv, sl int, cur *[laneCount]uint32) {
	for ln, i := range cur {
		if i != 0 {
			b.lanes[ln] = i
			w.slab.at(i).prev = laneRef(lv, sl, uint8(ln))
		}
	}
}

// takeSoon hands to expire the stragglers whose deadline may have come. The soon bucket that
// stragglers do not go into is taken first if a step left some of it; else the one they go into,
// once its earliest deadline has come, after the two swap roles (its not-yet-due entries then go
// to the other). It reports how many entries it handed over and whether it is done: when the
// budget runs out, what is left goes back into the bucket being taken, due at once, for the next
// step.
func (w *timingWheel) takeSoon(expire func(i uint32, e *entry), budget int) (took int, done bool) {
	for {
		t := w.soonFill ^ 1
		if w.soon[t].empty() {
			f := w.soonFill
			if w.soon[f].empty() || w.soonMin[f] > w.now {
				return took, true
			}
			w.soonFill, t = t, f
		}
		limit := 0
		if budget > 0 {
			if limit = budget - took; limit <= 0 {
				return took, false
			}
		}
		b := &w.soon[t]
		cur := b.lanes
		b.lanes = [laneCount]uint32{}
		took += w.takeLanes(&cur, expire, limit)
		if cur != ([laneCount]uint32{}) {
			w.setLanes(b, soonLv, int(t), &cur)
			w.soonMin[t] = 0
			return took, false
		}
	}
}

// putBack links the untaken rest of a bucket's lanes, cur, back into the bucket of node n, which
// advance took and which nothing was inserted into since, and queues it again. Nothing can be:
// elapsed is the bucket's start, so a tick in its span now maps to a lower level (levelFor).
func (w *timingWheel) putBack(n heapNode, cur *[laneCount]uint32) {
	b := &w.buckets[n.level][n.slot]
	w.setLanes(b, int(n.level), int(n.slot), cur)
	w.occupied[n.level] |= 1 << n.slot
	if n.level == 0 {
		w.min0[n.slot] = 0 // the rest's deadlines are not known: due at the bucket's start
	}
	b.start = n.start
	b.queued = true
	w.heap.push(n)
}

// takeLanes hands the entries of the lists in cur to expire, unlinked, and returns how many it
// handed. It steps all lanes together: first the next pointers of every lane's current entry are
// loaded (independent loads, so their cache misses overlap), then the entries, now cached, are
// expired one by one. expire may link an entry into another bucket; next was read before, so the
// walk is unaffected. With limit > 0 it stops once it has handed limit entries (or up to
// laneCount-1 more) and leaves in cur what it did not take; otherwise cur ends empty.
func (w *timingWheel) takeLanes(cur *[laneCount]uint32, expire func(i uint32, e *entry), limit int) int {
	var (
		ids [laneCount]uint32
		es  [laneCount]*entry
	)
	taken := 0
	for limit <= 0 || taken < limit {
		ids = *cur
		live := false
		for ln, i := range ids {
			es[ln] = nil
			if i != 0 {
				e := w.slab.at(i)
				es[ln] = e
				cur[ln] = e.next
				live = true
			}
		}
		if !live {
			break
		}
		for ln, e := range es {
			if e != nil {
				e.next, e.prev = 0, 0
				w.count--
				taken++
				expire(ids[ln], e)
			}
		}
	}
	return taken
}

// forEach calls fn for every linked entry. Used by Wheel.Stop and tests. It visits the soon and
// held buckets, and of the levels only the buckets whose occupied bit is set (a shard's wheel has
// hundreds of buckets, mostly empty).
func (w *timingWheel) forEach(fn func(e *entry)) {
	for _, b := range []*bucket{&w.soon[0], &w.soon[1], &w.held, &w.casc} {
		for _, h := range b.lanes {
			for i := h; i != 0; {
				e := w.slab.at(i)
				i = e.next
				fn(e)
			}
		}
	}
	for lv := range w.buckets {
		for occ := w.occupied[lv]; occ != 0; occ &= occ - 1 {
			sl := bits.TrailingZeros64(occ)
			for _, h := range w.buckets[lv][sl].lanes {
				for i := h; i != 0; {
					e := w.slab.at(i)
					i = e.next
					fn(e)
				}
			}
		}
	}
}

// position returns the bucket and lane an entry is linked in, by walking back to its lane's
// reference. O(the entry's place in its lane): for tests, never the hot path.
func (w *timingWheel) position(e *entry) (lv, sl int, ln uint8, ok bool) {
	for p := e.prev; p != 0; p = w.slab.at(p).prev {
		if p&laneBit != 0 {
			lv, sl, ln = laneOf(p)
			return lv, sl, ln, true
		}
	}
	return 0, 0, 0, false
}

// verifyLanes checks bucket b, which is bucket (lv, sl), for verify: each lane's entries link
// back to it (the first to the lane's reference, each other to the entry before it), none is in
// a state it cannot have there (notLinkable), and each passes check (nil: no more). It returns
// how many entries it walked; an error names where.
func (w *timingWheel) verifyLanes(b *bucket, lv, sl int, where string, check func(e *entry) error) (int, error) {
	n := 0
	for ln, h := range b.lanes {
		prev := laneRef(lv, sl, uint8(ln))
		for i := h; i != 0; {
			e := w.slab.at(i)
			if i&laneBit != 0 || e.prev != prev {
				return n, fmt.Errorf("%s lane %d: entry links wrong", where, ln)
			}
			if check != nil {
				if err := check(e); err != nil {
					return n, fmt.Errorf("%s: %w", where, err)
				}
			}
			if err := notLinkable(e, lv == heldLv); err != nil {
				return n, fmt.Errorf("%s: %w", where, err)
			}
			prev, i = i, e.next
			n++
		}
	}
	return n, nil
}

// notLinkable reports a linked entry in a state it cannot have where it is linked: queued (the
// shard links an entry only as it takes the add, clearing the bit), stopping (only a queued
// entry stops that way), or parked outside the held bucket (wheel.park). For verify.
func notLinkable(e *entry, inHeld bool) error {
	st := e.state.Load()
	if isQueued(st) || isState(st, stStopping) {
		return fmt.Errorf("a linked entry is queued or stopping (state word %#x)", st)
	}
	if isState(st, stParked) && !inHeld {
		return errors.New("a parked entry outside the held bucket")
	}
	return nil
}

// verify checks the wheel's invariants and returns the first violation: each bitmap bit matches
// its bucket, each lane's entries link back to it (the first to the lane's reference, each other
// to the entry before it) and are counted, each non-empty bucket is in the heap with a start at
// or after elapsed that its slot math agrees with, the heap is a heap, the bounds min0 and
// soonMin are at or below their entries' deadlines, no parked entry (timer.go) is linked
// outside the held bucket, and a cascade in progress (casc) is of a level from 1 below the
// overflow and its bucket's span holds elapsed.
func (w *timingWheel) verify() error {
	n, err := w.verifyLevels()
	if err != nil {
		return err
	}
	for f := range w.soon {
		k, err := w.verifyLanes(&w.soon[f], soonLv, f, fmt.Sprintf("soon %d", f), func(e *entry) error {
			if when := e.when.Load(); when < w.soonMin[f] || when/w.tick < w.elapsed {
				return fmt.Errorf("deadline %d before its bound %d or the tick in progress %d", when, w.soonMin[f], w.elapsed)
			}
			return nil
		})
		if n += k; err != nil {
			return err
		}
	}
	k, err := w.verifyLanes(&w.held, heldLv, 0, "held", nil)
	if n += k; err != nil {
		return err
	}
	// Only buckets of lower levels go before a cascade's rest, and they lie in the span of its
	// bucket: so elapsed never leaves that span (advance).
	if !w.casc.empty() && (w.cascLevel == 0 || int(w.cascLevel) >= overflowLv ||
		bucketStart(w.elapsed, int(w.cascLevel)) != w.casc.start) {
		return fmt.Errorf("cascade in progress from tick %d at level %d, elapsed %d is not in its span", w.casc.start, w.cascLevel, w.elapsed)
	}
	k, err = w.verifyLanes(&w.casc, cascLv, 0, "cascade", nil)
	if n += k; err != nil {
		return err
	}
	if n != w.count {
		return fmt.Errorf("count %d, linked entries %d", w.count, n)
	}
	return w.heap.verify()
}

// verifyLevels is verify's check of the level buckets; it returns how many entries they hold.
func (w *timingWheel) verifyLevels() (n int, err error) {
	for lv := range w.buckets {
		for sl := range w.buckets[lv] {
			b := &w.buckets[lv][sl]
			bit := w.occupied[lv]&(1<<uint(sl)) != 0
			if bit != !b.empty() {
				return n, fmt.Errorf("level %d slot %d: bitmap bit %v, bucket non-empty %v", lv, sl, bit, !b.empty())
			}
			if b.empty() {
				continue
			}
			if !b.queued {
				return n, fmt.Errorf("level %d slot %d: non-empty bucket not in the heap", lv, sl)
			}
			if b.start < w.elapsed {
				return n, fmt.Errorf("level %d slot %d: start %d before elapsed %d", lv, sl, b.start, w.elapsed)
			}
			// A bucket whose start is elapsed is one that advance took in part and put back (any
			// level), or level 0's bucket of the tick in progress.
			maps := lv == overflowLv ||
				slotFor(b.start, lv) == sl && (b.start == w.elapsed || levelFor(w.elapsed, b.start) == lv)
			if !maps {
				return n, fmt.Errorf("level %d slot %d: start %d does not map here from elapsed %d", lv, sl, b.start, w.elapsed)
			}
			k, err := w.verifyLanes(b, lv, sl, fmt.Sprintf("level %d slot %d", lv, sl), func(e *entry) error {
				if lv == overflowLv && bucketStart(e.when.Load()/w.tick, lv) < b.start {
					return fmt.Errorf("entry due %d parked past its era start %d", e.when.Load(), b.start)
				}
				if lv == 0 && w.min0[sl] > e.when.Load() {
					return fmt.Errorf("bound %d after a deadline %d", w.min0[sl], e.when.Load())
				}
				return nil
			})
			if n += k; err != nil {
				return n, err
			}
		}
	}
	return n, nil
}
