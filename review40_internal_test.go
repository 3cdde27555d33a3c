package shardwheel

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 40: the submission side (AfterFunc/Stop/Reset -> state word -> ring -> drain -> wheel;
// the slab and its trim; WithMaxPending credits), each goroutine paused between two of its steps.

// newWheel40 starts a wheel on a fresh manual clock; the caller stops it (before goleak looks).
func newWheel40(t *testing.T, opts ...Option) (*Wheel, *ManualClock) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(append([]Option{WithClock(clk)}, opts...)...)
	require.NoError(t, err)
	return w, clk
}

// booksBalance requires Scheduled == Fired + Stopped + Dropped + Pending and Lateness.Count() ==
// Fired on a quiet wheel.
func booksBalance(t *testing.T, w *Wheel) Stats {
	t.Helper()
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "%+v", st)
	require.Equal(t, st.Fired, st.Lateness.Count(), "%+v", st)
	return st
}

// TestReview40PinQueuedResetBehindHeldSlot (pin): a producer is paused after claiming the ring's
// head slot (ArmHeld). Behind it, a timer T is armed (its add is queued behind the held slot) and
// then Reset to an earlier deadline (its reset command is behind too). The shard can see neither
// command: an Advance past T's new deadline must not fire it (never early is not at stake, but
// nothing may fire from an entry whose add the shard has not taken), and it must not be lost:
// once the paused producer publishes, its kick makes the next Advance(0) take the ring, and T
// fires once, at no earlier than its reset deadline, and so does the held arm.
func TestReview40PinQueuedResetBehindHeldSlot(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := newWheel40(t, WithShards(1), WithWorkers(0), WithRingSize(64))
	defer w.Stop()

	var heldRan, tRan int
	var tRanAt int64
	h := w.ArmHeld(time.Millisecond, func(any) { heldRan++ }, nil)
	tm, err := w.AfterFuncArg(10*time.Millisecond, func(any) {
		tRan++
		tRanAt = clk.elapsed.Load()
	}, nil)
	require.NoError(t, err)
	require.True(t, tm.Queued(), "T's add waits behind the held slot")
	require.True(t, tm.Reset(3*time.Millisecond), "Reset of a queued, pending timer")
	resetDue := int64(3 * time.Millisecond)

	clk.Advance(5 * time.Millisecond) // past T's reset deadline and the held arm's
	require.Zero(t, tRan, "T fired though its add was never taken")
	require.Zero(t, heldRan, "the held arm fired before it was published")
	require.True(t, tm.Queued(), "the add is still behind the held slot")
	require.Equal(t, 1, w.Len(), "T is pending (the held arm is not counted until it returns)")

	h.Publish() // the paused producer goes on: its publish kicks the stalled shard
	clk.Advance(0)
	require.Equal(t, 1, tRan, "T fired once after the held slot was published")
	require.Equal(t, 1, heldRan, "the held arm fired once")
	require.GreaterOrEqual(t, tRanAt, resetDue, "T fired before its reset deadline")
	require.False(t, tm.Stop(), "a fired timer cannot be stopped")
	require.False(t, tm.Reset(time.Millisecond), "a fired timer cannot be reset")
	require.Zero(t, w.Len())
	booksBalance(t, w)
	require.NoError(t, w.Verify())
	require.Zero(t, w.Stop())
}

// TestReview40PinMaxPendingStopQueuedBehindHeld (pin): WithMaxPending(2) with one producer paused
// on the ring's head slot, holding one credit: a second timer T (queued behind it) takes the last
// credit, the third arm is refused with an error that names the bound, T's Stop (no command: its
// add is still queued) gives the credit back at once, before the shard has seen anything, so the
// next arm is accepted. After the publish, the shard frees T's entry when it takes T's add, and
// nothing of T ever runs; the books balance, and both places are free again once all is over.
func TestReview40PinMaxPendingStopQueuedBehindHeld(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := newWheel40(t, WithShards(1), WithWorkers(0), WithRingSize(64), WithMaxPending(2))
	defer w.Stop()
	s := w.shards[0]

	ran := map[string]int{}
	mk := func(name string) func(any) { return func(any) { ran[name]++ } }
	h := w.ArmHeld(time.Millisecond, mk("held"), nil)
	tm, err := w.AfterFuncArg(time.Millisecond, mk("T"), nil)
	require.NoError(t, err)
	_, err = w.AfterFuncArg(time.Millisecond, mk("refused"), nil)
	require.ErrorIs(t, err, ErrTooManyTimers)
	require.True(t, strings.Contains(err.Error(), "WithMaxPending(2)"), "the error names the bound: %v", err)

	tailBefore := s.ring.tail.Load()
	require.True(t, tm.Queued())
	require.True(t, tm.Stop(), "Stop of a queued pending timer")
	require.Equal(t, tailBefore, s.ring.tail.Load(), "a Stop of a queued timer sends no command")
	require.False(t, tm.Stop(), "a second Stop reports false")
	require.False(t, tm.Reset(time.Millisecond), "Reset of a stopped timer reports false")

	u, err := w.AfterFuncArg(time.Millisecond, mk("U"), nil)
	require.NoError(t, err, "T's Stop gave its place back")
	ui, _ := u.Slot()
	ti, _ := tm.Slot()
	require.NotEqual(t, ti, ui, "T's entry is not free before the shard takes its add")

	h.Publish()
	clk.Advance(time.Millisecond)
	require.Equal(t, map[string]int{"held": 1, "U": 1}, ran)
	require.Zero(t, w.Len())
	st := booksBalance(t, w)
	require.Equal(t, uint64(1), st.Stopped)
	require.Equal(t, uint64(1), st.Rejected)

	// Both places are free: two timers are accepted, and T's entry is reused (last in, first
	// out after the drain that freed it), with a gen above T's.
	a, err := w.AfterFuncArg(time.Hour, mk("a"), nil)
	require.NoError(t, err)
	b, err := w.AfterFuncArg(time.Hour, mk("b"), nil)
	require.NoError(t, err)
	_, err = w.AfterFuncArg(time.Hour, mk("c"), nil)
	require.True(t, errors.Is(err, ErrTooManyTimers))
	_, tgen := tm.Slot()
	for _, x := range []Timer{a, b} {
		if i, g := x.Slot(); i == ti {
			require.Greater(t, g, tgen)
		}
	}
	require.False(t, tm.Stop(), "T's stale handle does nothing to the entry's new owner")
	require.Equal(t, 2, w.Len())
	require.Equal(t, 2, w.Stop(), "both are pending at Stop")
	booksBalance(t, w)
}

// TestReview40PinStaleResetCommandOnRegrownChunk (pin): a Reset paused after its release and
// before its send (timer.go's release, step 4) publishes its command late. Meanwhile its timer
// fired, its chunk was trimmed away and re-grown in the same slot of the table, where the free
// entries start at genFloor: the very gen the stale command carries. The command must find the
// entry free and do nothing; nor may the stale handle's Stop or Reset act on it; and the entry's
// next owner fires once, at its own deadline. The late command is injected with send, exactly
// as release's step 4 sends it (no hook pauses Reset there).
func TestReview40PinStaleResetCommandOnRegrownChunk(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := newWheel40(t, WithShards(1), WithWorkers(0))
	defer w.Stop()
	s := w.shards[0]

	noop := func(any) {}
	old1, err := w.AfterFuncArg(time.Millisecond, noop, nil)
	require.NoError(t, err)
	old2, err := w.AfterFuncArg(time.Millisecond, noop, nil)
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Zero(t, w.Len())
	require.Equal(t, blockBytes, w.TrimNow(), "the only chunk, all free, is given back")
	i1, g1 := old1.Slot()
	i2, g2 := old2.Slot()
	require.Equal(t, g1, g2)
	require.Equal(t, g1, s.slab.genFloor, "genFloor is the highest gen of the released chunk")

	// Re-grow: the first new timer takes i1 (grow hands out the chunk's first entry) with a gen
	// above the floor; i2 is free in the new chunk at gen genFloor == the stale handle's gen.
	var fired []string
	n1, err := w.AfterFuncArg(5*time.Millisecond, func(any) { fired = append(fired, "n1") }, nil)
	require.NoError(t, err)
	ni1, ng1 := n1.Slot()
	require.Equal(t, i1, ni1)
	require.Greater(t, ng1, g1)
	e2 := s.slab.at(i2)
	require.True(t, isGen(e2.state.Load(), g2), "the free entry sits at the floor: the stale gen")
	require.True(t, isState(e2.state.Load(), stFree))

	require.False(t, old2.Stop(), "a stale Stop on a free entry of its own gen")
	require.False(t, old2.Reset(time.Millisecond), "a stale Reset on a free entry of its own gen")
	require.False(t, old1.Stop())
	require.False(t, old1.Reset(time.Millisecond))

	// The late reset command of old2, and of old1 (whose index now serves n1), taken by the shard.
	ok, _ := s.send(i2, g2, opReset)
	require.True(t, ok)
	ok, _ = s.send(i1, g1, opReset)
	require.True(t, ok)
	takeRing(s)
	require.True(t, isState(e2.state.Load(), stFree), "the stale command moved a free entry")
	require.False(t, e2.linked(), "the stale command linked a free entry")

	// The next owner of i2 fires once at its own deadline, as does n1.
	n2, err := w.AfterFuncArg(7*time.Millisecond, func(any) { fired = append(fired, "n2") }, nil)
	require.NoError(t, err)
	ni2, ng2 := n2.Slot()
	require.Equal(t, i2, ni2, "the free entry at the floor is reused")
	require.Greater(t, ng2, g2)
	ok, _ = s.send(i2, g2, opReset) // once more, now that i2 has a pending owner
	require.True(t, ok)
	clk.Advance(4 * time.Millisecond)
	require.Empty(t, fired, "nothing is due yet")
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"n1"}, fired)
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"n1"}, fired, "n2 fired early")
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"n1", "n2"}, fired)
	require.Zero(t, w.Len())
	booksBalance(t, w)
	require.NoError(t, w.Verify())
	require.Zero(t, w.Stop())
}

// TestReview40FixedOneShotResetVersionWrap: the state word's version has versionBits bits. The
// shard reads the word, then the deadline, then CASes the word it read. Paused between the two
// reads and the CAS while a Reset loop moves the timer later 2^versionBits times (a later
// deadline sends no command, so nothing waits for the shard's lock), the word comes back to the
// one the shard read and its CAS succeeds, on the deadline the first Reset replaced: the timer
// fired 1 ms after it was armed, its deadline then about a second later. Review 34 fixed the
// same wrap for Every's ev.when; a one-shot fired early.
func TestReview40FixedOneShotResetVersionWrap(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := newWheel40(t, WithShards(1), WithWorkers(0))
	defer w.Stop()

	var ran int
	var ranAt int64
	tm, err := w.AfterFuncArg(time.Millisecond, func(any) {
		ran++
		ranAt = clk.elapsed.Load()
	}, nil)
	require.NoError(t, err)
	clk.Advance(0) // the shard takes the add: the entry is linked, not queued

	var resets int
	var last int64
	testHookExpiring = func(e *entry) {
		if resets > 0 {
			return
		}
		for resets < 1<<versionBits {
			resets++
			d := time.Second + time.Duration(resets)*time.Microsecond
			require.True(t, tm.Reset(d), "Reset %d", resets)
		}
		last = clk.elapsed.Load() + int64(time.Second) + int64(resets)*int64(time.Microsecond)
	}
	defer func() { testHookExpiring = nil }()

	clk.Advance(time.Millisecond)
	require.Equal(t, 1<<versionBits, resets, "the hook ran its Resets")
	require.Zero(t, ran, "fired at %v, before the deadline of its last Reset (%v)", ranAt, last)

	clk.Advance(time.Duration(last-clk.elapsed.Load()) - 1)
	require.Zero(t, ran, "fired before the deadline of its last Reset")
	clk.Advance(1)
	require.Equal(t, 1, ran, "fires once, at the deadline of its last Reset")
	require.Equal(t, last, ranAt)
	require.False(t, tm.Stop())
	booksBalance(t, w)
}
