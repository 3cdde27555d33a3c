package shardwheel

import (
	"runtime"
	"sync"
	"unsafe"

	"go.uber.org/atomic"
)

// cacheLineSize is the unit of false sharing on the machines this runs on: 64 bytes on amd64 and
// most arm64 cores (Apple's M-series use 128; padding to 64 there costs some sharing, not
// correctness). Only the shard header is padded: never entries or buckets, which number millions.
const cacheLineSize = 64

// mallocHeaderSize is what Go's allocator puts in front of a heap object of more than 512 bytes
// that holds pointers (since Go 1.22): its type, 8 bytes. Such objects start on a multiple of 64
// bytes (their size classes are multiples of 64 and spans are page aligned), so a shard's own
// bytes start 8 bytes into a cache line. The shard's layout takes that into account: its first
// cacheLineSize-mallocHeaderSize bytes are read-only fields, and its producer line starts a cache
// line in memory. TestShardAlignment checks the real addresses of every shard of a Wheel.
const mallocHeaderSize = 8

// shard is one slice of the Wheel: a ring that carries commands in, a hierarchical wheel with its
// bucket heap, the slab its entries live in, and the entries linked into the wheel. A producer
// picks a shard once per AfterFunc (takeShard, pick.go) and the Timer remembers it, so Stop and
// Reset go straight back to it.
//
// Its lines in memory (the first one begins with the allocator's header, see mallocHeaderSize):
//
//  0. Read-only after init: the Wheel, the group, expireFn, and the ring's mask and slots, which
//     producers and the consumer read on every push and pop. Nobody writes this line.
//  1. What producers write: the ring's tail (and stalledAt, which the consumer writes when it
//     stalls), the counters of scheduled and stopped timers and the WithMaxPending stock; and
//     limited, read-only, which the arm and Stop read here since they write this line anyway.
//     It is written by the goroutines of (mostly) one P, because takeShard maps a P to a shard,
//     and by Stop and Reset of this shard's timers from any P.
//  2. The slab's (pool.go): its free stack is lock-free, used by producers and by whoever frees
//     an entry. The published next deadline sits there too: producers read it on every arm and
//     the holder of mu writes it after each advance; both kept off the owner's lines below. And
//     stoppedFiring, which only a rare Stop writes.
//  3. and on: everything owned by whoever holds mu: a worker while it advances the shard, or a
//     producer that found the ring full and drains it itself. A linked entry changes hands only
//     there: a producer hands an entry over by publishing a command; the holder of mu takes it by
//     popping the command.
type shard struct {
	w        *Wheel               // immutable
	g        *group               // immutable: the group whose summary covers this shard (wake.go)
	expireFn func(uint32, *entry) // s.expire, made once so that advance allocates nothing; immutable
	// ring: its read-only mask and slots end line 0; its tail starts line 1 (pinned by a test).
	ring      ring
	scheduled atomic.Uint64 // timers accepted on this shard (each Every run counts once)
	stopped   atomic.Uint64 // Timer.Stop calls that reported true for timers of this shard
	credit    atomic.Int64  // WithMaxPending: this shard's stock of free credits (pending.go)
	// limited says whether WithMaxPending is set; immutable. It sits here, not with the
	// read-only fields (line 0 is full), because Stop writes stopped on this line anyway: its
	// returnCredit then reads no other line.
	limited bool
	_       [2*cacheLineSize - mallocHeaderSize - unsafe.Sizeof(shardLine0{}) - unsafe.Sizeof(shardLine1{})]byte

	slab slab
	// next is a lower bound of the earliest deadline in the ring or the wheel (ns), except
	// for commands behind a slot claimed and not yet published when the consumer last drained:
	// the publish of that slot kicks the shard (ring.stall), and the kick lowers next. On the
	// system clock it is also at or below the moment the wheel's next bucket comes due, where a
	// cascade may be due before any deadline (an advance publishes that start; any other drain
	// notes it: drainNoteLocked).
	next atomic.Int64
	// stoppedFiring counts the Timer.Stop calls that stopped a timer of this shard after it had
	// fired, before its callback started: Stats.Queued no longer counts such a callback. Written
	// rarely (that Stop), by any goroutine.
	stoppedFiring atomic.Uint64
	_             [cacheLineSize - unsafe.Sizeof(slab{}) - 16]byte

	mu    sync.Mutex
	head  uint64      // the ring's consumer position; owned by the holder of mu
	tw    timingWheel // owned by the holder of mu
	freed freeBatch   // entries freed by the current drain; owned by the holder of mu
	fired []ref       // entries the current advance step fired; owned by the holder of mu

	// owner says who advances the shard on the system clock (advance.go), which lets go of mu
	// between steps: ownerNone (nobody), ownerAdvancing (one goroutine advances it; nobody else
	// may), ownerRunning (its advancer is running the callbacks of a step, or of another shard
	// taken with it, and means to come back; a keeper may take it over). Only CASes move it from
	// none or running to advancing; only the goroutine that holds it advancing moves it on, and
	// whoever moves it off advancing publishes s.next into the group's next (publishGroup): the
	// keeper's group summary leaves owned shards out, so that publish is what brings the shard
	// back into view.
	owner atomic.Int32

	// Shards are allocated one by one; this keeps the owner's fields above off the cache line
	// of whatever the allocator puts next, which may be another shard's read-only line; its
	// size also rounds the shard (with the allocator's header) up to whole lines (TestLayout
	// fails, naming the remainder, when a field change moves that): two lines, and the 8 bytes
	// that round up again since the cascade in progress (timingWheel.casc) grew the wheel by 56.
	_ [2*cacheLineSize + 8]byte
}

// shardLine0 and shardLine1 mirror the shard's first fields, only to size the pad after them.
type (
	shardLine0 struct {
		_ *Wheel               // w
		_ *group               // g
		_ func(uint32, *entry) // expireFn
		_ uint64               // the ring's mask
		_ []ringSlot           // the ring's slots
	}
	shardLine1 struct {
		_, _, _, _, _ uint64 // tail, stalledAt, scheduled, stopped, credit
		_             uint64 // limited, and its padding
	}
)

// Values of shard.owner.
const (
	ownerNone int32 = iota
	ownerAdvancing
	ownerRunning
)

func (s *shard) init(w *Wheel, ringSize int) {
	s.w = w
	s.limited = w.opts.maxPending != 0
	s.ring.init(ringSize)
	s.next.Store(never)
	s.tw.init(w.nanos()/w.tick, w.ticks, &s.slab)
	s.tw.interleave = w.manual == nil // a due lower bucket goes before a cascade's rest (timingWheel.casc)
	s.expireFn = s.expire
}

// send delivers a command to the shard; any goroutine may call it. It reports false only when
// the ring was closed by Wheel.Stop; contended reports that another producer raced it for the
// ring's tail, a sign that two Ps share this shard. When the ring is full the caller becomes the
// consumer for a moment: it takes mu and drains the ring into the wheel, then tries again. It
// never spins: it either sleeps on mu, drains something, or yields to the one producer whose
// command blocks the head of the ring (claimed, not yet published).
func (s *shard) send(i uint32, gen uint64, op uint64) (ok, contended bool) {
	cmd := gen<<opBits | op
	for {
		slot, pos, res := s.ring.claim() // claim and publish, not a push function: one call fewer
		if slot != nil {
			res |= s.ring.publish(slot, pos, i, cmd)
		}
		contended = contended || res&ringContended != 0
		switch {
		case res&ringKick != 0:
			s.kick()
			return true, contended
		case res&(ringFull|ringClosedResult) == 0:
			return true, contended
		case res&ringClosedResult != 0:
			return false, contended
		}
		// Full. That alone is no sign of sharing: one producer fills the ring between two
		// advances. (Counting it as contention moved every producer's token on each drain, about
		// 50,000 times a second in a pair loop, and so kept two Ps landing on one shard.)
		s.mu.Lock()
		took := s.drainNoteLocked()
		s.mu.Unlock()
		if !took {
			runtime.Gosched()
		}
	}
}

// kick makes the advancer look at the shard's ring again: its consumer stalled on a command that
// was claimed but not yet published (ring.stall), and the producer of that command has now
// published it. Instant 0 is due at any time, so the next advance drains the ring and publishes the
// true next deadline; with a manual clock, that is the next Advance.
func (s *shard) kick() { s.noteDeadline(0) }

// drainLocked applies every published command in the ring to the wheel and reports whether it
// took any. The caller holds s.mu. The entries that cancels free go back to the slab together.
func (s *shard) drainLocked() bool {
	took := false
	for {
		i, cmd, ok := s.ring.pop(&s.head)
		if !ok {
			s.freed.flush()
			return took
		}
		took = true
		s.applyLocked(i, cmd)
	}
}

// drainNoteLocked is drainLocked for a drain outside an advance (a producer whose ring is full,
// the trimmer), which publishes no next of its own. What it linked above level 0 is cascaded at
// its bucket's start, earlier than any deadline its producers noted: on the system clock it
// tells the keeper so, or the keeper would cascade a flood only once the flood came due, and
// fire it that much later. Lowering next is always safe there (at worst a visit finds nothing
// to do), and noting it under mu lets a later advance's publish overwrite it rather than follow
// it. Not on a manual clock: Advance takes every bucket up to its time anyway, and a next below
// the instant of its last round would give a d <= 0 timer armed by one of its callbacks a round
// in the same Advance (clock.go). The caller holds s.mu.
func (s *shard) drainNoteLocked() bool {
	took := s.drainLocked()
	if took && s.w.manual == nil {
		s.noteDeadline(s.tw.nextDue())
	}
	return took
}

// applyLocked carries out one command. The caller holds s.mu.
func (s *shard) applyLocked(i uint32, cmd uint64) {
	e := s.slab.at(i)
	gen := cmd >> opBits
	switch cmd & opMask {
	case opAdd:
		s.takeAddLocked(i, e, gen)
	case opCancel:
		// Sent once, by the Stop that moved the entry from pending to stopped after its add
		// was taken (Timer.Stop); only this command frees such an entry, so it is still ours.
		if e.linked() {
			s.tw.unlink(e)
		}
		s.freed.add(&s.slab, i, e)
	case opReset:
		// Stale if the entry fired and was reused since (another gen: not ours to touch), or
		// fired, or is between the runs of an Every (not linked; its add follows). Not for a
		// parked entry, even if this is its gen: that is an earlier Reset's command, and the
		// entry stays in the held bucket until the Reset that parked it sends its own (moved
		// now, it could be taken while still parked, and expire would drop it).
		if w := e.state.Load(); isGen(w, gen) && (isState(w, stPending) || isState(w, stResetting)) && e.linked() {
			s.tw.unlink(e)
			s.tw.insert(i, e, e.when.Load())
		}
	}
}

// takeAddLocked carries out the add of entry i, armed with gen: it clears the entry's queued
// bit (entry.go) with a CAS, so that a Stop either came first, and finds it here, or comes after,
// and sends a cancel. Then, by the state it cleared the bit from:
//   - pending, or held by a Reset (resetting): link it, at either deadline, both safe (a Reset to
//     an earlier one sends a reset command, which follows this one and moves the entry; a later
//     one leaves it to expire);
//   - stopped: a Stop came first and sent no cancel; free it. Its CAS to stopped ordered its
//     clearEntry before this, and nobody moves a stopped word (a stale Stop or Reset finds it
//     stopped and does nothing), so there is no CAS to make: the add is its only freer;
//   - stopping: a Stop is between its two steps; leave it, that Stop sends a cancel.
//
// An add with another gen, or of an entry that is no longer queued, is not this arming's: such
// an add does not arise (an entry armed or re-armed with an add is freed only by that add or by
// a cancel sent after it was taken), and is ignored. The caller holds s.mu.
func (s *shard) takeAddLocked(i uint32, e *entry, gen uint64) {
	for {
		w := e.state.Load()
		if !isGen(w, gen) || !isQueued(w) {
			return
		}
		if isState(w, stStopped) {
			s.freed.add(&s.slab, i, e)
			return
		}
		if !e.state.CompareAndSwap(w, w&^queuedBit) {
			continue // a Stop or a Reset moved it: look again
		}
		if isState(w, stPending) || isState(w, stResetting) {
			s.tw.insert(i, e, e.when.Load())
		}
		return
	}
}

// expire is called by timingWheel.advance for each entry of a bucket that came due, with
// s.tw.elapsed set to that bucket's start and s.tw.now to the advance's reading. The caller holds
// s.mu, and is the shard's advancer; what fires goes to s.fired, which the advancer empties after
// each step.
//
// It reads the state word, then the deadline, then CASes the word it read: if a Reset stored a
// later deadline in between, that Reset also bumped the version, the CAS fails and the loop
// re-reads the new deadline (entry.go). So an entry fires only on a deadline that is due: one in
// a later tick goes one level down (or further, after a Reset), one later in the tick in
// progress waits in a soon bucket for its moment (straggle).
func (s *shard) expire(i uint32, e *entry) {
	for {
		w := e.state.Load()
		if isHeld(w) {
			// A Reset holds the entry, and its new deadline may be anywhere (even before this
			// advance's reading, or within this tick). Park it (entry.go): no advance visits it
			// again, so a stalled Reset costs nothing, and the Reset, finding it parked, sends
			// the command that moves it to its deadline. Not linked at some later tick: a
			// Reset to a later deadline would send no command and find it there, late. (An
			// entry parked already lives in the held bucket, which no advance takes; verify
			// checks that none is linked elsewhere.)
			if isState(w, stResetting) && !e.state.CompareAndSwap(w, withState(w, stParked)) {
				continue // released meanwhile: look again
			}
			s.tw.park(i, e)
			return
		}
		if !isState(w, stPending) {
			return // stopped: its cancel command frees it. dropped: the wheel is going away.
		}
		when := e.when.Load()
		if t := when / s.tw.tick; t > s.tw.elapsed && (when > s.tw.now || s.w.manual != nil) {
			s.tw.link(i, e, t, when) // cascade: a lower level, or later after a Reset
			return
		}
		// Due, in this bucket's tick or (system clock) a later one: fire. An entry of a later
		// tick is due here when the advance's reading has passed the start of the bucket being
		// taken by more than a tick: a step of a cascade taken after its entries' deadline came
		// (driveShard reads the clock at each step). On the system clock nothing orders
		// callbacks by deadline, so it fires now rather than after the rest of the cascade.
		// ManualClock.Advance promises deadline order, so there it goes down a level and
		// fires with its tick.
		if when > s.tw.now {
			s.tw.straggle(i, e, when)
			return
		}
		if testHookExpiring != nil {
			testHookExpiring(e) // tests only: the shard paused between its read of when and its CAS
		}
		if e.state.CompareAndSwap(w, withState(w, stFiring)) {
			// The version has versionBits bits: 2^versionBits Resets of this timer while this
			// goroutine was paused between its reads and the CAS (each to a later deadline, so
			// each without a command that would wait for s.mu) bring the word back to w, and
			// the CAS succeeds on a deadline the first of them replaced. Firing, the entry
			// takes no Reset, so when is now final: the same, it is the deadline judged due
			// above; another, put the word back (nobody saw it firing but a Stop, below) and
			// look again. A Stop that moved it to letting go meanwhile reported true; the
			// worker frees it, as any entry a Stop let go of.
			if e.when.Load() != when && e.state.CompareAndSwap(withState(w, stFiring), w) {
				continue
			}
			s.fired = append(s.fired, ref{s: s, e: e, i: i})
			return
		}
	}
}

// testHookExpiring, set only by tests, runs in expire between its read of an entry's deadline
// and the CAS that fires the entry.
var testHookExpiring func(e *entry)

// advanceLocked drains the ring and fires what is due at the reading now (ns) into s.fired,
// visiting at most about budget entries (0: no bound). When it reaches now it publishes the shard's next
// deadline and reports true; otherwise s.next stays at or below now and the caller, which keeps
// the shard (owned, or under advMu), calls again after it let go of mu. The caller holds s.mu.
func (s *shard) advanceLocked(now int64, budget int) bool {
	s.drainLocked()
	if !s.tw.advance(now, s.expireFn, budget) {
		return false
	}
	s.publishNextLocked()
	return true
}

// publishNextLocked stores the wheel's next due moment in s.next. The drain behind that figure may
// have missed commands, and the store may erase a producer's lower next, in two ways:
//   - a producer published a command after the drain and lowered next with its CAS before this
//     store overwrote it: so after the store the ring is drained once more, and if that took
//     anything the store is repeated;
//   - a producer claimed the ring's head but has not published it (it may be paused there, by
//     preemption or a GC scan): its command and every command published behind it are invisible,
//     and producers behind it saw an earlier next and did not lower it. So the consumer stalls on
//     that position (ring.stall), and the producer's publish then kicks the shard.
func (s *shard) publishNextLocked() {
	for {
		s.next.Store(s.tw.nextDue())
		if !s.drainLocked() && !s.ring.stall(s.head) {
			return
		}
	}
}

// dropLocked closes the ring and moves every pending timer of the shard, in the ring or the wheel,
// to dropped, and returns how many it moved. Called by Wheel.Stop only; the caller holds s.mu.
//
// The count includes the timers of live deadline contexts: their callback will never run, and
// the context goes on to end at its deadline on a runtime timer instead (letGoDropped), as the
// standard library's context would. That end is not a callback of the wheel, so Stats keeps
// Scheduled == Fired + Stopped + Dropped + Pending, and Lateness.Count() == Fired.
func (s *shard) dropLocked() int {
	end := s.ring.close()
	for s.head < end {
		if !s.drainLocked() {
			runtime.Gosched() // a push that claimed a slot before close is about to publish it
		}
	}
	n := 0
	s.tw.forEach(func(e *entry) {
		if dropFrom(e, stPending) {
			n++
			letGoDropped(e)
		}
	})
	return n
}
