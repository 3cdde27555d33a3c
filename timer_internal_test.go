package shardwheel

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestResetHeldAcrossAdvance: a Reset paused between its claim and its release while an Advance
// meets the entry (an advance must neither fire it on the deadline being replaced nor lose it).
// The shard parks it and the Reset, finding it parked, sends the command that moves it to its new
// deadline, also when that deadline is later than the old one, inside the tick in progress
// (found by review: the shard used to link it at the next tick's start and the later Reset sent
// no command, so it fired a tick late and Advance returned with it due), or earlier.
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

// TestResetHeldAtEndOfTime: the same held Reset at the end of time, with a 1 ms and a 1 ns tick.
// Found by review (older than exact deadlines): the shard linked the held entry at tick
// target+1, past the last tick that starts before the end of time, a bucket no advance takes, and
// the Reset (to a later deadline) sent no command: the timer was never fired. With a 1 ns tick
// target+1 overflowed and the advance went round on the held entry until the Reset finished.
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

// freeStackAudit walks every shard's free stack of a quiet wheel and fails the test on a
// duplicate (an entry freed twice) or a count that does not match the slab's capacity (a leak).
func freeStackAudit(t *testing.T, w *Wheel) {
	t.Helper()
	for k, s := range w.shards {
		p := s.slab.blocks.Load()
		if p == nil {
			continue
		}
		live := 0
		for _, c := range *p {
			if c != &deadBlock {
				live++
			}
		}
		want := live*blockLen - 1
		if (*p)[0] == &deadBlock {
			want++
		}
		seen := map[uint32]bool{}
		for i := uint32(s.slab.free.Load()); i != 0; i = uint32(s.slab.at(i).when.Load()) {
			require.False(t, seen[i], "shard %d: entry %d is on the free stack twice (freed twice)", k, i)
			seen[i] = true
			st := s.slab.at(i).state.Load()
			require.False(t, isState(st, stPending) || isHeld(st) || isState(st, stStopping) || isState(st, stFiring) || isState(st, stRunning),
				"shard %d: free entry %d in state %#x", k, i, st)
			require.LessOrEqual(t, len(seen), want+1)
		}
		require.Equal(t, want, len(seen), "shard %d: free entries vs capacity (a leak if fewer)", k)
	}
}

func TestQueuedStressFreeStack(t *testing.T) {
	restore := SetTrimDelays(time.Hour, time.Hour)
	defer restore()
	w, err := New(WithShards(1), WithRingSize(4), WithWorkers(2), WithTick(100*time.Microsecond))
	require.NoError(t, err)
	defer w.Stop()

	const goroutines = 4
	dur := 3 * time.Second
	var oneFired, oneStopped, oneArmed atomic.Int64
	var wrong atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var mu sync.Mutex
	var shared []Timer // Everys and one-shots any goroutine may stop or reset
	type rec struct {
		fired   atomic.Int32
		stopped atomic.Int32
	}
	var everies []Timer
	var evMu sync.Mutex
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 99))
			var stale []Timer
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch x := r.IntN(100); {
				case x < 40: // arm and stop at once: the queued path
					rc := &rec{}
					tm, err := w.AfterFunc(time.Duration(r.IntN(300))*time.Microsecond, func() {
						if rc.stopped.Load() != 0 {
							wrong.Add(1)
						}
						rc.fired.Add(1)
						oneFired.Add(1)
					})
					if err != nil {
						return
					}
					oneArmed.Add(1)
					if r.IntN(4) == 0 {
						tm.Reset(time.Duration(r.IntN(300)) * time.Microsecond)
					}
					if tm.Stop() {
						if rc.fired.Load() != 0 {
							wrong.Add(1)
						}
						rc.stopped.Add(1)
						oneStopped.Add(1)
					}
					stale = append(stale, tm)
				case x < 55:
					rc := &rec{}
					tm, err := w.AfterFunc(time.Duration(r.IntN(500))*time.Microsecond, func() {
						rc.fired.Add(1)
						oneFired.Add(1)
					})
					if err != nil {
						return
					}
					oneArmed.Add(1)
					mu.Lock()
					shared = append(shared, tm)
					mu.Unlock()
				case x < 60:
					tm, err := w.Every(time.Duration(50+r.IntN(300))*time.Microsecond, func() {})
					if err != nil {
						return
					}
					evMu.Lock()
					everies = append(everies, tm)
					evMu.Unlock()
				case x < 80:
					evMu.Lock()
					var tm Timer
					if len(everies) > 0 {
						tm = everies[r.IntN(len(everies))]
					}
					evMu.Unlock()
					if r.IntN(3) == 0 {
						tm.Stop()
					} else {
						tm.Reset(time.Duration(r.IntN(300)) * time.Microsecond)
					}
				case x < 95:
					mu.Lock()
					var tm Timer
					if len(shared) > 0 {
						tm = shared[r.IntN(len(shared))]
					}
					mu.Unlock()
					if r.IntN(2) == 0 {
						if tm.Stop() {
							oneStopped.Add(1)
						}
					} else {
						tm.Reset(time.Duration(r.IntN(300)) * time.Microsecond)
					}
				default:
					if len(stale) > 0 {
						tm := stale[r.IntN(len(stale))]
						if tm.Stop() {
							wrong.Add(1000)
						}
						if tm.Reset(time.Millisecond) {
							wrong.Add(1000)
						}
					}
				}
				if len(stale) > 512 {
					stale = stale[256:]
				}
			}
		}()
	}
	time.Sleep(dur)
	close(stop)
	wg.Wait()
	for _, tm := range everies {
		tm.Stop()
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.Len() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	require.Zero(t, w.Len())
	require.Zero(t, wrong.Load())
	require.NoError(t, w.Verify())
	requireBalanced(t, w)
	// Let the shard take whatever is left in its ring (adds of stopped timers).
	for _, s := range w.shards {
		s.mu.Lock()
		s.drainNoteLocked()
		s.mu.Unlock()
	}
	freeStackAudit(t, w)
	t.Logf("armed %d fired %d stopped %d everies %d", oneArmed.Load(), oneFired.Load(), oneStopped.Load(), len(everies))
}

// takeThrough lets the shard take its ring until its head reaches pos: the commands up to
// there (the worker's add among them) were published and taken. It waits for the worker rather
// than sleeping a fixed time.
func takeThrough(t *testing.T, s *shard, pos uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		takeRing(s)
		s.mu.Lock()
		h := s.head
		s.mu.Unlock()
		if h >= pos {
			return
		}
		require.True(t, time.Now().Before(deadline), "the worker never published its add (head %d, want %d)", h, pos)
		time.Sleep(time.Millisecond)
	}
}

// requireSeriesEnded checks an Every stopped while its worker waited to send the re-arm's add:
// once the shard has taken the commands up to pos (the add among them) and two hours passed, it
// ran once, nothing is pending, the counters balance, and its entry is back on the free stack
// exactly once.
func requireSeriesEnded(t *testing.T, w *Wheel, clk *ManualClock, ev Timer, runs *atomic.Int32, pos uint64) {
	t.Helper()
	clk.Advance(time.Hour)
	clk.Advance(time.Hour)
	takeThrough(t, ev.s, pos)
	require.Equal(t, int32(1), runs.Load())
	require.Zero(t, w.Len())
	require.NoError(t, w.Verify())
	requireBalanced(t, w)
	freeStackAudit(t, w)
}

// A Stop between the worker's re-arm CAS and its add: true, no further run, and the entry freed
// once (the add, taken after the two held slots: head+3, is waited for, not slept for).
func TestQueuedEveryRearmStuckInSendThenStopped(t *testing.T) {
	w, clk, ev, runs, held := everyStuckInSend(t)
	defer w.Stop()
	head := commands(ev.s) - 2
	require.True(t, ev.Stop())
	held.Publish()
	requireSeriesEnded(t, w, clk, ev, runs, head+3)
}

// The same with a Reset to an earlier deadline first (its command and the worker's add: head+4).
func TestQueuedEveryRearmStuckInSendResetThenStopped(t *testing.T) {
	w, clk, ev, runs, held := everyStuckInSend(t)
	defer w.Stop()
	head := commands(ev.s) - 2
	done := make(chan bool)
	e := ev.s.slab.at(ev.i)
	v0 := e.state.Load() & versionMask
	go func() { done <- ev.Reset(time.Millisecond) }()
	for deadline := time.Now().Add(5 * time.Second); e.state.Load()&versionMask == v0; {
		require.True(t, time.Now().Before(deadline), "the Reset never released the entry")
		time.Sleep(time.Millisecond)
	}
	require.True(t, ev.Stop())
	held.Publish()
	require.True(t, <-done)
	requireSeriesEnded(t, w, clk, ev, runs, head+4)
}

// A Reset alone while the worker waits: the next run comes at the Reset's deadline. After the
// Advance to it the test Advances by 0 until the run starts, which a correct wheel does as soon as
// the worker's add is in; with the lost wake-up of TestEveryRearmResetEarlier the shard's next
// stays at the stale 20 ms and Advance(0) at 13 ms does not look at the shard.
func TestQueuedEveryRearmStuckInSendReset(t *testing.T) {
	w, clk, ev, runs, held := everyStuckInSend(t)
	defer w.Stop()
	done := make(chan bool)
	go func() { done <- ev.Reset(3 * time.Millisecond) }() // due at 13 ms
	held.Publish()
	require.True(t, <-done)
	clk.Advance(3*time.Millisecond - 1)
	time.Sleep(10 * time.Millisecond) // (a negative check: a sleep can only miss an early run)
	require.Equal(t, int32(1), runs.Load(), "early")
	clk.Advance(1)
	for deadline := time.Now().Add(5 * time.Second); runs.Load() != 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		clk.Advance(0)
	}
	require.Equal(t, int32(2), runs.Load(), "not run at the Reset's deadline (clock at %v)", clk.Now().Sub(time.Unix(0, 0)))
	require.True(t, ev.Stop())
}

func TestQueuedEveryRearmStuckInSendWheelStop(t *testing.T) {
	w, _, ev, runs, held := everyStuckInSend(t)
	done := make(chan int)
	go func() { done <- w.Stop() }()
	time.Sleep(10 * time.Millisecond)
	held.Publish()
	n := <-done
	require.Equal(t, 1, n, "the Every whose re-arm found the ring closed is dropped once")
	require.Equal(t, int32(1), runs.Load())
	require.False(t, ev.Stop())
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
}

// A Stop paused between its CAS to stopping and its CAS to stopped across Wheel.Stop: the drop
// takes the add (clearing queued), the Stop's cancel finds the ring closed. Nothing dropped.
func TestStopQueuedPausedAcrossWheelStop(t *testing.T) {
	w, _, _ := parkWheel(t)
	tm, err := w.AfterFunc(time.Millisecond, func() { t.Error("fired") })
	require.NoError(t, err)
	ok, finish := tm.StopQueuedHeld()
	require.True(t, ok)
	require.Zero(t, w.Stop())
	finish()
	require.False(t, tm.Stop())
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	require.EqualValues(t, 1, st.Stopped)
}

// A parked entry at Wheel.Stop: Stop waits for the paused Reset, then drops the timer once (the
// Reset's command finds the ring closed). Nothing fires, nothing leaks, the counters balance.
func TestResetParkedAtWheelStop(t *testing.T) {
	w, clk, _ := parkWheel(t)
	fired := 0
	tm, err := w.AfterFunc(time.Millisecond, func() { fired++ })
	require.NoError(t, err)
	finish := holdReset(t, tm, 5*time.Millisecond)
	clk.Advance(time.Millisecond)
	require.True(t, isParked(w, tm), "the advance met the held entry: parked")
	done := make(chan int)
	go func() { done <- w.Stop() }()
	select {
	case n := <-done:
		t.Fatalf("Wheel.Stop returned %d while a Reset held a pending timer", n)
	case <-time.After(20 * time.Millisecond):
	}
	finish()
	require.Equal(t, 1, <-done)
	require.Zero(t, fired)
	require.False(t, tm.Stop())
	require.False(t, tm.Reset(time.Millisecond))
	require.Zero(t, w.Len())
	requireBalanced(t, w)
}

// Parked, released (pending, still in the held bucket), and its command stuck behind a paused
// Stop's slot: a Stop of the timer then wins, its cancel frees the entry from the held bucket,
// and the Reset's command, applied before it, is harmless. The timer never fires.
func TestResetParkedThenStopped(t *testing.T) {
	w, clk, _ := parkWheel(t)
	fired := 0
	tm, err := w.AfterFunc(time.Millisecond, func() { fired++ })
	require.NoError(t, err)
	d, err := w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	finish := holdReset(t, tm, 5*time.Millisecond)
	clk.Advance(time.Millisecond)
	require.True(t, isParked(w, tm))
	ok, held := d.StopHeld() // the ring stalls here: the Reset's command waits behind it
	require.True(t, ok)
	finish()
	require.True(t, isParked(w, tm), "the command is behind the held slot")
	require.True(t, tm.Stop(), "pending again: Stop prevents it")
	clk.Advance(10 * time.Millisecond)
	held.Publish()
	clk.Advance(time.Hour)
	require.Zero(t, fired)
	require.Zero(t, w.Len())
	require.NoError(t, w.Verify())
	require.Zero(t, tm.s.tw.count, "nothing linked")
	requireBalanced(t, w)
}

// Parked, released, its command not yet applied; a second Reset to a later deadline (which, not
// parked, sends no command) returns: the first Reset's command must move the entry to the
// second's deadline, and it fires exactly there. Also a second Reset to an earlier deadline.
func TestResetParkedThenResetAgain(t *testing.T) {
	for _, tc := range []struct {
		name   string
		second time.Duration // Reset at 1 ms
		due    time.Duration
	}{
		{"later", 8 * time.Millisecond, 9 * time.Millisecond},
		{"earlier", 1500 * time.Microsecond, 2500 * time.Microsecond},
		{"same tick", 3900 * time.Microsecond, 4900 * time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, clk, now := parkWheel(t)
			var firedAt time.Duration = -1
			tm, err := w.AfterFunc(time.Millisecond, func() { firedAt = now() })
			require.NoError(t, err)
			d, err := w.AfterFunc(time.Hour, func() {})
			require.NoError(t, err)
			finish := holdReset(t, tm, 4*time.Millisecond) // due 4 ms
			clk.Advance(time.Millisecond)
			require.True(t, isParked(w, tm))
			ok, held := d.StopHeld()
			require.True(t, ok)
			finish()
			require.True(t, tm.Reset(tc.second))
			held.Publish()
			clk.Advance(tc.due - now() - 1)
			require.Equal(t, time.Duration(-1), firedAt, "fired before its last deadline")
			clk.Advance(1)
			require.Equal(t, tc.due, firedAt)
			require.NoError(t, w.Verify())
			require.Zero(t, w.Len())
		})
	}
}

// An Every whose Reset is paused across the advance that meets its re-armed entry: parked, then
// moved to the Reset's deadline; the series keeps its rate from there.
func TestResetParkedEvery(t *testing.T) {
	w, clk, now := parkWheel(t)
	var runs []time.Duration
	tm, err := w.Every(10*time.Millisecond, func() { runs = append(runs, now()) })
	require.NoError(t, err)
	clk.Advance(10 * time.Millisecond)
	require.Equal(t, []time.Duration{10 * time.Millisecond}, runs)
	finish := holdReset(t, tm, 15*time.Millisecond) // due 25 ms; the series' own run is at 20 ms
	clk.Advance(10 * time.Millisecond)
	require.True(t, isParked(w, tm))
	require.Len(t, runs, 1, "ran while a Reset held it")
	finish()
	clk.Advance(5*time.Millisecond - 1)
	require.Len(t, runs, 1)
	clk.Advance(1)
	clk.Advance(10 * time.Millisecond)
	require.Equal(t, []time.Duration{10 * time.Millisecond, 25 * time.Millisecond, 35 * time.Millisecond}, runs)
	require.True(t, tm.Stop())
	require.NoError(t, w.Verify())
	requireBalanced(t, w)
}

// TestResetParkedNotMovedByAnEarlierCommand: a parked entry stays in the held bucket until the
// Reset that parked it sends its own command; an earlier Reset's command does not move it. Found
// by review at 269d64a, where it did: the next advance then met the entry still parked and
// dropped it, the parked Reset's own command found it unlinked, and the timer never fired.
//
//  1. Reset0 of T (to 2 ms) publishes its reset command behind a slot claimed by a paused Stop
//     of another timer, so that no drain sees it yet (a Reset0 goroutine paused between its
//     release and its send is the same).
//  2. Reset1 of T claims it (resetting) and is paused (preemption, GC assist).
//  3. The advance to T's old deadline meets it held: parks it (stParked, held bucket).
//  4. The paused slot is published; the next advance's drain applies Reset0's command, which
//     must leave the parked entry where it is (it used to move it into the bucket of 2 ms, and
//     the same advance took that bucket and dropped the entry).
//  5. Reset1 goes on: its CAS fails (parked), it stores pending and sends its command, which
//     moves the entry to 50 ms.
//
// Keyed.Move storms (concurrent Resets of one timer) are where two Resets of one timer meet.
func TestResetParkedNotMovedByAnEarlierCommand(t *testing.T) {
	w, clk, now := parkWheel(t)
	var firedAt time.Duration = -1
	tm, err := w.AfterFunc(10*time.Millisecond, func() { firedAt = now() })
	require.NoError(t, err)
	d, err := w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	ok, held := d.StopHeld()
	require.True(t, ok)
	require.True(t, tm.Reset(2*time.Millisecond))   // 1. its command waits behind the held slot
	finish := holdReset(t, tm, 50*time.Millisecond) // 2.
	clk.Advance(10 * time.Millisecond)              // 3.
	require.True(t, isParked(w, tm), "the advance met the held entry: parked")
	held.Publish()
	clk.Advance(0) // 4.
	finish()       // 5.
	clk.Advance(40*time.Millisecond - 1)
	require.Equal(t, time.Duration(-1), firedAt, "fired before its deadline")
	clk.Advance(1)
	require.Equal(t, 50*time.Millisecond, firedAt, "T, reset to 50 ms, not fired at 50 ms (Len %d)", w.Len())
	clk.Advance(time.Hour)
	require.Zero(t, w.Len())
	require.NoError(t, w.Verify())
}

func parkStorm(t *testing.T, w *Wheel, tick func(), dur time.Duration, every bool) {
	const n = 64
	var fired [n]atomic.Int32
	var stopped [n]atomic.Int32
	var parkedRuns atomic.Int64
	tms := make([]Timer, n)
	for k := range tms {
		var err error
		if every {
			tms[k], err = w.Every(time.Duration(50+rand.IntN(500))*time.Microsecond, func() { fired[k].Add(1) })
		} else {
			tms[k], err = w.AfterFunc(time.Duration(rand.IntN(2000))*time.Microsecond, func() { fired[k].Add(1) })
		}
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := r.IntN(n)
				switch r.IntN(200) {
				case 0:
					if tms[k].Stop() {
						stopped[k].Add(1)
					}
				case 1, 2, 3, 4, 5, 6, 7, 8, 9, 10:
					// A Reset paused between its claim and its release (preemption): the
					// advance meets the entry held and parks it.
					if ok, release := tms[k].ResetHeld(time.Duration(r.IntN(1500)-100) * time.Microsecond); ok {
						time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
						if isParked(w, tms[k]) {
							parkedRuns.Add(1)
						}
						release()
					}
				default:
					tms[k].Reset(time.Duration(r.IntN(1500)-100) * time.Microsecond)
				}
				if r.IntN(16) == 0 {
					time.Sleep(time.Duration(r.IntN(50)) * time.Microsecond)
				}
			}
		}()
	}
	if tick != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				tick()
			}
		}()
	}
	time.Sleep(dur)
	close(stop)
	wg.Wait()
	if every {
		for k := range tms {
			if tms[k].Stop() {
				stopped[k].Add(1)
			}
		}
	}
	// Everything left must come due and fire within a few ms (resets were at most 1.4 ms out).
	deadline := time.Now().Add(2 * time.Second)
	for w.Len() != 0 && time.Now().Before(deadline) {
		if tick != nil {
			tick()
		}
		time.Sleep(time.Millisecond)
	}
	if tick != nil {
		tick()
	}
	t.Logf("Resets that found their entry parked: %d", parkedRuns.Load())
	require.NoError(t, w.Verify())
	for k := range tms {
		f, s := fired[k].Load(), stopped[k].Load()
		if every {
			require.LessOrEqual(t, s, int32(1), "timer %d stopped %d times", k, s)
			require.Equal(t, int32(1), s, "every %d: its series not ended by one Stop (fired %d)", k, f)
		} else {
			require.Equal(t, int32(1), f+s, "timer %d: fired %d, stopped %d (Len %d)", k, f, s, w.Len())
		}
	}
	require.Zero(t, w.Len())
}

func TestResetParkStormSystemClock(t *testing.T) {
	for round := 0; round < 2; round++ {
		w, err := New(WithShards(2), WithWorkers(3), WithTick(100*time.Microsecond))
		require.NoError(t, err)
		parkStorm(t, w, nil, 300*time.Millisecond, false)
		st := w.Stats()
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+uint64(st.Pending), "%+v", st)
		w.Stop()
	}
}

func TestResetParkStormManualClock(t *testing.T) {
	for round := 0; round < 2; round++ {
		clk := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clk), WithShards(2), WithWorkers(2), WithTick(100*time.Microsecond))
		require.NoError(t, err)
		parkStorm(t, w, func() { clk.Advance(time.Duration(rand.IntN(300)) * time.Microsecond) }, 300*time.Millisecond, false)
		w.Stop()
	}
}

func TestResetParkStormEvery(t *testing.T) {
	for round := 0; round < 2; round++ {
		w, err := New(WithShards(2), WithWorkers(3), WithTick(100*time.Microsecond))
		require.NoError(t, err)
		parkStorm(t, w, nil, 300*time.Millisecond, true)
		w.Stop()
	}
}

// TestResetParkedCommandAppliedWhileAnotherResetHolds: the parking Reset's command is applied
// while a second Reset holds the entry (resetting, in the held bucket): it moves the entry out
// at the deadline it reads (the first Reset's, the second has not stored yet). Then the second
// Reset releases: with the entry met and parked again by the advance meanwhile, or not met, to a
// later or an earlier deadline. The timer fires once, exactly at the second Reset's deadline.
func TestResetParkedCommandAppliedWhileAnotherResetHolds(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name    string
		second  time.Duration // Reset at 1 ms
		reparks bool          // advance to 5 ms (the first Reset's deadline) while the second holds
		due     time.Duration
	}{
		{"later, re-parked", 8 * ms, true, 9 * ms},
		{"later, not met", 8 * ms, false, 9 * ms},
		{"earlier, not met", 2 * ms, false, 3 * ms},
		{"earlier than the first's, met", 2500 * time.Microsecond, true, 3500 * time.Microsecond}, // met at 5 ms: parked, fires at once after its release
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, clk, now := parkWheel(t)
			var fired []time.Duration
			tm, err := w.AfterFunc(ms, func() { fired = append(fired, now()) })
			require.NoError(t, err)
			finish1 := holdReset(t, tm, 5*ms) // due 5 ms
			clk.Advance(ms)
			require.True(t, isParked(w, tm))
			finish1() // pending, still held; its command is in the ring
			finish2 := holdReset(t, tm, tc.second)
			released := false
			defer func() {
				if !released {
					finish2() // else the cleanup's Wheel.Stop waits for it forever
				}
			}()
			s := tm.s
			s.mu.Lock()
			s.drainLocked() // a drain (a full ring's producer, the trimmer) applies the first Reset's command
			s.mu.Unlock()
			require.False(t, isParked(w, tm), "the first Reset's command moves the entry out")
			if tc.reparks {
				clk.Advance(4 * ms)
				require.True(t, isParked(w, tm), "met while the second Reset holds it: parked")
			}
			finish2()
			released = true
			if d := tc.due - now() - 1; d >= 0 {
				clk.Advance(d)
				require.Empty(t, fired, "fired before its deadline")
				clk.Advance(1)
			} else {
				clk.Advance(0)
			}
			require.Equal(t, []time.Duration{max(tc.due, now())}, fired)
			clk.Advance(time.Hour)
			require.Len(t, fired, 1)
			require.NoError(t, w.Verify())
			require.Zero(t, w.Len())
			requireBalanced(t, w)
		})
	}
}

// TestReview26StaleHandles pins Stop and Reset on stale handles (a pin): after the timer fired
// and its entry was taken by a new timer, from inside its own callback, and for an Every whose
// entry was reused after its series ended. A stale handle reports false and leaves the new
// timer alone.
func TestReview26StaleHandles(t *testing.T) {
	w, clk, _ := parkWheel(t)
	var fired []string
	var inside []bool
	var self Timer
	self, err := w.AfterFunc(time.Millisecond, func() {
		fired = append(fired, "one")
		inside = append(inside, self.Stop(), self.Reset(time.Millisecond))
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"one"}, fired)
	require.Equal(t, []bool{false, false}, inside, "Stop and Reset from inside a one-shot's callback")

	next, err := w.AfterFunc(time.Hour, func() { fired = append(fired, "next") })
	require.NoError(t, err)
	require.Equal(t, self.i, next.i, "the fired entry is reused")
	require.Equal(t, self.gen+1, next.gen)
	require.False(t, self.Reset(0))
	require.False(t, self.Stop())
	clk.Advance(time.Minute)
	require.Equal(t, []string{"one"}, fired, "the stale Reset(0) moved nothing")
	require.Equal(t, 1, w.Len())

	// An Every: Reset from inside its run reports false (the series is running, not waiting),
	// Stop reports true once; its entry then serves a new timer.
	inside = nil
	var ev Timer
	ev, err = w.Every(time.Millisecond, func() {
		fired = append(fired, "every")
		inside = append(inside, ev.Reset(time.Millisecond), ev.Stop(), ev.Stop())
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"one", "every"}, fired)
	require.Equal(t, []bool{false, true, false}, inside)
	again, err := w.AfterFunc(time.Millisecond, func() { fired = append(fired, "again") })
	require.NoError(t, err)
	require.Equal(t, ev.i, again.i)
	require.False(t, ev.Reset(time.Hour), "a stale Every handle")
	require.False(t, ev.Stop())
	clk.Advance(time.Millisecond)
	require.Equal(t, []string{"one", "every", "again"}, fired)
	require.True(t, next.Stop())
	require.Zero(t, w.Len())
	requireBalanced(t, w)
	require.NoError(t, w.Verify())
}

// r32Pair is the argument of one of two timers due in the same tick: whichever runs first stops
// the other (which the shard has already moved to firing) and looks whether the other's
// argument is still kept reachable by the wheel.
type r32Pair struct {
	p      *r32Payload
	other  Timer
	otherP weak.Pointer[r32Payload]
	out    *r32PairOut
}

type r32PairOut struct {
	runs      int
	stopped   bool
	collected bool
}

// TestReview32FixedStopOfFiringTimerKeepsArg (bug, memory): README "Prompt release": "When
// Timer.Stop (or a context's cancel, or Keyed.Remove) reports true, the wheel no longer keeps
// the callback or its argument reachable." A timer that the shard has fired (state firing) but
// whose callback has not started is stopped with Stop reporting true, yet its entry keeps f and
// arg until the worker reaches it in its batch, which is after every callback ahead of it in
// that batch has returned (timer.go:196: "firing: dispatched, not started; the worker sees
// stopped and frees the entry"; no clearEntry on that path). A slow callback ahead of it, or a
// callback that blocks, keeps the stopped timer's argument alive for as long as it runs.
//
// Deterministic: one shard, a manual clock, WithWorkers(0); two timers due in the same tick; the
// first to run stops the other (true) and collects garbage: the other's argument is still live.
func TestReview32FixedStopOfFiringTimerKeepsArg(t *testing.T) {
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()

	out := &r32PairOut{}
	f := func(arg any) {
		pr := arg.(*r32Pair)
		pr.out.runs++
		pr.out.stopped = pr.other.Stop()
		pr.out.collected = r32Gone(pr.otherP)
	}
	func() { // the payloads are made in here so that no frame of the test keeps them
		a := &r32Pair{p: new(r32Payload), out: out}
		b := &r32Pair{p: new(r32Payload), out: out}
		ta, err := w.AfterFuncArg(time.Millisecond, f, a)
		require.NoError(t, err)
		tb, err := w.AfterFuncArg(time.Millisecond, f, b)
		require.NoError(t, err)
		a.other, a.otherP = tb, weak.Make(b.p)
		b.other, b.otherP = ta, weak.Make(a.p)
	}()
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, out.runs, "the first callback stops the other")
	require.True(t, out.stopped, "Stop of a fired, not yet started, timer reports true")
	require.True(t, out.collected, "Stop reported true, yet the wheel keeps the stopped timer's argument reachable")
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

// requireFreed checks that tm's entry went back to the slab: the next arm on its shard takes it
// (the free stack is last in, first out) with the next gen.
func requireFreed(t *testing.T, w *Wheel, tm Timer) {
	t.Helper()
	next, err := w.AfterFunc(time.Hour, func() {})
	require.NoError(t, err)
	require.Equal(t, tm.i, next.i, "the stopped timer's entry is the next one armed")
	require.Equal(t, tm.gen+1, next.gen)
	require.True(t, next.Stop())
}

func TestStopQueuedSendsNoCommand(t *testing.T) {
	w, clk, _ := parkWheel(t)
	fired := 0
	tm, err := w.AfterFunc(time.Millisecond, func() { fired++ })
	require.NoError(t, err)
	require.True(t, tm.Queued(), "the shard has not taken the add")
	before := commands(tm.s)

	require.True(t, tm.Stop())
	require.Equal(t, before, commands(tm.s), "a Stop of a queued timer pushes no command")
	e := tm.s.slab.at(tm.i)
	require.Nil(t, e.f, "Stop lets go of the callback at once")
	require.False(t, tm.Stop(), "only the first Stop reports true")
	require.False(t, tm.Reset(time.Millisecond))

	takeRing(tm.s) // the shard takes the add, finds the entry stopped, and frees it
	require.False(t, e.linked())
	clk.Advance(time.Hour)
	require.Zero(t, fired)
	requireFreed(t, w, tm)
	require.NoError(t, w.Verify())
	requireBalanced(t, w)
	require.Zero(t, w.Len())
}

// The shard takes the add while the Stop is paused between its CAS to stopping and its CAS to
// stopped: the shard clears queued and leaves the entry unlinked and unfreed; the Stop's second
// CAS fails, so it sends a cancel, which frees the entry.
func TestStopQueuedPausedWhileTheShardTakesTheAdd(t *testing.T) {
	w, clk, _ := parkWheel(t)
	fired := 0
	tm, err := w.AfterFunc(time.Millisecond, func() { fired++ })
	require.NoError(t, err)
	ok, finish := tm.StopQueuedHeld()
	require.True(t, ok)
	require.False(t, tm.Stop(), "the paused Stop is the one that reports true")
	require.False(t, tm.Reset(time.Minute), "a stopping timer cannot be reset")

	takeRing(tm.s)
	e := tm.s.slab.at(tm.i)
	require.False(t, tm.Queued(), "the shard took the add")
	require.False(t, e.linked(), "and did not link a stopping entry")
	require.True(t, isState(e.state.Load(), stStopping), "nor free it")

	before := commands(tm.s)
	finish()
	require.Equal(t, before+1, commands(tm.s), "the Stop, finding the add taken, sends a cancel")
	require.True(t, isState(e.state.Load(), stStopped))
	takeRing(tm.s)
	clk.Advance(time.Hour)
	require.Zero(t, fired)
	requireFreed(t, w, tm)
	require.NoError(t, w.Verify())
	requireBalanced(t, w)
}

// The same pause, with the add taken only after the Stop finished: the add frees the entry.
func TestStopQueuedFinishedBeforeTheAdd(t *testing.T) {
	w, clk, _ := parkWheel(t)
	tm, err := w.AfterFunc(time.Millisecond, func() { t.Error("a stopped timer fired") })
	require.NoError(t, err)
	ok, finish := tm.StopQueuedHeld()
	require.True(t, ok)
	before := commands(tm.s)
	finish()
	require.Equal(t, before, commands(tm.s))
	takeRing(tm.s)
	clk.Advance(time.Hour)
	requireFreed(t, w, tm)
	requireBalanced(t, w)
}

// A Reset claims a queued entry, the shard takes the add (clearing queued under the Reset's
// feet), and the Reset's release CAS fails for that: it retries, keeps the timer where the add
// linked it, and the timer fires at the new deadline. With park, an Advance to the old deadline
// takes the add and meets the held entry too: it parks it, the release finds it parked and sends
// its command, and the timer fires at the later of the two deadlines (a review's case).
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
				require.False(t, tm.Queued(), "the release keeps the bit the shard cleared")
				require.Equal(t, park, isParked(w, tm), "parked until the release's command is taken")
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

// An Every's re-arm is queued too: a Stop between runs, before the shard took the re-arm's add,
// sends no command, and the series ends.
func TestStopQueuedEveryRearm(t *testing.T) {
	w, clk, _ := parkWheel(t)
	runs := 0
	tm, err := w.Every(time.Millisecond, func() { runs++ })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, 1, runs)
	if !tm.Queued() {
		t.Fatal("after a run inside Advance the re-arm's add should still be in the ring")
	}
	before := commands(tm.s)
	require.True(t, tm.Stop())
	require.Equal(t, before, commands(tm.s))
	clk.Advance(time.Second)
	require.Equal(t, 1, runs)
	requireFreed(t, w, tm)
	requireBalanced(t, w)
}

// TestStopFiringPausedWorkerPasses drives the one interleaving a schedule rarely shows: the Stop
// has moved the entry to letting go and is paused there (before it lets go of the callback),
// and the worker comes to the entry. The worker must not start the callback, must not wait,
// and must leave the entry to the Stop, which then frees it: the slab hands the entry out again
// once, and nothing of the stopped timer is kept.
func TestStopFiringPausedWorkerPasses(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	s := w.shards[0]

	ran := false
	tm := func() Timer {
		p := new(ctxPayload)
		tm, err := w.AfterFuncArg(time.Millisecond, func(any) { ran = true }, p)
		require.NoError(t, err)
		return tm
	}()
	e := s.slab.at(tm.i)
	wp := weak.Make(e.arg.(*ctxPayload))

	// The shard fires the entry into a batch, as an advance does, without running it.
	s.mu.Lock()
	s.advanceLocked(int64(time.Millisecond), 0)
	refs := append([]ref(nil), s.fired...)
	clear(s.fired)
	s.fired = s.fired[:0]
	s.mu.Unlock()
	require.Len(t, refs, 1)
	word := e.state.Load()
	require.True(t, isState(word, stFiring))

	// Stop's first step (its CAS and its counts), then the pause.
	require.True(t, e.state.CompareAndSwap(word, withState(word, stLetGo)))
	s.stopped.Inc()
	s.returnCredit()

	// The worker comes to the entry meanwhile: it passes, without starting the callback.
	var fb freeBatch
	lc := lateClock{w: w}
	w.runEntry(refs[0], w.pool.advancerSlot(), &lc, &fb)
	fb.flush()
	require.False(t, ran, "a stopped timer's callback started")
	require.True(t, isState(e.state.Load(), stPassed), "the worker left the entry to the Stop")
	require.False(t, tm.Stop(), "a second Stop reports false while the first lets go")
	require.False(t, tm.Reset(time.Second), "Reset of a stopped timer")

	// The Stop goes on: it lets go of the callback, finds the worker passed, and frees the entry.
	tm.stopFiring(e, word)
	require.True(t, isState(e.state.Load(), stStopped))
	require.Nil(t, e.f)
	require.Nil(t, e.arg)
	runtime.GC()
	runtime.GC()
	require.Nil(t, wp.Value(), "the stopped timer's argument is kept")
	require.False(t, tm.Stop())

	// The entry went back to the slab once: the next arming takes it (last in, first out), the
	// one after takes another.
	t1, err := w.AfterFunc(time.Millisecond, func() {})
	require.NoError(t, err)
	t2, err := w.AfterFunc(time.Millisecond, func() {})
	require.NoError(t, err)
	require.Equal(t, tm.i, t1.i)
	require.NotEqual(t, t1.i, t2.i)
	clk.Advance(2 * time.Millisecond)
	st := w.Stats()
	require.Equal(t, uint64(3), st.Scheduled)
	require.Equal(t, uint64(2), st.Fired)
	require.Equal(t, uint64(1), st.Stopped)
	require.Zero(t, st.Pending)
	require.False(t, ran)
}

// TestStopFiringStorm: timers that come due together stop one another from their callbacks, and a
// goroutine outside stops them too, on several workers. Each timer either ran or had exactly one
// Stop report true, never both; the books balance; and the slab, whose entries the Stops and the
// workers freed, hands out each entry to one timer at a time afterwards (every later timer runs
// once).
func TestStopFiringStorm(t *testing.T) {
	defer goleak.VerifyNone(t)
	for round := 0; round < 4; round++ {
		clk := NewManualClock(time.Unix(0, 0))
		w, err := New(WithClock(clk), WithShards(2), WithWorkers(3))
		require.NoError(t, err)
		const n = 3000
		tms := make([]Timer, n)
		var ran, stopped [n]atomic.Int32
		var mu sync.Mutex // guards tms while they are armed
		rng := rand.New(rand.NewPCG(uint64(int64(round)), 0))
		seeds := make([]int64, n)
		for i := range seeds {
			seeds[i] = rng.Int64()
		}
		mu.Lock()
		for i := 0; i < n; i++ {
			i := i
			tms[i], err = w.AfterFunc(time.Duration(1+i%3)*time.Millisecond, func() {
				ran[i].Add(1)
				r := rand.New(rand.NewPCG(uint64(seeds[i]), 0))
				for k := 0; k < 3; k++ {
					j := r.IntN(n)
					if tms[j].Stop() {
						stopped[j].Add(1)
					}
				}
			})
			require.NoError(t, err)
		}
		mu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			r := rand.New(rand.NewPCG(uint64(int64(round)+100), 0))
			for k := 0; k < n/2; k++ {
				j := r.IntN(n)
				if tms[j].Stop() {
					stopped[j].Add(1)
				}
			}
		}()
		clk.Advance(3 * time.Millisecond)
		<-done
		require.Eventually(t, func() bool { return w.Stats().Queued == 0 }, 5*time.Second, time.Millisecond)
		w.Stop() // waits for the callbacks
		var fired, stops int
		for i := 0; i < n; i++ {
			r, s := ran[i].Load(), stopped[i].Load()
			require.True(t, r+s == 1, "timer %d: ran %d times, stopped %d times", i, r, s)
			fired += int(r)
			stops += int(s)
		}
		st := w.Stats()
		require.Equal(t, uint64(fired), st.Fired)
		require.Equal(t, uint64(stops), st.Stopped)
		require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending))
	}
}

// TestStopFiringSlabAfterStorm: after a storm of Stops of fired timers (freed by the Stops or by
// the workers), a wheel that goes on arming reuses the freed entries one owner at a time: every
// timer armed afterwards runs exactly once.
func TestStopFiringSlabAfterStorm(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithShards(1), WithWorkers(2))
	require.NoError(t, err)
	defer w.Stop()
	for round := 0; round < 20; round++ {
		const n = 500
		tms := make([]Timer, n)
		ready := make(chan struct{})
		for i := 0; i < n; i++ {
			i := i
			tms[i], err = w.AfterFunc(time.Millisecond, func() {
				<-ready
				tms[(i+1)%n].Stop()
			})
			require.NoError(t, err)
		}
		close(ready)
		clk.Advance(time.Millisecond)
		// What the storm freed is armed again at once: a doubly freed entry would be handed to
		// two of these, and one of them would be lost or run twice.
		requireFreshTimersRunOnce(t, w, clk, n)
		// The storm's last callbacks may still wait in a worker's chunk behind the fresh ones
		// (two workers; a fired timer counts as pending until its callback starts).
		require.Eventually(t, func() bool { return w.Len() == 0 }, 5*time.Second, time.Millisecond)
	}
}

// requireFreshTimersRunOnce arms n timers due in 1ms on w, advances clk past them and requires
// that each runs exactly once: after a storm of Stops and frees, a doubly freed entry would be
// handed to two of them, and one would be lost or run twice.
func requireFreshTimersRunOnce(t *testing.T, w *Wheel, clk *ManualClock, n int) {
	t.Helper()
	runs := make([]atomic.Int32, n)
	for i := range runs {
		_, err := w.AfterFunc(time.Millisecond, func() { runs[i].Add(1) })
		require.NoError(t, err)
	}
	clk.Advance(time.Millisecond)
	require.Eventually(t, func() bool {
		for i := range runs {
			if runs[i].Load() != 1 {
				return false
			}
		}
		return true
	}, 5*time.Second, time.Millisecond)
}
