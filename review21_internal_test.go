package shardwheel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Review of ac26876 (on the system clock, shard.expire fires a due entry of a later tick as its
// bucket is taken; advanceShard reads the clock again at each budgeted step). These tests probe
// the hazards the change could open; they all passed on ac26876 and are kept as pins.

// strongBare is strongVerify's bucket check for a bare wheel: every linked entry sits in a bucket
// that comes due no later than its deadline's tick (or than elapsed, for a deadline already
// behind it). verify checks level 0's bound only; this checks every level, the overflow, the
// cascade in progress and the soon buckets (eachLinked).
func strongBare(w *timingWheel) error {
	return eachLinked(w, func(where string, startTick int64, _ uint32, e *entry) error {
		if when := e.when.Load(); startTick > max(when/w.tick, w.elapsed) {
			return fmt.Errorf("%s: entry due %d (tick %d) in a bucket starting at %d (elapsed %d)",
				where, when, when/w.tick, startTick, w.elapsed)
		}
		return nil
	})
}

// TestReview21BareSystemBigJumps is TestWheelExactResets/system=true with what it leaves out:
// fresh readings between budgeted steps that jump far (a level-1, level-2 and level-3 span, and
// past the overflow's era), deadlines in the overflow and at the end of time, and an audit that
// each entry fires at most once and that every pending one stays linked (count and position).
// After every step: verify, strongBare, never early (the harness), and after a completed
// advance nothing due is left and the next wake is no later than the earliest deadline rounded
// up to the grain.
func TestReview21BareSystemBigJumps(t *testing.T) {
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

// sysShard returns a one-shard wheel on the system clock whose shard the test holds claimed
// (ownerAdvancing): the keeper never collects it, so the test drives shard.expire's system
// branch by hand with readings of its choice (ahead of the true clock: deadlines are an hour
// out, so the wheel's own time never reaches them). drive is one advanceLocked step under mu;
// run runs what it fired as a worker would. The cleanup frees the claim and stops the wheel.
func sysShard(t *testing.T) (w *Wheel, s *shard, drive func(now int64, budget int) bool, run func() int) {
	t.Helper()
	w, err := New(WithShards(1), WithWorkers(1), WithTick(time.Millisecond))
	require.NoError(t, err)
	s = w.shards[0]
	for !s.owner.CompareAndSwap(ownerNone, ownerAdvancing) {
		time.Sleep(time.Millisecond)
	}
	var batch []ref
	drive = func(now int64, budget int) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		require.Nil(t, s.w.manual)
		done := s.advanceLocked(now, budget)
		batch = append(batch, s.fired...)
		clear(s.fired)
		s.fired = s.fired[:0]
		require.NoError(t, s.tw.verify())
		require.NoError(t, strongBare(&s.tw))
		return done
	}
	run = func() int {
		n := len(batch)
		w.runBatch(batch, &w.pool.slots[len(w.pool.done)])
		clear(batch)
		batch = batch[:0]
		return n
	}
	t.Cleanup(func() {
		s.owner.Store(ownerNone)
		w.publishGroup(s)
		w.Stop()
	})
	return w, s, drive, run
}

// TestReview21HeldResetMeetsFireAhead: a Reset paused between its claim and its release while a
// cascade step of its level-3 bucket is taken with a reading past its old deadline (the fire-
// ahead path): the entry is parked, not fired, and after the release it fires at its new
// deadline, not before, exactly once. Both a later and an earlier new deadline.
func TestReview21HeldResetMeetsFireAhead(t *testing.T) {
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

// requireBalancedSoon: Scheduled == Fired + Stopped + Pending, with pending as expected.
func requireBalancedSoon(t *testing.T, w *Wheel, pending int) {
	t.Helper()
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "counters: %+v", st)
	require.Equal(t, pending, st.Pending)
}

// TestReview21FireAheadRaceFreeEdges: on the fire-ahead path, with budgeted steps at readings
// that move on between steps: a Reset to a later deadline (no command) past the step's reading
// is re-linked, not fired; a Reset to a later deadline still before the reading fires at it; a
// Stop after the step fired an entry (firing) keeps its callback from running; an Every fired
// ahead re-arms a whole interval after its due instant, not from the bucket's start, and does not
// run again before it. Stats balance at the end.
func TestReview21FireAheadRaceFreeEdges(t *testing.T) {
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
