package shardwheel

import (
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Timer.Reset: paused between its two steps (Timer.hold, finishReset) while an advance meets the
// entry, a Reset of a queued entry, and the state word's version wrapping round under many Resets.

// TestResetHeldAcrossAdvance: a Reset paused between its two steps (Timer.hold and finishReset)
// while an Advance meets the entry: the advance neither fires it on the deadline being replaced nor
// loses it. The shard parks it, and the Reset, finding it parked, sends the command that moves it
// to its new deadline: later than the old one within the tick in progress, later in the next tick,
// or earlier. It fires once, at that deadline, never before. (Linked at the next tick's start
// instead, a later deadline within the tick in progress would get no command and fire a tick late,
// due already when Advance returned.)
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

// TestResetHeldAtEndOfTime: a timer held by a paused Reset to the end of time (a later deadline,
// for which Reset sends no command by itself) is met by an Advance to the end of time, with a 1 ms
// and a 1 ns tick. It does not fire while held, and once the Reset finishes it fires at the next
// Advance, exactly once: the held entry must not be linked past the last tick that starts before
// the end of time (a bucket no advance takes), nor at a tick that overflows.
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

// TestResetOfQueuedEntryWhileTheShardTakesTheAdd: a Reset holds a queued entry, the shard takes the
// add (clearing queued under the Reset's feet), and the Reset's final CAS fails for that: it
// retries, keeps the timer where the add linked it, and the timer fires at the new deadline,
// earlier or later. With park, an Advance to the old deadline takes the add and meets the held
// entry too: it parks it, the Reset finds it parked and sends its command, and the timer fires at
// the later of the two deadlines (an earlier new one is due at once). Either way it fires once and
// never early.
func TestResetOfQueuedEntryWhileTheShardTakesTheAdd(t *testing.T) {
	const armed = 5 * time.Millisecond
	for _, park := range []bool{false, true} {
		for _, d := range []time.Duration{2 * time.Millisecond, 10 * time.Millisecond} { // earlier, later
			t.Run(fmt.Sprintf("park=%v/%v", park, d), func(t *testing.T) {
				w, clk, since := parkWheel(t)
				var at []time.Duration
				tm, err := w.AfterFunc(armed, func() { at = append(at, since()) })
				require.NoError(t, err)
				require.True(t, tm.Queued())
				ok, release := tm.ResetHeld(d)
				require.True(t, ok)
				want := d
				if park {
					clk.Advance(armed)
					require.True(t, isParked(w, tm))
					require.Empty(t, at)
					want = max(d, armed)
				} else {
					takeRing(tm.s)
					require.True(t, tm.s.slab.at(tm.i).linked(), "the add links a held entry")
				}
				require.False(t, tm.Queued())
				release()
				require.False(t, tm.Queued(), "finishing, the Reset keeps the bit the shard cleared")
				require.Equal(t, park, isParked(w, tm), "parked until the Reset's command is taken")
				if want > since() {
					clk.Advance(want - since() - time.Nanosecond)
					require.Empty(t, at, "never early")
				}
				clk.Advance(want - since())
				require.Equal(t, []time.Duration{want}, at)
				clk.Advance(time.Hour)
				require.Len(t, at, 1)
				require.NoError(t, w.Verify())
				requireBalanced(t, w)
			})
		}
	}
}

// TestResetQueuedBehindUnpublishedSlot: a producer is paused after claiming the ring's head slot
// (ArmHeld). Behind it, a timer T is armed (its add waits behind the unpublished slot) and then
// Reset to an earlier deadline (its reset command waits too). The shard can see neither command: an
// Advance past T's new deadline fires nothing (nothing fires from an entry whose add the shard has
// not taken), and T is not lost: once the paused producer publishes, its kick makes the next
// Advance(0) take the ring, and T fires once, no earlier than its reset deadline, as does the
// paused arm's timer.
func TestResetQueuedBehindUnpublishedSlot(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := timerManualWheel(t, WithShards(1), WithWorkers(0), WithRingSize(64))
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
	requireBooks(t, w)
	require.NoError(t, w.Verify())
	require.Zero(t, w.Stop())
}

// TestResetVersionWrapNeverFiresEarly: the state word's version has versionBits bits. The shard
// reads the word, then the deadline, then CASes the word it read. Paused between the reads and the
// CAS (testHookExpiring) while a Reset loop moves the timer later 2^versionBits times (a later
// deadline sends no command, so nothing waits for the shard's lock), it finds the word back at the
// one it read, and its CAS succeeds, on the deadline the first Reset replaced. The shard then sees
// the deadline moved, puts the word back and looks again (shard.expire): the timer does not fire a
// millisecond after it was armed, but once, exactly at the deadline of its last Reset, about a
// second later.
func TestResetVersionWrapNeverFiresEarly(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := timerManualWheel(t, WithShards(1), WithWorkers(0))
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
	requireBooks(t, w)
}

// TestResetVersionWrapToDueKeepsDeadlineOrder: the shard is paused between its reads of T's word
// and deadline and its CAS (testHookExpiring) while T is Reset 2^versionBits times: all but the
// last to later deadlines (no command), the last with d = 0, to the clock's time (2 ms), which
// sends a reset command and leaves T due in this very Advance, but in a later round than the one
// T was taken in (1 ms). The CAS succeeds on the wrapped word; the shard sees the deadline moved,
// puts the word back and looks again: T goes down to its new tick and fires there, after Z
// (1.5 ms), as ManualClock.Advance promises (deadline order within one Advance), exactly once.
// The last Reset's command, taken once T is linked at its new tick, leaves it there; the books
// balance.
func TestResetVersionWrapToDueKeepsDeadlineOrder(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := timerManualWheel(t, WithShards(1), WithWorkers(0), WithTick(100*time.Microsecond))
	defer w.Stop()

	var order []string
	var tAt int64
	tm, err := w.AfterFunc(time.Millisecond, func() {
		order = append(order, "T")
		tAt = clk.elapsed.Load()
	})
	require.NoError(t, err)
	clk.Advance(0) // the shard takes the add: T is linked
	_, err = w.AfterFunc(1500*time.Microsecond, func() { order = append(order, "Z") })
	require.NoError(t, err)

	te := tm.s.slab.at(tm.i)
	var resets int
	var hookCalls int
	testHookExpiring = func(e *entry) {
		if e != te {
			return
		}
		hookCalls++
		if resets > 0 {
			return
		}
		for resets < 1<<versionBits-1 {
			resets++
			require.True(t, tm.Reset(time.Second+time.Duration(resets)*time.Microsecond), "Reset %d", resets)
		}
		resets++
		require.True(t, tm.Reset(0), "the last Reset")
	}
	defer func() { testHookExpiring = nil }()

	clk.Advance(2 * time.Millisecond)
	require.Equal(t, 1<<versionBits, resets)
	require.Equal(t, []string{"Z", "T"}, order, "T fired in the round of its old deadline, before Z")
	require.Equal(t, 2, hookCalls, "T was judged due twice: at 1 ms (put back) and at 2 ms")
	require.Equal(t, int64(2*time.Millisecond), tAt)
	require.False(t, tm.Stop())
	require.False(t, tm.Reset(time.Millisecond))
	clk.Advance(time.Second * 3)
	require.Equal(t, []string{"Z", "T"}, order, "fires once")
	require.Zero(t, w.Len())
	st := requireBooks(t, w)
	require.Equal(t, uint64(2), st.Fired)
}

// everyResetN arms an Every(10ms) at time 0 on a one-shard manual wheel, Resets it n times to
// 3ms from now (still time 0), advances to 3ms and then to 13ms, and returns the runs seen.
func everyResetN(t *testing.T, n int) int32 {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	var runs atomic.Int32
	tm, err := w.Every(10*time.Millisecond, func() { runs.Add(1) })
	require.NoError(t, err)
	for k := 0; k < n; k++ {
		if !tm.Reset(3 * time.Millisecond) {
			t.Fatalf("Reset %d failed", k)
		}
	}
	clk.Advance(3 * time.Millisecond)
	require.Equal(t, int32(1), runs.Load(), "the first run, at the Reset's 3ms")
	clk.Advance(10 * time.Millisecond) // 13ms: the Reset's run + one interval
	return runs.Load()
}

// TestResetEveryKeepsRateAcrossVersionWrap: after Reset(d) an Every's next runs are due whole
// intervals after the instant that run was due at (Every's doc), however many Resets came before
// its first run: one, or 2^versionBits, which brings the state word's version round to the value
// it was armed with. runPeriodic also compares the deadline the series armed, so it sees the
// Reset either way, and the second run is due 13 ms (3 ms + 10 ms), not on the old grid at 20 ms.
func TestResetEveryKeepsRateAcrossVersionWrap(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, n := range []int{1, 1 << versionBits} {
		t.Run(fmt.Sprint("resets=", n), func(t *testing.T) {
			require.Equal(t, int32(2), everyResetN(t, n), "second run due 13ms (3ms + 10ms)")
		})
	}
}
