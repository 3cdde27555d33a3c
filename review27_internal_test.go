package shardwheel

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Review 27: contexts (context.go), memory given back (trim.go, pool.go), bad input (options.go,
// clock.go and the entry points).

// manualWrapper is a Clock that is a *ManualClock to its user: a struct embedding one satisfies
// the Clock interface (its unexported method is promoted), so WithClock accepts it.
type manualWrapper struct{ *ManualClock }

// TestReview27WithClockWrappedManual (bug, bad input): WithClock accepts any Clock, but the wheel
// recognises a manual clock only by the dynamic type *ManualClock (shardwheel.go:160; WithClock,
// options.go:204-207). A Clock that embeds a *ManualClock is accepted without an error, and the
// wheel then keeps time on the system clock (nanos, clock.go:115) while its contexts read Now from
// the wrapper (context.go:62, 80, 478):
// Advance never fires its timers, timers fire on the real clock while the manual one stands still,
// and a context's Deadline is on the manual clock's scale while its timer runs on the real one.
// API.md: "A wheel built WithClock(manual) reads time only from it"; an option the wheel cannot
// honour must be an error naming it.
func TestReview27WithClockWrappedManual(t *testing.T) {
	m := NewManualClock(time.Unix(0, 0))
	_, err := New(WithClock(manualWrapper{m}), WithShards(1), WithWorkers(0))
	require.Error(t, err)
	require.Contains(t, err.Error(), "WithClock", "the error names the option")
	require.Contains(t, err.Error(), "manualWrapper", "the error names the value's type")
	// The package's own clocks are still accepted.
	w, err := New(WithClock(m), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	w.Stop()
}

// TestReview27EndOfTimeOnLateWheel (bug, huge delays): ManualClock.Advance says the clock
// "saturates at math.MaxInt64 nanoseconds past its start, the end of time, where every timer is
// due", and API.md that any d up to math.MaxInt64 fires at its time, never lost. A wheel attached
// to a clock that had already moved keeps time as the clock's elapsed minus manualBase
// (clock.go:113), which stops at math.MaxInt64-manualBase, but deadlineFrom saturates at
// math.MaxInt64 (clock.go:127): a timer whose deadline lands past the wheel's own end of time is
// never due, on a clock that can move no further. Its callback never runs, Len stays 1. (So does
// AfterFunc(1ns) armed at the end of time, which fires on a wheel made before the clock moved.)
func TestReview27EndOfTimeOnLateWheel(t *testing.T) {
	m := NewManualClock(time.Unix(0, 0))
	m.Advance(time.Hour) // the clock served another wheel first
	w, err := New(WithClock(m), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	fired := 0
	_, err = w.AfterFunc(math.MaxInt64, func() { fired++ })
	require.NoError(t, err)
	m.Advance(math.MaxInt64) // the end of time
	require.Equal(t, 1, fired, "a timer is not due at the end of time (Len %d)", w.Len())
	// Armed at the end of time, a timer of 1 ns is due there too.
	_, err = w.AfterFunc(time.Nanosecond, func() { fired++ })
	require.NoError(t, err)
	m.Advance(0)
	require.Equal(t, 2, fired, "a timer armed at the end of time is not due there (Len %d)", w.Len())
	require.Zero(t, w.Len())
}

// TestReview27StaleHandlesAcrossTrim (pin): handles of timers whose chunks were given back and
// whose indices now serve new timers are inert, also on the old chunk object a paused Stop or
// Reset may still hold (it loaded the table before the trim): they never stop, move or free a
// new timer, and every new timer fires once.
func TestReview27StaleHandlesAcrossTrim(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	s := w.shards[0]
	const n = 3*blockLen - 100 // three chunks, the last partly used
	noop := func(any) {}
	old := make([]Timer, n)
	for i := range old {
		old[i], err = w.AfterFuncArg(time.Duration(i%5)*time.Millisecond, noop, nil)
		require.NoError(t, err)
	}
	for i, h := range old { // some fire, the rest are stopped: every entry ends up free
		if i%2 == 0 {
			require.True(t, h.Stop())
		}
	}
	clk.Advance(10 * time.Millisecond)
	require.Zero(t, w.Len())
	oldTbl := *s.slab.blocks.Load() // what a Stop or Reset paused before the trim holds
	require.Equal(t, 3*blockBytes, w.Stats().HeldBytes)
	require.Equal(t, 3*blockBytes, w.TrimNow())
	require.Zero(t, w.Stats().HeldBytes)

	var fired int
	count := func(any) { fired++ }
	fresh := map[uint32]Timer{}
	for range n {
		h, err := w.AfterFuncArg(time.Hour, count, nil)
		require.NoError(t, err)
		i, _ := h.Slot()
		fresh[i] = h
	}
	reused := 0
	for _, h := range old {
		i, gen := h.Slot()
		if nh, ok := fresh[i]; ok {
			reused++
			_, ngen := nh.Slot()
			require.Greater(t, ngen, gen, "index %d: the new timer's gen is not above the stale one's", i)
		}
		require.False(t, h.Stop(), "a stale Stop acted")
		require.False(t, h.Reset(time.Millisecond), "a stale Reset acted")
		_, ok := h.hold(&oldTbl[i>>blockBits][i&blockMask]) // a Reset that read the old table
		require.False(t, ok, "a stale Reset claimed the old chunk's entry")
	}
	require.Greater(t, reused, n/2, "the new timers reuse the stale handles' indices")
	require.Equal(t, n, w.Len(), "every new timer is pending")
	clk.Advance(time.Hour)
	require.Equal(t, n, fired, "every new timer fired once")
	require.NoError(t, w.Verify())
}

// TestReview27ContextCancelAcrossTrim (pin): a context whose timer fired, whose entry went back
// to the slab, was trimmed away and re-grown for another timer, does nothing to that timer when
// its cancel func is called late; nor does one cancelled by its wheel parent after such a cycle.
func TestReview27ContextCancelAcrossTrim(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	ctx, cancel := w.WithTimeout(context.Background(), time.Millisecond)
	dc := ctx.(*deadlineCtx)
	clk.Advance(time.Millisecond)
	require.Equal(t, context.DeadlineExceeded, ctx.Err())
	require.Equal(t, blockBytes, w.TrimNow())
	fired := 0
	h, err := w.AfterFunc(time.Hour, func() { fired++ })
	require.NoError(t, err)
	i, _ := h.Slot()
	ci, _ := dc.timer.Slot()
	require.Equal(t, ci, i, "the new timer took the context's old index")
	cancel()
	require.Equal(t, 1, w.Len())
	require.Equal(t, context.DeadlineExceeded, ctx.Err())
	clk.Advance(time.Hour)
	require.Equal(t, 1, fired)
}

// TestReview27OptionErrors (pin): every invalid option value fails New with a nil Wheel and an
// error that names the option and the value, in API.md's form.
func TestReview27OptionErrors(t *testing.T) {
	for _, c := range []struct {
		opt  Option
		want string
	}{
		{WithTick(0), "shardwheel: WithTick(0): tick must be positive"},
		{WithTick(-time.Second), "shardwheel: WithTick(-1s): tick must be positive"},
		{WithShards(0), "shardwheel: WithShards(0): "},
		{WithShards(maxShards + 1), "shardwheel: WithShards(4097): "},
		{WithWorkers(-1), "shardwheel: WithWorkers(-1): "},
		{WithQueueSize(0), "shardwheel: WithQueueSize(0): "},
		{WithRingSize(0), "shardwheel: WithRingSize(0): "},
		{WithRingSize(-5), "shardwheel: WithRingSize(-5): "},
		{WithMaxPending(-1), "shardwheel: WithMaxPending(-1): "},
		{WithFullPolicy(FullPolicy(7)), "shardwheel: WithFullPolicy(FullPolicy(7)): "},
		{WithClock(nil), "shardwheel: WithClock(nil): "},
		{WithClock((*ManualClock)(nil)), "shardwheel: WithClock((*ManualClock)(nil)): "},
		{WithPanicHandler(nil), "shardwheel: WithPanicHandler(nil): "},
	} {
		w, err := New(WithShards(1), c.opt)
		require.Nil(t, w)
		require.ErrorContains(t, err, c.want)
	}
}
