package shardwheel

import "unsafe"

// ShardLineAddrs returns, for each shard of w, the addresses of its producer line (the ring's
// tail), its slab line and its owner's line, as they are in memory.
func (w *Wheel) ShardLineAddrs() (producer, slab, owner []uintptr) {
	for _, s := range w.shards {
		producer = append(producer, uintptr(unsafe.Pointer(&s.ring.tail)))
		slab = append(slab, uintptr(unsafe.Pointer(&s.slab)))
		owner = append(owner, uintptr(unsafe.Pointer(&s.mu)))
	}
	return producer, slab, owner
}

// ShardOf returns the index of t's home shard in w (-1 if none).
func (w *Wheel) ShardOf(t Timer) int {
	for i, s := range w.shards {
		if s == t.s {
			return i
		}
	}
	return -1
}

// TargetIdleAddrs returns the addresses of w's keeper target, which every arm reads, and of its
// idle count, which every worker writes as it goes idle.
func (w *Wheel) TargetIdleAddrs() (target, idle uintptr) {
	return uintptr(unsafe.Pointer(&w.target)), uintptr(unsafe.Pointer(&w.idle))
}
