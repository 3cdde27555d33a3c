//go:build race

package shardwheel

import (
	"unsafe"

	"go.uber.org/atomic"
)

// picker, under the race detector, maps goroutine stacks to shards.
//
// This is the race detector's build: there, sync.Pool drops a quarter of its Puts on purpose and
// makes every Get and Put a happens-before edge (a vector-clock acquire or release, the
// detector's dearest operations), so the per-P tokens of pick.go cost more than the rest of an
// arm and keep moving. Here the address of the caller's stack frame names it instead, in 2 KiB
// windows (addr>>11): goroutine stacks are at least 2 KiB and aligned to their size, so two
// goroutines never share a window, and nothing shared is written to tell them apart. A goroutine
// whose stack is larger may arm from several windows (at different call depths), and then from
// several shards; that costs only the sharing below.
//
// A bare hash of the window onto the shards put two goroutines on one shard as often as chance
// does (half the time with 2 shards), and two producers sharing a ring cost twice as much per
// pair under the detector (contended atomics are ten times dearer there than uncontended ones).
// So a window's first arm assigns it the next shard in turn, in slots: a table of window hashes
// to shards, filled round-robin. Producers arming from distinct slots get distinct shards until
// every shard has one; two windows share a slot, and so a shard, 1 time in len(slots). With more
// shards than slots the table could not reach them all, and the bare hash is used.
//
// Fields: slots and seq are written by any producer, each slot once (by CAS from 0); a slot holds
// its shard's index plus one. A goroutine whose stack moves (it grew) takes a new slot; a slot is
// never freed, and a later stack at the same place takes it over. Which shard a timer lands on
// changes no guarantee of the wheel, and every access the race detector checks is the same as in
// the normal build.
type picker struct {
	slots [256]atomic.Uint32
	seq   atomic.Uint32 // slots assigned so far
}

// takeShard returns the shard the caller arms its timer on.
func (w *Wheel) takeShard() *shard {
	n := uint32(len(w.shards))
	if n == 1 {
		return w.shards[0]
	}
	var anchor byte
	return w.shards[w.pick.shardFor(uintptr(unsafe.Pointer(&anchor)), n)]
}

// shardFor returns the shard, of n, for a goroutine whose stack holds addr.
func (p *picker) shardFor(addr uintptr, n uint32) uint32 {
	h := uint64(addr) >> 11 // goroutine stacks are 2 KiB apart at least
	h *= 0x9e3779b97f4a7c15 // Fibonacci hashing: spread the high bits
	if n > uint32(len(p.slots)) {
		return uint32((h >> 32) % uint64(n))
	}
	slot := &p.slots[h>>56]
	v := slot.Load()
	if v == 0 {
		v = (p.seq.Inc()-1)%n + 1 // shards 0, 1, ... in turn
		if !slot.CompareAndSwap(0, v) {
			v = slot.Load() // another goroutine with this hash took the slot first
		}
	}
	return v - 1
}

// noteContention does nothing under the race detector: a goroutine's shard is fixed.
func (w *Wheel) noteContention(*shard) {}
