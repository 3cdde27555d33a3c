package shardwheel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
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

func (h *rwHarness) lower(id int, when int64) { h.Move(id, when); h.when[id] = when }

func (h *rwHarness) unlink(id int) { h.Unlink(id); delete(h.when, id) }

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
// It runs twice: as with a manual clock, and as on the system clock, where a due entry of a later
// tick fires as its bucket is taken (shard.expire: the fire-ahead path) and the reading may move
// on between the budgeted steps of one advance (driveShard reads the clock at each step).
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

// TestWheelExactResetsBigJumps: TestWheelExactResets on the system clock, with what it leaves out:
// fresh readings between budgeted steps that jump far (a level-1, level-2 and level-3 span, and
// past the overflow's era), deadlines in the overflow and at the end of time, and an audit that
// each entry fires at most once and that every pending one stays linked (count and position).
// After every step: verify, strongBare, never early (the harness), and after a completed
// advance nothing due is left and the next wake is no later than the earliest deadline rounded
// up to the grain.
func TestWheelExactResetsBigJumps(t *testing.T) {
	ahead := 0
	for _, tc := range []struct{ tick, grain int64 }{{1000, 1}, {1000, 64}, {1, 1}, {1 << 20, 1 << 16}} {
		rng := rand.New(rand.NewPCG(uint64(tc.tick)+2121, uint64(tc.grain)))
		for round := 0; round < 40; round++ {
			start := rng.Int64N(1 << 30)
			h := newRW(start, tc.tick, tc.grain, true)
			now := start * tc.tick
			const nowCap = int64(1) << 61
			id := 0
			fired := map[int]bool{}
			span := []int64{2, 70, 5000, 1 << 20, 1 << 37}[rng.IntN(5)] * tc.tick
			jump := func() int64 {
				j := []int64{0, 1, 3, 64, 4096, 1 << 18, 1 << 37}[rng.IntN(7)] * tc.tick
				return rng.Int64N(j + 1)
			}
			pick := func() (int, bool) { return h.pickAny(rng) }
			cmds := func(n int) {
				for k := rng.IntN(n); k > 0; k-- {
					switch rng.IntN(8) {
					case 0, 1:
						h.insert(id, satAddNanos(now, rng.Int64N(span)))
						id++
					case 2:
						h.insert(id, max(0, now-rng.Int64N(3*tc.tick)))
						id++
					case 3:
						h.insert(id, math.MaxInt64-rng.Int64N(3*tc.tick)) // the end of time
						id++
					case 4:
						if x, ok := pick(); ok {
							h.raise(x, satAddNanos(h.when[x], rng.Int64N(span)))
						}
					case 5:
						if x, ok := pick(); ok {
							h.lower(x, max(0, h.when[x]-rng.Int64N(span)))
						}
					case 6:
						if x, ok := pick(); ok {
							h.unlink(x)
						}
					case 7:
						if x, ok := pick(); ok { // a Reset to "now": due already
							h.lower(x, min(h.when[x], now))
						}
					}
				}
			}
			audit := func(where string) {
				t.Helper()
				if err := h.w.verify(); err != nil {
					t.Fatalf("tick %d round %d %s: %v", tc.tick, round, where, err)
				}
				if err := strongBare(&h.w); err != nil {
					t.Fatalf("tick %d round %d %s: %v", tc.tick, round, where, err)
				}
				err := h.spent(fired, true, func(f Firing) error {
					if f.When/tc.tick > f.At {
						ahead++
					}
					return nil
				})
				if err != nil {
					t.Fatalf("tick %d round %d %s: %v", tc.tick, round, where, err)
				}
			}
			for step := 0; step < 200; step++ {
				cmds(8)
				if rng.IntN(3) == 0 {
					if n := h.w.nextDue(); n != never {
						now = max(now, min(n, nowCap))
					}
				} else {
					now = min(nowCap, now+jump())
				}
				budget := []int{0, 1, 2, 7, 50}[rng.IntN(5)]
				for steps := 0; !h.advance(now, budget); steps++ {
					audit(fmt.Sprintf("step %d, budgeted %d", step, steps))
					cmds(4)
					if rng.IntN(2) == 0 {
						now = min(nowCap, now+jump()) // the next step's fresh reading
					}
					require.Less(t, steps, 1_000_000, "budgeted advance does not progress")
				}
				audit(fmt.Sprintf("step %d", step))
				first := int64(math.MaxInt64)
				for x, wh := range h.when {
					if wh <= now {
						t.Fatalf("tick %d round %d step %d: entry %d due %d left after advance to %d", tc.tick, tc.grain, step, x, wh, now)
					}
					first = min(first, wh)
				}
				if len(h.when) > 0 {
					if n := h.w.nextDue(); n > now {
						if lim := h.w.roundUp(first); n > lim {
							t.Fatalf("tick %d round %d step %d: next due %d after earliest deadline %d (now %d)", tc.tick, round, step, n, first, now)
						}
					}
				}
			}
		}
	}
	require.Positive(t, ahead, "the fire-ahead path was never taken")
}

// TestWheelHeldResetNotFiredAhead: a Reset paused between its two steps (Timer.hold and
// finishReset) while a cascade step of its level-3 bucket is taken with a reading past its old
// deadline (the fire-ahead path, which fires a due entry of a later tick as its bucket is taken):
// the entry is parked, not fired on the deadline being replaced, and once the Reset finishes it
// fires at its new deadline, not before, exactly once. Both a later and an earlier new deadline.
func TestWheelHeldResetNotFiredAhead(t *testing.T) {
	for _, later := range []bool{true, false} {
		t.Run(fmt.Sprint("later=", later), func(t *testing.T) {
			w, s, drive, run := sysShard(t)
			var ran []int64 // the reading of the step that fired it
			var cur int64
			tmA, err := w.AfterFunc(time.Hour+20*time.Millisecond, func() { ran = append(ran, cur) })
			require.NoError(t, err)
			// Company in the same bucket, so that budgeted steps matter.
			var company []int64 // their deadlines
			for k := 0; k < 40; k++ {
				tm, err := w.AfterFunc(time.Hour+time.Duration(k)*time.Millisecond, func() {})
				require.NoError(t, err)
				company = append(company, s.slab.at(tm.i).when.Load())
			}
			oldWhen := s.slab.at(tmA.i).when.Load()
			d := time.Hour + 50*time.Millisecond
			if !later {
				d = time.Hour + 5*time.Millisecond
			}
			finish := holdReset(t, tmA, d)
			newWhen := w.deadline(d) // no earlier than the held Reset's own (it read the clock before)
			cur = oldWhen + int64(time.Millisecond)
			for !drive(cur, 3) {
			}
			run()
			require.Empty(t, ran, "fired while a Reset held it")
			require.True(t, isParked(w, tmA), "the step met the held entry: parked")
			finish()
			heldWhen := s.slab.at(tmA.i).when.Load()
			require.LessOrEqual(t, heldWhen, newWhen)
			// From the reading already reached (an earlier new deadline is behind it: the
			// Reset's command moves the entry there and the next step fires it).
			for first := true; first || cur < heldWhen+int64(3*time.Millisecond); first, cur = false, cur+int64(100*time.Microsecond) {
				for !drive(cur, 2) {
				}
				run()
				if len(ran) > 0 {
					break
				}
			}
			require.Len(t, ran, 1)
			require.GreaterOrEqual(t, ran[0], heldWhen, "fired before its new deadline")
			due := 0 // the company due by the last reading has fired
			for _, wh := range company {
				if wh <= cur {
					due++
				}
			}
			requireBalancedSoon(t, w, 40-due)
		})
	}
}

// requireBalancedSoon requires Scheduled == Fired + Stopped + Dropped + Pending, with pending as
// expected.
func requireBalancedSoon(t *testing.T, w *Wheel, pending int) {
	t.Helper()
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "counters: %+v", st)
	require.Equal(t, pending, st.Pending)
}

// TestWheelFireAheadEdges: on the fire-ahead path, with budgeted steps at readings that move on
// between steps: a Reset to a later deadline (no command) past the step's reading is re-linked, not
// fired; a Reset to a later deadline still before the reading fires at it; a Stop after the step
// fired an entry (firing) keeps its callback from running; an Every fired ahead re-arms a whole
// interval after its due instant, not from the bucket's start, and does not run again before it.
// Stats balance at the end.
func TestWheelFireAheadEdges(t *testing.T) {
	w, s, drive, run := sysShard(t)
	h := time.Hour
	ms := int64(time.Millisecond)
	var cur int64
	type rec struct {
		when int64 // the deadline it must not fire before (set after any Reset)
		runs []int64
	}
	recs := map[string]*rec{}
	arm := func(name string, d time.Duration) Timer {
		r := &rec{}
		recs[name] = r
		tm, err := w.AfterFunc(d, func() { r.runs = append(r.runs, cur) })
		require.NoError(t, err)
		r.when = s.slab.at(tm.i).when.Load()
		return tm
	}
	raised := arm("raised", h+10*time.Millisecond)
	raisedDue := arm("raisedDue", h+11*time.Millisecond)
	stopped := arm("stopped", h+12*time.Millisecond)
	for k := 0; k < 30; k++ {
		arm(fmt.Sprint("fill", k), h+time.Duration(k)*time.Millisecond)
	}
	var evRuns []int64
	ev, err := w.Every(h, func() { evRuns = append(evRuns, cur) })
	require.NoError(t, err)
	evFirst := s.slab.at(ev.i).when.Load()
	evDue := s.slab.at(ev.i).arg.(*every).due

	require.True(t, raised.Reset(h+200*time.Millisecond)) // later: no command
	recs["raised"].when = s.slab.at(raised.i).when.Load()
	require.True(t, raisedDue.Reset(h+15*time.Millisecond)) // later, but due at the reading below
	recs["raisedDue"].when = s.slab.at(raisedDue.i).when.Load()

	// One reading well past the burst, with a budget of 2: each step of the level-3 bucket fires
	// what is due as it goes.
	cur = recs["stopped"].when + 30*ms
	firedStop := false
	for !drive(cur, 2) {
		if !firedStop && isState(s.slab.at(stopped.i).state.Load(), stFiring) {
			require.True(t, stopped.Stop(), "Stop of a fired, not started, timer")
			firedStop = true
		}
		run()
		cur += ms / 10 // the next step's fresh reading
	}
	if !firedStop && isState(s.slab.at(stopped.i).state.Load(), stFiring) {
		require.True(t, stopped.Stop())
		firedStop = true
	}
	run()
	require.True(t, firedStop, "the stopped timer did not fire ahead")
	require.Empty(t, recs["stopped"].runs, "Stop reported true, yet the callback ran")
	require.Empty(t, recs["raised"].runs, "a Reset to a later deadline fired at the old one")
	require.Len(t, recs["raisedDue"].runs, 1)
	for name, r := range recs {
		for _, at := range r.runs {
			require.GreaterOrEqual(t, at, r.when, "%s fired early", name)
		}
		if name != "stopped" && name != "raised" {
			require.Len(t, r.runs, 1, name)
		}
	}
	require.Len(t, evRuns, 1)
	require.GreaterOrEqual(t, evRuns[0], evFirst)
	// The Every's add is in the ring: its next run is due one interval after its due instant.
	e := s.slab.at(ev.i)
	require.Equal(t, evDue+int64(h), e.when.Load(), "next run not a whole interval after the due instant")
	for step := 0; step < 5; step++ {
		cur += 10 * ms
		for !drive(cur, 2) {
			run()
		}
		run()
	}
	require.Len(t, evRuns, 1, "the Every ran again before its next due instant")
	cur = recs["raised"].when
	for !drive(cur, 2) {
		run()
	}
	run()
	require.Len(t, recs["raised"].runs, 1)
	require.GreaterOrEqual(t, recs["raised"].runs[0], recs["raised"].when)
	cur = evDue + int64(h)
	for !drive(cur, 0) {
	}
	run()
	require.Len(t, evRuns, 2)
	require.True(t, ev.Stop())
	requireBalancedSoon(t, w, 0)
}

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

// TestWheelCascadeInProgressRandom: a random model in the style of TestWheelExactResetsBigJumps,
// tuned so that cascades are cut short often (most entries land in buckets of level 1 to 3, budgets
// of 1 to 40), with commands aimed at entries sitting in casc (unlink, lower, raise), fresh
// readings between the steps (system clock) or one reading per advance (manual). After every step:
// verify, strongBare, cascBare, the count, never early, at most once; after a completed advance
// casc is empty and nothing due is left; on the manual clock the buckets fire in order within one
// advance (elapsed at each firing never goes back, and no entry fires ahead of its tick).
func TestWheelCascadeInProgressRandom(t *testing.T) {
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

// TestWheelLevel1BucketBeforeLevel2CascadeRest: on the system clock a due bucket of any level
// below a cascade's goes before the cascade's rest (timingWheel.lowerDue), not only one of level 0.
// The cut-short cascade is of a bucket of level 2 (ticks 4096 to 8191), taken late: the step's
// reading is tick 4166, past the first 64 ticks of its span. The 2000 entries of that bucket are
// all due at tick 4196 or later, so none is due; the cascade only moves them down. A short timer
// armed between the steps, due at tick 4168, goes to level 1 (the bucket of ticks 4160-4223), not
// level 0, since elapsed stays at the cascade's start, 4096. It fires within two steps, rather
// than after the 1950 entries left, none of them due, were moved down (35 steps). The case arises
// whenever a cascade of level 2 or more is still running 64 ticks after its bucket's start: a
// bucket taken late (the shard's advancer held up), or a cascade longer than 64 ticks (about
// 20 ms for a million entries: any tick under ~300 us).
func TestWheelLevel1BucketBeforeLevel2CascadeRest(t *testing.T) {
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

// TestWheelCascadeInProgressStopResetOnShard: with a cascade in progress (casc holds the rest of a
// level-3 bucket), timers sitting in casc are stopped (the cancel unlinks them from casc: a lane's
// first entry and a later one), reset earlier (the reset command moves them out of casc), reset
// later (no command: casc takes them and re-links them), and held by a paused Reset while casc is
// taken (parked, then moved by the Reset's command). Then the rest runs in budgeted steps at
// readings that move on. Every timer not stopped runs once, at or after its deadline; stopped ones
// never; verify and strongVerify hold after every step; the counters balance.
func TestWheelCascadeInProgressStopResetOnShard(t *testing.T) {
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

// TestWheelStaleReadingKeepsCascadeDue: an advance with a reading behind elapsed (a keeper that took
// the shard over with the reading of its wake, older than the previous step's fresh one) returns
// done at once and publishes the shard's next; with a cascade in progress that next must be due
// at once, or the rest of the cascade waits for the shard's next deadline.
func TestWheelStaleReadingKeepsCascadeDue(t *testing.T) {
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

// TestWheelShortTimerBeforeCascadeRestOnShard: TestWheelLevel1BucketBeforeLevel2CascadeRest
// through a shard (AfterFunc, the add command, shard.expire): the rest of a level-3 bucket is in
// casc, its timers 7 ms apart; at a reading 72 ticks past the bucket's start a timer armed for
// that moment is linked at level 1 (elapsed stays at the bucket's start). It runs within two
// budgeted steps, not once the whole rest has been moved down (35 steps), though all but about
// ten of those timers are minutes away.
func TestWheelShortTimerBeforeCascadeRestOnShard(t *testing.T) {
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

// putBackBare checks what putBack and lowerDue rely on, on a bare wheel with a cascade in
// progress: every non-empty bucket of a level below casc's lies in casc's span, and every other
// one starts after it. (That nothing is linked into a put-back bucket is checked by the caller,
// by the ids in it: putBackIDs.)
func putBackBare(w *timingWheel) error {
	if w.casc.empty() {
		return nil
	}
	span := int64(1) << (uint(w.cascLevel) * slotBits)
	for lv := 0; lv <= overflowLv; lv++ {
		for sl := 0; sl < numSlots; sl++ {
			b := &w.buckets[lv][sl]
			if b.empty() {
				continue
			}
			if lv < int(w.cascLevel) {
				if b.start < w.casc.start || b.start >= w.casc.start+span {
					return fmt.Errorf("level %d slot %d (start %d) below casc's level %d lies outside its span from %d", lv, sl, b.start, w.cascLevel, w.casc.start)
				}
			} else if b.start < w.casc.start+span {
				return fmt.Errorf("level %d slot %d (start %d) at or above casc's level %d starts in its span from %d", lv, sl, b.start, w.cascLevel, w.casc.start)
			}
		}
	}
	return nil
}

// putBackIDs returns the ids in buckets of level 1 or more whose start is elapsed (put back), by
// bucket.
func putBackIDs(h *rwHarness) map[[2]int][]int {
	w := &h.w
	out := map[[2]int][]int{}
	for lv := 1; lv < numLevels; lv++ {
		for sl := 0; sl < numSlots; sl++ {
			b := &w.buckets[lv][sl]
			if b.empty() || b.start != w.elapsed {
				continue
			}
			out[[2]int{lv, sl}] = h.ids(b)
		}
	}
	return out
}

// TestWheelPutBackRandom: a random model of buckets put back beside a cascade in progress: a big
// bucket of level 2 or 3 whose cascade is cut short (budgets 0 and 3 to 64, some below 32, where
// casc's share is a round of lanes or less), bursts into level-1 and level-2 buckets inside its
// span (so that lower buckets go first and are cut short and put back while casc is non-empty),
// readings that move within the span and far past it, and commands between the steps aimed at
// entries in put-back buckets and in casc (unlink, lower, raise, lower to due). After every step:
// verify, strongBare, cascBare, putBackBare, the count, never early, at most once; nothing is
// linked into a put-back bucket (its ids only shrink until it is taken); after a completed advance
// casc is empty and nothing due is left.
func TestWheelPutBackRandom(t *testing.T) {
	seenPutBack, hitPutBack, seenCasc := 0, 0, 0
	pbLevels := map[int]int{} // put-back buckets seen at a step's start, by level
	// A bare wheel on one goroutine: the race detector has nothing to check here and makes it
	// ten times slower (100 s), so under it two rounds; CI's pass without -race runs all twelve.
	rounds := 12
	if raceEnabled {
		rounds = 2
	}
	for _, tc := range []struct{ tick, grain int64 }{{1, 1}, {1000, 64}} {
		rng := rand.New(rand.NewPCG(uint64(tc.tick)+2323, 23))
		for round := 0; round < rounds; round++ {
			lvl := 2 + rng.IntN(2) // the big bucket's level
			span := int64(1) << (uint(lvl) * slotBits)
			start := rng.Int64N(1<<24) &^ (span - 1)
			h := newRW(start, tc.tick, tc.grain, true)
			now := start * tc.tick
			id := 0
			fired := map[int]bool{}
			// The big bucket: the next one of level lvl.
			big := start + span
			for k := 0; k < 200+rng.IntN(600); k++ {
				h.insert(id, (big+rng.Int64N(span))*tc.tick+rng.Int64N(tc.tick))
				id++
			}
			pick := func() (int, bool) {
				if rng.IntN(3) != 0 {
					pb := putBackIDs(h)
					keys := make([][2]int, 0, len(pb))
					for k := range pb {
						keys = append(keys, k)
					}
					slices.SortFunc(keys, func(a, b [2]int) int { return a[0]*64 + a[1] - b[0]*64 - b[1] })
					if len(keys) > 0 {
						l := pb[keys[rng.IntN(len(keys))]]
						hitPutBack++
						return l[rng.IntN(len(l))], true
					}
				}
				if c := h.ids(&h.w.casc); len(c) > 0 && rng.IntN(2) == 0 {
					return c[rng.IntN(len(c))], true
				}
				return h.pickAny(rng)
			}
			cmds := func(n int, bursts bool) {
				for k := rng.IntN(n); k > 0; k-- {
					el := h.w.elapsed
					c := rng.IntN(11)
					if (!bursts || len(h.when) > 1500) && (c < 3 || c == 10) {
						c = 3
					}
					switch c {
					case 10:
						// A big burst spread over a level-2 bucket ahead of elapsed in its level-3
						// group: a lower bucket of level 2 beside a level-3 cascade.
						b2 := bucketStart(el, 2) + 4096*(1+rng.Int64N(3))
						for j := 60 + rng.IntN(200); j >= 0; j-- {
							h.insert(id, (b2+rng.Int64N(4096))*tc.tick+rng.Int64N(tc.tick))
							id++
						}
					case 0, 1, 2:
						// A burst into a level-1 or level-2 bucket ahead of elapsed, mostly in
						// the big bucket's span.
						off := []int64{64, 64 * 3, 4096, 4096 * 2}[rng.IntN(4)]
						base := (el + rng.Int64N(off) + 1) * tc.tick
						for j := rng.IntN(40); j >= 0; j-- {
							h.insert(id, base+rng.Int64N(70*tc.tick))
							id++
						}
					case 8:
						h.randomCmd(rng, 4, &id, now, tc.tick, nil, pick) // an unlink, twice as likely
					case 9:
						h.randomCmd(rng, 5, &id, now, tc.tick, nil, pick)
					default: // 3 to 7
						h.randomCmd(rng, c-3, &id, now, tc.tick, []int64{3, 70, 5000}, pick)
					}
				}
			}
			audit := func(where string, full bool) {
				t.Helper()
				fail := func(err error) {
					t.Fatalf("tick %d round %d (level %d from %d) %s: %v", tc.tick, round, lvl, big, where, err)
				}
				if !h.w.casc.empty() {
					seenCasc++
				}
				if full || rng.IntN(6) == 0 {
					for _, chk := range []func(*timingWheel) error{(*timingWheel).verify, strongBare, cascBare, putBackBare} {
						if err := chk(&h.w); err != nil {
							fail(err)
						}
					}
				}
				if err := h.spent(fired, full, nil); err != nil {
					fail(err)
				}
			}
			for step := 0; step < 60; step++ {
				cmds(6, true)
				switch rng.IntN(4) {
				case 0:
					if n := h.w.nextDue(); n != never {
						now = max(now, n)
					}
				case 1:
					now = max(now, big*tc.tick) // the big bucket's start
					if rng.IntN(2) == 0 {
						now += rng.Int64N(4*4096) * tc.tick // into its span, past some level-2 starts
					}
				default:
					now += rng.Int64N([]int64{2, 70, 5000, 300000}[rng.IntN(4)] * tc.tick)
				}
				budget := []int{0, 3, 8, 12, 16, 24, 40, 64}[rng.IntN(8)]
				stuck := 0
				for steps := 0; ; steps++ {
					before := putBackIDs(h)
					elBefore := h.w.elapsed
					cascBefore := len(h.ids(&h.w.casc))
					if h.advance(now, budget) {
						break
					}
					if len(before) > 0 {
						seenPutBack++
						for k := range before {
							pbLevels[k[0]]++
						}
					}
					audit(fmt.Sprintf("step %d, budgeted %d", step, steps), false)
					// Nothing is linked into a put-back bucket: neither within the step (its rest
					// only shrinks while elapsed stays its start) nor by commands between steps.
					subset := func(what string, a, b map[[2]int][]int) {
						for k, l := range b {
							old, ok := a[k]
							in := make(map[int]bool, len(old))
							for _, x := range old {
								in[x] = true
							}
							for _, x := range l {
								if !ok || !in[x] {
									t.Fatalf("tick %d round %d step %d: %s: entry %d (due %d) linked into put-back bucket %v at elapsed %d",
										tc.tick, round, step, what, x, h.when[x], k, h.w.elapsed)
								}
							}
						}
					}
					after := putBackIDs(h)
					if h.w.elapsed == elBefore {
						subset("the step", before, after)
					}
					cmds(3, budget >= 8)
					subset("commands", after, putBackIDs(h))
					if c := len(h.ids(&h.w.casc)); c > 0 && c >= cascBefore {
						stuck++
					} else {
						stuck = 0
					}
					require.Less(t, stuck, 5000, "tick %d round %d: the cascade's rest did not shrink in %d steps", tc.tick, round, stuck)
					if rng.IntN(2) == 0 {
						now += rng.Int64N(3 * tc.tick)
					}
					require.Less(t, steps, 1_000_000, "budgeted advance does not progress")
				}
				audit(fmt.Sprintf("step %d", step), true)
				if !h.w.casc.empty() {
					t.Fatalf("round %d step %d: advance done with a cascade in progress", round, step)
				}
				for x, wh := range h.when {
					if wh <= now {
						t.Fatalf("round %d step %d: entry %d due %d left after advance to %d", round, step, x, wh, now)
					}
				}
			}
		}
	}
	t.Logf("steps with casc: %d, steps from a put-back bucket: %d (by level %v), commands on put-back entries: %d", seenCasc, seenPutBack, pbLevels, hitPutBack)
	require.Positive(t, pbLevels[2], "no level-2 bucket was put back beside a level-3 cascade")
	require.Greater(t, seenPutBack, 50, "lower buckets were rarely put back beside a cascade")
	require.Greater(t, hitPutBack, 50)
}

// TestWheelCascadeShareSurvivesLaneRounds: with small budgets too, a cascade in progress gets its
// share of every step, however many short timers come due beside it
// (TestWheelCascadeGoesOnBesideShortTimers at budgets of 8 to 24 rather than 80). Its share is a
// quarter of the budget, which a lower bucket that goes first must leave it; and takeLanes passes
// its limit by up to laneCount-1 entries to finish a round of its lanes, so the lower bucket's
// limit must leave room for that too (advance's keep). Were it not so, at budget 16 (share 4, so a
// limit of 12) a lower bucket with 2 entries in each of the 8 lanes would be taken whole (16),
// leaving casc nothing at every step. Shards step by stepBudget (256), far above this, but the
// bare wheel's contract holds for any budget.
func TestWheelCascadeShareSurvivesLaneRounds(t *testing.T) {
	for _, budget := range []int{8, 16, 24} {
		t.Run(fmt.Sprint("budget=", budget), func(t *testing.T) {
			const n = 2000
			tw := NewTestWheel(0)
			tw.SystemClock = true
			for id := 0; id < n; id++ {
				tw.Insert(id, 4196+int64(id)%3900) // the level-2 bucket from tick 4096; none due before 4196
			}
			require.False(t, tw.AdvanceBudget(4100, budget))
			id, now := n, int64(4101)
			start := tw.Cascading()
			for step := 0; step < 50; step++ {
				for k := 0; k < budget; k++ {
					tw.Insert(id, now) // due at this step's reading
					id++
				}
				tw.AdvanceBudget(now, budget)
				require.NoError(t, tw.Verify())
				now++
			}
			require.Less(t, tw.Cascading(), start,
				"50 steps of budget %d (casc's share %d) beside %d due short timers each: the cascade's rest did not shrink (%d entries)",
				budget, max(1, budget/4), budget, tw.Cascading())
		})
	}
}

// TestWheelPutBackStopResetOnShard: through a shard on the system clock, the rest of a level-3
// bucket is in casc, and a burst of 400 timers in one level-1 bucket inside its span comes due:
// it goes first (lowerDue), is cut short by its share of the step and put back beside casc.
// Timers in that put-back bucket are then stopped (a lane's first entry and a later one), reset
// earlier (due at once: the command moves them out), reset later within the span and a minute on
// (no command: the bucket's take re-links them), and held by a paused Reset across the takes
// (parked, then moved by the Reset's command). Every timer not stopped runs once and never
// early; verify and strongBare hold after every step (drive); the counters balance.
func TestWheelPutBackStopResetOnShard(t *testing.T) {
	const n, burst = 600, 400
	w, s, drive, run, tms, cur, ran := cascShard(t, n, 10)
	base := s.tw.casc.start
	require.Equal(t, uint8(3), s.tw.cascLevel)
	due := map[int]int64{}
	for k, tm := range tms {
		due[k] = s.slab.at(tm.i).when.Load()
	}
	// The burst: ticks base+200 to base+239 (the level-1 bucket from base+192), 0.1 ms apart.
	for k := 0; k < burst; k++ {
		k := n + k
		at := (base+200)*w.tick + int64(k-n)*w.tick/10 + w.tick/20
		tm, err := w.AfterFunc(time.Duration(at-w.nanos()), func() { ran[k] = append(ran[k], *cur) })
		require.NoError(t, err)
		tms = append(tms, tm)
		due[k] = s.slab.at(tm.i).when.Load()
	}
	*cur = (base+200)*w.tick + w.tick/2
	require.False(t, drive(*cur, 40))
	run()
	s.mu.Lock()
	var pb []int // burst timers in the put-back level-1 bucket
	var heads []int
	pbSlot := -1
	for k := n; k < n+burst; k++ {
		e := s.slab.at(tms[k].i)
		if lv, sl, _, ok := s.tw.position(e); ok && lv == 1 && s.tw.buckets[1][sl].start == s.tw.elapsed {
			pb = append(pb, k)
			pbSlot = sl
			if e.prev&laneBit != 0 {
				heads = append(heads, k)
			}
		}
	}
	cascN := 0
	for _, tm := range tms[:n] {
		if lv, _, _, ok := s.tw.position(s.slab.at(tm.i)); ok && lv == cascLv {
			cascN++
		}
	}
	el := s.tw.elapsed
	s.mu.Unlock()
	require.Greater(t, len(pb), 100, "the burst's bucket was cut short and put back")
	require.NotEmpty(t, heads)
	require.Greater(t, cascN, 100, "casc is still in progress")
	require.Equal(t, base+192, el, "elapsed moved to the level-1 bucket's start, in casc's span")
	require.GreaterOrEqual(t, pbSlot, 0)
	others := slices.DeleteFunc(slices.Clone(pb), func(k int) bool { return slices.Contains(heads, k) })
	stopped := []int{heads[0], others[0]}
	for _, k := range stopped {
		require.True(t, tms[k].Stop())
	}
	earlier, laterIn, laterFar, held := others[1], others[2], others[3], others[4]
	resetAt(t, w, tms, due, earlier, *cur-int64(time.Millisecond))
	require.Less(t, due[earlier], *cur)
	resetAt(t, w, tms, due, laterIn, due[laterIn]+int64(700*time.Millisecond))
	resetAt(t, w, tms, due, laterFar, due[laterFar]+int64(time.Minute))
	finish := holdReset(t, tms[held], time.Duration(due[held]-w.nanos())+20*time.Millisecond)
	// At the same reading: the put-back bucket and casc go on in steps.
	driveChecked(t, s, drive, run, *cur, 40)
	require.Len(t, ran[earlier], 1, "the earlier Reset's timer, due already, ran")
	require.True(t, isParked(w, tms[held]), "the put-back bucket's take met the held timer: parked")
	finish()
	due[held] = s.slab.at(tms[held].i).when.Load()
	last := int64(0)
	for _, d := range due {
		last = max(last, d)
	}
	for *cur < last+int64(time.Millisecond) {
		*cur += 3 * int64(time.Millisecond)
		if *cur < last-int64(2*time.Second) && *cur > (base+300)*w.tick {
			*cur += int64(time.Second) // skip ahead through the quiet stretches, in steps
		}
		for !drive(*cur, 40) {
			run()
		}
		run()
	}
	require.NoError(t, strongVerify(s))
	requireRanOnce(t, w, len(tms), ran, due, stopped)
}

// TestStrongInvariantRandom: random sequences of arms, Everys, Stops, Resets (some paused between
// their two steps), arms and Stops paused between the claim of their ring slot and its publish,
// drains and Advances on a manual clock keep the strong invariant after every step
// (strongVerifyAll, which drains nothing: every pending entry sits in a bucket that comes due no
// later than its deadline, and the shard's next is no later than any pending deadline it can see,
// unless a reset command on its way moves it).
func TestStrongInvariantRandom(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 60
	}
	if n, err := strconv.Atoi(os.Getenv("SHARDWHEEL_STRONG_SEEDS")); err == nil {
		seeds = n
	}
	for seed := range seeds {
		r := rand.New(rand.NewPCG(uint64(seed), 2))
		clk := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clk), WithWorkers(0), WithShards(1+r.IntN(3)), WithTick(time.Millisecond))
		require.NoError(t, err)
		type rec struct {
			tm    Timer
			hold  func()
			every bool
		}
		var timers []*rec
		var held []*Held
		var holding []*rec
		var log []string
		delay := func() time.Duration {
			switch r.IntN(6) {
			case 0:
				return -time.Duration(r.IntN(5)) * time.Millisecond
			case 1:
				return time.Duration(r.IntN(2000)) * time.Microsecond
			case 2:
				return time.Duration(r.IntN(100)) * time.Millisecond
			case 3:
				return time.Duration(r.IntN(10000)) * time.Second
			case 4:
				return time.Duration(r.IntN(300)) * time.Hour
			default:
				return time.Duration(r.IntN(64)) * time.Millisecond
			}
		}
		fail := func(step int, err error) {
			for _, h := range held {
				h.Publish()
			}
			for _, x := range holding {
				x.hold()
			}
			w.Stop()
			t.Fatalf("seed %d step %d: %v\n%v", seed, step, err, log)
		}
		for step := 0; step < 300; step++ {
			switch op := r.IntN(14); {
			case op < 3:
				tm, err := w.AfterFunc(delay(), func() {})
				require.NoError(t, err)
				timers = append(timers, &rec{tm: tm})
				log = append(log, "arm")
			case op == 3:
				d := delay()
				if d <= 0 {
					d = time.Millisecond
				}
				tm, err := w.Every(d, func() {})
				require.NoError(t, err)
				timers = append(timers, &rec{tm: tm, every: true})
				log = append(log, "every")
			case op == 4 && len(held) < 4:
				h := w.ArmHeld(delay(), func(any) {}, nil)
				held = append(held, h)
				log = append(log, "armHeld")
			case op == 5 && len(timers) > 0:
				if x := timers[r.IntN(len(timers))]; x.hold == nil {
					x.tm.Stop()
					log = append(log, "stop")
				}
			case op == 6 && len(timers) > 0 && len(held) < 4:
				if x := timers[r.IntN(len(timers))]; x.hold == nil {
					if ok, h := x.tm.StopHeld(); ok && h != nil {
						held = append(held, h)
					}
					log = append(log, "stopHeld")
				}
			case (op == 7 || op == 8) && len(timers) > 0:
				if x := timers[r.IntN(len(timers))]; x.hold == nil {
					x.tm.Reset(delay())
					log = append(log, "reset")
				}
			case op == 9 && len(timers) > 0 && len(holding) < 3:
				if x := timers[r.IntN(len(timers))]; x.hold == nil {
					if ok, rel := x.tm.ResetHeld(delay()); ok {
						x.hold = rel
						holding = append(holding, x)
					}
					log = append(log, "resetHeld")
				}
			case op == 10 && len(holding) > 0:
				k := r.IntN(len(holding))
				holding[k].hold()
				holding[k].hold = nil
				holding = append(holding[:k], holding[k+1:]...)
				log = append(log, "release")
			case op == 11 && len(held) > 0:
				k := r.IntN(len(held))
				h := held[k]
				held = append(held[:k], held[k+1:]...)
				h.Publish()
				if h.IsArm() {
					timers = append(timers, &rec{tm: h.Timer()})
				}
				log = append(log, "publish")
			case op == 12:
				s := w.shards[r.IntN(len(w.shards))]
				takeRing(s) // as a producer whose ring is full does, or the trimmer
				log = append(log, "drain")
			default:
				d := []time.Duration{0, time.Millisecond, time.Duration(r.IntN(100)) * time.Millisecond, time.Hour, 100 * time.Hour}[r.IntN(5)]
				clk.Advance(d)
				log = append(log, fmt.Sprintf("advance %v", d))
			}
			if err := strongVerifyAll(w); err != nil {
				fail(step, err)
			}
		}
		for _, h := range held {
			h.Publish()
		}
		for _, x := range holding {
			x.hold()
		}
		clk.Advance(0)
		if err := strongVerifyAll(w); err != nil {
			fail(-1, err)
		}
		w.Stop()
	}
}

// TestStrongVerifySelfCheck: strongVerifyAll catches what it is meant to (a lost wake-up, a
// pending entry linked after its deadline) where Verify does not.
func TestStrongVerifySelfCheck(t *testing.T) {
	w, clk, _ := parkWheel(t)
	tm, err := w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	require.NoError(t, strongVerifyAll(w))
	tm.s.next.Store(2 * int64(time.Hour)) // a lost wake-up for the add in the ring
	require.ErrorContains(t, strongVerifyAll(w), "lost wake-up")
	require.NoError(t, w.Verify(), "Verify drains it and sees nothing (and on a manual clock does not fix next)")
	tm.s.next.Store(int64(time.Hour))
	clk.Advance(time.Millisecond)
	e := tm.s.slab.at(tm.i)
	e.when.Store(int64(time.Minute)) // a Reset to earlier that sent no command
	require.ErrorContains(t, strongVerifyAll(w), "linked in a bucket starting")
	require.NoError(t, w.Verify(), "Verify checks no bucket of level 1 and up against its deadlines")
	e.when.Store(int64(time.Hour))
}
