package shardwheel

import (
	"math"
	"time"
)

// never is the instant of "no deadline": an empty shard's next, an idle keeper's target. It
// doubles as the end of time (deadlines saturate there), so a timer at the end of time fires when
// a manual clock is advanced that far.
const never = math.MaxInt64

// A Clock is the time source of a Wheel. Its method set is the package's own: the system's
// monotonic clock (the default) and *ManualClock are the implementations, and WithClock accepts
// only those (a type that embeds a *ManualClock has the method set too, and is refused).
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	isClock()
}

// systemClock is the default Clock: time.Now for Now, and for the wheel the monotonic reading
// time.Since(base), which costs one vDSO read (time.Now costs two). A change of the system's
// wall clock changes nothing: only monotonic readings decide firing.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
func (systemClock) isClock()       {}

// nanos returns the time since the wheel started, in nanoseconds on its clock, saturating at the
// end of time.
//
// Where a coarse reading is safe and where it is not: the firing side may use a stale (early)
// reading, since that only fires later; so a keeper reads the clock once per wake. A producer
// must never compute a deadline from a stale reading (that fires early, and with no empty ticks
// the keeper may have slept for an hour), so AfterFunc and Reset read the clock themselves.
func (w *Wheel) nanos() int64 {
	if w.manual != nil {
		e := w.manual.elapsed.Load()
		if e == math.MaxInt64 {
			// The clock's end of time is every wheel's, also of one made after the clock had
			// moved (manualBase > 0): every deadline saturates there, and is due.
			return math.MaxInt64
		}
		return e - w.manualBase
	}
	return int64(time.Since(w.base))
}

// deadlineFrom returns the instant (ns on the wheel's clock) at which a timer armed at the
// reading now with delay d comes due: now+d, never early; d <= 0 is due at once. A deadline past
// the end of time saturates there, where a manual clock can reach it.
func (w *Wheel) deadlineFrom(now int64, d time.Duration) int64 {
	if d <= 0 {
		return now
	}
	return satAddNanos(now, int64(d))
}

// satAddNanos adds two non-negative nanosecond counts, saturating at the end of time.
func satAddNanos(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// grainsPerTick is how finely a wake inside a tick is placed on the system clock: a wake for a
// deadline is rounded up to tick/grainsPerTick (ticks.grain).
const grainsPerTick = 16

// ticks is a Wheel's tick arithmetic: instants (ns on its clock) against ticks, saturating at the
// end of time. Immutable; the Wheel and each shard's timing wheel hold the same value.
type ticks struct {
	tick      int64 // nanoseconds per tick: the width of a bucket of level 0
	lastStart int64 // the last tick whose start is below the end of time, math.MaxInt64/tick
	// grain is what a wake for a deadline inside a tick is rounded up to: tick/grainsPerTick on
	// the system clock, so that a bucket is visited at most about grainsPerTick times in its
	// tick however its deadlines are spread (timingWheel.nextDue); 1 on a manual clock, whose
	// Advance fires everything at or before its time.
	grain int64
}

// newTicks returns the arithmetic of a tick of that many nanoseconds, on a manual clock or not.
func newTicks(tick int64, manual bool) ticks {
	k := ticks{tick: tick, lastStart: math.MaxInt64 / tick, grain: max(tick/grainsPerTick, 1)}
	if manual {
		k.grain = 1
	}
	return k
}

// start returns the instant at which tick t begins, saturating at the end of time.
func (k ticks) start(t int64) int64 {
	if t > k.lastStart {
		return math.MaxInt64
	}
	return t * k.tick
}

// end returns the instant at which tick t ends (the start of the next), saturating.
func (k ticks) end(t int64) int64 {
	if t >= k.lastStart {
		return math.MaxInt64
	}
	return k.start(t + 1)
}

// ceil returns deadline ns rounded up to the tick: the start of the tick it rounds up to (ns
// itself on a tick boundary), saturating at the end of time.
func (k ticks) ceil(ns int64) int64 {
	t := ns / k.tick
	if ns%k.tick != 0 {
		t++
	}
	return k.start(t)
}

// roundUp rounds a deadline up to a whole number of grains, saturating: a wake for it is never
// early, and at most a grain late.
func (k ticks) roundUp(d int64) int64 {
	g := k.grain
	if g <= 1 || d > math.MaxInt64-g {
		return d
	}
	return (d + g - 1) / g * g
}
