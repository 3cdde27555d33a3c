package shardwheel

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Mutation 36: tests that kill mutants of the library which the suite let live. Each test names
// the mutant it was written against; all of them pass on the library as it is.

// payload36 is a callback argument whose reachability a test watches (weak pointer).
type payload36 struct{ _ [64]byte }

// TestMutation36StopOfTakenTimerLetsGoAtOnce: "Let go of the callback now, not when the shard gets
// to the command" (Timer.Stop, a pending timer whose add the shard has taken). On a quiet shard of
// a manual clock nobody drains the cancel until the next Advance: the stopped timer's argument must
// not be reachable through the entry meanwhile. Kills: timer.go, the clearEntry before the cancel
// command dropped.
func TestMutation36StopOfTakenTimerLetsGoAtOnce(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, _ := newManualWheel(t, WithShards(1), WithWorkers(0))
	s := w.shards[0]

	tm := func() Timer {
		tm, err := w.AfterFuncArg(time.Hour, func(any) {}, new(payload36))
		require.NoError(t, err)
		return tm
	}()
	takeRing(s) // the shard takes the add: the entry is linked, no longer queued
	e := s.slab.at(tm.i)
	word := e.state.Load()
	require.True(t, isState(word, stPending) && !isQueued(word) && e.linked())
	wp := weak.Make(e.arg.(*payload36))

	require.True(t, tm.Stop())
	require.Nil(t, e.f, "Stop kept the callback until the shard takes its cancel")
	require.Nil(t, e.arg, "Stop kept the argument until the shard takes its cancel")
	runtime.GC()
	runtime.GC()
	require.Nil(t, wp.Value(), "the stopped timer's argument is still reachable")
	require.Equal(t, 0, w.Len())
}

// TestMutation36LatenessAgainstTickRoundedDeadline: Stats.Lateness counts "how late each callback
// started, against its deadline rounded up to the tick" (API.md). A timer 300µs out on a 1ms tick
// that starts at 1ms started on time by that measure: its lateness is under 1µs (bucket 0), not
// 700µs. Kills: workers.go, lateness measured against the raw deadline.
func TestMutation36LatenessAgainstTickRoundedDeadline(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, clk := newManualWheel(t, WithShards(1), WithWorkers(0), WithTick(time.Millisecond))
	ran := 0
	_, err := w.AfterFunc(300*time.Microsecond, func() { ran++ })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, ran)
	st := w.Stats()
	require.Equal(t, uint64(1), st.Lateness.Count())
	require.Equal(t, uint64(1), st.Lateness.Buckets[0],
		"a callback that started at its deadline rounded up to the tick was counted late: %v", st.Lateness.Buckets)
	require.LessOrEqual(t, st.Lateness.Quantile(1), time.Microsecond)
}

// TestMutation36CanceledRootReachesGrandchild: cancelling the root of a chain of three wheel
// contexts ends every one of them with context.Canceled, as the standard library's chain does;
// the grandchild's end code comes from its parent's end code (endParentCanceled), which must map
// to Canceled again. Kills: context.go, fromParent mapping only endCanceled to a parent's cancel.
func TestMutation36CanceledRootReachesGrandchild(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, _ := newManualWheel(t, WithShards(1), WithWorkers(0))
	root, cancel := w.WithTimeout(context.Background(), time.Hour)
	kid, kcancel := w.WithTimeout(root, time.Hour)
	defer kcancel()
	grand, gcancel := w.WithTimeout(kid, time.Hour)
	defer gcancel()
	great, xcancel := w.WithTimeout(grand, time.Hour)
	defer xcancel()
	_, ok := great.(*deadlineCtx)
	require.True(t, ok, "a chain of wheel contexts under Background stays on the wheel")
	require.Equal(t, 4, w.Len())

	cancel()
	for i, c := range []context.Context{root, kid, grand, great} {
		require.ErrorIs(t, c.Err(), context.Canceled, "context %d of the chain", i)
		require.NotErrorIs(t, c.Err(), context.DeadlineExceeded, "context %d of the chain", i)
		require.ErrorIs(t, context.Cause(c), context.Canceled, "context %d of the chain", i)
		select {
		case <-c.Done():
		default:
			t.Fatalf("context %d of the chain is not done", i)
		}
	}
	require.Equal(t, 0, w.Len(), "the chain's timers were not released")
}

// TestMutation36PublishGroupSignalsEarlierNext: an advancer that lets go of a shard publishes the
// shard's next into its group "and signals the keeper if that is earlier than its target"
// (publishGroup): a keeper that collected while the shard was claimed left the shard out of its
// summary, and sleeps until its target; nothing else tells it about the shard's earlier next.
// Driven on a manual-clock wheel with no goroutines, with the target set as a sleeping keeper's:
// an earlier next leaves a token in wake, a later one leaves none. Kills: expiry.go,
// publishGroup's signal dropped.
func TestMutation36PublishGroupSignalsEarlierNext(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, _ := newManualWheel(t, WithShards(1), WithWorkers(0))
	s := w.shards[0]
	const target = int64(time.Hour)
	t.Cleanup(func() { w.target.Store(awake) })

	// A later next: lowered into the group, no signal.
	w.target.Store(target)
	s.next.Store(2 * target)
	w.publishGroup(s)
	require.Equal(t, 2*target, s.g.next.Load())
	require.Equal(t, 0, len(w.wake), "a next after the keeper's target signalled it")

	// An earlier next: lowered into the group, and the keeper is woken.
	s.next.Store(target / 2)
	w.publishGroup(s)
	require.Equal(t, target/2, s.g.next.Load())
	require.Equal(t, 1, len(w.wake), "a next before the keeper's target did not wake it")
	<-w.wake

	w.target.Store(awake)
	s.next.Store(never)
	s.g.next.Store(never)
}
