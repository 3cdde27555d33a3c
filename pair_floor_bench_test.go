package shardwheel_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/atomic"
)

// BenchmarkPairFloor asks a skeleton, not the library: what
// is the least an arm+stop pair can cost under -race when the arm hands the timer to another
// goroutine through a lock-free ring that the race detector sees?
//
// The skeleton keeps only the steps no such design can drop, and leaves out everything else
// the library does (the shard pick, the slab and its growth, the counters, Reset, the wheel).
// Its 13 atomics per pair:
//   - arm (7): the ring claim (load tail, load the slot's seq, CAS tail); the deadline, which a
//     Reset may write later (a store); the publish (store seq); the lost-wake-up check of
//     ring.publish (load stalledAt) and the earliest-deadline check of noteDeadline (load next);
//   - stop (2): load the state word, CAS it to stopped;
//   - the consumer, per command (4): load seq; load the state; pre-arm the next entry for the
//     slot (store its state, whose gen a stale handle must see); hand the slot back (store seq).
//
// Each goroutine has a shard of its own (as the race build's picker gives it), the consumer is
// that goroutine when its ring fills (as the library's producers drain a full ring), and a
// stopped entry goes straight back to the slot it came from. It is not a timer library: no
// callback ever runs. With 64 slots every word it touches stays hot; 1024 is the library's
// default ring. Run it beside the runtime under -race:
//
//	go test -race -run '^$' -bench 'BenchmarkPairFloor' -count 6 . | benchstat -col /impl
func BenchmarkPairFloor(b *testing.B) {
	for _, slots := range []int{64, 1024} {
		b.Run(fmt.Sprintf("impl=skeleton/slots=%d", slots), func(b *testing.B) {
			f := func(any) {}
			b.RunParallel(func(pb *testing.PB) {
				s := newFloorShard(slots)
				var x int
				for pb.Next() {
					i, gen := s.arm(time.Minute, f, &x)
					if !s.stop(i, gen) {
						b.Error("stop of a pending skeleton timer failed")
					}
				}
			})
		})
	}
	b.Run("impl=runtime", func(b *testing.B) {
		f := func() {}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !time.AfterFunc(time.Minute, f).Stop() {
					b.Error("Stop of a pending timer reported false")
				}
			}
		})
	})
}

// floorEntry is the skeleton's timer: a state word (gen<<8 | state) and a deadline, both read
// by other goroutines in a real design (stale handles, Reset), so atomic.
type floorEntry struct {
	state atomic.Uint64
	when  atomic.Int64
	gen   uint64 // the consumer's copy of the gen it armed last
	f     func(any)
	arg   any
}

const (
	floorPending = 1
	floorStopped = 2
)

// floorSlot is a Vyukov ring slot that also carries the entry the consumer pre-armed for the
// producer that claims it: the producer takes no entry from a shared free list.
type floorSlot struct {
	seq   atomic.Uint64
	i     uint32 // the command's entry, written by the producer
	fresh uint32 // the entry for the next claim, written by the consumer
	gen   uint64 // fresh's gen
}

// floorShard is one goroutine's ring and entries. Producer words first, then the consumer's.
type floorShard struct {
	tail      atomic.Uint64
	stalledAt atomic.Uint64
	next      atomic.Int64
	mu        sync.Mutex
	head      uint64
	mask      uint64
	slots     []floorSlot
	entries   []floorEntry
}

var floorBase = time.Now()

func newFloorShard(n int) *floorShard {
	s := &floorShard{slots: make([]floorSlot, n), mask: uint64(n - 1), entries: make([]floorEntry, n)}
	for p := range s.slots {
		s.slots[p].seq.Store(uint64(p))
		s.preArm(&s.slots[p], uint32(p))
	}
	s.next.Store(0) // something is always due before a new timer: no wake-up to send
	return s
}

// preArm gives entry i, free, to the slot's next producer, armed with the next gen.
func (s *floorShard) preArm(sl *floorSlot, i uint32) {
	e := &s.entries[i]
	e.gen++
	e.state.Store(e.gen<<8 | floorPending)
	sl.fresh, sl.gen = i, e.gen
}

// drain takes every published command; a stopped entry goes back to the slot it came from.
func (s *floorShard) drain() {
	s.mu.Lock()
	for {
		h := s.head
		sl := &s.slots[h&s.mask]
		if sl.seq.Load() != h+1 {
			break
		}
		e := &s.entries[sl.i]
		if e.state.Load()&0xff != floorStopped {
			panic("the skeleton's pair stops every timer it arms")
		}
		e.f, e.arg = nil, nil
		s.preArm(sl, sl.i)
		sl.seq.Store(h + s.mask + 1)
		s.head = h + 1
	}
	s.mu.Unlock()
}

func (s *floorShard) arm(d time.Duration, f func(any), arg any) (uint32, uint64) {
	for {
		t := s.tail.Load()
		sl := &s.slots[t&s.mask]
		seq := sl.seq.Load()
		if seq < t {
			s.drain() // full: the producer drains, as the library's do
			continue
		}
		if seq != t || !s.tail.CompareAndSwap(t, t+1) {
			continue
		}
		i, gen := sl.fresh, sl.gen
		e := &s.entries[i]
		e.f, e.arg = f, arg
		when := int64(time.Since(floorBase)) + int64(d)
		e.when.Store(when)
		sl.i = i
		sl.seq.Store(t + 1)
		if s.stalledAt.Load() == t+1 || when < s.next.Load() {
			panic("the skeleton's consumer never stalls, and next is 0")
		}
		return i, gen
	}
}

func (s *floorShard) stop(i uint32, gen uint64) bool {
	e := &s.entries[i]
	w := e.state.Load()
	if w>>8 != gen || w&0xff != floorPending {
		return false
	}
	return e.state.CompareAndSwap(w, w&^0xff|floorStopped)
}
