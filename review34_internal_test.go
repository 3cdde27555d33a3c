package shardwheel

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

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

// TestReview34FixedEveryResetVersionWrap: Every's doc promises that after Reset(d) "the runs after
// it are due whole intervals after the instant that run was due at (d from the Reset)". Before
// the first run, runPeriodic told a Reset only by the version in the state word (ev.when was 0),
// which is 20 bits: 2^20 Resets (a keep-alive, say) wrapped it to the armed value, the Reset went
// unseen, and the series kept the old grid (next run at 20ms, not 13ms). schedule now records
// the first run's deadline too.
func TestReview34FixedEveryResetVersionWrap(t *testing.T) {
	defer goleak.VerifyNone(t)
	require.Equal(t, int32(2), everyResetN(t, 1<<versionBits), "second run due 13ms (3ms + 10ms)")
}

// TestReview34PinEveryResetNoWrap: the same with one Reset fewer keeps the rate from the Reset.
func TestReview34PinEveryResetNoWrap(t *testing.T) {
	defer goleak.VerifyNone(t)
	require.Equal(t, int32(2), everyResetN(t, 1))
}

// TestReview34PinLetGoStormEveryReset: Every and one-shot timers that come due together are
// stopped (from their own callbacks, from each other's, from outside), reset and stopped again
// with stale handles, while the manual clock advances on several workers. Each one-shot ran or
// had one Stop report true, never both; no Every runs after the Stop that reported true; the
// books balance; and the slab then hands out each entry to one timer at a time.
func TestReview34PinLetGoStormEveryReset(t *testing.T) {
	defer goleak.VerifyNone(t)
	for round := 0; round < 3; round++ {
		clk := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clk), WithShards(2), WithWorkers(3))
		require.NoError(t, err)
		const n = 1500
		tms := make([]Timer, n)
		var ran, stopped, ranAtStop [n]atomic.Int32
		var armed atomic.Bool
		for i := 0; i < n; i++ {
			i := i
			stopOther := func() {
				if !armed.Load() {
					return
				}
				j := (i*7 + 3) % n
				if tms[j].Stop() {
					ranAtStop[j].Store(ran[j].Load())
					stopped[j].Add(1)
				}
			}
			if i%3 == 0 {
				tms[i], err = w.Every(time.Millisecond, func() {
					ran[i].Add(1)
					stopOther()
				})
			} else {
				tms[i], err = w.AfterFunc(time.Duration(1+i%2)*time.Millisecond, func() {
					ran[i].Add(1)
					stopOther()
				})
			}
			require.NoError(t, err)
		}
		armed.Store(true)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for k := 0; k < n; k++ {
				j := (k * 13) % n
				if k%5 == 0 {
					tms[j].Reset(time.Millisecond)
				}
				if tms[j].Stop() {
					ranAtStop[j].Store(ran[j].Load())
					stopped[j].Add(1)
				}
			}
		}()
		for k := 0; k < 6; k++ {
			clk.Advance(time.Millisecond)
		}
		<-done
		for i := 0; i < n; i += 3 { // end every series still going
			if tms[i].Stop() {
				ranAtStop[i].Store(ran[i].Load())
				stopped[i].Add(1)
			}
		}
		require.Eventually(t, func() bool { return w.Stats().Queued == 0 }, 5*time.Second, time.Millisecond)
		clk.Advance(time.Millisecond)
		require.Eventually(t, func() bool { return w.Stats().Queued == 0 }, 5*time.Second, time.Millisecond)
		// The slab after the storm: every new timer runs once.
		requireFreshTimersRunOnce(t, w, clk, n)
		require.Zero(t, w.Stop())
		for i := 0; i < n; i++ {
			r, s := ran[i].Load(), stopped[i].Load()
			require.LessOrEqual(t, s, int32(1), "timer %d stopped twice", i)
			if i%3 == 0 {
				require.Equal(t, int32(1), s, "series %d never stopped", i)
				// A run in progress at the Stop (started by the wheel, its count not yet
				// taken) may count after it; no other may start.
				require.LessOrEqual(t, ran[i].Load(), ranAtStop[i].Load()+1, "series %d ran after its Stop", i)
			} else {
				require.Equal(t, int32(1), r+s, "timer %d: ran %d, stopped %d", i, r, s)
			}
		}
		st := w.Stats()
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending))
		require.Equal(t, st.Fired, st.Lateness.Count())
		require.Zero(t, st.Queued)
	}
}

// TestReview34PinLatenessStrideBound (review 34 reported it as a bug; it is the documented bound
// of lateClock's stride): Stats.Lateness counts "how late each callback started", read "as
// callbacks start" so that the callbacks behind a slow one in a batch show how late they were.
// After a flood of quick callbacks the stride is 16 (lateClock), and up to 15 callbacks after a
// slow one share the reading taken before it started. Here 31 callbacks start at least 30 ms
// after their deadline, and all but those 15 at most are counted 16 ms late or more.
// The stride the slot's last batch ended with is set by hand to what a flood of quick callbacks
// leaves (lateStride; reached by runFrom without the race detector, whose overhead keeps each
// callback above lateQuick): without -race, 64 real timers on one worker show the same, 17 of 32.
func TestReview34PinLatenessStrideBound(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, err := New(WithShards(1), WithWorkers(1))
	require.NoError(t, err)
	defer w.Stop()
	s := w.shards[0]
	const n = 32
	var k atomic.Int32
	s.mu.Lock() // the keeper cannot fire them: this test does, as an advance step would
	for i := 0; i < n; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			if k.Add(1) == 1 {
				time.Sleep(30 * time.Millisecond) // the slow one, first of its batch
			}
		})
		require.NoError(t, err)
	}
	time.Sleep(2 * time.Millisecond)
	s.advanceLocked(w.nanos(), 0)
	refs := append([]ref(nil), s.fired...)
	clear(s.fired)
	s.fired = s.fired[:0]
	s.mu.Unlock()
	require.Len(t, refs, n)

	other := w.pool.advancerSlot() // used by no goroutine on the system clock (dispatch is manual's)
	other.stride = lateStride
	base := w.Stats().Lateness
	w.runBatch(refs, other)
	late := w.Stats().Lateness
	var slow uint64 // callbacks counted at least 16.384 ms late (buckets 15 and up)
	for i := 15; i < len(late.Buckets); i++ {
		slow += late.Buckets[i] - base.Buckets[i]
	}
	require.Equal(t, int32(n), k.Load())
	require.GreaterOrEqual(t, slow, uint64(n-1-(lateStride-1)),
		"callbacks that started >= 30 ms after their deadline, counted as >= 16 ms late")
}

// TestReview34PinPeriodicBit: the periodic bit is set for an Every's arming only, and survives a
// Reset, its firing, its run and its re-arm; a one-shot armed next on the same entry has none.
func TestReview34PinPeriodicBit(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	s := w.shards[0]
	var seen []uint64
	var tm Timer
	tm, err = w.Every(time.Millisecond, func() { seen = append(seen, s.slab.at(tm.i).state.Load()) })
	require.NoError(t, err)
	e := s.slab.at(tm.i)
	require.True(t, isPeriodic(e.state.Load()))
	require.True(t, tm.Reset(2*time.Millisecond))
	require.True(t, isPeriodic(e.state.Load()))
	clk.Advance(2 * time.Millisecond)
	clk.Advance(time.Millisecond)
	require.Len(t, seen, 2)
	for _, st := range seen {
		require.True(t, isPeriodic(st) && isState(st, stRunning))
	}
	require.True(t, isPeriodic(e.state.Load()) && isState(e.state.Load(), stPending))
	require.True(t, tm.Stop())
	clk.Advance(time.Millisecond) // the cancel frees the entry
	t1, err := w.AfterFunc(time.Millisecond, func() {})
	require.NoError(t, err)
	require.Equal(t, tm.i, t1.i)
	require.False(t, isPeriodic(e.state.Load()))
	require.False(t, tm.Stop(), "a stale handle")
}
