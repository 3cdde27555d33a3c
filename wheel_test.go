package shardwheel_test

import (
	"math"
	"math/rand/v2"
	"testing"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestWheelBudgetSameFirings: an advance cut into bounded steps (what a worker does so that it
// holds a shard's mutex only briefly) fires exactly what one unbounded advance fires, in the same
// order, with the wheel's invariants holding after every step, and with inserts and unlinks landing
// between steps (what drains do while the worker has let go of the mutex).
func TestWheelBudgetSameFirings(t *testing.T) {
	for seed := uint64(0); seed < 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		whole, steps := sw.NewTestWheel(0), sw.NewTestWheel(0)
		n := 200 + rng.IntN(3000)
		for id := 0; id < n; id++ {
			// Many on few ticks (a flood's buckets), some far (cascades from high levels).
			when := int64(rng.IntN(8)) * 64
			if rng.IntN(4) == 0 {
				when = rng.Int64N(1 << 20)
			}
			whole.Insert(id, when)
			steps.Insert(id, when)
		}
		now := int64(0)
		for round := 0; round < 20; round++ {
			now += rng.Int64N(1 << 16)
			whole.Advance(now)
			budget := 1 + rng.IntN(100)
			for i := 0; ; i++ {
				done := steps.AdvanceBudget(now, budget)
				require.NoError(t, steps.Verify(), "seed %d round %d step %d", seed, round, i)
				if done {
					break
				}
				require.Less(t, i, n+10, "seed %d: a bounded advance made no progress", seed)
			}
			require.Equal(t, whole.Fired, steps.Fired, "seed %d round %d", seed, round)
			require.Equal(t, whole.Len(), steps.Len())
			require.Equal(t, whole.Elapsed(), steps.Elapsed())
		}
	}
}

// TestWheelBudgetBetweenSteps: entries inserted and unlinked while a bounded advance is half way
// through a bucket leave the put-back bucket consistent; nothing fires early or twice, and an
// unlinked entry never fires.
func TestWheelBudgetBetweenSteps(t *testing.T) {
	tw := sw.NewTestWheel(0)
	const n = 1000
	for id := 0; id < n; id++ {
		tw.Insert(id, 100) // one level-1 bucket, 1000 entries: cascaded, then fired, in steps
	}
	require.False(t, tw.AdvanceBudget(100, 50), "a budget of 50 cannot take 1000 entries")
	require.NoError(t, tw.Verify())
	require.Less(t, len(tw.Fired), n)
	// Between steps: an overdue insert, a later one, and an unlink of an untaken entry.
	tw.Insert(n, 10)
	tw.Insert(n+1, 5000)
	var untaken int
	fired := map[int]bool{}
	for _, f := range tw.Fired {
		fired[f.ID] = true
	}
	for id := 0; id < n; id++ {
		if !fired[id] {
			untaken = id
			break
		}
	}
	tw.Unlink(untaken)
	require.NoError(t, tw.Verify())
	for !tw.AdvanceBudget(100, 50) {
		require.NoError(t, tw.Verify())
	}
	seen := map[int]int{}
	for _, f := range tw.Fired {
		seen[f.ID]++
		require.LessOrEqual(t, f.When, int64(100), "entry %d fired early", f.ID)
	}
	require.Len(t, seen, n) // n-1 of the bucket plus the overdue one
	for id, c := range seen {
		require.Equal(t, 1, c, "entry %d fired %d times", id, c)
	}
	require.NotContains(t, seen, untaken)
	require.NotContains(t, seen, n+1)
	require.Equal(t, 1, tw.Len())
}

// TestWheelLevel0BeforeCascadeRest: a bucket of level 1 with 1000 entries is taken in budgeted
// steps (a cascade into level 0), and between its steps a timer due one tick later is armed,
// into level 0. On the system clock its bucket goes before the rest of the cascade, so it fires
// in the first step after its deadline; without that, it waited for the whole cascade (about
// 20 ms for a million entries on one core: BenchmarkShortTimerBehindCascade). With a manual
// clock the cascade still finishes first, as one unbounded advance would. Either way every
// entry fires once, never early, and the invariants hold after every step.
func TestWheelLevel0BeforeCascadeRest(t *testing.T) {
	const n, budget, flood, short = 1000, 50, 64 + 40, 65
	for _, system := range []bool{false, true} {
		t.Run(map[bool]string{false: "manual", true: "system"}[system], func(t *testing.T) {
			tw := sw.NewTestWheel(0) // a tick of 1 ns: deadlines are ticks
			tw.SystemClock = system
			for id := 0; id < n; id++ {
				tw.Insert(id, flood) // all in the level-1 bucket that starts at tick 64
			}
			require.False(t, tw.AdvanceBudget(64, budget), "the cascade takes more than one step")
			require.NoError(t, tw.Verify())
			tw.Insert(n, short) // elapsed is 64: tick 65 is in level 0
			shortStep := -1
			for step, now := 0, int64(short); ; step++ {
				before := len(tw.Fired)
				done := tw.AdvanceBudget(now, budget)
				require.NoError(t, tw.Verify(), "step %d", step)
				for _, f := range tw.Fired[before:] {
					require.Equal(t, n, f.ID, "step %d: a flood entry due %d fired at %d", step, f.When, now)
					shortStep = step
				}
				if done {
					break
				}
				require.Less(t, step, n, "the advance makes no progress")
			}
			if system {
				require.Equal(t, 0, shortStep, "the short timer waited behind the cascade")
			} else {
				// The cascade's 950 entries left take 17 to 19 steps of 50 (a step may take a
				// few more than its budget: takeLanes finishes a round of its lanes).
				require.Greater(t, shortStep, 10, "with a manual clock the cascade goes first")
			}
			for !tw.AdvanceBudget(flood, budget) {
				require.NoError(t, tw.Verify())
			}
			seen := map[int]int{}
			for _, f := range tw.Fired {
				seen[f.ID]++
				require.LessOrEqual(t, f.When, f.Now, "entry %d fired early", f.ID)
			}
			require.Len(t, seen, n+1)
			for id, c := range seen {
				require.Equal(t, 1, c, "entry %d fired %d times", id, c)
			}
			require.Zero(t, tw.Len())
		})
	}
}

// TestWheelCascadeGoesOnBesideShortTimers: on the system clock a due bucket below a cascade's rest
// goes first (timingWheel.lowerDue), but not with the whole step: while a budget's worth of short
// timers comes due at every step, the rest of a level-2 cascade still shrinks at every step, by a
// quarter of the budget, and every timer fires once and never early.
func TestWheelCascadeGoesOnBesideShortTimers(t *testing.T) {
	const n, budget = 2000, 80
	tw := sw.NewTestWheel(0) // a tick of 1 ns: deadlines are ticks
	tw.SystemClock = true
	for id := 0; id < n; id++ {
		tw.Insert(id, 4196+int64(id)%3900) // the level-2 bucket from tick 4096; none due before 4196
	}
	require.Equal(t, 2, tw.Level(0))
	require.False(t, tw.AdvanceBudget(4100, budget), "the cascade takes more than one step")
	id, now := n, int64(4101)
	for step := 0; tw.Cascading() > 0; step++ {
		before := tw.Cascading()
		for k := 0; k < budget; k++ {
			tw.Insert(id, now) // due at this step's reading
			id++
		}
		tw.AdvanceBudget(now, budget)
		require.NoError(t, tw.Verify(), "step %d", step)
		require.LessOrEqual(t, tw.Cascading(), before-budget/4, "step %d: the cascade's rest did not shrink by its share", step)
		now++
	}
	for !tw.AdvanceBudget(8192, budget) {
		require.NoError(t, tw.Verify())
	}
	seen := map[int]int{}
	for _, f := range tw.Fired {
		seen[f.ID]++
		require.LessOrEqual(t, f.When, f.Now, "entry %d fired early", f.ID)
	}
	require.Len(t, seen, id)
	for x, c := range seen {
		require.Equal(t, 1, c, "entry %d fired %d times", x, c)
	}
	require.Zero(t, tw.Len())
}

// levelWidth is the number of ticks one slot of a level spans.
func levelWidth(level int) int64 { return int64(1) << (uint(level) * sw.SlotBits) }

// TestSlotFor: slotFor finds the slot of a deadline in every slot of every level, whatever the
// bits below and above that level's digit.
func TestSlotFor(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for level := 0; level < sw.NumLevels; level++ {
		for slot := 0; slot < sw.NumSlots; slot++ {
			base := int64(slot) << (uint(level) * sw.SlotBits)
			for range 8 {
				below := rng.Int64N(levelWidth(level))
				above := rng.Int64N(1<<20) << (uint(level+1) * sw.SlotBits)
				when := above | base | below
				require.Equal(t, slot, sw.SlotFor(when, level), "level %d slot %d when %d", level, slot, when)
			}
		}
	}
}

// TestLevelFor: levelFor and bucketStart over every slot of every level: a deadline in slot s of
// level l, seen from an elapsed tick that agrees with it above l and is below it at l, is at level
// l, and its bucket starts after elapsed, at or before the deadline.
func TestLevelFor(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for level := 0; level < sw.NumLevels; level++ {
		for slot := 1; slot < sw.NumSlots; slot++ {
			for range 8 {
				shift := uint(level) * sw.SlotBits
				upper := rng.Int64N(1<<20) << (shift + sw.SlotBits)
				elapsedDigit := rng.Int64N(int64(slot))
				elapsed := upper | elapsedDigit<<shift | rng.Int64N(levelWidth(level))
				when := upper | int64(slot)<<shift | rng.Int64N(levelWidth(level))
				require.Equal(t, level, sw.LevelFor(elapsed, when), "elapsed %d when %d", elapsed, when)
				start := sw.BucketStart(when, level)
				require.Greater(t, start, elapsed)
				require.LessOrEqual(t, start, when)
				require.Equal(t, int64(0), start%levelWidth(level))
			}
		}
	}
	// A deadline equal to elapsed is at level 0; one past the top level overflows.
	require.Equal(t, 0, sw.LevelFor(12345, 12345))
	require.Equal(t, sw.Overflow, sw.LevelFor(0, sw.WheelSpan))
	require.Equal(t, sw.Overflow, sw.LevelFor(5, math.MaxInt64))
	require.Equal(t, sw.NumLevels-1, sw.LevelFor(0, sw.WheelSpan-1))
	require.Equal(t, int64(math.MaxInt64)&^(sw.WheelSpan-1), sw.BucketStart(math.MaxInt64, sw.Overflow))
	require.Equal(t, 3*sw.WheelSpan, sw.BucketStart(3*sw.WheelSpan+7, sw.Overflow))
}

// TestWheelCascade: with deadlines across every level and beyond the top, advanced in random
// steps, every entry fires exactly once, at its own tick (never before, and never after the tick
// of the advance that passed it), in deadline order, with the wheel's invariants holding after
// every step.
func TestWheelCascade(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for round := 0; round < 20; round++ {
		start := rng.Int64N(1 << 40)
		tw := sw.NewTestWheel(start)
		want := map[int]int64{}
		n := 2000
		for id := 0; id < n; id++ {
			// Spread deadlines over every level: a random level, then a random offset in it.
			level := rng.IntN(sw.NumLevels + 1)
			span := levelWidth(level) * sw.NumSlots
			if level == sw.NumLevels {
				span = 1 << 45
			}
			when := start + rng.Int64N(span)
			tw.Insert(id, when)
			want[id] = when
		}
		require.NoError(t, tw.Verify())
		require.Equal(t, n, tw.Len())

		now := start
		for tw.Len() > 0 {
			// Jump to just before, at, or past the next due bucket.
			next := tw.NextDue()
			require.GreaterOrEqual(t, next, now)
			switch rng.IntN(3) {
			case 0:
				now = next
			case 1:
				now = next + rng.Int64N(100)
			default:
				now += rng.Int64N(1 << uint(rng.IntN(40)))
			}
			before := len(tw.Fired)
			tw.Advance(now)
			require.Equal(t, now, tw.Elapsed())
			require.NoError(t, tw.Verify())
			for _, f := range tw.Fired[before:] {
				require.Equal(t, want[f.ID], f.When)
				require.Equal(t, f.When, f.At, "entry %d fired at tick %d, due %d", f.ID, f.At, f.When)
				require.LessOrEqual(t, f.When, now)
			}
			// Whatever is left is due after now.
			if tw.Len() > 0 {
				require.Greater(t, tw.NextDue(), now)
			}
		}
		require.Len(t, tw.Fired, n)
		seen := map[int]bool{}
		for i, f := range tw.Fired {
			require.False(t, seen[f.ID], "entry %d fired twice", f.ID)
			seen[f.ID] = true
			if i > 0 {
				require.LessOrEqual(t, tw.Fired[i-1].When, f.When, "fired out of deadline order")
			}
		}
		require.Zero(t, tw.Len(), "entries left")
	}
}

// TestWheelUnlinkAndMove: after unlinks and re-links (a Stop's cancel, a Reset's move) bitmaps
// and buckets agree, unlinked entries never fire and moved ones fire at their new tick.
func TestWheelUnlinkAndMove(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	tw := sw.NewTestWheel(0)
	want := map[int]int64{}
	for id := 0; id < 5000; id++ {
		when := rng.Int64N(1 << 30)
		tw.Insert(id, when)
		want[id] = when
	}
	for id := 0; id < 5000; id += 3 {
		tw.Unlink(id)
		delete(want, id)
		require.NoError(t, tw.Verify())
	}
	for id := 1; id < 5000; id += 3 {
		when := rng.Int64N(1 << 30)
		tw.Move(id, when)
		want[id] = when
	}
	require.NoError(t, tw.Verify())
	tw.Advance(1 << 31)
	require.NoError(t, tw.Verify())
	require.Len(t, tw.Fired, len(want))
	for _, f := range tw.Fired {
		require.Equal(t, want[f.ID], f.When)
		require.Equal(t, f.When, f.At)
	}
	for l := 0; l <= sw.NumLevels; l++ {
		require.Zero(t, tw.Occupied(l), "level %d bitmap after the wheel emptied", l)
	}
}

// TestWheelOverflow: deadlines far beyond the top level, up to the end of time, are parked in the
// overflow, re-cascade and fire at their exact tick, each in a handful of advances (no empty
// ticks: never clamped, never lost); a deadline already behind elapsed fires at the next advance.
func TestWheelOverflow(t *testing.T) {
	tw := sw.NewTestWheel(0)
	far := []int64{sw.WheelSpan, sw.WheelSpan + 1, 5*sw.WheelSpan + 12345, 1 << 50, math.MaxInt64 - 1, math.MaxInt64}
	for id, when := range far {
		tw.Insert(id, when)
		require.Equal(t, sw.Overflow, tw.Level(id))
	}
	require.NoError(t, tw.Verify())
	steps := 0
	for tw.Len() > 0 {
		tw.Advance(tw.NextDue())
		require.NoError(t, tw.Verify())
		steps++
	}
	require.Len(t, tw.Fired, len(far))
	for i, f := range tw.Fired {
		require.Equal(t, far[i], f.When)
		require.Equal(t, f.When, f.At)
	}
	// Each step is one visit of a due bucket: a few per entry, not one per tick or per era.
	require.Less(t, steps, 20*len(far))

	// A deadline before elapsed (its command waited in a ring) fires at the next advance.
	tw.Insert(100, 5)
	require.NoError(t, tw.Verify())
	tw.Advance(tw.Elapsed())
	require.Equal(t, 100, tw.Fired[len(tw.Fired)-1].ID)
}

// TestWheelBitmapMatchesSlots: each level's occupancy bitmap has exactly the bits of its
// non-empty slots.
func TestWheelBitmapMatchesSlots(t *testing.T) {
	tw := sw.NewTestWheel(0)
	var want [sw.NumLevels + 1]uint64
	for level := 0; level < sw.NumLevels; level++ {
		for _, slot := range []int{1, 2, 17, 63} {
			id := level*100 + slot
			tw.Insert(id, int64(slot)<<(uint(level)*sw.SlotBits))
			want[level] |= 1 << uint(slot)
		}
	}
	for level := range want {
		require.Equal(t, want[level], tw.Occupied(level), "level %d", level)
	}
	require.NoError(t, tw.Verify())
}

// TestWheelExactDeadlines: with a tick wider than a nanosecond, deadlines inside one tick fire at
// their own instant, not at the tick's end. Entries are spread over a few hundred ticks, several per
// tick; the wheel is advanced to readings inside ticks, in budgeted steps of random size, with
// entries unlinked on the way (stragglers among them). Every firing is at or after its deadline;
// after each completed advance nothing due is left; the wheel's next wake is never later than the
// earliest pending deadline (rounded up to the grain); each entry fires once; the invariants hold
// after every step.
func TestWheelExactDeadlines(t *testing.T) {
	const tick = 1000
	for _, grain := range []int64{1, 64} {
		rng := rand.New(rand.NewPCG(11, uint64(grain)))
		for round := 0; round < 30; round++ {
			start := rng.Int64N(1 << 30)
			tw := sw.NewTestWheelTick(start, tick, grain)
			pending := map[int]int64{}
			n := 500
			for id := 0; id < n; id++ {
				when := start*tick + rng.Int64N(300*tick)
				if id%5 == 0 {
					when = start*tick + rng.Int64N(2*tick) // crowd the first ticks
				}
				tw.Insert(id, when)
				pending[id] = when
			}
			require.NoError(t, tw.Verify())
			now := start * tick
			fired := map[int]bool{}
			for len(pending) > 0 {
				switch rng.IntN(4) {
				case 0:
					now = max(now, tw.NextDue())
				case 1:
					now = max(now, tw.NextDue()+rng.Int64N(tick))
				default:
					now += rng.Int64N(3 * tick)
				}
				budget := []int{0, 1, 3, 50}[rng.IntN(4)]
				for {
					before := len(tw.Fired)
					done := tw.AdvanceBudget(now, budget)
					require.NoError(t, tw.Verify())
					for _, f := range tw.Fired[before:] {
						require.False(t, fired[f.ID], "entry %d fired twice", f.ID)
						fired[f.ID] = true
						require.Equal(t, pending[f.ID], f.When)
						require.LessOrEqual(t, f.When, f.Now, "entry %d fired early", f.ID)
						delete(pending, f.ID)
					}
					if done {
						break
					}
				}
				first := int64(math.MaxInt64)
				for id, when := range pending {
					require.Greater(t, when, now, "entry %d due at %d left after an advance to %d", id, when, now)
					first = min(first, when)
				}
				if len(pending) > 0 {
					next := tw.NextDue()
					require.Greater(t, next, now)
					require.LessOrEqual(t, next, (first+grain-1)/grain*grain, "the next wake is after the earliest deadline")
				}
				// Unlink a few pending entries: some are stragglers in a soon bucket by now.
				for id := range pending {
					if rng.IntN(8) == 0 {
						tw.Unlink(id)
						delete(pending, id)
					}
				}
				require.NoError(t, tw.Verify())
			}
			require.Zero(t, tw.Len())
		}
	}
}
