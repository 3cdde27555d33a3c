package shardwheel

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 38: review 37's fix (context.go: the loser of end's CAS waits for the winner's finished
// bit, awaitEnd), the Goexit unwatch in work's deferred call (expiry.go) and Timer.Stop's new
// doc on timers of a batch whose callback stopped the wheel (timer.go).

var start38 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// lockedBag38 is a context wrapper of a common kind: a struct embedding its parent, with values
// of its own behind a mutex that its Value takes for every key (here a one-token semaphore, so
// that the test can break a deadlock it finds rather than hang: closing abort lets Value go on
// without the lock). Done, Err and Deadline are the parent's, so a wheel parent stays in the
// closed world (withDeadline finds it through Value(wheelCtxKey)).
type lockedBag38 struct {
	context.Context
	sem     chan struct{}
	abort   chan struct{}
	watch   atomic.Bool   // set once the setup is over: then a cancelCtxKey look is reported
	entered chan struct{} // closed at the first such look
	once    sync.Once
	vals    map[any]any
}

func newLockedBag38(parent context.Context) *lockedBag38 {
	return &lockedBag38{
		Context: parent,
		sem:     make(chan struct{}, 1),
		abort:   make(chan struct{}),
		entered: make(chan struct{}),
		vals:    map[any]any{},
	}
}

// lock takes the bag's lock, or reports false once abort is closed.
func (b *lockedBag38) lock() bool {
	select {
	case b.sem <- struct{}{}:
		return true
	case <-b.abort:
		return false
	}
}

func (b *lockedBag38) unlock() { <-b.sem }

func (b *lockedBag38) Value(key any) any {
	if b.watch.Load() && key == cancelCtxKey {
		b.once.Do(func() { close(b.entered) })
	}
	if b.lock() {
		defer b.unlock()
	}
	if v, ok := b.vals[key]; ok {
		return v
	}
	return b.Context.Value(key)
}

// TestReview38FixedSessionCloseDeadlocksWithShutdown: API.md asks for the standard library's
// behaviour "in every observable way". Review 37's fix makes a loser of end's CAS wait for the
// winner's finished bit (context.go:386, end -> awaitEnd, context.go:431-436), and the comment
// above end (context.go:373-374) argues "the winner never waits for a loser: it holds no lock of
// a loser's". But the winner runs user code: ending a wheel kid with its own end code
// (context.go:414, endParentCanceled), the kid's end calls its gate registration f
// (context.go:408-409), std's closure func() { q.cancel(false, gate.Err(), context.Cause(gate)) },
// and Cause(gate) -> ctxGate.Value (context_afterfunc.go:50-51) -> g.parent.Value(&cancelCtxKey):
// the Value of the wrapper the kid was made under. That wrapper is user code, and a common kind
// takes a lock: a session that embeds its context and keeps values behind a mutex, whose Close
// takes that mutex and calls the session context's CancelFunc. The interleaving:
//  1. G1 (the session's Close) takes the session's lock;
//  2. G2 (the server's shutdown) cancels the server context: its end ends the session context
//     (sctx.end(endParentCanceled) wins the CAS), whose end ends a request made under the session
//     (req.end wins) -> req's f -> Cause(req's gate) -> session.Value(&cancelCtxKey), which waits
//     for the lock;
//  3. G1 calls the session context's CancelFunc: sctx.end loses the CAS -> awaitEnd spins until
//     G2 sets sctx's finished bit, after G2's Value returns, which needs G1's lock. Neither G1
//     nor G2 ever returns.
//
// The same program on the standard library (first part of the test) completes: std's cancel
// passes err and cause down to its children (cancelCtx.cancel) and calls no Value, so the
// request's Done closes at the shutdown whatever the session's lock; and the session context's
// CancelFunc calls Value only on its own parent (removeChild: the server), never on the session
// wrapper below it. Before review 37 (84fb636) the loser returned at once and this program
// completed here too. Bounded: after 2 s the test lets the session's Value go on without the
// lock, and fails. Failed 5 of 5 (-race -count=5) on 2f7ff88: the order is forced by channels.
// Fixed since: ctxGate.Value asks the wheel parent for its q directly, so an ender runs no user
// code (as std's), and G2 ends everything without the session's lock.
func TestReview38FixedSessionCloseDeadlocksWithShutdown(t *testing.T) {
	defer goleak.VerifyNone(t)

	// The standard library: server, session context, session, a request under the session.
	{
		server, cancelServer := context.WithCancel(context.Background())
		sctx, cancelS := context.WithTimeout(server, time.Hour)
		session := newLockedBag38(sctx)
		req, cancelReq := context.WithTimeout(session, time.Minute)
		defer cancelReq()
		req.Done()
		require.True(t, session.lock()) // 1.
		done := make(chan struct{})
		go func() { cancelServer(); cancelS(); close(done) }() // 2. and 3., in this order
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			close(session.abort)
			<-done
			t.Fatal("std: the shutdown or the session's CancelFunc waited for the session's lock")
		}
		require.True(t, isDone37(req), "std: the request ended with the shutdown")
		session.unlock()
		require.Equal(t, context.Canceled, req.Err())
	}

	clk := NewManualClock(start38)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()

	server, cancelServer := w.WithTimeout(context.Background(), 2*time.Hour)
	sctx, cancelS := w.WithTimeout(server, time.Hour)
	session := newLockedBag38(sctx)
	req, cancelReq := w.WithTimeout(session, time.Minute)
	defer cancelReq()
	_, onWheel := req.(*deadlineCtx)
	require.True(t, onWheel, "the session keeps its context's Done: the request is a wheel context")
	req.Done() // a select on Done: q is made, and the request's end calls its registration
	session.watch.Store(true)

	closer := make(chan struct{})
	locked := make(chan struct{})
	shut := make(chan struct{})
	go func() { // G1: the session's Close
		defer close(closer)
		session.lock() // 1.
		close(locked)
		select {
		case <-session.entered: // 2. has come to the session's Value (before the fix)
		case <-shut: // or has ended everything without it (since)
		}
		cancelS() // 3.
		session.unlock()
	}()
	<-locked
	go func() { cancelServer(); close(shut) }() // G2: the shutdown

	deadlocked := false
	select {
	case <-closer:
	case <-time.After(2 * time.Second):
		deadlocked = true
		close(session.abort) // let G2's Value go on without the lock
		<-closer
	}
	<-shut
	require.False(t, deadlocked, "the session's CancelFunc, called under the session's lock, "+
		"waited forever for the shutdown's end of the session context, which waited for that "+
		"lock in the session's Value (for its request's Cause)")
	require.Equal(t, context.Canceled, sctx.Err())
	require.Equal(t, context.Canceled, req.Err())
	require.Zero(t, w.Len())
}

// TestReview38FixedCloseUnderWrapperLockSelfDeadlocks: the same root cause without any race, and
// older than review 37 (it fails on 84fb636 too). The session's Close takes the session's lock
// and calls the session context's CancelFunc, which wins the CAS: its end ends the request made
// under the session (context.go:414) and the request's f computes Cause(req's gate) ->
// session.Value(&cancelCtxKey) (context_afterfunc.go:50-51) on the same goroutine, under the
// lock it holds: a self-deadlock. On the standard library (first part) the CancelFunc never calls
// the Value of a wrapper below the context (cancelCtx.cancel passes err and cause down; removeChild
// asks the context's own parent). Bounded at 2 s, as above. Failed 5 of 5 on 2f7ff88
// (deterministic); fixed since, as above.
func TestReview38FixedCloseUnderWrapperLockSelfDeadlocks(t *testing.T) {
	defer goleak.VerifyNone(t)
	closeUnderLock := func(sctx context.Context, cancelS context.CancelFunc, session *lockedBag38,
		req context.Context) bool {
		req.Done()
		done := make(chan struct{})
		go func() {
			defer close(done)
			if session.lock() {
				defer session.unlock()
			}
			cancelS()
		}()
		select {
		case <-done:
			return true
		case <-time.After(2 * time.Second):
			close(session.abort)
			<-done
			return false
		}
	}

	sctx, cancelS := context.WithTimeout(context.Background(), time.Hour)
	session := newLockedBag38(sctx)
	req, cancelReq := context.WithTimeout(session, time.Minute)
	defer cancelReq()
	require.True(t, closeUnderLock(sctx, cancelS, session, req), "std: Close did not return")
	require.Equal(t, context.Canceled, req.Err())

	clk := NewManualClock(start38)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	sctx, cancelS = w.WithTimeout(context.Background(), time.Hour)
	session = newLockedBag38(sctx)
	req, cancelReq = w.WithTimeout(session, time.Minute)
	defer cancelReq()
	_, onWheel := req.(*deadlineCtx)
	require.True(t, onWheel)
	require.True(t, closeUnderLock(sctx, cancelS, session, req),
		"Close (the session's lock held, then the session context's CancelFunc) never returned: "+
			"the CancelFunc's end of the request asked the session's Value for its Cause")
	require.Equal(t, context.Canceled, req.Err())
	require.Zero(t, w.Len())
}

// TestReview38PinGoexitKeeperLosesNoWake: expiry.go's work now stops the unwound goroutine's
// watchdog on a Goexit (expiry.go:147). The watchdog is what hands time over while the role is
// free (releaseLater); with it stopped, only the replacement goroutine is left to take the role
// (a replacement started 2 s late made this test fail, the timer 1.7 s late). Two workers: W1 is held in a callback that waits for a later timer's callback (so it can
// neither keep time nor take a nudge), and the keeper's own callback calls runtime.Goexit right
// after releaseLater freed the role. The later timer must still fire on time (fake time, exact:
// within a tick of its deadline), or W1 would wait for it forever.
func TestReview38PinGoexitKeeperLosesNoWake(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		const tick = 10 * time.Millisecond
		w, err := New(WithWorkers(2), WithShards(1), WithTick(tick))
		require.NoError(t, err)
		fired, free := make(chan struct{}), make(chan struct{})
		defer func() { close(free); w.Stop() }()
		held := make(chan struct{})
		_, err = w.AfterFunc(100*time.Millisecond, func() {
			close(held)
			select { // the worker is held until the later timer fired
			case <-fired:
			case <-free:
			}
		})
		require.NoError(t, err)
		<-held
		synctest.Wait()
		t0 := time.Now()
		_, err = w.AfterFunc(100*time.Millisecond, func() { runtime.Goexit() })
		require.NoError(t, err)
		var at time.Duration
		_, err = w.AfterFunc(400*time.Millisecond, func() { at = time.Since(t0); close(fired) })
		require.NoError(t, err)
		select {
		case <-fired:
		case <-time.After(time.Minute):
			t.Fatal("the timer after the Goexit never fired: nobody kept time")
		}
		require.GreaterOrEqual(t, at, 400*time.Millisecond)
		require.LessOrEqual(t, at, 400*time.Millisecond+tick, "fired %v late", at-400*time.Millisecond)
		require.Zero(t, w.Stop())
		st := w.Stats()
		require.Equal(t, uint64(3), st.Fired, "%+v", st)
		require.Equal(t, st.Fired, st.Lateness.Count())
	})
}

// TestReview38PinStopFromCallbackThenStopBatchOnWorkers: Timer.Stop's new doc (timer.go:160-162)
// on the system clock with workers: a batch of 20 timers due together, shared between the keeper
// and an idle worker (offerFired); the first callback to start stops the wheel and then stops
// every other timer of the batch, plus one far timer. Each timer ends exactly one way: ran, or
// its Stop reported true (those still firing on the Stop caller's goroutine, which never run), or
// counted in Wheel.Stop (the far one only: a fired timer is no longer pending); and the books
// balance (Scheduled == Fired + Stopped + Dropped, Lateness.Count() == Fired).
func TestReview38PinStopFromCallbackThenStopBatchOnWorkers(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		w, err := New(WithWorkers(2), WithShards(1), WithTick(time.Millisecond))
		require.NoError(t, err)
		const n = 20
		var (
			hs       [n]Timer
			ran      [n]atomic.Bool
			stopTrue [n]atomic.Bool
			first    atomic.Bool
			got      = -1
			far      Timer
			farStop  bool
		)
		ready := make(chan struct{})
		for i := range n {
			hs[i], err = w.AfterFunc(50*time.Millisecond, func() {
				<-ready
				if !first.CompareAndSwap(false, true) {
					ran[i].Store(true)
					return
				}
				ran[i].Store(true)
				got = w.Stop()
				for j := range n {
					if j != i && hs[j].Stop() {
						stopTrue[j].Store(true)
					}
				}
				farStop = far.Stop()
			})
			require.NoError(t, err)
		}
		far, err = w.AfterFunc(time.Hour, func() { t.Error("a dropped timer ran") })
		require.NoError(t, err)
		close(ready)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		require.Zero(t, w.Stop(), "later Stop calls return 0")
		require.Equal(t, 1, got, "Stop counts the far timer only: the batch had fired")
		require.False(t, farStop, "Stop counted the far timer")
		stopped := 0
		for i := range n {
			require.NotEqual(t, ran[i].Load(), stopTrue[i].Load(), "timer %d: ran %v, stopped %v",
				i, ran[i].Load(), stopTrue[i].Load())
			if stopTrue[i].Load() {
				stopped++
			}
		}
		st := w.Stats()
		require.Equal(t, uint64(n+1), st.Scheduled, "%+v", st)
		require.Equal(t, uint64(n-stopped), st.Fired, "%+v", st)
		require.Equal(t, uint64(stopped), st.Stopped, "%+v", st)
		require.Equal(t, uint64(1), st.Dropped, "%+v", st)
		require.Equal(t, st.Fired, st.Lateness.Count())
		require.Zero(t, st.Pending)
	})
}

// TestReview38PinLoserWaitsAtOneP: the loser's wait is a runtime.Gosched loop (awaitEnd). With
// GOMAXPROCS(1) it must still let the winner finish: a manual clock with two workers fires a
// parent's and its kids' deadlines while the test cancels the kids and the parent at once, every
// winner yielding right after its CAS (testHookEnded) so that the others come to it as losers;
// every CancelFunc and Advance returns, and at each CancelFunc's return its context and every std
// child under it is done. (On 84fb636, before the losers waited, this fails.)
func TestReview38PinLoserWaitsAtOneP(t *testing.T) {
	defer goleak.VerifyNone(t)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	hook := func(*deadlineCtx) { runtime.Gosched() }
	testHookEnded.Store(&hook)
	defer testHookEnded.Store(nil)
	clk := NewManualClock(start38)
	w, err := New(WithClock(clk), WithWorkers(2), WithShards(2))
	require.NoError(t, err)
	defer w.Stop()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for round := range 300 {
			d := time.Duration(1+round%3) * time.Millisecond
			parent, cancelParent := w.WithTimeout(context.Background(), d)
			var kids []context.Context
			var cancels []context.CancelFunc
			for range 3 {
				k, cancel := w.WithTimeout(parent, d)
				std, cancelStd := context.WithCancel(k)
				defer cancelStd()
				kids = append(kids, k, std)
				cancels = append(cancels, cancel)
			}
			var wg sync.WaitGroup
			bad := make(chan string, 8)
			for i, cancel := range cancels {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cancel()
					if !isDone37(kids[2*i]) || !isDone37(kids[2*i+1]) {
						bad <- "a kid's CancelFunc returned before it (or its std child) was done"
					}
				}()
			}
			wg.Add(1)
			go func() { defer wg.Done(); clk.Advance(d) }()
			runtime.Gosched()
			cancelParent()
			for _, k := range kids {
				if !isDone37(k) {
					bad <- "the parent's CancelFunc returned before a descendant was done"
					break
				}
			}
			wg.Wait()
			close(bad)
			for s := range bad {
				t.Error(s)
				return
			}
		}
	}()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("a CancelFunc or an Advance did not return at GOMAXPROCS(1)")
	}
	require.Zero(t, w.Len())
}
