package shardwheel

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// Review of f4dada9 (wheel.casc: the rest of a cascade cut short by a step's budget waits aside;
// on the system clock a due level-0 bucket goes before it).
//
// Fail on f4dada9 (a finding, latency only): TestReview22ShortTimerBehindLevel2CascadeRest and
// TestReview22ShortTimerBehindCascadeOnShard. The others passed and are pins: no timer lost,
// fired twice or early, Stop/Reset/Wheel.Stop of entries in casc, the next wake with casc.

// cascBare is strongBare for the cascade in progress: every entry of casc has a tick at or after
// casc.start (a lowered deadline leaves casc by unlink and insert; a raised one only goes later),
// casc.start is at or before elapsed, and a wheel with a cascade in progress is due now.
func cascBare(w *timingWheel) error {
	if w.casc.empty() {
		return nil
	}
	if w.casc.start > w.elapsed {
		return fmt.Errorf("cascade from %d after elapsed %d", w.casc.start, w.elapsed)
	}
	if d := w.nextDue(); d > w.start(w.elapsed) {
		return fmt.Errorf("cascade in progress, next due %d after the start of elapsed %d", d, w.elapsed)
	}
	for _, h := range w.casc.lanes {
		for i := h; i != 0; {
			e := w.slab.at(i)
			if t := e.when.Load() / w.tick; t < w.casc.start {
				return fmt.Errorf("cascade from %d holds an entry of tick %d", w.casc.start, t)
			}
			i = e.next
		}
	}
	return nil
}

// TestReview22CascRandom: a random model in the style of TestReview21BareSystemBigJumps, tuned
// so that cascades are cut short often (most entries land in buckets of level 1 to 3, budgets of
// 1 to 40), with commands aimed at entries sitting in casc (unlink, lower, raise), fresh readings
// between the steps (system clock) or one reading per advance (manual). After every step:
// verify, strongBare, cascBare, the count, never early, at most once; after a completed advance
// casc is empty and nothing due is left; on the manual clock the buckets fire in order within
// one advance (elapsed at each firing never goes back, and no entry fires ahead of its tick).
func TestReview22CascRandom(t *testing.T) {
	cascSeen, cascHit := 0, 0
	for _, system := range []bool{false, true} {
		for _, tc := range []struct{ tick, grain int64 }{{1, 1}, {1000, 64}} {
			rng := rand.New(rand.NewPCG(uint64(tc.tick)+2222, map[bool]uint64{false: 1, true: 2}[system]))
			for round := 0; round < 25; round++ {
				start := rng.Int64N(1 << 24)
				h := newRW(start, tc.tick, tc.grain, system)
				now := start * tc.tick
				id := 0
				fired := map[int]bool{}
				startElapsed := int64(0) // elapsed at the start of the advance in progress
				pick := func() (int, bool) {
					ids := h.ids(&h.w.casc)
					if len(ids) > 0 && rng.IntN(4) != 0 {
						cascHit++
						return ids[rng.IntN(len(ids))], true
					}
					return h.pickAny(rng)
				}
				spans := []int64{64, 300, 5000, 300000}
				cmds := func(n int) {
					for k := rng.IntN(n); k > 0; k-- {
						switch c := rng.IntN(9); c {
						case 0, 1, 2:
							// A burst into one bucket a level or more up.
							base := now + spans[rng.IntN(len(spans))]*tc.tick
							for j := rng.IntN(40); j >= 0; j-- {
								h.insert(id, base+rng.Int64N(70*tc.tick))
								id++
							}
						default: // 3 to 8
							h.randomCmd(rng, c-3, &id, now, tc.tick, spans, pick)
						}
					}
				}
				audit := func(where string, manualOrder *int64, full bool) {
					t.Helper()
					fail := func(err error) {
						t.Fatalf("system=%v tick %d round %d %s: %v", system, tc.tick, round, where, err)
					}
					if !h.w.casc.empty() {
						cascSeen++
					}
					if full || rng.IntN(8) == 0 {
						for _, chk := range []func(*timingWheel) error{(*timingWheel).verify, strongBare, cascBare} {
							if err := chk(&h.w); err != nil {
								fail(err)
							}
						}
					}
					var order func(f Firing) error
					if manualOrder != nil {
						order = func(f Firing) error {
							// Deadline order by tick; a deadline behind elapsed at the start of
							// the advance (a late insert) counts as that tick.
							tk := max(f.When/tc.tick, startElapsed)
							if tk < *manualOrder {
								return fmt.Errorf("entry %d due %d (tick %d) fired after an entry of tick %d (manual)", f.ID, f.When, tk, *manualOrder)
							}
							if f.When/tc.tick > f.At {
								return fmt.Errorf("entry %d due %d fired ahead at elapsed %d (manual)", f.ID, f.When, f.At)
							}
							*manualOrder = tk
							return nil
						}
					}
					if err := h.spent(fired, full, order); err != nil {
						fail(err)
					}
				}
				for step := 0; step < 80; step++ {
					cmds(6)
					if rng.IntN(3) == 0 {
						if n := h.w.nextDue(); n != never {
							now = max(now, n)
						}
					} else {
						now += rng.Int64N([]int64{2, 70, 5000}[rng.IntN(3)] * tc.tick)
					}
					budget := []int{2, 5, 9, 40}[rng.IntN(4)]
					order := int64(-1)
					startElapsed = h.w.elapsed
					var mo *int64
					if !system {
						mo = &order
					}
					for steps := 0; !h.advance(now, budget); steps++ {
						audit(fmt.Sprintf("step %d, budgeted %d", step, steps), mo, false)
						if system {
							cmds(3)
							if rng.IntN(2) == 0 {
								now += rng.Int64N(3 * tc.tick)
							}
						}
						require.Less(t, steps, 1_000_000, "budgeted advance does not progress")
					}
					audit(fmt.Sprintf("step %d", step), mo, true)
					if !h.w.casc.empty() {
						t.Fatalf("system=%v round %d step %d: advance done with a cascade in progress", system, round, step)
					}
					for x, wh := range h.when {
						if wh <= now {
							t.Fatalf("system=%v round %d step %d: entry %d due %d left after advance to %d", system, round, step, x, wh, now)
						}
					}
				}
			}
		}
	}
	require.Greater(t, cascSeen, 100, "cascades were rarely cut short")
	require.Greater(t, cascHit, 100, "commands rarely hit an entry in casc")
	t.Logf("steps with a cascade in progress: %d; commands on casc entries: %d", cascSeen, cascHit)
}

// TestReview22ShortTimerBehindLevel2CascadeRest: the cut-short cascade is of a bucket of level
// 2 (ticks 4096 to 8191), taken late: the step's reading is tick 4166, past the first 64 ticks of
// its span. The 2000 entries of that bucket are all due at tick 4196 or later, so none is due;
// the cascade only moves them down. A short timer armed between the steps, due at tick 4168, goes
// to level 1 (the bucket of ticks 4160-4223), not level 0, since elapsed stays at the cascade's
// start, 4096. On f4dada9 only a level-0 bucket went before the rest of a cascade, so this one
// waited for every one of the 1950 entries left, none of which was due (35 steps): the wait
// f4dada9 set out to remove. Any bucket of a lower level goes first now (wheel.lowerDue). The
// case is reached whenever a cascade of level 2 or more is still running 64 ticks after its
// bucket's start: a bucket taken late (the shard's advancer held up), or a cascade longer than
// 64 ticks (about 20 ms for a million entries: any tick under ~300 us).
func TestReview22ShortTimerBehindLevel2CascadeRest(t *testing.T) {
	const n, budget, short = 2000, 50, 4168
	tw := NewTestWheel(0)
	tw.SystemClock = true
	for id := 0; id < n; id++ {
		tw.Insert(id, 4196+int64(id)%3900) // the level-2 bucket from tick 4096; none due before 4196
	}
	require.Equal(t, 2, tw.Level(0))
	require.False(t, tw.AdvanceBudget(4166, budget), "the cascade takes more than one step")
	require.NoError(t, tw.Verify())
	require.Empty(t, tw.Fired)
	tw.Insert(n, short)
	require.Equal(t, 1, tw.Level(n), "the short timer is linked at level 1, behind the cascade")
	now := int64(short) // a fresh reading per step, moving on one tick per step
	shortStep := -1
	for step := 0; shortStep < 0; step++ {
		tw.AdvanceBudget(now, budget)
		require.NoError(t, tw.Verify())
		for _, f := range tw.Fired {
			require.LessOrEqual(t, f.When, f.Now)
			if f.ID == n {
				shortStep = step
			}
		}
		require.Less(t, step, 10*n)
		now++
	}
	require.LessOrEqual(t, shortStep, 1,
		"the short timer due at tick %d fired %d steps (ticks) late, after the rest of a level-2 cascade none of whose entries was due", short, shortStep)
}

// cascShard arms n timers about an hour out in one bucket of level 3 on a sysShard, and drives
// one budgeted step at that bucket's start, so that the rest of the bucket is in casc. It returns
// the timers, their deadlines, the reading reached, and the callbacks' record of the reading at
// which each ran (by index).
func cascShard(t *testing.T, n, budget int) (w *Wheel, s *shard, drive func(now int64, budget int) bool, run func() int,
	tms []Timer, cur *int64, ran map[int][]int64) {
	w, s, drive, run = sysShard(t)
	cur = new(int64)
	ran = map[int][]int64{}
	// Deadlines from one hour on, 7 ms apart: one level-3 bucket (262144 ticks, about 4.4 min).
	base := (w.nanos()+int64(time.Hour))/w.tick/(1<<18)*(1<<18) + (1 << 18) // a level-3 start
	for k := 0; k < n; k++ {
		k := k
		d := time.Duration(base*w.tick + int64(k)*7*w.tick + w.tick/2 - w.nanos())
		tm, err := w.AfterFunc(d, func() { ran[k] = append(ran[k], *cur) })
		require.NoError(t, err)
		tms = append(tms, tm)
	}
	*cur = base*w.tick - 1 // everything before the bucket: cascades it into level 3's bucket
	for !drive(*cur, 0) {
	}
	s.mu.Lock()
	lv, _, _, _ := s.tw.position(s.slab.at(tms[0].i))
	s.mu.Unlock()
	require.Equal(t, 3, lv, "the timers are in one bucket of level 3")
	*cur = base * w.tick
	require.False(t, drive(*cur, budget), "the cascade takes more than one step")
	require.Zero(t, run())
	return
}

// requireRanOnce checks the end of a cascShard test: of its n timers, the stopped ones never ran
// and every other ran once, at or after its deadline in due (by the readings in ran); the
// wheel's counters balance with nothing pending.
func requireRanOnce(t *testing.T, w *Wheel, n int, ran map[int][]int64, due map[int]int64, stopped []int) {
	t.Helper()
	for k := range n {
		if slices.Contains(stopped, k) {
			require.Empty(t, ran[k], "timer %d was stopped", k)
			continue
		}
		require.Len(t, ran[k], 1, "timer %d", k)
		require.GreaterOrEqual(t, ran[k][0], due[k], "timer %d ran early", k)
	}
	requireBalancedSoon(t, w, 0)
}

// resetAt resets timer k of a cascShard test to fire at the instant at (ns on w's clock, or the
// first after it that a Reset from now can reach) and records its new deadline in due.
func resetAt(t *testing.T, w *Wheel, tms []Timer, due map[int]int64, k int, at int64) {
	t.Helper()
	require.True(t, tms[k].Reset(time.Duration(at-w.nanos())), "timer %d", k)
	due[k] = tms[k].s.slab.at(tms[k].i).when.Load()
}

// driveChecked drives a cascShard test's shard to the reading now in steps of budget, running
// each step's callbacks and checking the shard (strongVerify) after each, and runs the last's.
func driveChecked(t *testing.T, s *shard, drive func(now int64, budget int) bool, run func() int, now int64, budget int) {
	t.Helper()
	for !drive(now, budget) {
		run()
		require.NoError(t, strongVerify(s))
	}
	run()
}

// inCasc reports whether tm's entry is linked in casc.
func inCasc(tm Timer) bool {
	s := tm.s
	s.mu.Lock()
	defer s.mu.Unlock()
	lv, _, _, ok := s.tw.position(s.slab.at(tm.i))
	return ok && lv == cascLv
}

// TestReview22CascStopResetOnShard: with a cascade in progress (casc holds the rest of a level-3
// bucket), timers sitting in casc are stopped (the cancel unlinks them from casc: a lane's first
// entry and a later one), reset earlier (the reset command moves them out of casc), reset later
// (no command: casc takes them and re-links them), and held by a paused Reset while casc is taken
// (parked, then moved by the Reset's command). Then the rest runs in budgeted steps at readings
// that move on. Every timer not stopped runs once, at or after its deadline; stopped ones never;
// verify and strongVerify hold after every step; the counters balance.
func TestReview22CascStopResetOnShard(t *testing.T) {
	const n = 200
	w, s, drive, run, tms, cur, ran := cascShard(t, n, 10)
	var casc []int
	for k, tm := range tms {
		if inCasc(tm) {
			casc = append(casc, k)
		}
	}
	require.Greater(t, len(casc), 20, "most of the bucket is in casc")
	// A lane's first entry of casc, and one further down its lane.
	s.mu.Lock()
	head := -1
	for k := range tms {
		if e := s.slab.at(tms[k].i); e.prev&laneBit != 0 && s.tw.casc.lanes[e.prev&laneMask] == tms[k].i {
			head = k
			break
		}
	}
	s.mu.Unlock()
	require.GreaterOrEqual(t, head, 0)
	pickCasc := func(skip ...int) int {
		for _, k := range casc {
			if !slices.Contains(skip, k) && inCasc(tms[k]) {
				return k
			}
		}
		t.Fatal("no timer left in casc")
		return -1
	}
	stopped := []int{head, pickCasc(head)}
	for _, k := range stopped {
		require.True(t, tms[k].Stop())
	}
	earlier := pickCasc(stopped...)
	later := pickCasc(append(stopped, earlier)...)
	held := pickCasc(append(stopped, earlier, later)...)
	due := map[int]int64{}
	for k, tm := range tms {
		due[k] = s.slab.at(tm.i).when.Load()
	}
	// Earlier: back before the reading reached (due at once); later: a minute on.
	resetAt(t, w, tms, due, earlier, *cur-int64(time.Second))
	require.Less(t, due[earlier], *cur)
	resetAt(t, w, tms, due, later, due[later]+int64(time.Minute))
	finish := holdReset(t, tms[held], time.Duration(due[held]-w.nanos())+30*time.Second)
	// The next steps drain the cancels and the earlier Reset's command, and take casc.
	driveChecked(t, s, drive, run, *cur, 10)
	require.Len(t, ran[earlier], 1, "the earlier Reset's timer, due already, ran")
	require.True(t, isParked(w, tms[held]), "casc met the held timer: parked")
	require.True(t, s.tw.casc.empty())
	finish()
	due[held] = s.slab.at(tms[held].i).when.Load()
	// Everything else, in budgeted steps whose readings move on 3 ms at a time.
	last := int64(0)
	for _, d := range due {
		last = max(last, d)
	}
	for *cur < last+int64(time.Millisecond) {
		*cur += 3 * int64(time.Millisecond)
		driveChecked(t, s, drive, run, *cur, 10)
	}
	requireRanOnce(t, w, len(tms), ran, due, stopped)
}

// TestReview22WheelStopDropsCasc: Wheel.Stop while a cascade is in progress drops (and counts)
// the timers in casc: it returns every timer that never ran.
func TestReview22WheelStopDropsCasc(t *testing.T) {
	const n = 100
	w, s, _, _, tms, _, ran := cascShard(t, n, 10)
	inC := 0
	for _, tm := range tms {
		if inCasc(tm) {
			inC++
		}
	}
	require.Greater(t, inC, 50)
	require.Zero(t, len(ran))
	require.Equal(t, n, s.tw.count)
	require.Equal(t, n, w.Stop(), "Wheel.Stop returns every pending timer, those in casc included")
	st := w.Stats()
	require.EqualValues(t, n, st.Dropped)
}

// TestReview22StaleReadingWithCasc: an advance with a reading behind elapsed (a keeper that took
// the shard over with the reading of its wake, older than the previous step's fresh one) returns
// done at once and publishes the shard's next; with a cascade in progress that next must be due
// at once, or the rest of the cascade waits for the shard's next deadline.
func TestReview22StaleReadingWithCasc(t *testing.T) {
	_, s, drive, _, _, cur, _ := cascShard(t, 100, 10)
	require.False(t, s.tw.casc.empty())
	s.mu.Lock()
	done := s.advanceLocked(*cur-int64(time.Hour), 10)
	next := s.next.Load()
	s.mu.Unlock()
	require.True(t, done, "a stale reading returns done")
	require.LessOrEqual(t, next, *cur, "a cascade in progress is due at once")
	for !drive(*cur, 10) {
	}
	require.True(t, s.tw.casc.empty())
}

// TestReview22CascadeInBubble runs the system clock's expiry side (keeper, claims, budgeted
// steps, take-overs) in a synctest bubble over a cascade that takes many steps: 3000 timers in
// one level-2 bucket, a tenth of them due at its start (so steps fire callbacks, the claim goes
// running and may be taken over), and callbacks that arm short timers and Stop or Reset timers
// still in the bucket, so commands reach entries sitting in casc. Every timer not stopped runs
// once and never early; the wheel ends empty and its invariants hold. (Fake time does not move
// while the cascade runs, so this pins correctness, not latency.)
func TestReview22CascadeInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithShards(1), WithWorkers(2), WithTick(time.Millisecond))
		require.NoError(t, err)
		defer w.Stop()
		start := time.Now()
		const n = 3000
		type rec struct {
			due  time.Duration // from start
			runs []time.Duration
			tm   Timer
		}
		var mu sync.Mutex
		recs := map[int]*rec{}
		stopped := map[int]bool{}
		var sawCasc atomic.Bool // a callback ran between two steps of the cascade
		next := 0
		arm := func(d time.Duration, f func()) {
			mu.Lock()
			k := next
			next++
			r := &rec{due: time.Since(start) + d}
			recs[k] = r
			tm, err := w.AfterFunc(d, func() {
				mu.Lock()
				r.runs = append(r.runs, time.Since(start))
				mu.Unlock()
				if f != nil {
					f()
				}
			})
			r.tm = tm
			mu.Unlock()
			require.NoError(t, err)
		}
		// Level 2 from elapsed 0: ticks 4096-8191. A tenth at its very start.
		for k := 0; k < n; k++ {
			if k%10 != 0 {
				arm(4200*time.Millisecond+time.Duration(k)*time.Millisecond, nil)
				continue
			}
			arm(4096*time.Millisecond+time.Duration(k%7)*time.Microsecond, func() {
				sh := w.shards[0]
				sh.mu.Lock()
				if !sh.tw.casc.empty() {
					sawCasc.Store(true)
				}
				sh.mu.Unlock()
				arm(time.Millisecond, nil)
				arm(0, nil)
				victim := (k*7 + 13) % n
				if victim%10 == 0 {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				r := recs[victim]
				if k%20 == 0 {
					if r.tm.Stop() {
						stopped[victim] = true
					}
					return
				}
				nd := time.Duration(victim%50) * time.Millisecond
				now := time.Since(start)
				if r.tm.Reset(nd) {
					r.due = now + nd
				}
			})
		}
		time.Sleep(4096 * time.Millisecond)
		synctest.Wait()
		require.NoError(t, w.Verify())
		time.Sleep(8300*time.Millisecond - 4096*time.Millisecond)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		require.NotEmpty(t, stopped)
		require.True(t, sawCasc.Load(), "no callback ran while a cascade was in progress")
		for k, r := range recs {
			if stopped[k] {
				require.Empty(t, r.runs, "timer %d was stopped", k)
				continue
			}
			require.Len(t, r.runs, 1, "timer %d", k)
			require.GreaterOrEqual(t, r.runs[0], r.due, "timer %d ran early", k)
		}
		require.Zero(t, w.Len())
		require.NoError(t, w.Verify())
	})
}

// TestReview22ShortTimerBehindCascadeOnShard is TestReview22ShortTimerBehindLevel2CascadeRest
// through a shard (AfterFunc, the add command, shard.expire): the rest of a level-3 bucket is in
// casc, its timers 7 ms apart; at a reading 72 ticks past the bucket's start a timer armed for
// that moment is linked at level 1 (elapsed stays at the bucket's start). On f4dada9 it ran only
// once the whole rest had been moved down (35 steps), although all but about ten of those timers
// are minutes away.
func TestReview22ShortTimerBehindCascadeOnShard(t *testing.T) {
	const n, budget = 2000, 50
	w, s, drive, run, _, cur, _ := cascShard(t, n, budget)
	start := s.tw.casc.start
	require.Equal(t, start, s.tw.elapsed)
	at := (start+72)*w.tick + 1
	ran := 0
	_, err := w.AfterFunc(time.Duration(at-w.nanos()), func() { ran++ })
	require.NoError(t, err)
	*cur = at + w.tick/2 // AfterFunc read the clock after the d above: its deadline is a little later than at
	steps := 0
	for ; ran == 0; steps++ {
		drive(*cur, budget)
		run()
		require.Less(t, steps, n)
	}
	require.LessOrEqual(t, steps, 2,
		"a timer due at the reading ran after %d budgeted steps of a cascade of timers that were not due", steps)
}
