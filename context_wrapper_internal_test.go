package shardwheel

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// ctxLockedBag is a context wrapper of a common kind: a struct embedding its parent, with values
// of its own behind a mutex that its Value takes for every key (here a one-token semaphore, so
// that the test can break a deadlock it finds rather than hang: closing abort lets Value go on
// without the lock). Done, Err and Deadline are the parent's, so a wheel parent stays in the
// closed world (withDeadline finds it through Value(wheelCtxKey)).
type ctxLockedBag struct {
	context.Context
	sem     chan struct{}
	abort   chan struct{}
	watch   atomic.Bool   // set once the setup is over: then a cancelCtxKey look is reported
	entered chan struct{} // closed at the first such look
	once    sync.Once
	vals    map[any]any
}

func newCtxLockedBag(parent context.Context) *ctxLockedBag {
	return &ctxLockedBag{
		Context: parent,
		sem:     make(chan struct{}, 1),
		abort:   make(chan struct{}),
		entered: make(chan struct{}),
		vals:    map[any]any{},
	}
}

// lock takes the bag's lock, or reports false once abort is closed.
func (b *ctxLockedBag) lock() bool {
	select {
	case b.sem <- struct{}{}:
		return true
	case <-b.abort:
		return false
	}
}

func (b *ctxLockedBag) unlock() { <-b.sem }

func (b *ctxLockedBag) Value(key any) any {
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

// TestContextSessionCloseRacingShutdownReturns: an ender runs no user code, as std's cancel runs
// none: it never calls the Value of a wrapper that the context or its kids were made under. A
// common wrapper takes a lock in Value: a session that embeds its context and keeps values behind
// a mutex, whose Close takes that mutex and calls the session context's CancelFunc. Then:
//  1. G1 (the session's Close) takes the session's lock;
//  2. G2 (the server's shutdown) cancels the server context, whose end ends the session context,
//     whose end ends a request made under the session: the request's q (its std part) copies the
//     request's cause, which ctxGate.Value must read from the session context's q directly, not
//     through session.Value, which would wait for G1's lock;
//  3. G1 calls the session context's CancelFunc, which loses the CAS that ends the session
//     context and waits for G2's end of it to finish (awaitEnd).
//
// So G2 must end everything without the session's lock, and both return. The same program on the
// standard library (first part of the test) completes: std's cancel passes err and cause down to
// its children (cancelCtx.cancel) and calls no Value, and the session context's CancelFunc calls
// Value only on its own parent (removeChild: the server). The order is forced by channels;
// bounded: after 2 s the test lets the session's Value go on without the lock, and fails.
func TestContextSessionCloseRacingShutdownReturns(t *testing.T) {
	defer goleak.VerifyNone(t)

	// The standard library: server, session context, session, a request under the session.
	{
		server, cancelServer := context.WithCancel(context.Background())
		sctx, cancelS := context.WithTimeout(server, time.Hour)
		session := newCtxLockedBag(sctx)
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
		require.True(t, ctxIsDone(req), "std: the request ended with the shutdown")
		session.unlock()
		require.Equal(t, context.Canceled, req.Err())
	}

	clk := NewManualClock(ctxStart)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()

	server, cancelServer := w.WithTimeout(context.Background(), 2*time.Hour)
	sctx, cancelS := w.WithTimeout(server, time.Hour)
	session := newCtxLockedBag(sctx)
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
		case <-session.entered: // 2. reached the session's Value, where it waits for the lock
		case <-shut: // or ended everything without it
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

// TestContextCancelUnderWrapperLockReturns: the same rule without a race. The session's Close
// takes the session's lock and calls the session context's CancelFunc, which wins the CAS: its end
// ends the request made under the session, whose q copies the request's cause on the same
// goroutine, under the lock that goroutine holds; read through session.Value, that cause would be
// a self-deadlock. On the standard library (first part) the CancelFunc never calls the Value of a
// wrapper below the context (cancelCtx.cancel passes err and cause down; removeChild asks the
// context's own parent). Bounded at 2 s, as above.
func TestContextCancelUnderWrapperLockReturns(t *testing.T) {
	defer goleak.VerifyNone(t)
	closeUnderLock := func(sctx context.Context, cancelS context.CancelFunc, session *ctxLockedBag,
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
	session := newCtxLockedBag(sctx)
	req, cancelReq := context.WithTimeout(session, time.Minute)
	defer cancelReq()
	require.True(t, closeUnderLock(sctx, cancelS, session, req), "std: Close did not return")
	require.Equal(t, context.Canceled, req.Err())

	clk := NewManualClock(ctxStart)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	sctx, cancelS = w.WithTimeout(context.Background(), time.Hour)
	session = newCtxLockedBag(sctx)
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

// ctxStartFuture is far in the future: a context that falls back to std under a ManualClock runs
// its timer on the real clock with a deadline on the manual clock's scale (see withDeadline).
var ctxStartFuture = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)

// ctxMerged is a context wrapper of a known kind (a "merged" or "detached values" context): Done,
// Err and Deadline are those of the embedded context, and Value looks in a second context first
// (values), then in the embedded one. Its Done is the embedded context's, so a wheel context made
// under it whose embedded context is a wheel context is in the closed world (withDeadline finds
// the wheel parent through Value(wheelCtxKey), which values does not answer).
type ctxMerged struct {
	context.Context
	values context.Context
}

func (m ctxMerged) Value(key any) any {
	if v := m.values.Value(key); v != nil {
		return v
	}
	return m.Context.Value(key)
}

// TestContextUnderMergedWrapperFallsBackToStd: context.Cause is the standard library's through
// wrappers too (API.md). m = ctxMerged{P, V}: P a deadline context (the wheel's, or std's in the
// reference run), V = context.WithCancelCause(Background). Std: a context K made under m finds no
// *cancelCtx whose Done is m's Done (m.Value(&cancelCtxKey) is V's), so K's end and its cause come
// from m itself: child.cancel(false, m.Err(), Cause(m)), at once in propagateCancel if m is done,
// else on std's goroutine; and Cause(m) is V's cause (nil while V is live, and K's cause then
// becomes its err). Two cases:
//  1. P ends by its deadline, with causeP; then K2 = WithDeadline(m, P's deadline) is born ended,
//     and G under K2 too. Std: Cause(K2) == Cause(G) == DeadlineExceeded.
//  2. P (deadline 1h) live; K1 = WithTimeout(m, 30m) made; V canceled with causeV; P's CancelFunc.
//     Std: Cause(K1) == causeV.
//
// A wheel kid reads a cause its parent gave it from the wheel parent's q (ctxGate.Value), past
// the wrapper it was made under: here that would be causeP for K2 and G, and Canceled for K1. So
// a wrapper parent must also lead std's cause lookup (Value(&cancelCtxKey)) to the wheel parent's
// q, or the context falls back to the standard library (causeFrom): K1, K2 and G are std's here,
// with std's causes. Deterministic: a ManualClock, and std in a synctest bubble.
func TestContextUnderMergedWrapperFallsBackToStd(t *testing.T) {
	defer goleak.VerifyNone(t)
	causeP, causeV := errors.New("P's deadline"), errors.New("V's cause")
	type run struct {
		withD func(p context.Context, d time.Duration) (context.Context, context.CancelFunc)
		withC func(p context.Context, d time.Duration, c error) (context.Context, context.CancelFunc)
		pass  func(d time.Duration)
	}
	body := func(t *testing.T, r run) []error {
		var out []error
		// 1.
		p, cancelP := r.withC(context.Background(), time.Second, causeP)
		defer cancelP()
		v, cancelV := context.WithCancelCause(context.Background())
		defer cancelV(nil)
		m := ctxMerged{Context: p, values: v}
		r.pass(time.Second)
		k2, cancelK2 := r.withD(m, 0)
		defer cancelK2()
		g, cancelG := r.withD(k2, 0)
		defer cancelG()
		require.Equal(t, context.DeadlineExceeded, k2.Err())
		require.Equal(t, context.DeadlineExceeded, g.Err())
		out = append(out, context.Cause(p), context.Cause(k2), context.Cause(g))
		// 2.
		p, cancelP = r.withC(context.Background(), time.Hour, causeP)
		defer cancelP()
		v, cancelV = context.WithCancelCause(context.Background())
		defer cancelV(nil)
		m = ctxMerged{Context: p, values: v}
		k1, cancelK1 := r.withD(m, 30*time.Minute)
		defer cancelK1()
		cancelV(causeV)
		cancelP()
		<-k1.Done() // std: its goroutine
		require.Equal(t, context.Canceled, k1.Err())
		return append(out, context.Cause(k1))
	}

	var std []error
	synctest.Test(t, func(t *testing.T) {
		// d is from the deadline of the first P: WithDeadline(m, that deadline) for d == 0
		var first time.Time
		std = body(t, run{
			withD: func(p context.Context, d time.Duration) (context.Context, context.CancelFunc) {
				if d == 0 {
					return context.WithDeadline(p, first)
				}
				return context.WithTimeout(p, d)
			},
			withC: func(p context.Context, d time.Duration, c error) (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithTimeoutCause(p, d, c)
				if first.IsZero() {
					first, _ = ctx.Deadline()
				}
				return ctx, cancel
			},
			pass: func(d time.Duration) { time.Sleep(d); synctest.Wait() },
		})
	})
	require.Equal(t, []error{causeP, context.DeadlineExceeded, context.DeadlineExceeded, causeV}, std,
		"std: K's cause is Cause(m) at its end")

	clk := NewManualClock(ctxStartFuture)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	var first time.Time
	got := body(t, run{
		withD: func(p context.Context, d time.Duration) (context.Context, context.CancelFunc) {
			var ctx context.Context
			var cancel context.CancelFunc
			if d == 0 {
				ctx, cancel = w.WithDeadline(p, first)
			} else {
				ctx, cancel = w.WithTimeout(p, d)
			}
			_, onWheel := ctx.(*deadlineCtx)
			require.False(t, onWheel, "m answers std's cause key with V's cancelCtx, not P's q: "+
				"a context made under m (or under one made there) is the standard library's")
			return ctx, cancel
		},
		withC: func(p context.Context, d time.Duration, c error) (context.Context, context.CancelFunc) {
			ctx, cancel := w.WithTimeoutCause(p, d, c)
			if first.IsZero() {
				first, _ = ctx.Deadline()
			}
			return ctx, cancel
		},
		pass: clk.Advance,
	})
	require.Equal(t, std, got, "Cause of P, K2 (born ended under m), G (K2's kid), K1 (ended by "+
		"P's cancel, V canceled with causeV): the wheel reads P's q past the wrapper m")
	require.Zero(t, w.Len())
}

// ctxEmbed is a struct embedding its context, overriding Value for a key of its own only.
type ctxEmbed struct {
	context.Context
	k, v any
}

func (e ctxEmbed) Value(key any) any {
	if key == e.k {
		return e.v
	}
	return e.Context.Value(key)
}

type ctxTreeKey struct{}

// ctxWorld builds a tree with the wheel's constructors or std's. Kinds of deadline: short (ends at
// fire), long (never ends in the test), past (born at its deadline).
type ctxWorld struct {
	mk      func(p context.Context, kind int, cause error) (context.Context, context.CancelFunc)
	fire    func()
	cancels []func()
}

const (
	ctxKindShort = iota
	ctxKindLong
	ctxKindPast
)

func (wd *ctxWorld) dl(p context.Context, kind int, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := wd.mk(p, kind, cause)
	wd.cancels = append(wd.cancels, cancel)
	return ctx, cancel
}

func (wd *ctxWorld) std(p context.Context, cause error) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(p)
	wd.cancels = append(wd.cancels, func() { cancel(nil) })
	return ctx, cancel
}

// TestContextTreesMatchStd: trees mixing wheel deadline contexts (causes at several levels),
// WithValue, a struct embedding a wheel context, std WithCancelCause / WithDeadlineCause /
// WithoutCancel / AfterFunc, parents ended by deadline and by cancel, kids born ended (parent
// ended, or past deadline): Err and Cause of every node equal those of the same tree built with
// the standard library only (run in a synctest bubble, fired by its fake clock).
func TestContextTreesMatchStd(t *testing.T) {
	defer goleak.VerifyNone(t)
	cA, cB, cC, cS := errors.New("A"), errors.New("B"), errors.New("C"), errors.New("S")
	scenarios := map[string]func(wd *ctxWorld) []context.Context{
		"root deadline, wrappers, born-ended kids": func(wd *ctxWorld) []context.Context {
			r, _ := wd.dl(context.Background(), ctxKindShort, cA)
			v := context.WithValue(r, ctxTreeKey{}, 1)
			k, _ := wd.dl(v, ctxKindLong, cB)
			e := ctxEmbed{Context: k, k: ctxTreeKey{}, v: 2}
			g, _ := wd.dl(e, ctxKindLong, cC)
			s1, _ := wd.std(g, nil)
			s2, c2 := context.WithDeadlineCause(k, time.Now().Add(time.Hour), cS)
			wd.cancels = append(wd.cancels, c2)
			stop := context.AfterFunc(g, func() {})
			wd.cancels = append(wd.cancels, func() { stop() })
			wo := context.WithoutCancel(k)
			lw, _ := wd.dl(wo, ctxKindLong, cC)
			wd.fire()
			b1, _ := wd.dl(v, ctxKindLong, cB) // born ended: parent ended by deadline
			b2, _ := wd.dl(ctxEmbed{Context: b1, k: 1, v: 1}, ctxKindPast, cC)
			b3, _ := wd.std(b2, nil)
			return []context.Context{r, v, k, e, g, s1, s2, wo, lw, b1, b2, b3}
		},
		"middle deadline, root cancel later": func(wd *ctxWorld) []context.Context {
			r, cancelR := wd.dl(context.Background(), ctxKindLong, cA)
			k, _ := wd.dl(context.WithValue(r, ctxTreeKey{}, 1), ctxKindShort, cB)
			g, _ := wd.dl(ctxEmbed{Context: k}, ctxKindLong, cC)
			s, _ := wd.std(g, nil)
			k2, _ := wd.dl(r, ctxKindLong, cB)
			g2, _ := wd.dl(k2, ctxKindLong, cC)
			wd.fire()
			cancelR()
			b, _ := wd.dl(r, ctxKindLong, cC)
			bp, _ := wd.dl(k, ctxKindPast, cA)
			return []context.Context{r, k, g, s, k2, g2, b, bp}
		},
		"root canceled, causes below, std in between": func(wd *ctxWorld) []context.Context {
			r, cancelR := wd.dl(context.Background(), ctxKindLong, cA)
			s, cancelS := wd.std(r, nil)
			ks, _ := wd.dl(s, ctxKindLong, cB) // under a std cancelCtx: std's own
			k, _ := wd.dl(r, ctxKindShort, cB)
			sg, _ := wd.std(k, nil)
			cancelS(cS)
			cancelR()
			wd.fire()
			b, _ := wd.dl(ctxEmbed{Context: k}, ctxKindPast, cC)
			return []context.Context{r, s, ks, k, sg, b}
		},
		"kid deadline, parent canceled after": func(wd *ctxWorld) []context.Context {
			r, cancelR := wd.dl(context.Background(), ctxKindLong, cA)
			k, _ := wd.dl(r, ctxKindShort, cB)
			g, _ := wd.dl(k, ctxKindLong, nil)
			sd, c := context.WithDeadlineCause(g, time.Now().Add(time.Hour), cS)
			wd.cancels = append(wd.cancels, c)
			k2, cancelK2 := wd.dl(r, ctxKindLong, cB)
			g2, _ := wd.dl(k2, ctxKindShort, cC)
			cancelK2()
			wd.fire()
			cancelR()
			return []context.Context{r, k, g, sd, k2, g2}
		},
	}
	type res struct{ err, cause []error }
	look := func(ctxs []context.Context) res {
		var r res
		for _, c := range ctxs {
			r.err = append(r.err, c.Err())
			r.cause = append(r.cause, context.Cause(c))
		}
		return r
	}
	for name, sc := range scenarios {
		var want res
		synctest.Test(t, func(t *testing.T) {
			wd := &ctxWorld{
				mk: func(p context.Context, kind int, cause error) (context.Context, context.CancelFunc) {
					d := map[int]time.Duration{ctxKindShort: time.Second, ctxKindLong: time.Hour, ctxKindPast: -time.Second}[kind]
					return context.WithTimeoutCause(p, d, cause)
				},
				fire: func() { time.Sleep(time.Second); synctest.Wait() },
			}
			want = look(sc(wd))
			for _, c := range wd.cancels {
				c()
			}
			synctest.Wait()
		})
		clk := NewManualClock(ctxStartFuture)
		w, err := New(WithClock(clk), WithWorkers(0))
		require.NoError(t, err)
		wd := &ctxWorld{
			mk: func(p context.Context, kind int, cause error) (context.Context, context.CancelFunc) {
				d := map[int]time.Duration{ctxKindShort: time.Second, ctxKindLong: time.Hour, ctxKindPast: -time.Second}[kind]
				return w.WithTimeoutCause(p, d, cause)
			},
			fire: func() { clk.Advance(time.Second) },
		}
		got := look(sc(wd))
		require.Equal(t, want, got, name)
		for _, c := range wd.cancels {
			c()
		}
		require.Zero(t, w.Len(), name)
		w.Stop()
	}
}

// TestContextKidsRacingParentEndUnderLockedWrapper: a parent P (deadline with causeP) ends by its
// timer on one goroutine while another makes kids under a locking wrapper of P (ctxLockedBag), so
// that a kid (deadline and cause P's own, so that whichever timer ends it, err and cause are P's)
// is born ended, loses addKid to P's ender, is linked and ended by it, or ends by its own timer.
// Then, with the wrapper's lock held, the kid's CancelFunc, Err and Cause, a grandkid's and a std
// child's all return (bounded: 2 s) with P's err and cause, as std's: no end waits for the
// wrapper's lock, and nothing spins for a finished bit that is never set. Under -race: pw and the
// state word.
func TestContextKidsRacingParentEndUnderLockedWrapper(t *testing.T) {
	defer goleak.VerifyNone(t)
	causeP := errors.New("P's deadline")
	clk := NewManualClock(ctxStartFuture)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	for i := 0; i < 200; i++ {
		p, cancelP := w.WithTimeoutCause(context.Background(), time.Millisecond, causeP)
		dl, _ := p.Deadline()
		bag := newCtxLockedBag(p)
		advanced := make(chan struct{})
		go func() { clk.Advance(time.Millisecond); close(advanced) }()
		// P's deadline, and its cause: whichever timer ends k, its err and cause are P's
		k, cancelK := w.WithDeadlineCause(bag, dl, causeP)
		_, onWheel := k.(*deadlineCtx)
		require.True(t, onWheel)
		done := make(chan []error)
		go func() {
			require.True(t, bag.lock())
			defer bag.unlock()
			<-advanced
			g, cancelG := w.WithTimeout(k, time.Hour)
			s, cancelS := context.WithCancel(k)
			cancelK()
			out := []error{k.Err(), context.Cause(k), g.Err(), context.Cause(g), s.Err(), context.Cause(s)}
			cancelG()
			cancelS()
			done <- out
		}()
		select {
		case out := <-done:
			require.Equal(t, []error{context.DeadlineExceeded, causeP, context.DeadlineExceeded, causeP,
				context.DeadlineExceeded, causeP}, out, "iteration %d", i)
		case <-time.After(2 * time.Second):
			close(bag.abort)
			<-done
			t.Fatalf("iteration %d: a CancelFunc, Err or Cause under the wrapper's lock waited", i)
		}
		cancelP()
	}
	require.Zero(t, w.Len())
}
