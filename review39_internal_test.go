package shardwheel

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 39: d0d5717 (a loser of end's CAS waits for the winner's finished bit, awaitEnd) and
// 4aaec8c (a context ended by its wheel parent answers std's Cause lookup with g.pw.lazyQ(),
// no longer through parent.Value).

// start39 is far in the future: a context that falls back to std under a ManualClock runs its
// timer on the real clock with a deadline on the manual clock's scale (withDeadline's doc).
var start39 = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)

// merged39 is a context wrapper of a known kind (a "merged" or "detached values" context): Done,
// Err and Deadline are those of the embedded context, and Value looks in a second context first
// (values), then in the embedded one. Its Done is the embedded context's, so a wheel context made
// under it whose embedded context is a wheel context is in the closed world (withDeadline finds
// the wheel parent through Value(wheelCtxKey), which values does not answer).
type merged39 struct {
	context.Context
	values context.Context
}

func (m merged39) Value(key any) any {
	if v := m.values.Value(key); v != nil {
		return v
	}
	return m.Context.Value(key)
}

// TestReview39FixedMergedWrapperCauseNotStd: API.md: "context.Cause ... behave as the standard
// library's in every observable way", through wrappers. m = merged39{P, V}: P a deadline context
// (the wheel's, or std's in the reference run), V = context.WithCancelCause(Background). Std: a
// context K made under m finds no *cancelCtx whose Done is m's Done (m.Value(&cancelCtxKey) is
// V's), so K's end and its cause come from m itself: child.cancel(false, m.Err(), Cause(m)), at
// once in propagateCancel if m is done, else on std's goroutine; and Cause(m) is V's cause (nil
// while V is live, and K's cause then becomes its err). Two cases:
//  1. P ends by its deadline, with causeP; then K2 = WithDeadline(m, P's deadline) is born ended,
//     and G under K2 too. Std: Cause(K2) == Cause(G) == DeadlineExceeded.
//  2. P (deadline 1h) live; K1 = WithTimeout(m, 30m) made; V canceled with causeV; P's CancelFunc.
//     Std: Cause(K1) == causeV.
//
// Before 4aaec8c the wheel asked the same (ctxGate.Value -> g.parent.Value(&cancelCtxKey) =
// m.Value) and agreed with std. Since, context_afterfunc.go:58 (case endParentCanceled,
// endParentDeadline: return g.pw.lazyQ()) reads P's q directly, past the wrapper the context was
// made under: Cause(K2) == Cause(G) == causeP, Cause(K1) == Canceled. Deterministic (ManualClock;
// std in a synctest bubble): failed 5 of 5 on 4aaec8c; passed on 2f7ff88. Fixed since: a wrapper
// parent must also lead std's cause lookup (Value(&cancelCtxKey)) to the wheel parent's q, or
// the context falls back to the standard library (causeFrom), so K1 and K2 are std's here.
func TestReview39FixedMergedWrapperCauseNotStd(t *testing.T) {
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
		m := merged39{Context: p, values: v}
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
		m = merged39{Context: p, values: v}
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

	clk := NewManualClock(start39)
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

// embed39 is a struct embedding its context, overriding Value for a key of its own only.
type embed39 struct {
	context.Context
	k, v any
}

func (e embed39) Value(key any) any {
	if key == e.k {
		return e.v
	}
	return e.Context.Value(key)
}

type key39 struct{}

// world39 builds a tree with the wheel's constructors or std's. Kinds of deadline: short (ends at
// fire), long (never ends in the test), past (born at its deadline).
type world39 struct {
	mk      func(p context.Context, kind int, cause error) (context.Context, context.CancelFunc)
	fire    func()
	cancels []func()
}

const (
	short39 = iota
	long39
	past39
)

func (wd *world39) dl(p context.Context, kind int, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := wd.mk(p, kind, cause)
	wd.cancels = append(wd.cancels, cancel)
	return ctx, cancel
}

func (wd *world39) std(p context.Context, cause error) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(p)
	wd.cancels = append(wd.cancels, func() { cancel(nil) })
	return ctx, cancel
}

// TestReview39PinTreesMatchStd: trees mixing wheel deadline contexts (causes at several levels),
// WithValue, a struct embedding a wheel context, std WithCancelCause / WithDeadlineCause /
// WithoutCancel / AfterFunc, parents ended by deadline and by cancel, kids born ended (parent
// ended, or past deadline): Err and Cause of every node equal those of the same tree built with
// the standard library only (run in a synctest bubble, fired by its fake clock).
func TestReview39PinTreesMatchStd(t *testing.T) {
	defer goleak.VerifyNone(t)
	cA, cB, cC, cS := errors.New("A"), errors.New("B"), errors.New("C"), errors.New("S")
	scenarios := map[string]func(wd *world39) []context.Context{
		"root deadline, wrappers, born-ended kids": func(wd *world39) []context.Context {
			r, _ := wd.dl(context.Background(), short39, cA)
			v := context.WithValue(r, key39{}, 1)
			k, _ := wd.dl(v, long39, cB)
			e := embed39{Context: k, k: key39{}, v: 2}
			g, _ := wd.dl(e, long39, cC)
			s1, _ := wd.std(g, nil)
			s2, c2 := context.WithDeadlineCause(k, time.Now().Add(time.Hour), cS)
			wd.cancels = append(wd.cancels, c2)
			stop := context.AfterFunc(g, func() {})
			wd.cancels = append(wd.cancels, func() { stop() })
			wo := context.WithoutCancel(k)
			lw, _ := wd.dl(wo, long39, cC)
			wd.fire()
			b1, _ := wd.dl(v, long39, cB) // born ended: parent ended by deadline
			b2, _ := wd.dl(embed39{Context: b1, k: 1, v: 1}, past39, cC)
			b3, _ := wd.std(b2, nil)
			return []context.Context{r, v, k, e, g, s1, s2, wo, lw, b1, b2, b3}
		},
		"middle deadline, root cancel later": func(wd *world39) []context.Context {
			r, cancelR := wd.dl(context.Background(), long39, cA)
			k, _ := wd.dl(context.WithValue(r, key39{}, 1), short39, cB)
			g, _ := wd.dl(embed39{Context: k}, long39, cC)
			s, _ := wd.std(g, nil)
			k2, _ := wd.dl(r, long39, cB)
			g2, _ := wd.dl(k2, long39, cC)
			wd.fire()
			cancelR()
			b, _ := wd.dl(r, long39, cC)
			bp, _ := wd.dl(k, past39, cA)
			return []context.Context{r, k, g, s, k2, g2, b, bp}
		},
		"root canceled, causes below, std in between": func(wd *world39) []context.Context {
			r, cancelR := wd.dl(context.Background(), long39, cA)
			s, cancelS := wd.std(r, nil)
			ks, _ := wd.dl(s, long39, cB) // under a std cancelCtx: std's own
			k, _ := wd.dl(r, short39, cB)
			sg, _ := wd.std(k, nil)
			cancelS(cS)
			cancelR()
			wd.fire()
			b, _ := wd.dl(embed39{Context: k}, past39, cC)
			return []context.Context{r, s, ks, k, sg, b}
		},
		"kid deadline, parent canceled after": func(wd *world39) []context.Context {
			r, cancelR := wd.dl(context.Background(), long39, cA)
			k, _ := wd.dl(r, short39, cB)
			g, _ := wd.dl(k, long39, nil)
			sd, c := context.WithDeadlineCause(g, time.Now().Add(time.Hour), cS)
			wd.cancels = append(wd.cancels, c)
			k2, cancelK2 := wd.dl(r, long39, cB)
			g2, _ := wd.dl(k2, short39, cC)
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
			wd := &world39{
				mk: func(p context.Context, kind int, cause error) (context.Context, context.CancelFunc) {
					d := map[int]time.Duration{short39: time.Second, long39: time.Hour, past39: -time.Second}[kind]
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
		clk := NewManualClock(start39)
		w, err := New(WithClock(clk), WithWorkers(0))
		require.NoError(t, err)
		wd := &world39{
			mk: func(p context.Context, kind int, cause error) (context.Context, context.CancelFunc) {
				d := map[int]time.Duration{short39: time.Second, long39: time.Hour, past39: -time.Second}[kind]
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

// TestReview39PinRacingKidsUnderLockedWrapper: a parent P (deadline with causeP) ends by its
// timer on one goroutine while another makes kids under a locking wrapper of P (lockedBag38), so
// that a kid (deadline and cause P's own, so that whichever timer ends it, err and cause are P's)
// is born ended, loses addKid to P's ender, is linked and ended by it, or ends by its own timer. Then, with
// the wrapper's lock held, the kid's CancelFunc, Err, Cause, a grandkid's and a std child's all
// return (bounded: 2 s) with P's err and cause, as std's; no end waits for the wrapper's lock,
// and nothing spins for a finished bit that is never set. Under -race: pw and the state word.
func TestReview39PinRacingKidsUnderLockedWrapper(t *testing.T) {
	defer goleak.VerifyNone(t)
	causeP := errors.New("P's deadline")
	clk := NewManualClock(start39)
	w, err := New(WithClock(clk), WithWorkers(0))
	require.NoError(t, err)
	defer w.Stop()
	for i := 0; i < 200; i++ {
		p, cancelP := w.WithTimeoutCause(context.Background(), time.Millisecond, causeP)
		dl, _ := p.Deadline()
		bag := newLockedBag38(p)
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
