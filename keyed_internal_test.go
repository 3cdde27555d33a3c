package shardwheel

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// keyedHookRig is a Keyed[string, int] on a manual clock with one shard and workers (two
// unless told: one callback may be paused while another runs), that sends each fire to fired.
type keyedHookRig struct {
	w      *Wheel
	clk    *ManualClock
	k      *Keyed[string, int]
	fired  chan string
	pauses []*pausePoint
}

func newKeyedHookRig(t *testing.T, opts ...Option) *keyedHookRig {
	t.Cleanup(func() { testHookKeyedArmed, testHookKeyedExpire = nil, nil }) // after w.Stop
	r := &keyedHookRig{clk: NewManualClock(time.Unix(0, 0)), fired: make(chan string, 16)}
	w, err := New(append([]Option{WithClock(r.clk), WithWorkers(2), WithShards(1)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, p := range r.pauses {
			p.unpause()
		}
		w.Stop()
	})
	r.w = w
	r.k = NewKeyed(w, func(key string, v int) { r.fired <- fmt.Sprintf("%s=%d", key, v) })
	return r
}

// pauseExpire pauses the first Keyed callback before its decision.
func (r *keyedHookRig) pauseExpire() *pausePoint {
	p := newPausePoint()
	r.pauses = append(r.pauses, p)
	testHookKeyedExpire = func(any) { p.pause() }
	return p
}

// pauseArmed pauses the first Set or Move (from now on) between arming and installing.
func (r *keyedHookRig) pauseArmed() *pausePoint {
	p := newPausePoint()
	r.pauses = append(r.pauses, p)
	testHookKeyedArmed = func(bool) { p.pause() }
	return p
}

// dueAndDeciding sets key k to 1, due in 1ms, and advances to its fire with its callback
// paused before its decision: the key is armed, its Reset fails. Unpause the returned pause.
func (r *keyedHookRig) dueAndDeciding(t *testing.T) *pausePoint {
	t.Helper()
	require.NoError(t, r.k.Set("k", 1, time.Millisecond))
	p := r.pauseExpire()
	r.clk.Advance(time.Millisecond)
	waitKeyed(t, p.reached, "the key's callback never started")
	require.Equal(t, 1, r.k.Len())
	return p
}

// move runs Move on another goroutine; its result comes on the channel.
func (r *keyedHookRig) move(key string, d time.Duration) <-chan bool {
	ch := make(chan bool, 1)
	go func() { ch <- r.k.Move(key, d) }()
	return ch
}

// expectFire waits for the next fire and requires it to be want.
func (r *keyedHookRig) expectFire(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-r.fired:
		require.Equal(t, want, got)
	case <-time.After(5 * time.Second):
		t.Fatalf("%s never fired", want)
	}
}

// finish requires nothing armed and, soon, nothing pending, stops the wheel (which waits for every
// callback handed to the workers), and requires that nothing more fired and that the
// accounting balances.
func (r *keyedHookRig) finish(t *testing.T) {
	t.Helper()
	require.Zero(t, r.k.Len(), "a key is left armed")
	// A callback dispatched by the last Advance counts as pending until a worker starts it.
	require.Eventually(t, func() bool { return r.w.Len() == 0 }, 5*time.Second, time.Millisecond,
		"a timer is left pending")
	require.Zero(t, r.w.Stop())
	select {
	case got := <-r.fired:
		t.Fatalf("%s fired too", got)
	default:
	}
	s := r.w.Stats()
	require.Equal(t, s.Scheduled, s.Fired+s.Stopped+s.Dropped+uint64(s.Pending), "stats %+v", s)
}

// TestKeyedMoveWhileDueNotRun: a key whose timer fired inside the wheel and whose callback waits
// in the worker queue (behind a blocker on the only worker) is still armed: Move reports true and
// re-arms it, the old callback does not fire, and the key fires once, with its value, d after the
// Move. (A false would tell the caller that the key had fired, and yet it would fire after.)
func TestKeyedMoveWhileDueNotRun(t *testing.T) {
	r := newKeyedHookRig(t, WithWorkers(1))
	gate, started := newPausePoint(), make(chan struct{})
	r.pauses = append(r.pauses, gate)
	_, err := r.w.AfterFunc(time.Millisecond, func() { close(started); gate.pause() })
	require.NoError(t, err)
	require.NoError(t, r.k.Set("conn", 1, 2*time.Millisecond))
	r.clk.Advance(time.Millisecond)
	waitKeyed(t, started, "the blocker never started")
	r.clk.Advance(time.Millisecond) // the key's timer fires; its callback waits in the queue

	require.True(t, r.k.Move("conn", time.Hour), "the key is armed and has not fired")
	require.Equal(t, 1, r.k.Len())
	require.Empty(t, r.fired)
	gate.unpause() // the old arming's callback was stopped or finds itself displaced

	r.clk.Advance(time.Hour - time.Millisecond)
	require.Equal(t, 1, r.w.Len(), "the moved key is not due yet")
	r.clk.Advance(time.Millisecond)
	r.expectFire(t, "conn=1")
	r.finish(t)
}

// TestKeyedMoveWhileDeciding: the old arming's callback has started and is paused before its
// decision; Move installs the new arming and the old callback, deciding later, finds itself
// displaced and does not fire.
func TestKeyedMoveWhileDeciding(t *testing.T) {
	r := newKeyedHookRig(t)
	deciding := r.dueAndDeciding(t)
	require.True(t, r.k.Move("k", time.Second))
	deciding.unpause()
	r.clk.Advance(time.Second - time.Millisecond)
	require.Equal(t, 1, r.w.Len(), "the moved key is not due yet")
	r.clk.Advance(time.Millisecond)
	r.expectFire(t, "k=1")
	r.finish(t)
}

// TestKeyedMoveNewArmingFiresInPlace: Move's new arming comes due (d = 0) and fires before
// Move installed it, while the old arming is still current: it fires once, with the old
// arming's value, in its place, and Move reports true; the old arming's callback then finds
// itself displaced.
func TestKeyedMoveNewArmingFiresInPlace(t *testing.T) {
	r := newKeyedHookRig(t)
	deciding := r.dueAndDeciding(t)
	armed := r.pauseArmed()
	moved := r.move("k", 0)
	waitKeyed(t, armed.reached, "Move never armed a new timer")
	r.clk.Advance(0) // the new arming fires on the other worker
	r.expectFire(t, "k=1")
	require.Zero(t, r.k.Len(), "fired: absent")
	armed.unpause()
	require.True(t, <-moved, "the key was armed: Move re-armed it, and it fired")
	deciding.unpause()
	r.finish(t)
}

// TestKeyedMoveAfterOldArmingFired: the old arming's callback decides (fires) while Move is
// between arming its new timer and installing it: Move reports false, after the fire, and
// its new timer is stopped and never fires.
func TestKeyedMoveAfterOldArmingFired(t *testing.T) {
	r := newKeyedHookRig(t)
	deciding := r.dueAndDeciding(t)
	armed := r.pauseArmed()
	moved := r.move("k", time.Hour)
	waitKeyed(t, armed.reached, "Move never armed a new timer")
	deciding.unpause()
	r.expectFire(t, "k=1")
	armed.unpause()
	require.False(t, <-moved, "fired before Move's decision: absent")
	r.clk.Advance(2 * time.Hour)
	r.finish(t)
}

// TestKeyedMoveRacesSet: a Set displaces the old arming while Move is between arming and
// installing: Move retries on the Set's arming (Reset, in place) and reports true; the key
// fires once, with the Set's value, at Move's delay.
func TestKeyedMoveRacesSet(t *testing.T) {
	r := newKeyedHookRig(t)
	deciding := r.dueAndDeciding(t)
	armed := r.pauseArmed()
	moved := r.move("k", 2*time.Hour)
	waitKeyed(t, armed.reached, "Move never armed a new timer")
	require.NoError(t, r.k.Set("k", 2, time.Hour))
	armed.unpause()
	require.True(t, <-moved)
	deciding.unpause()
	r.clk.Advance(time.Hour)
	require.Equal(t, 1, r.w.Len(), "Move, after the Set, re-armed the Set's arming to 2h")
	r.clk.Advance(time.Hour)
	r.expectFire(t, "k=2")
	r.finish(t)
}

// TestKeyedMoveRacesRemove: Remove takes the key while Move is between arming and installing:
// Remove reports true, Move false, and nothing fires.
func TestKeyedMoveRacesRemove(t *testing.T) {
	r := newKeyedHookRig(t)
	deciding := r.dueAndDeciding(t)
	armed := r.pauseArmed()
	moved := r.move("k", 0) // due at once: its callback finds the old arming gone
	waitKeyed(t, armed.reached, "Move never armed a new timer")
	require.True(t, r.k.Remove("k"))
	r.clk.Advance(0)
	armed.unpause()
	require.False(t, <-moved, "removed before Move's decision")
	deciding.unpause()
	r.clk.Advance(time.Hour)
	r.finish(t)
}

// TestKeyedMoveRacesDrain: Drain takes the key while Move is between arming and installing,
// and after Move installed its new arming: Drain collects the key with its value either way,
// and nothing fires.
func TestKeyedMoveRacesDrain(t *testing.T) {
	for _, when := range []string{"before install", "after install"} {
		t.Run(when, func(t *testing.T) {
			r := newKeyedHookRig(t)
			deciding := r.dueAndDeciding(t)
			armed := r.pauseArmed()
			moved := r.move("k", time.Second)
			waitKeyed(t, armed.reached, "Move never armed a new timer")
			if when == "after install" {
				armed.unpause()
				require.True(t, <-moved)
			}
			var got []string
			require.Equal(t, 1, r.k.Drain(func(key string, v int) { got = append(got, fmt.Sprintf("%s=%d", key, v)) }))
			require.Equal(t, []string{"k=1"}, got)
			if when == "before install" {
				armed.unpause()
				require.False(t, <-moved, "drained before Move's decision")
			}
			deciding.unpause()
			r.clk.Advance(time.Hour)
			r.finish(t)
		})
	}
}

// TestKeyedMoveRacesMove: two Moves of a key whose callback is deciding. The first is paused
// between arming and installing while the second installs its arming; the first then finds
// the old arming displaced, stops its own and retries on the second's: both report true, and
// the key fires once, at the first Move's delay, which came last.
func TestKeyedMoveRacesMove(t *testing.T) {
	r := newKeyedHookRig(t)
	deciding := r.dueAndDeciding(t)
	armed := r.pauseArmed()
	first := r.move("k", time.Hour)
	waitKeyed(t, armed.reached, "Move never armed a new timer")
	require.True(t, r.k.Move("k", 2*time.Hour))
	armed.unpause()
	require.True(t, <-first)
	deciding.unpause()
	require.Equal(t, 1, r.w.Len(), "one timer for the key")
	r.clk.Advance(time.Hour)
	r.expectFire(t, "k=1")
	r.finish(t)
}

// TestKeyedMoveRefused: Move of a due key needs a new timer; a wheel that refuses it (stopped,
// or at WithMaxPending) leaves the key as it is, and Move reports false.
func TestKeyedMoveRefused(t *testing.T) {
	t.Run("stopped", func(t *testing.T) {
		r := newKeyedHookRig(t)
		require.NoError(t, r.k.Set("k", 1, time.Second))
		require.Equal(t, 1, r.w.Stop())
		require.False(t, r.k.Move("k", time.Second), "a stopped wheel arms nothing")
		var got []string
		require.Equal(t, 1, r.k.Drain(func(key string, v int) { got = append(got, fmt.Sprintf("%s=%d", key, v)) }))
		require.Equal(t, []string{"k=1"}, got)
	})
	t.Run("max pending", func(t *testing.T) {
		r := newKeyedHookRig(t, WithMaxPending(1))
		deciding := r.dueAndDeciding(t)
		_, err := r.w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
		require.False(t, r.k.Move("k", time.Hour), "no room for a new timer")
		_, err = r.w.AfterFunc(time.Hour, func() {})
		require.True(t, errors.Is(err, ErrTooManyTimers), "the wheel is full: %v", err)
		require.Equal(t, 1, r.k.Len())
		deciding.unpause()
		r.expectFire(t, "k=1")
		r.clk.Advance(time.Hour)
		r.finish(t)
	})
}

// TestKeyedSetFiredBeforeInstallDisplacesCurrent: Set A's arming fires (d = 0) before A installed
// it, while the arming of a Set B that returned meanwhile is current. A is ordered after B, so the
// key fires once, with A's value, and B's arming is displaced and stopped: it must not fire too,
// after A's, with the older value last.
func TestKeyedSetFiredBeforeInstallDisplacesCurrent(t *testing.T) {
	r := newKeyedHookRig(t)
	armed := r.pauseArmed()
	setA := make(chan error, 1)
	go func() { setA <- r.k.Set("k", 1, 0) }()
	waitKeyed(t, armed.reached, "Set A never armed its timer")
	require.NoError(t, r.k.Set("k", 2, time.Millisecond)) // B: installs its arming
	r.clk.Advance(0)                                      // A's arming fires, not installed
	r.expectFire(t, "k=1")
	require.Zero(t, r.k.Len(), "fired: absent")
	require.Zero(t, r.w.Len(), "B's arming is stopped")
	armed.unpause()
	require.NoError(t, <-setA)
	r.clk.Advance(time.Hour)
	r.finish(t)
}

// TestKeyedSetAfterFireBeforeInstallNotLost: Set A's arming fires before A installed it; a Set C
// of the key, after that fire, installs its own arming and returns; A's install then leaves C's
// arming in place (it is ordered after A's fire), and C's value fires: C is not lost.
func TestKeyedSetAfterFireBeforeInstallNotLost(t *testing.T) {
	r := newKeyedHookRig(t)
	armed := r.pauseArmed()
	setA := make(chan error, 1)
	go func() { setA <- r.k.Set("k", 1, 0) }()
	waitKeyed(t, armed.reached, "Set A never armed its timer")
	r.clk.Advance(0) // A's arming fires, not installed
	r.expectFire(t, "k=1")
	require.NoError(t, r.k.Set("k", 3, time.Millisecond)) // C
	armed.unpause()
	require.NoError(t, <-setA)
	require.Equal(t, 1, r.k.Len(), "C's arming is current")
	r.clk.Advance(time.Millisecond)
	r.expectFire(t, "k=3")
	r.finish(t)
}

// TestKeyedMoveStormWhileFiring: one goroutine Sets four keys in turn, each with values
// counting up, and two more Move them, with delays of a tick or less, while their timers keep
// coming due (a manual clock advanced by another goroutine, or the system clock) and their
// callbacks, slow, on one worker (so that fires are in the order of their decisions) wait in
// its queue, so that Moves meet due armings and take the slow path. No value fires
// twice, none fires after a newer one of its key, each key's last Set fires last, and nothing
// is left armed or pending.
func TestKeyedMoveStormWhileFiring(t *testing.T) {
	for _, clock := range []string{"manual", "system"} {
		t.Run("clock="+clock, func(t *testing.T) {
			var (
				w   *Wheel
				clk *ManualClock
				err error
			)
			if clock == "manual" {
				clk = NewManualClock(time.Unix(0, 0))
				w, err = New(WithClock(clk), WithWorkers(1), WithShards(1))
			} else {
				w, err = New(WithWorkers(1), WithShards(2), WithTick(50*time.Microsecond))
			}
			require.NoError(t, err)
			defer w.Stop()
			var slow atomic.Int64
			testHookKeyedArmed = func(move bool) {
				if move {
					slow.Add(1)
				}
			}
			defer func() { testHookKeyedArmed = nil }()
			const keys = 4
			var mu sync.Mutex
			fired := map[int][]int{} // key -> values, in the order they fired
			k := NewKeyed(w, func(key int, v int) {
				mu.Lock()
				fired[key] = append(fired[key], v)
				mu.Unlock()
				time.Sleep(10 * time.Microsecond) // a slow callback: due armings wait in the queue
			})
			n := 40_000
			if testing.Short() {
				n = 4_000
			}
			stop := make(chan struct{})
			var bg sync.WaitGroup
			if clk != nil {
				bg.Add(1)
				go func() {
					defer bg.Done()
					for {
						select {
						case <-stop:
							return
						default:
							clk.Advance(50 * time.Microsecond)
						}
					}
				}()
			}
			var moves atomic.Int64
			for m := range 2 {
				bg.Add(1)
				go func() {
					defer bg.Done()
					for i := m; ; i++ {
						select {
						case <-stop:
							return
						default:
							if k.Move(i%keys, time.Duration(i%3)*50*time.Microsecond) {
								moves.Add(1)
							}
							runtime.Gosched()
						}
					}
				}()
			}
			for i := 1; i <= n; i++ {
				require.NoError(t, k.Set(i%keys, i, time.Duration(i%3)*50*time.Microsecond))
				if i%16 == 0 {
					runtime.Gosched()
				}
			}
			close(stop)
			bg.Wait()
			if clk != nil {
				clk.Advance(time.Second)
			}
			require.Eventually(t, func() bool { return k.Len() == 0 && w.Len() == 0 }, time.Minute, time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			fires := 0
			for key := range keys {
				f := fired[key]
				require.NotEmpty(t, f)
				fires += len(f)
				require.Equal(t, n-(n-key)%keys, f[len(f)-1], "key %d: the last Set's value fires last", key)
				for i := 1; i < len(f); i++ {
					require.Greater(t, f[i], f[i-1], "key %d: value %d fired after %d", key, f[i], f[i-1])
				}
			}
			s := w.Stats()
			require.Equal(t, s.Scheduled, s.Fired+s.Stopped+s.Dropped+uint64(s.Pending), "stats %+v", s)
			t.Logf("%d Sets, %d Moves true, %d by a new arming; %d fires", n, moves.Load(), slow.Load(), fires)
		})
	}
}

// TestKeyedSetFiresInPlaceOfDecidingArming: the current arming's timer came due and its
// callback is paused before its decision; a Set of the key (its in-place Reset fails) arms a new
// arming due at once, which fires before the Set installed it. It fires in place of the current
// arming, whose callback then finds itself displaced: one fire, with the Set's value, and the
// Set's Compute leaves the key absent. Nothing is left armed or pending.
func TestKeyedSetFiresInPlaceOfDecidingArming(t *testing.T) {
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

// TestKeyedSetFiresInPlaceWhileMoveInstalls: a Move of a due key is paused between arming its
// new timer b (b.prev = the due arming a) and installing it, while a Set's arming, due at once
// and not installed either, fires in a's place. a is gone for good, so b, coming due too, does
// not fire, and Move (ordered after the fire) reports false and stops b. One fire, the Set's.
func TestKeyedSetFiresInPlaceWhileMoveInstalls(t *testing.T) {
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

// TestKeyedMoveDuringWheelStopArmsNothing: a Move of a due key while Wheel.Stop is in progress.
// The key's callback waits in the queue behind a blocker; Stop, called from outside the wheel, has
// closed the ring and waits for the blocker. Move cannot arm a new timer (ErrClosed): it reports
// false and changes nothing; the queued callback, taken from the wheel before Stop, runs before
// Stop returns, and the key fires once with its value; Drain then finds nothing.
func TestKeyedMoveDuringWheelStopArmsNothing(t *testing.T) {
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

// TestKeyedSetPausedAcrossStopKeepsValue: a Set of an absent key is paused between arming its
// timer and installing it while Wheel.Stop drops that timer; the Set then installs the arming and
// reports nil (it is ordered before Stop). The key never fires, is counted by Len and collected by
// Drain with its value, once; a later Set reports ErrClosed and a later Move false, and neither
// changes anything.
func TestKeyedSetPausedAcrossStopKeepsValue(t *testing.T) {
	defer goleak.VerifyNone(t)
	r := newKeyedHookRig(t)
	armed := r.pauseArmed()
	set := make(chan error, 1)
	go func() { set <- r.k.Set("k", 1, time.Millisecond) }()
	waitKeyed(t, armed.reached, "Set never armed its timer")
	require.Equal(t, 1, r.w.Stop(), "Stop drops the Set's timer")
	armed.unpause()
	require.NoError(t, <-set)
	r.clk.Advance(time.Hour)
	require.Equal(t, 1, r.k.Len())
	require.ErrorIs(t, r.k.Set("k", 2, time.Millisecond), ErrClosed)
	require.False(t, r.k.Move("k", time.Millisecond), "Move after Stop refuses")
	var got []string
	require.Equal(t, 1, r.k.Drain(func(k string, v int) { got = append(got, fmt.Sprintf("%s=%d", k, v)) }))
	require.Equal(t, []string{"k=1"}, got)
	require.Zero(t, r.k.Len())
	select {
	case f := <-r.fired:
		t.Fatalf("%s fired after Stop", f)
	default:
	}
}

// TestKeyedMoveOfDueKeyAcrossStop: a key is due and its callback paused before its decision; a
// Move, whose Reset fails, arms a new timer b and is paused before installing it; Wheel.Stop starts
// from outside the wheel (and waits for the paused callback). The Move installs b and reports
// true, the old callback finds its arming displaced and does not fire, Stop returns having dropped
// b (its count is 1), and the key, still armed, is drained once with its value.
func TestKeyedMoveOfDueKeyAcrossStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	r := newKeyedHookRig(t)
	deciding := r.dueAndDeciding(t)
	armed := r.pauseArmed()
	moved := r.move("k", time.Millisecond)
	waitKeyed(t, armed.reached, "Move never armed its new timer")
	stopped := make(chan int, 1)
	go func() { stopped <- r.w.Stop() }()
	armed.unpause()
	require.True(t, <-moved)
	deciding.unpause()
	select {
	case n := <-stopped:
		require.Equal(t, 1, n, "Stop drops the Move's timer")
	case <-time.After(5 * time.Second):
		t.Fatal("Stop never returned")
	}
	require.Equal(t, 1, r.k.Len())
	var got []string
	require.Equal(t, 1, r.k.Drain(func(k string, v int) { got = append(got, fmt.Sprintf("%s=%d", k, v)) }))
	require.Equal(t, []string{"k=1"}, got)
	select {
	case f := <-r.fired:
		t.Fatalf("%s fired", f)
	default:
	}
}
