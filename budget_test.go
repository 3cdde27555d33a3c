package shardwheel_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	sw "github.com/shardwheel/shardwheel"
)

// TestWheelBudgetSameFirings checks that an advance cut into bounded steps (what a worker does
// so that it holds a shard's mutex only briefly) fires exactly what one unbounded advance fires,
// in the same order, with the wheel's invariants holding after every step, and with inserts and
// unlinks landing between steps (what drains do while the worker has let go of the mutex).
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

// TestWheelBudgetBetweenSteps inserts and removes entries while a bounded advance is half way
// through a bucket: the put-back bucket stays consistent and nothing fires early or twice.
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

// TestWheelCascadeGoesOnBesideShortTimers: on the system clock a due bucket below a cascade's
// rest goes first (wheel.lowerDue), but not with the whole step: while a budget's worth of short
// timers comes due at every step, the rest of a level-2 cascade still shrinks at every step, by
// a quarter of the budget, and every timer fires once and never early.
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
