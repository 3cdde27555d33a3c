package shardwheel

import (
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestStopLetsGoOfDroppedCallbacks: every entry Stop drops lets go of its callback and argument
// (AfterFuncArg, AfterFunc, Every, a Keyed arming, a timer whose Reset was paused across the
// drop), while the handles stay inert (Stop and Reset report false) and a Keyed still drains
// its values, which it keeps itself.
func TestStopLetsGoOfDroppedCallbacks(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w, _, _ := parkWheel(t)
	p := new(ctxPayload)
	var tms []Timer
	tm, err := w.AfterFuncArg(time.Hour, func(any) {}, p)
	require.NoError(t, err)
	tms = append(tms, tm)
	tm, err = w.AfterFunc(time.Hour, func() { _ = p })
	require.NoError(t, err)
	tms = append(tms, tm)
	tm, err = w.Every(time.Hour, func() { _ = p })
	require.NoError(t, err)
	tms = append(tms, tm)
	k := NewKeyed(w, func(string, *ctxPayload) {})
	require.NoError(t, k.Set("a", p, time.Hour))
	held, err := w.AfterFuncArg(time.Hour, func(any) {}, p)
	require.NoError(t, err)
	tms = append(tms, held)
	finish := holdReset(t, held, 2*time.Hour)
	done := make(chan int)
	go func() { done <- w.Stop() }()
	time.Sleep(10 * time.Millisecond) // Stop waits for the Reset
	finish()
	require.Equal(t, 5, <-done)
	require.Nil(t, keptArg(w), "a dropped entry kept its callback or argument")
	for _, tm := range tms {
		require.False(t, tm.Stop())
		require.False(t, tm.Reset(time.Millisecond))
	}
	require.False(t, k.Move("a", time.Millisecond))
	require.ErrorIs(t, k.Set("a", p, time.Hour), ErrClosed)
	var got *ctxPayload
	require.Equal(t, 1, k.Drain(func(_ string, v *ctxPayload) { got = v }))
	require.Same(t, p, got)
	requireBalanced(t, w)
}

// TestTrimLeavesStaleHandlesInert: handles of timers whose slab blocks were given back and whose
// indices now serve new timers are inert, also on the old block that a paused Stop or Reset may
// still hold (it loaded the block table before the trim): they never stop, move or free a new
// timer, each new timer's generation is above the stale one's, and every new timer fires once.
func TestTrimLeavesStaleHandlesInert(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	s := w.shards[0]
	const n = 3*blockLen - 100 // three blocks, the last partly used
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
		require.False(t, ok, "a stale Reset claimed the old block's entry")
	}
	require.Greater(t, reused, n/2, "the new timers reuse the stale handles' indices")
	require.Equal(t, n, w.Len(), "every new timer is pending")
	clk.Advance(time.Hour)
	require.Equal(t, n, fired, "every new timer fired once")
	require.NoError(t, w.Verify())
}

// TestStopLetsGoOfEveryDroppedMidRun: API.md: an Every whose run is in progress when the wheel
// stops finishes that run, and its next run counts as pending and is counted in what Stop
// returns (Stop drops it: dropRunning). Once the run has ended, its entry is dropped and, like
// every other entry Stop drops, lets go of its argument (the *every, and so the user's f and all
// it captures): the stopped wheel lives on as long as anyone holds it.
func TestStopLetsGoOfEveryDroppedMidRun(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1))
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	started, release := make(chan struct{}), make(chan struct{})
	payload := weak.Make(new(ctxPayload))
	tm := func() Timer {
		p := new(ctxPayload)
		payload = weak.Make(p)
		runs := 0
		tm, err := w.Every(time.Millisecond, func() {
			_ = p[0]
			runs++
			if runs == 1 {
				close(started)
				<-release
			}
		})
		require.NoError(t, err)
		return tm
	}()
	clk.Advance(time.Millisecond)
	waitKeyed(t, started, "the run never started")
	stopped := make(chan int, 1)
	go func() { stopped <- w.Stop() }()
	s := w.shards[0]
	for start := time.Now(); s.ring.tail.Load()&ringClosed == 0; runtime.Gosched() {
		require.Less(t, time.Since(start), 5*time.Second, "Stop never closed the ring")
	}
	close(release) // the run ends; its next run was dropped
	require.Equal(t, 1, <-stopped, "the next run was pending and is dropped")
	e := tm.s.slab.at(tm.i)
	require.Equal(t, stDropped, stateOf(e.state.Load()))
	require.False(t, tm.Stop())
	require.True(t, collected(payload), "the stopped wheel keeps what the dropped Every's f captured")
	require.Nil(t, e.arg, "the dropped Every's entry keeps its *every")
	runtime.KeepAlive(w)
}

// TestTrimGivesHeldBytesBackAfterQuiet: a burst grows HeldBytes by whole slab blocks, kept for
// reuse while the timers are over (fired or stopped) but the shard has not been quiet long; once
// it has been quiet for trimQuiet of the manual clock, an Advance trims and HeldBytes is back to
// 0, not below. The books balance and nothing is left queued.
func TestTrimGivesHeldBytesBackAfterQuiet(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1))
	require.Zero(t, w.Stats().HeldBytes)
	var ts []Timer
	for i := range 3000 {
		tm, err := w.AfterFunc(time.Duration(i%2+1)*time.Millisecond, func() {})
		require.NoError(t, err)
		ts = append(ts, tm)
	}
	held := w.Stats().HeldBytes
	require.Equal(t, int64(3)*blockBytes, held, "3000 entries take three blocks (index 0 unused)")
	for _, tm := range ts[:1500] {
		tm.Stop()
	}
	clk.Advance(2 * time.Millisecond)
	require.Zero(t, w.Len())
	require.Equal(t, held, w.Stats().HeldBytes, "kept for reuse until a quiet spell")
	clk.Advance(trimQuiet + trimLook)
	clk.Advance(trimLook)
	require.Zero(t, w.Stats().HeldBytes)
	requireBalanced(t, w)
	st := w.Stats()
	require.Equal(t, st.Fired, st.Lateness.Count(), "%+v", st)
	require.Zero(t, st.Queued, "%+v", st)
}

// TestTrimLookRightAfterGrow: a shard whose slab is full and trimmed (every entry in use for
// longer than trimQuiet) grows, and the trimmer looks while the grow is still under way. The look
// must see the grow and look again within trimLook, so that the new block is watched, not sleep
// for trimIdleLook (30 s) as for an idle, trimmed slab, which would delay giving the block back.
// (The grow notes itself, onGrow, only once the block's entries are on the free stack.)
func TestTrimLookRightAfterGrow(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	s := w.shards[0]
	for range blockLen - 1 { // entry 0 of the first block stays unused: the block is full
		_, err := w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
	}
	require.Zero(t, uint32(s.slab.free.Load()), "the free stack is empty")
	for range 8 { // looks, then a trim once the slab has been quiet for trimQuiet
		clk.Advance(time.Second)
	}
	require.True(t, w.trim.slabs[0].trimmed, "the full slab is trimmed")

	var now, next int64
	grew := s.slab.onGrow
	s.slab.onGrow = func() {
		grew()
		now = w.nanos()
		next = w.trimIdle(now) // the trimmer, looking while the grow is under way
	}
	_, err = w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	require.NotZero(t, now, "the slab did not grow")
	require.LessOrEqual(t, next-now, int64(trimLook), "the look after the grow is %v away", time.Duration(next-now))
}
