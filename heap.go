package shardwheel

import "fmt"

// heapNode names a bucket of a wheel and the tick at which it comes due.
type heapNode struct {
	start int64
	level uint8
	slot  uint8
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
		if h.nodes[p].start <= h.nodes[i].start {
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
		if l < last && h.nodes[l].start < h.nodes[m].start {
			m = l
		}
		if r < last && h.nodes[r].start < h.nodes[m].start {
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
		if p := (i - 1) / 2; h.nodes[p].start > h.nodes[i].start {
			return fmt.Errorf("heap: node %d (start %d) above node %d (start %d)", p, h.nodes[p].start, i, h.nodes[i].start)
		}
	}
	return nil
}
