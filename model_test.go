package shardwheel_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// The reference model: a deliberately simple scheduler with no concurrency and no wheel, only a
// list of timers and the arithmetic of the contract, in nanoseconds and ticks of a manual clock.
// The harness below (relRun) drives a real Wheel (WithWorkers(0), so callbacks run inside
// ManualClock.Advance on the test's goroutine) and the model with the same operations, and
// requires after every step that exactly the same timers have fired, each once, none early, in
// deadline order by tick within one Advance, and that every Stop and Reset answered as the
// model says.
//
// The deadline rule, written from the contract and not from the core's code:
//   - a timer (re)armed at manual time T with delay d > 0 is due at T+d (deadlines are exact; the
//     tick is only the width of the wheel's buckets); it fires in the first Advance that brings
//     the clock to T+d or beyond;
//   - a timer with d <= 0 is due at once and fires in the next Advance (Advance(0) included);
//   - the clock saturates at math.MaxInt64 ns (the end of time); a timer whose T+d is at or before
//     it fires when the clock gets there. One whose T+d lies beyond it (only possible when armed at
//     T > 0 with a huge d) may fire at the end of time or never: the contract leaves it open (the
//     core has done both), so the model accepts either, and then holds the wheel to what it did;
//   - Every keeps a fixed rate: its first run is due one interval after the call, and after each
//     run the next is due whole intervals after the one that ran, the first such instant strictly
//     after the run ended (the Advance's time): runs due meanwhile are skipped. A Reset moves the
//     next run as for a one-shot timer, and the series then counts its intervals from the instant
//     that run was due at (the Reset's time, for d <= 0).

const (
	mPending = iota
	mFired   // one-shot whose callback ran
	mStopped // a Stop reported true
	mDropped // pending at Wheel.Stop
)

type mTimer struct {
	id       int
	state    int
	armed    int64 // manual time of the (re)arming, ns since the clock's start
	delay    int64 // ns, as passed (may be <= 0)
	periodic bool
	interval int64 // of an Every; a Reset moves only the next run
	// waits are the Stops paused before their publication that held the timer's shard when it
	// was (re)armed: its command waits in the ring behind their slots, so it may fire late, and
	// must fire at the first Advance after the last of them is let go. A hold claimed after the
	// timer's command does not block it: the ring drains up to the first unpublished slot.
	waits []*sw.Held
	// late is set when the last hold the timer waited for was let go: the wheel learns of it
	// after its deadline, so it fires at the next Advance, in ring order rather than deadline
	// order among such timers.
	late bool
	// hold releases a Reset of this timer paused between its claim and its release (nil if
	// none): meanwhile the timer must not fire, and the harness neither stops nor resets it.
	hold func()
	// arming is the arm of this timer, paused before it published its add (nil once it did):
	// until then the arm has not returned, nobody holds the handle, and the wheel does not count
	// the timer or know of it, so it must not fire.
	arming *sw.Held
	runs   int // callbacks that ran
	handle sw.Timer
}

type model struct {
	tick   int64
	now    int64 // ns since start; saturates at math.MaxInt64
	timers []*mTimer
}

// satAdd adds two non-negative int64s, saturating at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// endTick is the tick of the end of time: the boundary that math.MaxInt64 ns rounds up to.
func (m *model) endTick() uint64 {
	return uint64(math.MaxInt64)/uint64(m.tick) + 1 // MaxInt64 is never a whole number of ticks here
}

// key is a pending timer's deadline rounded up to the tick, for checking the order of firing
// within an Advance (the contract orders by that; ties in any order). A d <= 0 timer's deadline
// is the instant it was armed at.
func (m *model) key(t *mTimer) uint64 {
	target := uint64(t.armed) // < 2^64: no overflow in uint64
	if t.delay > 0 {
		target += uint64(t.delay)
	}
	if target >= math.MaxInt64 {
		return m.endTick()
	}
	k := target / uint64(m.tick)
	if target%uint64(m.tick) != 0 {
		k++
	}
	return k
}

// beyond reports whether a timer's deadline lies past the end of time.
func (m *model) beyond(t *mTimer) bool {
	return t.delay > 0 && uint64(t.armed)+uint64(t.delay) > math.MaxInt64
}

// due reports whether a pending timer must have fired once the clock reads m.now.
func (m *model) due(t *mTimer) bool {
	if t.delay <= 0 {
		return true
	}
	if m.beyond(t) {
		return false // see maybe
	}
	if m.now == math.MaxInt64 {
		return true
	}
	return uint64(m.now) >= uint64(t.armed)+uint64(t.delay)
}

// maybe reports whether a pending timer may, but need not, have fired once the clock reads m.now.
func (m *model) maybe(t *mTimer) bool { return m.now == math.MaxInt64 && m.beyond(t) }

func (m *model) pending() int {
	n := 0
	for _, t := range m.timers {
		if t.state == mPending && t.arming == nil {
			n++
		}
	}
	return n
}

// relHarness runs one sequence of operations against a Wheel and the model.
type relHarness struct {
	t      testing.TB
	clock  *sw.ManualClock
	w      *sw.Wheel
	m      model
	fired  []int // ids, in the order their callbacks ran during the current Advance
	log    []string
	stats  struct{ fired, stopped, scheduled uint64 }
	argFns func(any)
	// held are cancels claimed in their rings and not yet published: their Stops are paused
	// between claim and publish, and every command behind them waits (the v1 lost wake-up).
	held []*sw.Held
	// holding are the timers whose Reset is paused (mTimer.hold).
	holding []*mTimer
}

func newRelHarness(t testing.TB, tick time.Duration, shards int) *relHarness {
	h := &relHarness{t: t, m: model{tick: int64(tick)}}
	h.clock = sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, err := sw.New(sw.WithClock(h.clock), sw.WithWorkers(0), sw.WithTick(tick), sw.WithShards(shards))
	require.NoError(t, err)
	h.w = w
	h.argFns = func(arg any) { h.fired = append(h.fired, arg.(int)) }
	h.logf("New(tick=%v, shards=%d)", tick, shards)
	return h
}

func (h *relHarness) logf(format string, args ...any) {
	h.log = append(h.log, fmt.Sprintf(format, args...))
}

// fail reports a mismatch with the sequence of operations that led to it.
func (h *relHarness) fail(format string, args ...any) {
	h.t.Helper()
	for _, hd := range h.held {
		hd.Publish() // Wheel.Stop waits for every claimed slot
	}
	h.held = nil
	for _, mt := range h.holding {
		mt.hold() // Wheel.Stop waits for every held entry
	}
	h.holding = nil
	h.w.Stop()
	h.t.Fatalf("%s\noperations:\n  %s", fmt.Sprintf(format, args...), strings.Join(h.log, "\n  "))
}

func (h *relHarness) check(cond bool, format string, args ...any) {
	h.t.Helper()
	if !cond {
		h.fail(format, args...)
	}
}

func (h *relHarness) schedule(d time.Duration, useArg bool) {
	id := len(h.m.timers)
	h.logf("t%d = AfterFunc(%d) at %d", id, int64(d), h.m.now)
	var tm sw.Timer
	var err error
	if useArg {
		tm, err = h.w.AfterFuncArg(d, h.argFns, id)
	} else {
		tm, err = h.w.AfterFunc(d, func() { h.fired = append(h.fired, id) })
	}
	h.check(err == nil, "AfterFunc(%v): %v", d, err)
	h.m.timers = append(h.m.timers, &mTimer{id: id, armed: h.m.now, delay: int64(d), handle: tm, waits: h.holdsOn(tm)})
	h.stats.scheduled++
	h.checkLen()
}

// armHeld is schedule, paused after the claim of its add's ring slot; publish lets it go on.
// The timer waits behind its own slot (and those held before it on its shard), so it fires at
// the first Advance after the publish if it is due by then (late). It shares maxHeld with
// stopHeld.
func (h *relHarness) armHeld(d time.Duration) {
	if len(h.held) == maxHeld {
		return
	}
	id := len(h.m.timers)
	hd := h.w.ArmHeld(d, h.argFns, id)
	h.logf("t%d = AfterFuncArg(%d) at %d, paused before it publishes (held %d)", id, int64(d), h.m.now, len(h.held))
	tm := hd.Timer()
	h.m.timers = append(h.m.timers, &mTimer{id: id, armed: h.m.now, delay: int64(d), handle: tm,
		waits: append(h.holdsOn(tm), hd), arming: hd})
	h.held = append(h.held, hd)
	h.checkLen()
}

func (h *relHarness) every(d time.Duration) {
	if h.m.now == math.MaxInt64 {
		return // see relAdvance: Every at the end of time is TestClockEveryAtEndOfTime's subject
	}
	id := len(h.m.timers)
	h.logf("t%d = Every(%d) at %d", id, int64(d), h.m.now)
	tm, err := h.w.Every(d, func() { h.fired = append(h.fired, id) })
	h.check(err == nil, "Every(%v): %v", d, err)
	h.m.timers = append(h.m.timers, &mTimer{id: id, armed: h.m.now, delay: int64(d), periodic: true, interval: int64(d), handle: tm, waits: h.holdsOn(tm)})
	h.stats.scheduled++
	h.checkLen()
}

// pick returns timer i (modulo their number), or nil if there is none or a paused Reset holds
// it: Stop or Reset of that timer would wait for the paused Reset, on this very goroutine.
func (h *relHarness) pick(i int) *mTimer {
	if len(h.m.timers) == 0 {
		return nil
	}
	if mt := h.m.timers[i%len(h.m.timers)]; mt.hold == nil && mt.arming == nil {
		return mt
	}
	return nil
}

func (h *relHarness) stop(i int) {
	mt := h.pick(i)
	if mt == nil {
		return
	}
	want := mt.state == mPending
	got := mt.handle.Stop()
	h.logf("t%d.Stop() = %v", mt.id, got)
	h.check(got == want, "t%d.Stop() = %v, model says %v (state %d)", mt.id, got, want, mt.state)
	if want {
		mt.state = mStopped
		h.stats.stopped++
	}
	h.checkLen()
}

// maxHeld bounds the commands paused at once (stopHeld, armHeld), so that what queues behind
// them fits in the ring.
const maxHeld = 4

// stopHeld is stop, paused after the claim of the cancel's ring slot; publish lets it go on.
func (h *relHarness) stopHeld(i int) {
	mt := h.pick(i)
	if mt == nil || len(h.held) == maxHeld {
		return
	}
	want := mt.state == mPending
	got, held := mt.handle.StopHeld()
	h.logf("t%d.Stop() = %v, paused before it publishes (held %d)", mt.id, got, len(h.held))
	h.check(got == want, "t%d.Stop() = %v, model says %v (state %d)", mt.id, got, want, mt.state)
	if want {
		mt.state = mStopped
		h.stats.stopped++
		if held != nil { // nil: the timer's add was still queued, and Stop sent no command
			h.held = append(h.held, held)
		}
	}
	h.checkLen()
}

// publish lets the paused Stop number i (of those held) publish its cancel.
func (h *relHarness) publish(i int) {
	if len(h.held) == 0 {
		return
	}
	i %= len(h.held)
	h.logf("held %d publishes", i)
	hd := h.held[i]
	hd.Publish()
	h.held = slices.Delete(h.held, i, i+1)
	if hd.IsArm() {
		for _, mt := range h.m.timers {
			if mt.arming == hd {
				mt.arming = nil
				h.stats.scheduled++ // the arm counts the timer once it published
			}
		}
	}
	for _, mt := range h.m.timers {
		if mt.behind() {
			if mt.waits = slices.DeleteFunc(mt.waits, func(w *sw.Held) bool { return w == hd }); !mt.behind() {
				mt.late = true
			}
		}
	}
}

// holdsOn returns the paused Stops that hold a slot in the ring of tm's shard: a command tm
// sends now waits behind them.
func (h *relHarness) holdsOn(tm sw.Timer) []*sw.Held {
	var hs []*sw.Held
	for _, hd := range h.held {
		if hd.ShardID() == tm.ShardID() {
			hs = append(hs, hd)
		}
	}
	return hs
}

// behind reports whether the timer's latest arming waits in its ring behind a paused Stop.
func (mt *mTimer) behind() bool { return len(mt.waits) > 0 }

func (h *relHarness) reset(i int, d time.Duration) {
	mt := h.pick(i)
	if mt == nil {
		return
	}
	want := mt.state == mPending
	got := mt.handle.Reset(d)
	h.logf("t%d.Reset(%d) = %v at %d", mt.id, int64(d), got, h.m.now)
	h.check(got == want, "t%d.Reset(%d) = %v, model says %v (state %d)", mt.id, int64(d), got, want, mt.state)
	if want {
		mt.armed, mt.delay = h.m.now, int64(d)
		mt.waits = h.holdsOn(mt.handle)
	}
	h.checkLen()
}

// resetHeld is reset, paused between the claim of the entry and its release (Reset's two
// steps); releaseReset lets it go on. Until then the timer must not fire, whatever Advance does:
// the shard meets a held entry and must neither fire it nor lose it (it parks it, and the Reset
// then sends a command). At most maxHolding are paused at once.
func (h *relHarness) resetHeld(i int, d time.Duration) {
	const maxHolding = 3
	mt := h.pick(i)
	if mt == nil || len(h.holding) == maxHolding {
		return
	}
	want := mt.state == mPending
	got, release := mt.handle.ResetHeld(d)
	h.logf("t%d.Reset(%d) = %v at %d, paused before its release", mt.id, int64(d), got, h.m.now)
	h.check(got == want, "t%d.Reset(%d) = %v, model says %v (state %d)", mt.id, int64(d), got, want, mt.state)
	if want {
		mt.armed, mt.delay = h.m.now, int64(d) // the deadline is read at the call
		mt.hold = release
		h.holding = append(h.holding, mt)
	}
	h.checkLen()
}

// releaseReset lets the paused Reset number i (of those paused) finish. If the shard parked the
// entry meanwhile, the Reset's command moves it; it may then fire at the next Advance in ring
// order rather than deadline order (late), and that command may wait behind paused Stops.
func (h *relHarness) releaseReset(i int) {
	if len(h.holding) == 0 {
		return
	}
	i %= len(h.holding)
	mt := h.holding[i]
	h.logf("t%d's paused Reset releases", mt.id)
	mt.hold()
	mt.hold = nil
	mt.late = true
	mt.waits = h.holdsOn(mt.handle)
	h.holding = slices.Delete(h.holding, i, i+1)
	h.checkLen()
}

func (h *relHarness) zeroHandle(d time.Duration) {
	var z sw.Timer
	h.check(!z.Stop(), "zero Timer.Stop() = true")
	h.check(!z.Reset(d), "zero Timer.Reset() = true")
}

func (h *relHarness) advance(d time.Duration) {
	if satAdd(h.m.now, int64(d)) == math.MaxInt64 {
		// An Every at the end of time would be due again the moment it re-arms; that case has
		// its own test (TestClockEveryAtEndOfTime). Here the series end before the clock gets there.
		for _, mt := range h.m.timers {
			if mt.periodic && mt.state == mPending {
				h.stop(mt.id)
			}
		}
	}
	h.m.now = satAdd(h.m.now, int64(d))
	want := map[int]uint64{}  // id -> due tick: must fire
	maybe := map[int]uint64{} // may fire (past the end of time)
	for _, mt := range h.m.timers {
		if mt.hold != nil || mt.arming != nil {
			continue // a paused Reset holds it, or its arm has not published: it must not fire
		}
		if mt.state == mPending && h.m.due(mt) && !mt.behind() {
			want[mt.id] = h.m.key(mt)
		} else if mt.state == mPending && (h.m.maybe(mt) || h.m.due(mt)) {
			maybe[mt.id] = h.m.key(mt)
		}
	}
	h.fired = h.fired[:0]
	h.clock.Advance(d)
	h.logf("Advance(%d) -> %d fired %v", int64(d), h.m.now, h.fired)

	seen := map[int]bool{}
	var last uint64
	for _, id := range h.fired {
		k, ok := want[id]
		if !ok {
			k, ok = maybe[id]
		}
		h.check(!seen[id], "t%d fired twice in one Advance", id)
		seen[id] = true
		h.check(ok, "t%d fired but is not due (state %d, armed %d, delay %d, now %d): early or stale",
			id, h.m.timers[id].state, h.m.timers[id].armed, h.m.timers[id].delay, h.m.now)
		// Out of order is allowed for a timer whose latest arming waited behind a paused Stop:
		// one still waiting (its old position may fire first, never before the new deadline)
		// or one whose wait just ended (late).
		if mt := h.m.timers[id]; !mt.late && !mt.behind() {
			h.check(k >= last, "t%d (tick %d) fired after a timer of tick %d: out of deadline order", id, k, last)
			last = k
		}
	}
	for id := range want {
		h.check(seen[id], "t%d is due (armed %d, delay %d, now %d) but did not fire", id,
			h.m.timers[id].armed, h.m.timers[id].delay, h.m.now)
	}
	for _, mt := range h.m.timers {
		if mt.hold == nil {
			mt.late = false
		}
	}
	for _, id := range h.fired {
		mt := h.m.timers[id]
		mt.runs++
		h.stats.fired++
		if mt.periodic {
			// Fixed rate: the run that just ran was due at the instant due (the Reset's own
			// time, if a Reset with d <= 0 moved it); the next is due the first whole number
			// of intervals after it that lies strictly after now, when the run ended.
			due := mt.armed
			if mt.delay > 0 {
				due = satAdd(mt.armed, mt.delay)
			}
			n := int64(1)
			if h.m.now >= due {
				n += (h.m.now - due) / mt.interval
			}
			mt.armed, mt.delay = due, satMul(n, mt.interval)
			mt.waits = h.holdsOn(mt.handle)
			h.stats.scheduled++ // each run counts once in Scheduled
		} else {
			mt.state = mFired
		}
	}
	h.checkLen()
}

func (h *relHarness) checkLen() {
	h.t.Helper()
	st := h.w.Stats()
	h.check(st.Pending == h.m.pending(), "Len %d, model %d", st.Pending, h.m.pending())
	h.check(st.Fired == h.stats.fired && st.Stopped == h.stats.stopped && st.Scheduled == h.stats.scheduled,
		"Stats %+v, model fired %d stopped %d scheduled %d", st, h.stats.fired, h.stats.stopped, h.stats.scheduled)
}

// finish stops the wheel: its return value is the model's pending count, every handle is inert
// afterwards, and the counters balance.
func (h *relHarness) finish() {
	for len(h.holding) > 0 {
		h.releaseReset(0) // Wheel.Stop waits for every held entry
	}
	for len(h.held) > 0 {
		h.publish(0) // Wheel.Stop waits for every claimed slot to be published
	}
	want := h.m.pending()
	n := h.w.Stop()
	h.logf("Wheel.Stop() = %d", n)
	h.check(n == want, "Wheel.Stop() = %d, model has %d pending", n, want)
	for _, mt := range h.m.timers {
		h.check(!mt.handle.Stop(), "t%d.Stop() after Wheel.Stop = true", mt.id)
		h.check(!mt.handle.Reset(time.Millisecond), "t%d.Reset() after Wheel.Stop = true", mt.id)
		if mt.state == mPending {
			mt.state = mDropped
		}
		if !mt.periodic {
			h.check(mt.runs <= 1, "t%d ran %d times", mt.id, mt.runs)
		}
	}
	h.fired = h.fired[:0]
	h.clock.Advance(math.MaxInt64)
	h.check(len(h.fired) == 0, "timers fired after Wheel.Stop: %v", h.fired)
	_, err := h.w.AfterFunc(0, func() {})
	h.check(err == sw.ErrClosed, "AfterFunc after Stop: %v", err)
	st := h.w.Stats()
	h.check(st.Scheduled == st.Fired+st.Stopped+st.Dropped, "after Stop: Scheduled %d != Fired %d + Stopped %d + Dropped %d",
		st.Scheduled, st.Fired, st.Stopped, st.Dropped)
	h.check(st.Dropped == uint64(want) && st.Pending == 0, "after Stop: %+v, want Dropped %d", st, want)
}

// relTicks are the ticks the fuzzer picks from: round, odd, and fine enough that the top level
// (2^36 ticks) and the end of time are both reachable. Not 1 ns: at that tick the end of time is
// tick math.MaxInt64, and TestClockEndOfTimeOneNanosecondTick shows Advance never returning there.
var relTicks = []time.Duration{time.Millisecond, 1_000_003, 250 * time.Microsecond, 10 * time.Millisecond, 7 * time.Microsecond}

// relBytes decodes fuzz input; past its end it reads zeros.
type relBytes struct {
	b []byte
	i int
}

func (r *relBytes) u8() uint8 {
	if r.i >= len(r.b) {
		r.i++
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

func (r *relBytes) u16() uint64 { return uint64(r.u8()) | uint64(r.u8())<<8 }
func (r *relBytes) u32() uint64 { return r.u16() | r.u16()<<16 }
func (r *relBytes) u64() uint64 { return r.u32() | r.u32()<<32 }
func (r *relBytes) done() bool  { return r.i >= len(r.b) }

// satMul multiplies non-negative int64s, saturating at math.MaxInt64.
func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

const relYear = int64(365 * 24 * time.Hour)

// delay decodes a delay for AfterFunc or Reset: zero, negative, sub-tick, a few ticks, tick
// boundaries, the top level's edge (2^36 ticks), years, anything up to math.MaxInt64.
func (r *relBytes) delay(tick int64) time.Duration {
	switch r.u8() % 11 {
	case 0:
		return 0
	case 1:
		if r.u8()%4 == 0 {
			return math.MinInt64
		}
		return -time.Duration(r.u16()) - 1
	case 2:
		return time.Duration(r.u8()) + 1 // below a tick, mostly
	case 3:
		return time.Duration(satMul(int64(r.u8()), tick) + int64(r.u8()%3) - 1) // at, just before and after a boundary
	case 4:
		return time.Duration(satMul(int64(r.u32()%(1<<24)), tick))
	case 5:
		return time.Duration(satAdd(satMul(1<<36+int64(r.u8())-128, tick), int64(r.u8()%3))) // around the top level
	case 6:
		return time.Duration(r.u64() >> 1)
	case 7:
		return math.MaxInt64 - time.Duration(r.u8())
	case 8:
		return time.Duration(satMul(int64(r.u8()%10)+1, relYear) + int64(r.u16()))
	case 9:
		return time.Duration(satMul(int64(r.u16()), tick))
	default:
		return time.Duration(satMul(int64(r.u8()), tick/3+1))
	}
}

// advance decodes an Advance amount: zero, a little, some ticks, years, math.MaxInt64.
func (r *relBytes) advance(tick int64) time.Duration {
	switch r.u8() % 9 {
	case 0:
		return 0
	case 1:
		return time.Duration(r.u8())
	case 2:
		return time.Duration(satMul(int64(r.u8()), tick))
	case 3:
		return time.Duration(satMul(int64(r.u16()), tick) + int64(r.u8()))
	case 4:
		return time.Duration(satMul(int64(r.u8()%5)+1, relYear))
	case 5:
		return math.MaxInt64
	case 6:
		return time.Duration(r.u64() >> 1)
	case 7:
		return time.Duration(satMul(1<<36, tick))
	default:
		return time.Duration(satMul(int64(r.u32()%(1<<26)), tick))
	}
}

// relRun decodes data into a sequence of operations and runs it against a Wheel and the model.
//
// With armHeld, a schedule op with bit 32 set pauses the arm before it publishes its add
// (FuzzWheelArmHeld); without, the bit means nothing, as in FuzzWheel's corpus.
func relRun(t testing.TB, data []byte, armHeld bool) {
	r := &relBytes{b: data}
	tick := relTicks[int(r.u8())%len(relTicks)]
	shards := 1 + int(r.u8()%4)
	h := newRelHarness(t, tick, shards)
	for ops := 0; !r.done() && ops < 400; ops++ {
		op := r.u8()
		if op&64 != 0 {
			h.publish(int(op >> 7))
		}
		switch op % 10 {
		case 0, 1, 2:
			if armHeld && op&32 != 0 {
				h.armHeld(r.delay(int64(tick)))
			} else {
				h.schedule(r.delay(int64(tick)), op&16 != 0)
			}
		case 3:
			if op&32 != 0 {
				h.stopHeld(int(r.u16()))
			} else {
				h.stop(int(r.u16()))
			}
		case 4:
			switch {
			case op&48 == 48:
				h.releaseReset(int(r.u8()))
			case op&32 != 0:
				h.resetHeld(int(r.u16()), r.delay(int64(tick)))
			default:
				h.reset(int(r.u16()), r.delay(int64(tick)))
			}
		case 5, 6:
			h.advance(r.advance(int64(tick)))
		case 7:
			d := r.delay(int64(tick))
			if d > 0 {
				h.every(d)
			}
		case 8:
			h.zeroHandle(r.delay(int64(tick)))
			h.advance(0)
		case 9:
			// Stop or Reset the handle of a timer that already fired or was stopped, if any.
			for _, mt := range h.m.timers {
				if mt.state != mPending {
					if op&16 != 0 {
						h.reset(mt.id, r.delay(int64(tick)))
					} else {
						h.stop(mt.id)
					}
					break
				}
			}
		}
	}
	h.advance(r.advance(int64(tick)))
	for len(h.holding) > 0 {
		h.releaseReset(0)
		h.advance(0)
	}
	for len(h.held) > 0 {
		h.publish(0)
		h.advance(0) // a kick must not fire anything early; the model checks every firing
	}
	h.advance(r.advance(int64(tick)))
	h.finish()
}

// TestModelRandomSequences runs random operation sequences through the harness, so that plain
// `go test` covers the model comparison beyond the fuzz corpus.
func TestModelRandomSequences(t *testing.T) {
	n := 300
	if testing.Short() {
		n = 60
	}
	rng := rand.New(rand.NewPCG(5, 5))
	for i := range n {
		data := make([]byte, 64+rng.IntN(512))
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		armHeld := i%2 == 1 // half of them pause arms too (FuzzWheelArmHeld's decoding)
		if !t.Run(fmt.Sprint(i), func(t *testing.T) { relRun(t, data, armHeld) }) {
			t.Logf("failing input (armHeld %v): %q", armHeld, data)
			return
		}
	}
}

// TestModelScenarios holds hand-written sequences whose expected firings are spelled out, so that
// the model itself is checked against the contract and not only against the wheel.
func TestModelScenarios(t *testing.T) {
	tick := time.Millisecond
	h := newRelHarness(t, tick, 2)
	h.schedule(0, false)                           // t0: due at the next Advance
	h.schedule(-time.Second, true)                 // t1: likewise
	h.schedule(1, false)                           // t2: due at 1 ns (deadlines are exact)
	h.schedule(time.Millisecond, false)            // t3: due at 1 ms exactly
	h.schedule(time.Millisecond+1, false)          // t4: due at 1 ms + 1 ns
	h.schedule(time.Duration(1<<36)*tick, false)   // t5: the top level's edge
	h.schedule(time.Duration(1<<36)*tick+1, false) // t6: one ns past it
	h.schedule(math.MaxInt64, false)               // t7: the end of time
	h.advance(0)
	require.Equal(t, []int{0, 1}, sortedInts(h.fired))
	h.advance(1)
	require.Equal(t, []int{2}, h.fired)
	h.advance(999_998)
	require.Empty(t, h.fired)
	h.advance(1)
	require.Equal(t, []int{3}, h.fired)
	h.stop(4)
	h.stop(4)             // stale: already stopped
	h.reset(2, time.Hour) // stale: already fired
	h.reset(5, 3*time.Millisecond)
	h.advance(3 * time.Millisecond)
	require.Equal(t, []int{5}, h.fired)
	h.advance(time.Duration(1<<36) * tick)
	require.Equal(t, []int{6}, h.fired)
	h.advance(math.MaxInt64)
	require.Equal(t, []int{7}, h.fired)
	h.schedule(time.Hour, false) // t8, armed at the end of time: past it, may fire or not
	h.advance(0)
	require.Subset(t, []int{8}, h.fired)
	h.schedule(0, false) // t9, armed at the end of time with d = 0: due at once
	h.advance(0)
	require.Equal(t, []int{9}, h.fired)
	h.schedule(-1, false) // t10: pending at Wheel.Stop
	h.finish()
}

func sortedInts(s []int) []int {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
