package shardwheel

import "go.uber.org/atomic"

// Commands a ring carries into its shard. A command is a word: the gen of the entry's arming
// shifted left by opBits, or'ed with the op. The gen lets the shard ignore a command that arrives
// after the entry was reused.
const (
	opAdd    uint64 = iota // link the entry at its deadline
	opCancel               // the entry was stopped while pending: unlink it and free it
	opReset                // the entry's deadline changed: move it
	opBits   = 2
	opMask   = 1<<opBits - 1
)

// ringClosed is the top bit of ring.tail; once set by close, push fails.
const ringClosed = uint64(1) << 63

// ring is a bounded multi-producer single-consumer queue of commands: Vyukov's bounded queue with
// one sequence number per slot, specialised to one consumer.
//
// Who owns what:
//   - tail: atomic; producers claim a slot by CAS from tail to tail+1. Its top bit closes the ring.
//   - each slot's seq: atomic; it tells whose turn the slot is. seq == pos: free for the producer
//     that claims position pos. seq == pos+1: published, for the consumer. The consumer sets it
//     to pos+len(slots) when it empties the slot, handing it to the producer one lap later.
//   - each slot's i and cmd: written by the producer that claimed the slot, before it stores
//     seq (publication); read by the consumer after it loads seq. The seq store/load pair orders
//     them, so they need no atomics of their own.
//   - head: the consumer's position, kept by the shard (shard.head) and passed to pop; owned by
//     the consumer, which is whoever holds the shard's mutex. Only that consumer may call pop.
//
// When the ring is full, push reports ringFull and the producer takes the shard's mutex and
// drains the ring into the wheel itself (shard.send): it never fails a command, and it never spins
// while another goroutine holds the mutex, because it sleeps on the mutex instead.
//
// The producer side (tail, mask, slots) shares the shard's first cache line with the shard's
// other producer-written words; head, which the consumer writes, is on the line after (shard.go).
type ring struct {
	tail  atomic.Uint64
	mask  uint64     // immutable after init
	slots []ringSlot // immutable after init (the slice, not the slots)
}

type ringSlot struct {
	seq atomic.Uint64
	cmd uint64
	i   uint32 // the entry's slab index
}

type pushResult int

const (
	ringOK          pushResult = iota
	ringOKContended            // pushed, but another producer won a CAS on tail first
	ringFull
	ringClosedResult
)

func (r *ring) init(size int) {
	n := 1
	for n < size {
		n <<= 1
	}
	r.slots = make([]ringSlot, n)
	r.mask = uint64(n - 1)
	for i := range r.slots {
		r.slots[i].seq.Store(uint64(i))
	}
}

// push appends a command. Any goroutine may call it. It never blocks.
func (r *ring) push(i uint32, cmd uint64) pushResult {
	ok := ringOK
	for {
		t := r.tail.Load()
		if t&ringClosed != 0 {
			return ringClosedResult
		}
		s := &r.slots[t&r.mask]
		seq := s.seq.Load()
		switch {
		case seq == t:
			if r.tail.CompareAndSwap(t, t+1) {
				s.i, s.cmd = i, cmd
				s.seq.Store(t + 1) // publish
				return ok
			}
			ok = ringOKContended
		case seq < t:
			// The slot still holds the command of the previous lap: full.
			return ringFull
		}
		// Another producer claimed t first; try the next position.
		ok = ringOKContended
	}
}

// pop takes the oldest command if it is published, and advances *head past it. Consumer only.
func (r *ring) pop(head *uint64) (uint32, uint64, bool) {
	h := *head
	s := &r.slots[h&r.mask]
	if s.seq.Load() != h+1 {
		// Empty, or the producer that claimed head has not published yet. That producer
		// publishes and then notes its deadline (shard.noteDeadline), so leaving its command for
		// the next drain loses no wake-up.
		return 0, 0, false
	}
	i, cmd := s.i, s.cmd
	s.seq.Store(h + r.mask + 1)
	*head = h + 1
	return i, cmd, true
}

// close stops further pushes and returns the final tail: every position below it was claimed by
// a push that reported ringOK and will be published. Any goroutine may call it; idempotent.
func (r *ring) close() uint64 {
	for {
		t := r.tail.Load()
		if t&ringClosed != 0 || r.tail.CompareAndSwap(t, t|ringClosed) {
			return t &^ ringClosed
		}
	}
}
