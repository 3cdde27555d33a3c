package shardwheel_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deadlineImpl is one implementation of deadline contexts: the standard library's, or a Wheel's
// on a manual clock. The scenarios below run against both and require the same observations.
type deadlineImpl interface {
	WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc)
	WithDeadline(parent context.Context, t time.Time) (context.Context, context.CancelFunc)
	// Now reads the clock that deadlines are measured on.
	Now() time.Time
	// Expire lets ctx's deadline pass and returns once ctx is done.
	Expire(t *testing.T, ctx context.Context)
}

// stdImpl is the reference: the context package on the real clock. Expire waits for Done.
type stdImpl struct{}

func (stdImpl) WithTimeout(p context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(p, d)
}

func (stdImpl) WithDeadline(p context.Context, t time.Time) (context.Context, context.CancelFunc) {
	return context.WithDeadline(p, t)
}

func (stdImpl) Now() time.Time { return time.Now() }

func (stdImpl) Expire(t *testing.T, ctx context.Context) { waitDone(t, ctx) }

// wheelImpl is a Wheel on a manual clock with callbacks on the advancing goroutine: Expire
// advances the clock to the deadline, and the context must be done when Advance returns.
type wheelImpl struct {
	w     *sw.Wheel
	clock *sw.ManualClock
}

func newWheelImpl(t *testing.T) *wheelImpl {
	clock := sw.NewManualClock(time.Now())
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0))
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	return &wheelImpl{w: w, clock: clock}
}

func (m *wheelImpl) WithTimeout(p context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return m.w.WithTimeout(p, d)
}

func (m *wheelImpl) WithDeadline(p context.Context, t time.Time) (context.Context, context.CancelFunc) {
	return m.w.WithDeadline(p, t)
}

func (m *wheelImpl) Now() time.Time { return m.clock.Now() }

func (m *wheelImpl) Expire(t *testing.T, ctx context.Context) {
	dl, ok := ctx.Deadline()
	require.True(t, ok)
	m.clock.Advance(max(dl.Sub(m.clock.Now()), 0))
	if m.w.Len() == 0 {
		// No wheel timer behind ctx: under a parent that std can cancel, WithTimeout is
		// context.WithTimeout itself (see withDeadline), whose timer runs on the real clock.
		waitDone(t, ctx)
	}
	requireDone(t, ctx)
}

// waitDone waits for ctx to be done; the time limit only turns a hang into a failure.
func waitDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("context not done after a minute")
	}
}

func requireDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	default:
		t.Fatal("context not done")
	}
	require.Error(t, ctx.Err())
}

func requireLive(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
		t.Fatal("context done")
	default:
	}
	require.NoError(t, ctx.Err())
	require.NoError(t, context.Cause(ctx))
}

// requireEnded checks Done, Err and Cause of a context that has ended.
func requireEnded(t *testing.T, ctx context.Context, err, cause error) {
	t.Helper()
	requireDone(t, ctx)
	require.Equal(t, err, ctx.Err())
	require.Equal(t, cause, context.Cause(ctx))
}

type ctxKey string

var errCause = errors.New("the client went away")

// ctxScenarios is the one table of behaviours required of both implementations.
var ctxScenarios = []struct {
	name string
	run  func(t *testing.T, im deadlineImpl)
}{
	{"live/then cancel", func(t *testing.T, im deadlineImpl) {
		before := im.Now()
		ctx, cancel := im.WithTimeout(context.Background(), time.Hour)
		after := im.Now()
		dl, ok := ctx.Deadline()
		require.True(t, ok)
		require.False(t, dl.Before(before.Add(time.Hour)))
		require.False(t, dl.After(after.Add(time.Hour)))
		requireLive(t, ctx)
		require.NotEmpty(t, fmt.Sprint(ctx))
		cancel()
		requireEnded(t, ctx, context.Canceled, context.Canceled)
		cancel() // idempotent
		requireEnded(t, ctx, context.Canceled, context.Canceled)
		dl2, ok := ctx.Deadline()
		require.True(t, ok)
		require.Equal(t, dl, dl2)
	}},
	{"deadline/exact", func(t *testing.T, im deadlineImpl) {
		at := im.Now().Add(time.Hour)
		ctx, cancel := im.WithDeadline(context.Background(), at)
		defer cancel()
		dl, ok := ctx.Deadline()
		require.True(t, ok)
		require.True(t, dl.Equal(at))
		requireLive(t, ctx)
	}},
	{"deadline/expires", func(t *testing.T, im deadlineImpl) {
		ctx, cancel := im.WithTimeout(context.Background(), short)
		done := ctx.Done() // asked for before the end, closed by it
		im.Expire(t, ctx)
		<-done
		requireEnded(t, ctx, context.DeadlineExceeded, context.DeadlineExceeded)
		cancel() // after the deadline: changes nothing
		requireEnded(t, ctx, context.DeadlineExceeded, context.DeadlineExceeded)
	}},
	{"deadline/already past", func(t *testing.T, im deadlineImpl) {
		for _, mk := range []func() (context.Context, context.CancelFunc){
			func() (context.Context, context.CancelFunc) { return im.WithTimeout(context.Background(), 0) },
			func() (context.Context, context.CancelFunc) { return im.WithTimeout(context.Background(), -time.Hour) },
			func() (context.Context, context.CancelFunc) {
				return im.WithDeadline(context.Background(), im.Now().Add(-time.Second))
			},
		} {
			ctx, cancel := mk()
			requireEnded(t, ctx, context.DeadlineExceeded, context.DeadlineExceeded)
			cancel()
			requireEnded(t, ctx, context.DeadlineExceeded, context.DeadlineExceeded)
		}
	}},
	{"deadline/parent's is earlier", func(t *testing.T, im deadlineImpl) {
		parent, pcancel := im.WithTimeout(context.Background(), time.Hour)
		defer pcancel()
		pdl, _ := parent.Deadline()
		ctx, cancel := im.WithTimeout(parent, 2*time.Hour)
		dl, ok := ctx.Deadline()
		require.True(t, ok)
		require.Equal(t, pdl, dl)
		requireLive(t, ctx)
		cancel()
		requireEnded(t, ctx, context.Canceled, context.Canceled)
		requireLive(t, parent)
	}},
	{"deadline/parent's expires first", func(t *testing.T, im deadlineImpl) {
		parent, pcancel := im.WithTimeout(context.Background(), short)
		defer pcancel()
		ctx, cancel := im.WithTimeout(parent, time.Hour)
		defer cancel()
		im.Expire(t, parent)
		waitDone(t, ctx)
		requireEnded(t, ctx, context.DeadlineExceeded, context.DeadlineExceeded)
	}},
	{"deadline/child's expires first", func(t *testing.T, im deadlineImpl) {
		parent, pcancel := im.WithTimeout(context.Background(), time.Hour)
		defer pcancel()
		ctx, cancel := im.WithTimeout(parent, short)
		defer cancel()
		im.Expire(t, ctx)
		requireEnded(t, ctx, context.DeadlineExceeded, context.DeadlineExceeded)
		requireLive(t, parent)
		pcancel()
		requireEnded(t, ctx, context.DeadlineExceeded, context.DeadlineExceeded)
	}},
	{"parent/canceled before", func(t *testing.T, im deadlineImpl) {
		parent, pcancel := context.WithCancel(context.Background())
		pcancel()
		ctx, cancel := im.WithTimeout(parent, time.Hour)
		defer cancel()
		requireEnded(t, ctx, context.Canceled, context.Canceled)
	}},
	{"parent/canceled before with cause", func(t *testing.T, im deadlineImpl) {
		parent, pcancel := context.WithCancelCause(context.Background())
		pcancel(errCause)
		ctx, cancel := im.WithTimeout(parent, time.Hour)
		defer cancel()
		requireEnded(t, ctx, context.Canceled, errCause)
	}},
	{"parent/canceled after", func(t *testing.T, im deadlineImpl) {
		parent, pcancel := context.WithCancel(context.Background())
		ctx, cancel := im.WithTimeout(parent, time.Hour)
		defer cancel()
		done := ctx.Done()
		requireLive(t, ctx)
		pcancel()
		// Err and Done report the parent's end as soon as its cancel has returned.
		requireEnded(t, ctx, context.Canceled, context.Canceled)
		<-done
	}},
	{"parent/canceled after with cause", func(t *testing.T, im deadlineImpl) {
		parent, pcancel := context.WithCancelCause(context.Background())
		ctx, cancel := im.WithTimeout(parent, time.Hour)
		defer cancel()
		derived, dcancel := context.WithCancel(ctx)
		defer dcancel()
		pcancel(errCause)
		requireEnded(t, ctx, context.Canceled, errCause)
		waitDone(t, derived)
		requireEnded(t, derived, context.Canceled, errCause)
	}},
	{"parent/canceled with cause after own deadline", func(t *testing.T, im deadlineImpl) {
		parent, pcancel := context.WithCancelCause(context.Background())
		ctx, cancel := im.WithTimeout(parent, short)
		defer cancel()
		im.Expire(t, ctx)
		pcancel(errCause)
		requireEnded(t, ctx, context.DeadlineExceeded, context.DeadlineExceeded)
	}},
	{"parent/canceled with cause after own cancel", func(t *testing.T, im deadlineImpl) {
		parent, pcancel := context.WithCancelCause(context.Background())
		ctx, cancel := im.WithTimeout(parent, time.Hour)
		cancel()
		pcancel(errCause)
		requireEnded(t, ctx, context.Canceled, context.Canceled)
		derived, dcancel := context.WithCancel(ctx)
		defer dcancel()
		requireEnded(t, derived, context.Canceled, context.Canceled)
	}},
	{"parent/deadline with cause", func(t *testing.T, im deadlineImpl) {
		parent, pcancel := context.WithTimeoutCause(context.Background(), short, errCause)
		defer pcancel()
		ctx, cancel := im.WithTimeout(parent, time.Hour) // parent's deadline is earlier
		defer cancel()
		waitDone(t, ctx)
		requireEnded(t, ctx, context.DeadlineExceeded, errCause)
	}},
	{"parent/nested, outer canceled", func(t *testing.T, im deadlineImpl) {
		outer, ocancel := im.WithTimeout(context.Background(), 2*time.Hour)
		inner, icancel := im.WithTimeout(outer, time.Hour)
		defer icancel()
		ocancel()
		requireEnded(t, inner, context.Canceled, context.Canceled)
		requireEnded(t, outer, context.Canceled, context.Canceled)
	}},
	{"value/passes through", func(t *testing.T, im deadlineImpl) {
		parent := context.WithValue(context.Background(), ctxKey("user"), "ada")
		ctx, cancel := im.WithTimeout(parent, time.Hour)
		defer cancel()
		require.Equal(t, "ada", ctx.Value(ctxKey("user")))
		require.Nil(t, ctx.Value(ctxKey("other")))
		derived := context.WithValue(ctx, ctxKey("req"), 7)
		require.Equal(t, "ada", derived.Value(ctxKey("user")))
		require.Equal(t, 7, derived.Value(ctxKey("req")))
		cancel()
		require.Equal(t, "ada", ctx.Value(ctxKey("user")))
	}},
	{"derived/canceled by CancelFunc", func(t *testing.T, im deadlineImpl) {
		ctx, cancel := im.WithTimeout(context.Background(), time.Hour)
		d1, c1 := context.WithCancel(ctx)
		defer c1()
		d2 := context.WithValue(ctx, ctxKey("k"), 1)
		d3, c3 := context.WithTimeout(ctx, 2*time.Hour)
		defer c3()
		d4, c4 := context.WithCancelCause(ctx)
		defer c4(nil)
		for _, d := range []context.Context{d1, d2, d3, d4} {
			requireLive(t, d)
		}
		cancel()
		// Children are done before the CancelFunc returns, as in the standard library.
		for _, d := range []context.Context{d1, d2, d3, d4} {
			requireEnded(t, d, context.Canceled, context.Canceled)
		}
		dl, _ := d3.Deadline()
		pdl, _ := ctx.Deadline()
		require.Equal(t, pdl, dl)
	}},
	{"derived/deadline expires", func(t *testing.T, im deadlineImpl) {
		ctx, cancel := im.WithTimeout(context.Background(), short)
		defer cancel()
		d1, c1 := context.WithCancel(ctx)
		defer c1()
		d2 := context.WithValue(ctx, ctxKey("k"), 1)
		im.Expire(t, ctx)
		waitDone(t, d1)
		requireEnded(t, d1, context.DeadlineExceeded, context.DeadlineExceeded)
		requireEnded(t, d2, context.DeadlineExceeded, context.DeadlineExceeded)
		// Derived after the end: done at once, with the same Err and Cause.
		d3, c3 := context.WithCancel(ctx)
		defer c3()
		requireEnded(t, d3, context.DeadlineExceeded, context.DeadlineExceeded)
		require.NoError(t, context.WithoutCancel(ctx).Err())
		require.NoError(t, context.Cause(context.WithoutCancel(ctx)))
	}},
	{"derived/own cancel survives", func(t *testing.T, im deadlineImpl) {
		ctx, cancel := im.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		d1, c1 := context.WithCancelCause(ctx)
		c1(errCause)
		requireEnded(t, d1, context.Canceled, errCause)
		requireLive(t, ctx)
	}},
	{"afterfunc/runs once, stop", func(t *testing.T, im deadlineImpl) {
		ctx, cancel := im.WithTimeout(context.Background(), time.Hour)
		ran := make(chan struct{})
		stop := context.AfterFunc(ctx, func() { close(ran) })
		never := context.AfterFunc(ctx, func() { t.Error("stopped AfterFunc ran") })
		require.True(t, never())
		cancel()
		<-ran
		require.False(t, stop())
		require.False(t, never())
		late := make(chan struct{})
		require.False(t, context.AfterFunc(ctx, func() { close(late) })())
		<-late
	}},
}

// TestContextScenarios runs every scenario of ctxScenarios against the standard library and
// against a wheel on a manual clock, and requires the same observations of both; on the wheel,
// every timer is released at the end of each scenario.
func TestContextScenarios(t *testing.T) {
	impls := []struct {
		name string
		new  func(t *testing.T) deadlineImpl
	}{
		{"context", func(*testing.T) deadlineImpl { return stdImpl{} }},
		{"wheel", func(t *testing.T) deadlineImpl { return newWheelImpl(t) }},
	}
	for _, impl := range impls {
		t.Run("impl="+impl.name, func(t *testing.T) {
			for _, sc := range ctxScenarios {
				t.Run(sc.name, func(t *testing.T) {
					im := impl.new(t)
					sc.run(t, im)
					if wi, ok := im.(*wheelImpl); ok {
						// Every timer was released: by its cancel, its expiry or its parent.
						waitPending(t, wi.w, 0)
					}
				})
			}
		})
	}
}

// waitPending waits until w.Len() == n. Releases that a parent's cancellation makes on another
// goroutine finish soon after Done closes; the time limit only turns a hang into a failure.
func waitPending(t *testing.T, w *sw.Wheel, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); w.Len() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("Len() = %d, want %d", w.Len(), n)
		}
		runtime.Gosched()
	}
}

// TestContextCancelReleasesTimerAtOnce: API.md: "the cancel func releases it at once (Len
// drops)". Each cancel drops Len by one before it returns (a second cancel changes nothing) and
// counts as Stopped; a wheel parent's cancel releases its wheel child's timer too; an expiry
// releases the timer as well.
func TestContextCancelReleasesTimerAtOnce(t *testing.T) {
	im := newWheelImpl(t)
	w := im.w
	cancels := make([]context.CancelFunc, 100)
	for i := range cancels {
		_, cancels[i] = w.WithTimeout(context.Background(), time.Hour)
	}
	require.Equal(t, 100, w.Len())
	for i, cancel := range cancels {
		cancel()
		require.Equal(t, 100-i-1, w.Len())
		cancel()
		require.Equal(t, 100-i-1, w.Len())
	}
	require.EqualValues(t, 100, w.Stats().Stopped)

	// A wheel parent's end releases its wheel children's timers before its cancel returns.
	outer, ocancel := w.WithTimeout(context.Background(), time.Hour)
	inner, icancel := w.WithTimeout(outer, 30*time.Minute)
	defer icancel()
	require.Equal(t, 2, w.Len())
	ocancel()
	require.Equal(t, 0, w.Len())
	requireEnded(t, inner, context.Canceled, context.Canceled)

	// Expiry releases it too.
	ctx, cancel := w.WithTimeout(context.Background(), time.Second)
	defer cancel()
	im.Expire(t, ctx)
	require.Equal(t, 0, w.Len())
}

// TestContextParentCancelReleasesTimer: a wheel parent's cancel ends its hundred wheel children
// with Canceled and releases all their timers, and its own, before it returns.
func TestContextParentCancelReleasesTimer(t *testing.T) {
	im := newWheelImpl(t)
	// A wheel parent: the children get wheel timers (under a std cancelable parent they would be
	// std contexts, see withDeadline), and its cancel ends and releases all of them before it returns.
	parent, pcancel := im.w.WithTimeout(context.Background(), 2*time.Hour)
	ctxs := make([]context.Context, 100)
	for i := range ctxs {
		var cancel context.CancelFunc
		ctxs[i], cancel = im.w.WithTimeout(parent, time.Hour)
		defer cancel()
	}
	require.Equal(t, 101, im.w.Len())
	pcancel()
	require.Equal(t, 0, im.w.Len())
	for _, ctx := range ctxs {
		requireEnded(t, ctx, context.Canceled, context.Canceled)
	}
}

// TestContextNoGoroutinePerContext: API.md: contexts derived through a wrapper "cost no
// goroutine each". A thousand wheel contexts made through a wrapper of a wheel parent, each with
// a std child made through another wrapper, start no goroutine per context, and their cancels
// release their timers.
func TestContextNoGoroutinePerContext(t *testing.T) {
	im := newWheelImpl(t)
	parent, pcancel := im.w.WithTimeout(context.Background(), 2*time.Hour)
	defer pcancel()
	before := runtime.NumGoroutine()
	cancels := make([]context.CancelFunc, 2000)
	for i := 0; i < len(cancels); i += 2 {
		// A wheel child through a wrapper, and a std child of it through another.
		var ctx context.Context
		ctx, cancels[i] = im.w.WithTimeout(otherCtx{parent}, time.Hour)
		_, cancels[i+1] = context.WithCancel(otherCtx{ctx})
	}
	require.Equal(t, 1+len(cancels)/2, im.w.Len())
	assert.Less(t, runtime.NumGoroutine()-before, 100)
	for _, cancel := range cancels {
		cancel()
	}
	require.Equal(t, 1, im.w.Len())
}

// TestContextFallbackOnStoppedWheel: on a stopped wheel the constructors still work, falling back
// to the standard library's contexts: live until cancelled or until the deadline, which they
// reach with DeadlineExceeded; they hold no wheel timer.
func TestContextFallbackOnStoppedWheel(t *testing.T) {
	w, err := sw.New()
	require.NoError(t, err)
	w.Stop()
	ctx, cancel := w.WithTimeout(context.Background(), time.Hour)
	requireLive(t, ctx)
	_, ok := ctx.Deadline()
	require.True(t, ok)
	cancel()
	requireEnded(t, ctx, context.Canceled, context.Canceled)

	ctx, cancel = w.WithTimeout(context.Background(), short)
	defer cancel()
	waitDone(t, ctx)
	requireEnded(t, ctx, context.DeadlineExceeded, context.DeadlineExceeded)
	require.Equal(t, 0, w.Len())
}

// TestContextFallbackPastMaxPending: past WithMaxPending, a constructor falls back to the standard
// library's context (no wheel timer, the refusal counted in Rejected) with the same deadline,
// values and cancel; the contexts that hold wheel timers are untouched.
func TestContextFallbackPastMaxPending(t *testing.T) {
	clock := sw.NewManualClock(time.Now())
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0), sw.WithMaxPending(1))
	require.NoError(t, err)
	defer w.Stop()
	first, cancel1 := w.WithTimeout(context.Background(), time.Hour)
	defer cancel1()
	require.Equal(t, 1, w.Len())

	parent := context.WithValue(context.Background(), ctxKey("k"), "v")
	at := clock.Now().Add(time.Hour)
	second, cancel2 := w.WithDeadline(parent, at)
	require.Equal(t, 1, w.Len(), "the second context holds no wheel timer")
	require.EqualValues(t, 1, w.Stats().Rejected)
	requireLive(t, second)
	dl, ok := second.Deadline()
	require.True(t, ok)
	require.True(t, dl.Equal(at))
	require.Equal(t, "v", second.Value(ctxKey("k")))
	cancel2()
	requireEnded(t, second, context.Canceled, context.Canceled)
	requireLive(t, first)
}

// TestContextHammer ends contexts from every side at once (CancelFunc, deadline, parent) while
// children are derived and Err, Done and Cause are read, and checks that every context ends with
// one of the legal errors, that a non-nil Err implies a closed Done, and that no timer is left.
// Under a std root (a context.WithCancelCause) the wheel hands out std's own contexts (see
// withDeadline); under a wheel root every deadline is a wheel timer, fired by the advancing
// goroutine while the others cancel.
func TestContextHammer(t *testing.T) {
	for _, root := range []string{"std", "wheel"} {
		t.Run("root="+root, func(t *testing.T) { testContextHammer(t, root == "wheel") })
	}
}

func testContextHammer(t *testing.T, wheelRoot bool) {
	im := newWheelImpl(t)
	rounds := 2000
	if testing.Short() {
		rounds = 200
	}
	var wg sync.WaitGroup
	stopAdvancing := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stopAdvancing:
				return
			default:
				im.clock.Advance(time.Millisecond)
			}
		}
	}()
	for i := 0; i < rounds; i++ {
		var (
			parent  context.Context
			pcancel func()
		)
		if wheelRoot {
			parent, pcancel = im.w.WithTimeout(context.Background(), veryLongDuration)
		} else {
			p, cancel := context.WithCancelCause(context.Background())
			parent, pcancel = p, func() { cancel(errCause) }
		}
		outer, ocancel := im.w.WithTimeout(parent, time.Duration(i%3)*time.Millisecond)
		ctx, cancel := im.w.WithTimeout(outer, time.Duration(i%5)*time.Millisecond)
		derived, dcancel := context.WithCancel(ctx)
		var inner sync.WaitGroup
		inner.Add(4)
		go func() { defer inner.Done(); cancel() }()
		go func() { defer inner.Done(); pcancel() }()
		go func() { defer inner.Done(); ocancel() }()
		go func() {
			defer inner.Done()
			if ctx.Err() != nil {
				select {
				case <-ctx.Done():
				default:
					t.Error("Err non-nil before Done closed")
				}
			}
		}()
		inner.Wait()
		for _, c := range []context.Context{outer, ctx, derived} {
			waitDone(t, c)
			err, cause := c.Err(), context.Cause(c)
			switch err {
			case context.Canceled:
				require.Contains(t, []error{context.Canceled, errCause}, cause)
			case context.DeadlineExceeded:
				require.Equal(t, context.DeadlineExceeded, cause)
			default:
				t.Fatalf("Err() = %v", err)
			}
		}
		dcancel()
	}
	close(stopAdvancing)
	wg.Wait()
	waitPending(t, im.w, 0)
}

// TestContextLazyDoneRace races the first Done (which makes the std cancelCtx behind it, see
// lazyQ) and std children made through a wrapper against the context's end, by its cancel or by
// its wheel parent's: once the end has returned, every Done handed out is closed and every child
// is done, with the context's error. A third goroutine reads Err until it is non-nil and then
// asks for Done, which must be closed even while the first Done is still making q.
func TestContextLazyDoneRace(t *testing.T) {
	w, err := sw.New()
	require.NoError(t, err)
	defer w.Stop()
	rounds := 2000
	if testing.Short() {
		rounds = 200
	}
	for i := range rounds {
		parent, pcancel := w.WithTimeout(context.Background(), 2*time.Hour)
		ctx, cancel := w.WithTimeout(otherCtx{parent}, time.Hour)
		end := cancel
		if i%2 == 1 {
			end = pcancel
		}
		var (
			wg    sync.WaitGroup
			done  <-chan struct{}
			child context.Context
			ccl   context.CancelFunc
		)
		wg.Add(3)
		go func() { defer wg.Done(); done = ctx.Done() }()
		go func() { defer wg.Done(); child, ccl = context.WithCancel(otherCtx{ctx}) }()
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				runtime.Gosched()
			}
			select {
			case <-ctx.Done():
			default:
				t.Errorf("round %d: Err non-nil before Done closed", i)
			}
		}()
		end()
		if err := ctx.Err(); err != context.Canceled {
			t.Fatalf("round %d: Err = %v after the end returned", i, err)
		}
		wg.Wait()
		select {
		case <-done:
		default:
			t.Fatalf("round %d: a Done handed out is open after the end", i)
		}
		select {
		case <-child.Done():
		default:
			t.Fatalf("round %d: a std child is live after the end", i)
		}
		require.Equal(t, context.Canceled, child.Err())
		require.Equal(t, context.Canceled, context.Cause(child))
		ccl()
		cancel()
		pcancel()
	}
	require.Equal(t, 0, w.Len())
}

// otherCtx is a wrapper that keeps the wrapped context's Done.
type otherCtx struct{ context.Context }

// ctxObservation is what a caller sees of a context: Err, Cause, whether Done is closed, and
// whether it has a deadline. Tests compare a wheel context's with the standard library's.
type ctxObservation struct {
	err, cause error
	done       bool
	deadlineOK bool
}

func observeCtx(ctx context.Context) ctxObservation {
	_, ok := ctx.Deadline()
	o := ctxObservation{err: ctx.Err(), cause: context.Cause(ctx), deadlineOK: ok}
	select {
	case <-ctx.Done():
		o.done = true
	default:
	}
	return o
}

// TestContextBornExpiredMatchesStd: a context whose deadline has passed when it is made (d == 0,
// d < 0, a past instant, the zero time; with a cause or not) is born ended and looks exactly like
// the standard library's (Err, Cause, Done, Deadline), before and after its cancel; so do a std
// child and a wheel child made under it afterwards. None of them holds a wheel timer.
func TestContextBornExpiredMatchesStd(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0), sw.WithShards(1))
	require.NoError(t, err)
	defer w.Stop()
	cause := errors.New("mine")
	now := clock.Now()
	type mk func() (context.Context, context.CancelFunc)
	cases := []struct {
		name     string
		std, whl mk
	}{
		{"timeout0", func() (context.Context, context.CancelFunc) { return context.WithTimeout(context.Background(), 0) },
			func() (context.Context, context.CancelFunc) { return w.WithTimeout(context.Background(), 0) }},
		{"timeoutNegCause", func() (context.Context, context.CancelFunc) {
			return context.WithTimeoutCause(context.Background(), -time.Hour, cause)
		}, func() (context.Context, context.CancelFunc) {
			return w.WithTimeoutCause(context.Background(), -time.Hour, cause)
		}},
		{"deadlineZeroTime", func() (context.Context, context.CancelFunc) {
			return context.WithDeadlineCause(context.Background(), time.Time{}, cause)
		}, func() (context.Context, context.CancelFunc) {
			return w.WithDeadlineCause(context.Background(), time.Time{}, cause)
		}},
		{"deadlinePast", func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Now().Add(-time.Nanosecond))
		}, func() (context.Context, context.CancelFunc) {
			return w.WithDeadline(context.Background(), now.Add(-time.Nanosecond))
		}},
	}
	for _, c := range cases {
		s, scancel := c.std()
		x, xcancel := c.whl()
		require.Equal(t, observeCtx(s), observeCtx(x), c.name)
		scancel()
		xcancel()
		require.Equal(t, observeCtx(s), observeCtx(x), c.name+" after cancel")
		// a child of each, made after the end
		sc, sccancel := context.WithCancel(s)
		xc, xccancel := context.WithCancel(x)
		require.Equal(t, observeCtx(sc), observeCtx(xc), c.name+" child")
		sccancel()
		xccancel()
		ws, wscancel := w.WithTimeoutCause(s, time.Hour, errors.New("other"))
		wx, wxcancel := w.WithTimeoutCause(x, time.Hour, errors.New("other"))
		require.Equal(t, observeCtx(ws), observeCtx(wx), c.name+" wheel child")
		wscancel()
		wxcancel()
	}
	require.Zero(t, w.Len())
	requireBalance(t, w)
	require.Equal(t, w.Stats().Fired, w.Stats().Lateness.Count())
}

// TestContextUnderWithoutCancelMatchesStd: a deadline context made under context.WithoutCancel of
// a deadline context gets a wheel timer (its parent is never done) and looks exactly like the
// standard library's: the first parent's cancel does not reach it, Value passes through, it and a
// std child of it end as std's by its own cancel, which releases its timer, and String names the
// same ancestry (the times aside).
func TestContextUnderWithoutCancelMatchesStd(t *testing.T) {
	clock := sw.NewManualClock(time.Unix(0, 0))
	w, err := sw.New(sw.WithClock(clock), sw.WithWorkers(0), sw.WithShards(1))
	require.NoError(t, err)
	defer w.Stop()
	type key struct{}
	base := context.WithValue(context.Background(), key{}, "v")
	sp, spc := context.WithTimeout(base, time.Hour)
	wp, wpc := w.WithTimeout(base, time.Hour)
	require.Equal(t, 1, w.Len())
	sx, sxc := context.WithTimeoutCause(context.WithoutCancel(sp), 2*time.Hour, errors.New("c"))
	wx, wxc := w.WithTimeoutCause(context.WithoutCancel(wp), 2*time.Hour, errors.New("c"))
	require.Equal(t, 2, w.Len(), "a never-done parent gets a wheel deadline")
	sk, skc := context.WithCancel(sx)
	wk, wkc := context.WithCancel(wx)
	defer skc()
	defer wkc()
	spc()
	wpc()
	require.Equal(t, observeCtx(sx), observeCtx(wx))
	require.Equal(t, observeCtx(sk), observeCtx(wk))
	require.Equal(t, "v", wx.Value(key{}))
	require.Equal(t, 1, w.Len())
	str := func(c context.Context) string {
		s := c.(interface{ String() string }).String()
		// the times differ: keep the shape, ancestry and method names
		var b strings.Builder
		depth := 0
		for _, r := range s {
			switch {
			case r == '(':
				depth++
				if depth == 1 {
					b.WriteRune(r)
				}
			case r == ')':
				depth--
				if depth == 0 {
					b.WriteRune(r)
				}
			case depth == 0:
				b.WriteRune(r)
			}
		}
		return b.String()
	}
	require.Equal(t, str(sk), str(wk))
	sxc()
	wxc()
	require.Equal(t, observeCtx(sx), observeCtx(wx))
	require.Equal(t, observeCtx(sk), observeCtx(wk))
	require.Zero(t, w.Len())
	requireBalance(t, w)
	require.Equal(t, w.Stats().Fired, w.Stats().Lateness.Count())
}
