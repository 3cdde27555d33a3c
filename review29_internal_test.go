package shardwheel

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
)

// Review 29: Keyed.Move of a due key and a Set's arming that fires before it is installed
// (keyed.go), and deadline contexts whose timer Wheel.Stop drops (context.go, shard.go).

// TestReview29EveryDroppedAtRearmLetsGo: an Every whose run is in progress when Stop closes its
// ring finds the ring closed when it re-arms after the run (every.go, endRun) and is dropped
// there, counted in what Stop returns. Like every other timer Stop drops (letGoDropped), its
// entry must let go of its argument (the *every, and so the user's f and all it captures): the
// stopped wheel lives on as long as anyone holds it.
func TestReview29EveryDroppedAtRearmLetsGo(t *testing.T) {
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
	close(release) // the run ends; its re-arm finds the ring closed
	require.Equal(t, 1, <-stopped, "the next run was pending and is dropped")
	e := tm.s.slab.at(tm.i)
	require.Equal(t, stDropped, stateOf(e.state.Load()))
	require.False(t, tm.Stop())
	require.True(t, collected(payload), "the stopped wheel keeps what the dropped Every's f captured")
	require.Nil(t, e.arg, "the dropped Every's entry keeps its *every")
	runtime.KeepAlive(w)
}

// TestReview29SetFiresInPlaceOfDecidingArming: the current arming's timer came due and its
// callback is paused before its decision; a Set of the key (its in-place Reset fails) arms a new
// arming due at once, which fires before the Set installed it. It fires in place of the current
// arming, whose callback then finds itself displaced: one fire, with the Set's value, and the
// Set's Compute leaves the key absent. Nothing is left armed or pending.
func TestReview29SetFiresInPlaceOfDecidingArming(t *testing.T) {
	r := newKeyedHookRig(t)
	deciding := r.dueAndDeciding(t)
	armed := r.pauseArmed()
	set := make(chan error, 1)
	go func() { set <- r.k.Set("k", 2, 0) }()
	waitKeyed(t, armed.reached, "Set never armed its timer")
	r.clk.Advance(0) // the Set's arming fires on the other worker, not installed
	r.expectFire(t, "k=2")
	require.Zero(t, r.k.Len(), "fired in place of the deciding arming: absent")
	deciding.unpause() // the old callback decides: displaced
	armed.unpause()
	require.NoError(t, <-set)
	require.Zero(t, r.k.Len(), "the Set's Compute found its arming fired: absent")
	require.False(t, r.k.Move("k", time.Hour), "absent")
	r.clk.Advance(time.Hour)
	r.finish(t)
}

// TestReview29SetFiresInPlaceWhileMoveInstalls: a Move of a due key is paused between arming its
// new timer b (b.prev = the due arming a) and installing it, while a Set's arming, due at once
// and not installed either, fires in a's place. a is gone for good, so b, coming due too, does
// not fire, and Move (ordered after the fire) reports false and stops b. One fire, the Set's.
func TestReview29SetFiresInPlaceWhileMoveInstalls(t *testing.T) {
	r := newKeyedHookRig(t, WithWorkers(3))
	deciding := r.dueAndDeciding(t)
	moveArmed := r.pauseArmed()
	moved := r.move("k", time.Millisecond)
	waitKeyed(t, moveArmed.reached, "Move never armed a new timer")
	setArmed := newPausePoint()
	r.pauses = append(r.pauses, setArmed)
	testHookKeyedArmed = func(move bool) {
		if !move {
			setArmed.pause()
		}
	}
	set := make(chan error, 1)
	go func() { set <- r.k.Set("k", 2, 0) }()
	waitKeyed(t, setArmed.reached, "Set never armed its timer")
	r.clk.Advance(0) // the Set's arming fires in a's place
	r.expectFire(t, "k=2")
	testHookKeyedExpire = nil
	r.clk.Advance(time.Millisecond) // b comes due: a is not current, b does nothing
	require.Eventually(t, func() bool { return r.w.Len() == 0 }, 5*time.Second, time.Millisecond)
	moveArmed.unpause()
	require.False(t, <-moved, "the key fired before Move's decision: absent")
	setArmed.unpause()
	require.NoError(t, <-set)
	deciding.unpause()
	r.clk.Advance(time.Hour)
	r.finish(t)
}

// TestReview29MoveDuringWheelStop: a Move of a due key while Wheel.Stop is in progress. The
// key's callback waits in the queue behind a blocker; Stop has closed the ring and waits for the
// blocker. Move cannot arm a new timer (ErrClosed): it reports false and changes nothing; the
// queued callback runs within Stop, and the key fires once with its value; Drain then finds
// nothing.
func TestReview29MoveDuringWheelStop(t *testing.T) {
	r := newKeyedHookRig(t, WithWorkers(1))
	gate, started := newPausePoint(), make(chan struct{})
	r.pauses = append(r.pauses, gate)
	_, err := r.w.AfterFunc(time.Millisecond, func() { close(started); gate.pause() })
	require.NoError(t, err)
	require.NoError(t, r.k.Set("k", 1, 2*time.Millisecond))
	r.clk.Advance(time.Millisecond)
	waitKeyed(t, started, "the blocker never started")
	r.clk.Advance(time.Millisecond) // the key's callback waits in the queue
	stopped := make(chan int, 1)
	go func() { stopped <- r.w.Stop() }()
	s := r.w.shards[0]
	for start := time.Now(); s.ring.tail.Load()&ringClosed == 0; runtime.Gosched() {
		require.Less(t, time.Since(start), 5*time.Second, "Stop never closed the ring")
	}
	require.False(t, r.k.Move("k", time.Hour), "a stopping wheel arms nothing")
	require.Equal(t, 1, r.k.Len(), "Move changed nothing")
	gate.unpause()
	require.Zero(t, <-stopped, "nothing was pending: the key's timer had fired")
	r.expectFire(t, "k=1")
	require.Zero(t, r.k.Len())
	require.Zero(t, r.k.Drain(nil))
	requireBalanced(t, r.w)
}

// TestReview29UserTimerWithContextArg: a caller passes one of the wheel's contexts as the
// argument of a timer of its own. Stop drops both timers; only the context's own hands its
// deadline to a runtime timer (the caller's func is not expireDeadline), both entries let go of
// the context, the caller's func never runs, and the context still ends at its deadline, once.
func TestReview29UserTimerWithContextArg(t *testing.T) {
	w, err := New(WithShards(1), WithWorkers(1))
	require.NoError(t, err)
	ctx, cancel := w.WithTimeout(context.Background(), 60*time.Millisecond)
	defer cancel()
	c := ctx.(*deadlineCtx)
	ran := make(chan struct{}, 1)
	user, err := w.AfterFuncArg(time.Hour, func(arg any) { ran <- struct{}{} }, ctx)
	require.NoError(t, err)
	handed := 0
	hook := func(k *deadlineCtx, step int) {
		if step == 1 {
			handed++
			require.Same(t, c, k)
		}
	}
	testHookDropped.Store(&hook)
	n := w.Stop()
	testHookDropped.Store(nil)
	require.Equal(t, 2, n)
	require.Equal(t, 1, handed, "one hand-off: the context's own timer")
	require.Nil(t, user.s.slab.at(user.i).arg, "the caller's dropped entry let go of the context")
	require.Nil(t, keptArg(w))
	require.NotNil(t, droppedRT(c))
	dl, _ := ctx.Deadline()
	requireEnded(t, ctx, context.DeadlineExceeded)
	require.False(t, time.Now().Before(dl), "ended before its deadline")
	select {
	case <-ran:
		t.Fatal("the caller's dropped timer ran")
	case <-time.After(10 * time.Millisecond):
	}
	requireBalanced(t, w)
}

// TestReview29DroppedParentEndsKidOnOpenShard: Stop drops the timer of a parent context on
// shard 0 whose deadline has passed on the real clock (a manual clock in 1970): its runtime
// timer ends it at once, on another goroutine, while Stop still holds shard 0's mu (paused in
// the hand-off) and has not yet closed shard 1's ring, where the parent's wheel child has its
// timer. The child ends with its parent, its end stops its timer there (counted as stopped, not
// dropped: Stop's return is exact), and nothing waits on Stop's mu: no deadlock.
func TestReview29DroppedParentEndsKidOnOpenShard(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(2), WithWorkers(1))
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	var (
		parent, kid context.Context
		cancels     []context.CancelFunc
	)
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	// Find a parent on shard 0 and a wheel child on shard 1. The shard follows the caller's P
	// (pick.go), and a new goroutine mostly runs on its spawner's P: two GCs empty the token
	// pool, whose next token takes the next shard, so each arm after them alternates shards
	// (under -race the shard follows the goroutine's stack: each attempt runs on a new one).
	// Without them the search failed about once in 180 runs (CI, 2026-11-26).
	fresh := func() { runtime.GC(); runtime.GC() }
	var tries, onZero, kids int
	for i := 0; i < 2000 && kid == nil; i++ {
		tries++
		ch := make(chan struct{})
		go func() {
			defer close(ch)
			fresh()
			p, pc := w.WithTimeout(context.Background(), time.Hour)
			if p.(*deadlineCtx).timer.s != w.shards[0] {
				pc()
				return
			}
			onZero++
			dl, _ := p.Deadline()
			for j := 0; j < 50; j++ {
				kids++
				done := make(chan struct{})
				var k context.Context
				var kc context.CancelFunc
				fresh()
				go func() { defer close(done); k, kc = w.WithDeadline(p, dl) }()
				<-done
				if k.(*deadlineCtx).timer.s == w.shards[1] {
					parent, kid, cancels = p, k, []context.CancelFunc{pc, kc}
					return
				}
				kc()
			}
			pc()
		}()
		<-ch
	}
	require.NotNil(t, kid, "could not place a parent on shard 0 and its child on shard 1 (%d tries, %d parents on shard 0, %d children tried)", tries, onZero, kids)
	pc, kc := parent.(*deadlineCtx), kid.(*deadlineCtx)
	require.Equal(t, 2, w.Len())
	stoppedBefore := w.Stats().Stopped // the search's cancelled contexts
	var kidDone bool
	hook := func(c *deadlineCtx, step int) {
		if c != pc || step != 2 {
			return
		}
		// Under shard 0's mu; shard 1's ring is still open.
		require.Zero(t, w.shards[1].ring.tail.Load()&ringClosed, "shard 1 not reached yet")
		select {
		case <-kc.Done():
			kidDone = true
		case <-time.After(5 * time.Second):
		}
	}
	testHookDropped.Store(&hook)
	n := w.Stop()
	testHookDropped.Store(nil)
	require.True(t, kidDone, "the parent's runtime timer never ended the child while Stop held shard 0")
	require.Equal(t, context.DeadlineExceeded, parent.Err())
	require.Equal(t, context.DeadlineExceeded, kid.Err())
	require.Nil(t, droppedRT(kc), "the child ended before Stop reached its timer: no hand-off")
	require.Eventually(t, func() bool {
		st := w.Stats()
		return st.Scheduled == st.Fired+st.Stopped+st.Dropped+uint64(st.Pending)
	}, 5*time.Second, time.Millisecond, "counters: %+v", w.Stats())
	require.Equal(t, 1, n, "the parent's timer is dropped; the child's was stopped by its end")
	require.Equal(t, stoppedBefore+1, w.Stats().Stopped, "the child's timer, stopped by its end")
	require.Nil(t, keptArg(w))
	runtime.KeepAlive(w)
}
