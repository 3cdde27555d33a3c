//go:build race

package shardwheel

import "unsafe"

// picker is empty under the race detector: see takeShard.
type picker struct{}

// takeShard returns the shard the caller arms its timer on. This is the race detector's build:
// there, sync.Pool drops a quarter of its Puts on purpose and makes every Get and Put a
// happens-before edge (a vector-clock acquire or release, the detector's dearest operations), so
// the per-P tokens of pick.go cost more than the rest of an arm and keep moving. Here the shard
// is a hash of the calling goroutine's stack address instead: no memory is read or written, each
// goroutine keeps to one shard (until its stack moves), and distinct goroutines spread over the
// shards. Which shard a timer lands on changes no guarantee of the wheel; every access the race
// detector checks is the same as in the normal build.
func (w *Wheel) takeShard() *shard {
	n := uint64(len(w.shards))
	if n == 1 {
		return w.shards[0]
	}
	var anchor byte
	h := uint64(uintptr(unsafe.Pointer(&anchor))) >> 11 // goroutine stacks are 2 KiB apart at least
	h *= 0x9e3779b97f4a7c15                             // Fibonacci hashing: spread the high bits
	return w.shards[(h>>32)%n]
}

// noteContention does nothing under the race detector: a goroutine's shard is fixed.
func (w *Wheel) noteContention(*shard) {}
