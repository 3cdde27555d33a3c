package shardwheel

import (
	"fmt"
	"unsafe"
)

// Internals for the black-box tests in package shardwheel_test.

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
	EntrySize      = unsafe.Sizeof(entry{})
	ShardHotSize   = unsafe.Offsetof(shard{}.mu)
	ShardHotFields = unsafe.Sizeof(ring{}) + unsafe.Sizeof(shard{}.next) + unsafe.Sizeof(shard{}.scheduled) + unsafe.Sizeof(shard{}.stopped)
	CacheLineSize  = uintptr(cacheLineSize)
)

// TestWheel drives one bare hierarchical wheel, as a shard does, with entries named by int ids.
// Expiry fires an entry whose deadline is due and re-inserts the others, like shard.expire.
type TestWheel struct {
	w       wheel
	entries map[int]*entry
	Fired   []Firing
}

// Firing records one fired entry and the tick at which the wheel fired it.
type Firing struct {
	ID   int
	When int64 // the entry's deadline
	At   int64 // elapsed when it fired (the start of its bucket)
}

func NewTestWheel(elapsed int64) *TestWheel {
	return &TestWheel{w: wheel{elapsed: elapsed}, entries: map[int]*entry{}}
}

func (t *TestWheel) Insert(id int, when int64) {
	e := &entry{arg: id}
	e.when.Store(when)
	t.entries[id] = e
	t.w.insert(e, when)
}

// Move changes an entry's deadline and re-links it, as a Reset command does.
func (t *TestWheel) Move(id int, when int64) {
	e := t.entries[id]
	e.when.Store(when)
	t.w.unlink(e)
	t.w.insert(e, when)
}

func (t *TestWheel) Unlink(id int) {
	t.w.unlink(t.entries[id])
	delete(t.entries, id)
}

func (t *TestWheel) Advance(now int64) {
	t.w.advance(now, func(e *entry) {
		when := e.when.Load()
		if when > t.w.elapsed {
			t.w.insert(e, when)
			return
		}
		id := e.arg.(int)
		t.Fired = append(t.Fired, Firing{ID: id, When: when, At: t.w.elapsed})
		delete(t.entries, id)
	})
}

func (t *TestWheel) Elapsed() int64        { return t.w.elapsed }
func (t *TestWheel) NextDue() int64        { return t.w.nextDue() }
func (t *TestWheel) Len() int              { return t.w.count }
func (t *TestWheel) Occupied(l int) uint64 { return t.w.occupied[l] }
func (t *TestWheel) Verify() error         { return t.w.verify() }

// Level reports the level an entry is linked at.
func (t *TestWheel) Level(id int) int { return int(t.entries[id].level) }

// Verify locks every shard and checks its wheel; the tests call it on quiet wheels.
func (w *Wheel) Verify() error {
	for i, s := range w.shards {
		s.mu.Lock()
		err := s.tw.verify()
		s.mu.Unlock()
		if err != nil {
			return fmt.Errorf("shard %d: %w", i, err)
		}
	}
	return nil
}
