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

// A push appends a command: claim, then publish (shard.send). Any goroutine may push; a push never
// blocks.

// ringClosed is the top bit of ring.tail; once set by close, a push fails.
const ringClosed = uint64(1) << 63

// ring is a bounded multi-producer single-consumer queue of commands: Vyukov's bounded queue with
// one sequence number per slot, specialised to one consumer.
//
// Who owns what:
//
//   - tail: atomic; producers claim a slot by CAS from tail to tail+1. Its top bit closes the ring.
//
//   - each slot's seq: atomic; it tells whose turn the slot is. seq == pos: free for the producer
//     that claims position pos. seq == pos+1: published, for the consumer. The consumer sets it
//     to pos+len(slots) when it empties the slot, handing it to the producer one lap later.
//
//   - each slot's i and cmd: written by the producer that claimed the slot, before it stores
//     seq (publication); read by the consumer after it loads seq. The seq store/load pair orders
//     them, so they need no atomics of their own.
//
//   - head: the consumer's position, kept by the shard (shard.head) and passed to pop; owned by
//     the consumer, which is whoever holds the shard's mutex. Only that consumer may call pop.
//
//   - stalledAt: atomic; 0, or pos+1 when the consumer stopped at position pos, which a producer
//     had claimed but not yet published (stall). The producer that then publishes pos takes it
//     back to 0 and kicks the shard (push reports ringKick), because the consumer could not see
//     that command, nor any published behind it, when it last derived the shard's next deadline.
//
// When the ring is full, push reports ringFull and the producer takes the shard's mutex and
// drains the ring into the wheel itself (shard.send): it never fails a command, and it never spins
// while another goroutine holds the mutex, because it sleeps on the mutex instead.
//
// mask and slots, read on every push and pop, come first: they end the shard's read-only line.
// tail and stalledAt start the shard's producer line, with the shard's other producer-written
// words; head, which the consumer writes, is on a line of its own further down (shard.go).
type ring struct {
	mask      uint64     // immutable after init
	slots     []ringSlot // immutable after init (the slice, not the slots)
	tail      atomic.Uint64
	stalledAt atomic.Uint64
}

type ringSlot struct {
	seq atomic.Uint64
	cmd uint64
	i   uint32 // the entry's slab index
}

// pushResult is ringOK, ringFull or ringClosedResult; ringOK may carry the flags ringContended and
// ringKick.
type pushResult uint8

const (
	ringOK           pushResult = 0
	ringContended    pushResult = 1 << 0 // pushed, but another producer won a CAS on tail first
	ringKick         pushResult = 1 << 1 // pushed, and the consumer stalled on this slot: kick the shard
	ringFull         pushResult = 1 << 2
	ringClosedResult pushResult = 1 << 3
)

// init makes a ring of size slots rounded up to a power of two, and to two at least: in a ring of
// one slot, "published for position p" and "free for position p+1" are the same seq (p+1), so
// a second push would overwrite a command the consumer has not taken.
func (r *ring) init(size int) {
	n := ringSlots(size)
	r.slots = make([]ringSlot, n)
	r.mask = uint64(n - 1)
	for i := range r.slots {
		r.slots[i].seq.Store(uint64(i))
	}
}

// ringSlots returns the slots of a ring of size: size rounded up to a power of two, two at least.
func ringSlots(size int) int {
	n := 2
	for n < size {
		n <<= 1
	}
	return n
}

// claim reserves the next position for one command and returns its slot, or a nil slot with
// ringFull or ringClosedResult. The caller must publish the slot: until it does, the consumer
// stops there, and Wheel.Stop waits for it (shard.dropLocked).
func (r *ring) claim() (*ringSlot, uint64, pushResult) {
	res := ringOK
	for {
		t := r.tail.Load()
		if t&ringClosed != 0 {
			return nil, 0, ringClosedResult
		}
		s := &r.slots[t&r.mask]
		seq := s.seq.Load()
		switch {
		case seq == t:
			if r.tail.CompareAndSwap(t, t+1) {
				return s, t, res
			}
		case seq < t:
			// The slot still holds the command of the previous lap: full.
			return nil, 0, ringFull
		}
		// Another producer claimed t first; try the next position.
		res = ringContended
	}
}

// publish fills the slot claimed at pos and hands it to the consumer. It reports ringKick if the
// consumer stalled on this position meanwhile (stall): then the caller must make the shard look
// at its ring again, since nothing else will.
//
// The order is what makes that safe: 1. the seq store publishes; 2. stalledAt is read after it.
// The consumer does the mirror image (stall): it stores stalledAt, then reads seq. With both
// sequentially consistent, at least one side sees the other's write: the consumer sees the
// command and drains it, or this producer sees stalledAt and kicks (or both, which costs one
// spare visit).
func (r *ring) publish(s *ringSlot, pos uint64, i uint32, cmd uint64) pushResult {
	s.i, s.cmd = i, cmd
	s.seq.Store(pos + 1)
	if r.stalledAt.Load() == pos+1 && r.stalledAt.CompareAndSwap(pos+1, 0) {
		return ringKick
	}
	return ringOK
}

// pop takes the oldest command if it is published, and advances *head past it. Consumer only.
func (r *ring) pop(head *uint64) (uint32, uint64, bool) {
	h := *head
	s := &r.slots[h&r.mask]
	if s.seq.Load() != h+1 {
		// Empty, or the producer that claimed head has not published yet: this command and
		// every one behind it, published or not, wait for the next drain. A consumer that
		// derives anything from the drain must call stall before it relies on it.
		return 0, 0, false
	}
	i, cmd := s.i, s.cmd
	s.seq.Store(h + r.mask + 1)
	*head = h + 1
	return i, cmd, true
}

// stall is called by the consumer after a drain stopped at head h. If a producer has claimed h
// and not yet published it, stall records h so that the producer's publish reports ringKick, and
// reports false; it reports true if the command at h was published meanwhile (drain again), and
// false if nothing is claimed. Consumer only.
func (r *ring) stall(h uint64) (published bool) {
	if r.tail.Load()&^ringClosed == h {
		return false // empty: a later command's producer notes its own deadline after publishing
	}
	r.stalledAt.Store(h + 1)
	if r.slots[h&r.mask].seq.Load() != h+1 {
		return false // the producer's publish will read stalledAt and kick
	}
	r.stalledAt.CompareAndSwap(h+1, 0)
	return true
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
