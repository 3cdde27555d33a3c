package shardwheel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rwHarness drives a bare wheel as a shard does (TestWheel: shard.expire without the state word),
// with deadlines that may be raised in place (a Reset to a later deadline: no command), lowered
// (a Reset command: unlink and insert), inserted late (a command that waited in the ring), or
// unlinked (a Stop's cancel); when holds the pending entries' deadlines.
type rwHarness struct {
	*TestWheel
	when map[int]int64
}

func newRW(elapsed, tick, grain int64, system bool) *rwHarness {
	h := &rwHarness{TestWheel: NewTestWheelTick(elapsed, tick, grain), when: map[int]int64{}}
	h.SystemClock = system
	return h
}

func (h *rwHarness) insert(id int, when int64) { h.Insert(id, when); h.when[id] = when }
func (h *rwHarness) lower(id int, when int64)  { h.Move(id, when); h.when[id] = when } // a reset command
func (h *rwHarness) unlink(id int)             { h.Unlink(id); delete(h.when, id) }

// raise is a Reset to a later deadline: no command, the entry stays where it is linked.
func (h *rwHarness) raise(id int, when int64) {
	h.sl.at(h.entries[id]).when.Store(when)
	h.when[id] = when
}

// holdsPending reports an error unless the wheel counts as many linked entries as there are
// pending ones and, with all, every pending entry is linked (all: a walk of them, which the
// random models skip at most steps).
func (h *rwHarness) holdsPending(all bool) error {
	if h.w.count != len(h.when) {
		return fmt.Errorf("%d linked, %d pending", h.w.count, len(h.when))
	}
	if all {
		for x := range h.when {
			if !h.sl.at(h.entries[x]).linked() {
				return fmt.Errorf("pending entry %d not linked", x)
			}
		}
	}
	return nil
}

// pickAny returns a pending entry chosen at random (by rng, over the ids in order, so that a
// seed replays), or false if none is pending.
func (h *rwHarness) pickAny(rng *rand.Rand) (int, bool) {
	if len(h.when) == 0 {
		return 0, false
	}
	ids := make([]int, 0, len(h.when))
	for x := range h.when {
		ids = append(ids, x)
	}
	slices.Sort(ids)
	return ids[rng.IntN(len(ids))], true
}

// randomCmd applies one of the commands that the random models of a cascade in progress share,
// of kind k in [0, 6): a short timer (due within 3 ticks of now) or a late insert (up to 3 ticks
// before it), each with the next id; or, to the entry that pick chooses, a raise or a lower by
// up to a distance drawn from dists (in ticks), an unlink, or a lower to now (a Reset to "now").
func (h *rwHarness) randomCmd(rng *rand.Rand, k int, id *int, now, tick int64, dists []int64, pick func() (int, bool)) {
	switch k {
	case 0:
		h.insert(*id, now+rng.Int64N(3*tick))
		*id++
		return
	case 1:
		h.insert(*id, max(0, now-rng.Int64N(3*tick)))
		*id++
		return
	}
	x, ok := pick()
	if !ok {
		return
	}
	switch k {
	case 2:
		h.raise(x, h.when[x]+rng.Int64N(dists[rng.IntN(len(dists))]*tick))
	case 3:
		h.lower(x, max(0, h.when[x]-rng.Int64N(dists[rng.IntN(len(dists))]*tick)))
	case 4:
		h.unlink(x)
	case 5:
		h.lower(x, min(h.when[x], now))
	}
}

// spent checks what fired since its last call (h.Fired): nothing twice (fired remembers every
// firing) and, for each, each (nil: no more check); then it empties Fired and checks that the
// wheel holds every pending entry (holdsPending, with all).
func (h *rwHarness) spent(fired map[int]bool, all bool, each func(f Firing) error) error {
	for _, f := range h.Fired {
		if fired[f.ID] {
			return fmt.Errorf("entry %d fired twice", f.ID)
		}
		fired[f.ID] = true
		if each != nil {
			if err := each(f); err != nil {
				return err
			}
		}
	}
	h.Fired = h.Fired[:0]
	return h.holdsPending(all)
}

// advance is one budgeted step; it fails the test's goroutine on an early firing.
func (h *rwHarness) advance(now int64, budget int) bool {
	before := len(h.Fired)
	done := h.AdvanceBudget(now, budget)
	for _, f := range h.Fired[before:] {
		if f.When > now {
			panic(fmt.Sprintf("entry %d due %d fired at %d: early", f.ID, f.When, now))
		}
		delete(h.when, f.ID)
	}
	return done
}

// TestWheelExactResets: a random model of a shard's wheel with late inserts (already due,
// clamped to elapsed), Resets both ways (raised in place with no command, lowered by unlink and
// insert, also of entries waiting in a soon bucket), cancels, and budgeted advances, with
// commands also arriving between the budgeted steps of one advance (as each advanceLocked step's
// drain applies them), at ticks of 1 ns, 1000 ns and 2^20 ns. Checks never early, nothing due
// left after a completed advance, a next wake after now and no later than the earliest pending
// deadline rounded up to the grain, that every budgeted advance finishes, and the invariants.
// (Written by this change's reviews.) It runs twice: as with a manual clock, and as on the system
// clock, where a due entry of a later tick fires as its bucket is taken (shard.expire) and the
// reading may move on between the budgeted steps of one advance (advanceShard reads the clock
// at each step).
func TestWheelExactResets(t *testing.T) {
	for _, system := range []bool{false, true} {
		t.Run(fmt.Sprintf("system=%v", system), func(t *testing.T) { testWheelExactResets(t, system) })
	}
}

func testWheelExactResets(t *testing.T, system bool) {
	ahead := 0 // entries fired from a bucket taken before their own tick's
	defer func() {
		if system {
			require.Positive(t, ahead, "no due entry of a later tick fired as its bucket was taken")
		} else {
			require.Zero(t, ahead, "an entry fired before the buckets of earlier ticks were taken")
		}
	}()
	for _, tc := range []struct{ tick, grain int64 }{{1000, 1}, {1000, 64}, {1, 1}, {1 << 20, 1 << 16}} {
		rng := rand.New(rand.NewPCG(uint64(tc.tick)+99, uint64(tc.grain)))
		for round := 0; round < 60; round++ {
			start := rng.Int64N(1 << 30)
			h := newRW(start, tc.tick, tc.grain, system)
			now := start * tc.tick
			id := 0
			span := []int64{2, 70, 5000, 1 << 20}[rng.IntN(4)] * tc.tick
			cmds := func(n int) {
				for k := rng.IntN(n); k > 0; k-- {
					switch rng.IntN(6) {
					case 0, 1:
						h.insert(id, now+rng.Int64N(span))
						id++
					case 2:
						h.insert(id, max(0, now-rng.Int64N(3*tc.tick)))
						id++
					case 3:
						for x, wh := range h.when {
							h.raise(x, wh+rng.Int64N(span))
							break
						}
					case 4:
						for x, wh := range h.when {
							h.lower(x, max(0, wh-rng.Int64N(span)))
							break
						}
					case 5:
						for x := range h.when {
							h.unlink(x)
							break
						}
					}
				}
			}
			for step := 0; step < 300; step++ {
				cmds(8)
				switch rng.IntN(3) {
				case 0:
					if n := h.w.nextDue(); n != never {
						now = max(now, n)
					}
				default:
					now += rng.Int64N(3 * tc.tick)
				}
				budget := []int{0, 1, 2, 7, 50}[rng.IntN(5)]
				for steps := 0; !h.advance(now, budget); steps++ {
					if err := h.w.verify(); err != nil {
						t.Fatalf("tick %d grain %d round %d step %d: budgeted: %v", tc.tick, tc.grain, round, step, err)
					}
					cmds(4) // the next step's drain
					if system && rng.IntN(2) == 0 {
						now += rng.Int64N(3 * tc.tick) // the next step's fresh reading
					}
					if steps > 1e6 {
						t.Fatalf("budgeted advance does not progress")
					}
				}
				if err := h.w.verify(); err != nil {
					t.Fatalf("tick %d grain %d round %d step %d: %v", tc.tick, tc.grain, round, step, err)
				}
				for _, f := range h.Fired {
					if f.When/tc.tick > f.At {
						ahead++
					}
				}
				h.Fired = h.Fired[:0]
				first := int64(math.MaxInt64)
				for x, wh := range h.when {
					if wh <= now {
						t.Fatalf("tick %d grain %d round %d step %d: entry %d due %d left after advance to %d", tc.tick, tc.grain, round, step, x, wh, now)
					}
					first = min(first, wh)
				}
				if len(h.when) > 0 {
					n := h.w.nextDue()
					if n <= now {
						continue
					}
					if lim := (first + tc.grain - 1) / tc.grain * tc.grain; n > lim {
						t.Fatalf("tick %d grain %d round %d step %d: next due %d after earliest deadline %d (now %d)", tc.tick, tc.grain, round, step, n, first, now)
					}
				}
			}
		}
	}
}

// holdReset is Timer.Reset(d) paused right after its claim (pending -> resetting), as
// preemption or a GC assist can pause it: it has read the clock (the new deadline) and holds
// the entry. finish is the rest of Reset: the store of the deadline, the release with a new
// version, and the command if the deadline is earlier.
// holdReset starts a Reset of tm to d from now and pauses it between its claim and its release,
// Reset's own two steps: finish runs the release. Meanwhile the entry is held (resetting).
func holdReset(t *testing.T, tm Timer, d time.Duration) (finish func()) {
	t.Helper()
	e := tm.s.slab.at(tm.i)
	when := tm.s.w.deadline(d)
	w, ok := tm.hold(e)
	require.True(t, ok, "timer not pending")
	return func() { tm.finishReset(e, w, when) }
}

// TestResetHeldAcrossAdvance: a Reset paused between its claim and its release while an Advance
// meets the entry (an advance must neither fire it on the deadline being replaced nor lose it).
// The shard parks it and the Reset, finding it parked, sends the command that moves it to its new
// deadline, also when that deadline is later than the old one, inside the tick in progress
// (found by review: the shard used to link it at the next tick's start and the later Reset sent
// no command, so it fired a tick late and Advance returned with it due), or earlier.
func TestResetHeldAcrossAdvance(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name  string
		reset time.Duration // at 0.2 ms
		due   time.Duration
	}{
		{"later, in the tick", 500 * time.Microsecond, 700 * time.Microsecond},
		{"later, next tick", 1200 * time.Microsecond, 1400 * time.Microsecond},
		{"earlier", 100 * time.Microsecond, 300 * time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := NewManualClock(time.Unix(0, 0))
			w, err := New(WithClock(clk), WithWorkers(0), WithShards(1), WithTick(ms))
			require.NoError(t, err)
			defer w.Stop()
			var firedAt time.Duration = -1
			tm, err := w.AfterFunc(500*time.Microsecond, func() { firedAt = clk.Now().Sub(time.Unix(0, 0)) })
			require.NoError(t, err)
			clk.Advance(200 * time.Microsecond)
			finish := holdReset(t, tm, tc.reset)
			clk.Advance(300 * time.Microsecond) // 0.5 ms: the old deadline; the entry is held
			require.Equal(t, time.Duration(-1), firedAt, "fired while a Reset held it")
			finish()
			require.NoError(t, w.Verify())
			if tc.due <= 500*time.Microsecond {
				clk.Advance(0) // due already: the next Advance fires it
				require.Equal(t, 500*time.Microsecond, firedAt)
				return
			}
			clk.Advance(tc.due - 500*time.Microsecond - 1)
			require.Equal(t, time.Duration(-1), firedAt, "fired before its new deadline")
			clk.Advance(1)
			require.Equal(t, tc.due, firedAt, "not fired at its new deadline")
		})
	}
}

// TestResetHeldAtEndOfTime: the same held Reset at the end of time, with a 1 ms and a 1 ns tick.
// Found by review (older than exact deadlines): the shard linked the held entry at tick
// target+1, past the last tick that starts before the end of time, a bucket no advance takes, and
// the Reset (to a later deadline) sent no command: the timer was never fired. With a 1 ns tick
// target+1 overflowed and the advance went round on the held entry until the Reset finished.
func TestResetHeldAtEndOfTime(t *testing.T) {
	for _, tick := range []time.Duration{time.Millisecond, 1} {
		t.Run(tick.String(), func(t *testing.T) {
			clk := NewManualClock(time.Unix(0, 0))
			w, err := New(WithClock(clk), WithWorkers(0), WithShards(1), WithTick(tick))
			require.NoError(t, err)
			defer w.Stop()
			fired := 0
			tm, err := w.AfterFunc(math.MaxInt64-10, func() { fired++ })
			require.NoError(t, err)
			finish := holdReset(t, tm, math.MaxInt64) // due at the end of time: later than before
			clk.Advance(math.MaxInt64)                // the end of time; the advance meets the held entry
			require.Zero(t, fired, "fired while a Reset held it")
			finish()
			clk.Advance(0)
			require.Equal(t, 1, fired, "due at the end of time, the clock there, not fired")
			require.Zero(t, w.Len())
		})
	}
}
