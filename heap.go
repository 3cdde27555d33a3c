package shardwheel

import "fmt"

// heapNode names a bucket of a wheel and the tick at which it comes due.
type heapNode struct {
	start int64
	level uint8
	slot  uint8
}

// before reports whether node a comes out of the heap before node b: by start, and at one start the
// higher level first. Only a bucket put back by a budgeted advance (wheel.putBack) can share its
// start with the level-0 bucket of the tick in progress, and it must be taken first: that level-0
// bucket may not be due yet (its first deadline is later in the tick), and advance stops there.
func before(a, b heapNode) bool {
	return a.start < b.start || a.start == b.start && a.level > b.level
}

// bucketHeap is a binary min-heap of buckets by start tick: Kafka's DelayQueue, without the
// locks, owned by the holder of the shard's mutex. It holds at most one node per bucket (the
// bucket's queued flag), so at most 7*64 nodes; nodes of buckets that emptied are dropped lazily
// by wheel.nextDue and wheel.advance.
type bucketHeap struct {
	nodes []heapNode
}

func (h *bucketHeap) len() int      { return len(h.nodes) }
func (h *bucketHeap) top() heapNode { return h.nodes[0] }

func (h *bucketHeap) push(n heapNode) {
	h.nodes = append(h.nodes, n)
	i := len(h.nodes) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !before(h.nodes[i], h.nodes[p]) {
			break
		}
		h.nodes[p], h.nodes[i] = h.nodes[i], h.nodes[p]
		i = p
	}
}

func (h *bucketHeap) pop() heapNode {
	top := h.nodes[0]
	last := len(h.nodes) - 1
	h.nodes[0] = h.nodes[last]
	h.nodes = h.nodes[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < last && before(h.nodes[l], h.nodes[m]) {
			m = l
		}
		if r < last && before(h.nodes[r], h.nodes[m]) {
			m = r
		}
		if m == i {
			return top
		}
		h.nodes[i], h.nodes[m] = h.nodes[m], h.nodes[i]
		i = m
	}
}

// verify checks the heap property.
func (h *bucketHeap) verify() error {
	for i := 1; i < len(h.nodes); i++ {
		if p := (i - 1) / 2; before(h.nodes[i], h.nodes[p]) {
			return fmt.Errorf("heap: node %d (start %d) above node %d (start %d)", p, h.nodes[p].start, i, h.nodes[i].start)
		}
	}
	return nil
}
