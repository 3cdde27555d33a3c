package shardwheel

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"
	"unsafe"
)

// Internals for the black-box tests in package shardwheel_test.

// deadline is deadlineFrom at a fresh reading: the deadline of a timer armed now (internal tests).
func (w *Wheel) deadline(d time.Duration) int64 { return w.deadlineFrom(w.nanos(), d) }

const (
	SlotBits  = slotBits
	NumSlots  = numSlots
	NumLevels = numLevels
	WheelSpan = wheelSpan
	Overflow  = overflowLv
)

var (
	LevelFor    = levelFor
	SlotFor     = slotFor
	BucketStart = bucketStart
)

// Layout facts pinned by tests.
var (
	EntrySize        = unsafe.Sizeof(entry{})
	ShardTailAt      = unsafe.Offsetof(shard{}.ring) + unsafe.Offsetof(ring{}.tail)
	ShardSlabAt      = unsafe.Offsetof(shard{}.slab)
	ShardOwnerAt     = unsafe.Offsetof(shard{}.mu)
	ShardSize        = unsafe.Sizeof(shard{})
	MallocHeaderSize = uintptr(mallocHeaderSize)
	CacheLineSize    = uintptr(cacheLineSize)
)

// TestWheel drives one bare hierarchical wheel, as a shard does, with entries named by int ids.
// Expiry fires an entry whose deadline is due and re-inserts the others, like shard.expire.
type TestWheel struct {
	w       timingWheel
	sl      slab
	entries map[int]uint32 // id -> slab index
	Fired   []Firing
	// SystemClock makes expiry fire a due entry of a later tick when its bucket is taken,
	// as shard.expire does on the system clock, and lets a due bucket of level 0 go before the
	// rest of a cascade (wheel.interleave); unset, an entry goes down a level, and a cascade
	// finishes first, as with a manual clock, which keeps deadline order.
	SystemClock bool
}

// Firing records one fired entry and the tick at which the wheel fired it.
type Firing struct {
	ID   int
	When int64 // the entry's deadline
	At   int64 // elapsed when it fired (the start of its bucket)
	Now  int64 // the reading of the advance that fired it
}

// NewTestWheel returns a wheel at tick elapsed with a tick of 1 ns: deadlines are ticks.
func NewTestWheel(elapsed int64) *TestWheel { return NewTestWheelTick(elapsed, 1, 1) }

// NewTestWheelTick returns a wheel at tick elapsed with the given tick and grain (ns).
func NewTestWheelTick(elapsed, tick, grain int64) *TestWheel {
	t := &TestWheel{entries: map[int]uint32{}}
	k := newTicks(tick, false)
	k.grain = grain
	t.w.init(elapsed, k, &t.sl)
	return t
}

func (t *TestWheel) Insert(id int, when int64) {
	i, e := t.sl.alloc()
	e.arg = id
	e.when.Store(when)
	t.entries[id] = i
	t.w.insert(i, e, when)
}

// Move changes an entry's deadline and re-links it, as a Reset command does.
func (t *TestWheel) Move(id int, when int64) {
	i := t.entries[id]
	e := t.sl.at(i)
	e.when.Store(when)
	t.w.unlink(e)
	t.w.insert(i, e, when)
}

func (t *TestWheel) Unlink(id int) {
	i := t.entries[id]
	e := t.sl.at(i)
	t.w.unlink(e)
	t.sl.freeEntry(i, e)
	delete(t.entries, id)
}

func (t *TestWheel) Advance(now int64) { t.AdvanceBudget(now, 0) }

// AdvanceBudget is one bounded step of Advance: it visits at most about budget entries and
// reports whether it reached now.
func (t *TestWheel) AdvanceBudget(now int64, budget int) bool {
	t.w.interleave = t.SystemClock
	return t.w.advance(now, func(i uint32, e *entry) {
		expireBare(&t.w, i, e, t.SystemClock, func(when int64) {
			id := e.arg.(int)
			t.Fired = append(t.Fired, Firing{ID: id, When: when, At: t.w.elapsed, Now: t.w.now})
			delete(t.entries, id)
			t.sl.freeEntry(i, e)
		})
	}, budget)
}

// expireBare is shard.expire without the state word, for wheels driven bare by tests: an entry
// of a later tick cascades (unless it is due and system is set, as on the system clock), one
// later in the tick in progress straggles, and fire gets the rest with their deadline.
func expireBare(w *timingWheel, i uint32, e *entry, system bool, fire func(when int64)) {
	when := e.when.Load()
	if t := when / w.tick; t > w.elapsed && (when > w.now || !system) {
		w.link(i, e, t, when)
		return
	}
	if when > w.now {
		w.straggle(i, e, when)
		return
	}
	fire(when)
}

func (t *TestWheel) Elapsed() int64        { return t.w.elapsed }
func (t *TestWheel) NextDue() int64        { return t.w.nextDue() }
func (t *TestWheel) Len() int              { return t.w.count }
func (t *TestWheel) Occupied(l int) uint64 { return t.w.occupied[l] }
func (t *TestWheel) Verify() error         { return t.w.verify() }

// Cascading reports how many entries wait in the rest of a cascade cut short (wheel.casc).
func (t *TestWheel) Cascading() int { return len(t.ids(&t.w.casc)) }

// ids returns the ids of the entries linked in bucket b, sorted.
func (t *TestWheel) ids(b *bucket) []int {
	var out []int
	for _, h := range b.lanes {
		for i := h; i != 0; i = t.sl.at(i).next {
			out = append(out, t.sl.at(i).arg.(int))
		}
	}
	slices.Sort(out)
	return out
}

// Level reports the level an entry is linked at, or -1 if it is not linked.
func (t *TestWheel) Level(id int) int {
	lv, _, _, ok := t.w.position(t.sl.at(t.entries[id]))
	if !ok {
		return -1
	}
	return lv
}

// Verify locks every shard, lets it take what its ring holds (as a producer whose ring is full
// does), and checks its wheel; the tests call it on quiet wheels. The drain comes first because
// commands in a ring are part of the state: a Reset to an earlier deadline leaves its entry in a
// bucket due after the new deadline until the shard takes its command, which moves it. On a
// quiet wheel that command may still wait in the ring (TestResetParkStormEvery failed 1 run in
// 10 on it: an Every stopped after such a Reset, whose command then was ignored and whose cancel
// had not been taken).
func (w *Wheel) Verify() error {
	for i, s := range w.shards {
		s.mu.Lock()
		s.drainNoteLocked()
		err := s.tw.verify()
		s.mu.Unlock()
		if err != nil {
			return fmt.Errorf("shard %d: %w", i, err)
		}
	}
	return nil
}

// SlabCapacity returns how many entries the shards' slabs hold, free or in use.
func (w *Wheel) SlabCapacity() int { return int(w.heldBytes() / blockBytes * blockLen) }

// BlockBytes is what one slab block of entries holds.
const BlockBytes = blockBytes

// SetTrimDelays sets trimQuiet and trimLook and returns the func that restores them. Tests that
// call it must not run in parallel, and must start their wheels after it.
func SetTrimDelays(quiet, look time.Duration) (restore func()) {
	oq, ol, oi := trimQuiet, trimLook, trimIdleLook
	trimQuiet, trimLook, trimIdleLook = quiet, look, 30*look
	return func() { trimQuiet, trimLook, trimIdleLook = oq, ol, oi }
}

// TrimQuiet is how long a shard must be quiet before the advancer trims it.
var TrimQuiet = trimQuiet

// TrimNow trims every shard at once, as the advancer does after trimQuiet, and returns the
// bytes given back. Any goroutine may call it, also while the wheel runs: where a shard's locks
// are held it tries again until it gets them, as the trimmer's next look would.
func (w *Wheel) TrimNow() int64 {
	n := int64(0)
	for _, s := range w.shards {
		for {
			f, _, ok := s.trim()
			if ok {
				n += f
				break
			}
			runtime.Gosched()
		}
	}
	return n
}

// Slot returns the timer's slab index and generation.
func (t Timer) Slot() (uint32, uint64) { return t.i, t.gen }

// SetSlabCap lowers how many entries a shard's slab may grow to (a multiple of BlockLen) and
// returns the func that restores it. Tests that call it must not run in parallel.
func SetSlabCap(n uint64) (restore func()) {
	old := slabCap
	slabCap = n
	return func() { slabCap = old }
}

const BlockLen = blockLen

// Held is a command that a producer has claimed in its shard's ring and not yet published: the
// producer is paused between the two steps (preemption, a GC scan, a CPU quota can do that).
type Held struct {
	s    *shard
	slot *ringSlot
	pos  uint64
	i    uint32
	cmd  uint64
	when int64 // an add's deadline, which its producer notes after the publish
}

// ArmHeld is AfterFuncArg paused after it claimed its add's ring slot, before it publishes it:
// the arm has not returned, so only the Held knows the timer; Publish finishes the arm, and
// Timer is then its handle. It panics where AfterFuncArg would return an error or the ring is
// full (the tests keep rings roomy).
func (w *Wheel) ArmHeld(d time.Duration, f func(any), arg any) *Held {
	s := w.takeShard()
	if s.limited && !s.takeCredit() {
		panic("ArmHeld: WithMaxPending")
	}
	i, e, gen := s.slab.newEntry(false)
	if e == nil {
		panic("ArmHeld: slab full")
	}
	e.f, e.arg = f, arg
	when := w.deadline(d)
	e.when.Store(when)
	slot, pos, res := s.ring.claim()
	if slot == nil {
		panic(fmt.Sprintf("ArmHeld: ring push result %d", res))
	}
	return &Held{s: s, slot: slot, pos: pos, i: i, cmd: gen << opBits /* | opAdd, which is 0 */, when: when}
}

// Timer is the handle of the timer a held arm makes (the zero Timer for a held Stop).
func (h *Held) Timer() Timer {
	if h.cmd&opMask != opAdd {
		return Timer{}
	}
	return Timer{s: h.s, i: h.i, gen: h.cmd >> opBits}
}

// IsArm reports whether the held command is an arm's add.
func (h *Held) IsArm() bool { return h.cmd&opMask == opAdd }

// takeRing lets the shard take every command its ring holds, as a producer whose ring is full
// does.
func takeRing(s *shard) {
	s.mu.Lock()
	s.drainNoteLocked()
	s.mu.Unlock()
}

// StopHeld is Timer.Stop paused after its state CAS and the claim of its cancel's ring slot: it
// reports what Stop would, and the caller must Publish the command (before Wheel.Stop, which
// waits for every claimed slot). It reports false and nil for a timer that is not pending, and
// panics if the ring is full (the tests keep rings roomy).
//
// Stop sends a cancel only for a timer whose add the shard has taken, so StopHeld first lets the
// shard take what its ring holds, as a producer whose ring is full does. If the timer's add is
// still queued after that (behind another held slot), it stops the timer as Stop does, with no
// command, and returns nil.
func (t Timer) StopHeld() (bool, *Held) {
	if t.s == nil {
		return false, nil
	}
	takeRing(t.s)
	e := t.s.slab.at(t.i)
	w := e.state.Load()
	if isGen(w, t.gen) && isState(w, stPending) && isQueued(w) {
		return t.Stop(), nil
	}
	if !isGen(w, t.gen) || !isState(w, stPending) || !e.state.CompareAndSwap(w, withState(w, stStopped)) {
		return false, nil
	}
	t.s.stopped.Inc() // as Stop does after its CAS
	t.s.returnCredit()
	slot, pos, res := t.s.ring.claim()
	if slot == nil {
		panic(fmt.Sprintf("StopHeld: ring push result %d", res))
	}
	return true, &Held{s: t.s, slot: slot, pos: pos, i: t.i, cmd: t.gen<<opBits | opCancel}
}

// StopQueuedHeld is Timer.Stop of a timer whose add is still in the ring, paused after its CAS
// to stopping: it reports whether it made that CAS, and finish runs the rest of Stop.
func (t Timer) StopQueuedHeld() (ok bool, finish func()) {
	e := t.s.slab.at(t.i)
	w := e.state.Load()
	if !isGen(w, t.gen) || !isState(w, stPending) || !isQueued(w) ||
		!e.state.CompareAndSwap(w, withState(w, stStopping)) {
		return false, nil
	}
	t.s.stopped.Inc()
	t.s.returnCredit()
	return true, func() { t.stopQueued(e, w) }
}

// Queued reports whether the timer's add command is still in its shard's ring.
func (t Timer) Queued() bool { return isQueued(t.s.slab.at(t.i).state.Load()) }

// ResetHeld is Timer.Reset paused between its two steps, the claim of the entry and its release
// (preemption can pause it there): it reports what Reset would, and release finishes it. While
// it is paused the entry is held, and Stop, Reset and Wheel.Stop of that timer wait for it.
func (t Timer) ResetHeld(d time.Duration) (ok bool, release func()) {
	if t.s == nil {
		return false, nil
	}
	e := t.s.slab.at(t.i)
	when := t.s.w.deadline(d)
	w, ok := t.hold(e)
	if !ok {
		return false, nil
	}
	return true, func() { t.finishReset(e, w, when) }
}

// ShardID names the shard the held command is in, comparable with Timer.ShardID.
func (h *Held) ShardID() uintptr { return uintptr(unsafe.Pointer(h.s)) }

// ShardID names the timer's home shard (0 for the zero Timer).
func (t Timer) ShardID() uintptr { return uintptr(unsafe.Pointer(t.s)) }

// Publish lets the paused producer go on: it publishes the command, as send does, and an arm
// then counts and notes its deadline, as schedule does.
func (h *Held) Publish() {
	if h.s.ring.publish(h.slot, h.pos, h.i, h.cmd)&ringKick != 0 {
		h.s.kick()
	}
	if h.IsArm() {
		h.s.scheduled.Inc()
		h.s.noteDeadline(h.when)
	}
}

// WorkerGoroutines counts the goroutines running worker loops of w (goroutine dumps: the loop's
// receiver is its first argument), for tests that the worker count stays fixed.
func WorkerGoroutines(w *Wheel) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), fmt.Sprintf("shardwheel.(*Wheel).work(%p", w))
}
