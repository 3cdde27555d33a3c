package shardwheel

import (
	"context"
	"errors"
	"maps"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Review 41: an audit of the code against every sentence of API.md.

// TestReview41FixedStopFromCallbackDuringStopWaits: API.md, "Starting and stopping":
// "Called from inside a callback, Stop waits for every other callback but not for the one it is
// called from (no deadlock)." Here a goroutine outside the wheel has called Stop first and waits
// for the workers; callback B then calls Stop while callback A, on the other worker, is still
// running. B's Stop must not return before A has ended (nothing deadlocks if it waits: A ends on
// its own 200ms later, and the first Stop waits for B's worker, not the other way round). It
// returns at once (shardwheel.go Stop: a later call on a worker returns 0 without waiting).
func TestReview41FixedStopFromCallbackDuringStopWaits(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, err := New(WithWorkers(2), WithShards(1))
	require.NoError(t, err)

	var aDone atomic.Bool
	aIn, bIn, bGo := make(chan struct{}), make(chan struct{}), make(chan struct{})
	aRelease := make(chan struct{})
	_, err = w.AfterFunc(0, func() {
		close(aIn)
		<-aRelease
		aDone.Store(true)
	})
	require.NoError(t, err)
	<-aIn
	var aDoneAtB atomic.Bool
	bOut := make(chan struct{})
	_, err = w.AfterFunc(0, func() { // the other worker takes the keeper role and runs it
		close(bIn)
		<-bGo
		w.Stop()
		aDoneAtB.Store(aDone.Load())
		close(bOut)
	})
	require.NoError(t, err)
	select {
	case <-bIn:
	case <-time.After(5 * time.Second):
		t.Fatal("B never started on the second worker")
	}
	first := make(chan int)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond,
		"the first Stop reached its wait for the workers")
	time.AfterFunc(200*time.Millisecond, func() { close(aRelease) })
	close(bGo)
	<-bOut
	require.Equal(t, 0, <-first)
	require.True(t, aDoneAtB.Load(),
		"Stop called from callback B returned while callback A (another worker) was still running")
}

// TestReview41PinLaterStopWaitsForFirst: API.md: Stop is "Safe to call more than once and from
// several goroutines (later calls return 0)", and "every goroutine the wheel started has exited
// when Stop returns". A later Stop from outside the wheel, made while the first waits for a
// running callback, returns 0 only once that callback has ended and every worker has exited;
// the first returns the count, which is Stats.Dropped.
func TestReview41PinLaterStopWaitsForFirst(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, err := New(WithWorkers(2), WithShards(2))
	require.NoError(t, err)
	in, release := make(chan struct{}), make(chan struct{})
	var done atomic.Bool
	_, err = w.AfterFunc(0, func() { close(in); <-release; done.Store(true) })
	require.NoError(t, err)
	<-in
	for i := 0; i < 5; i++ {
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
	}
	first := make(chan int)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.quit) }, 5*time.Second, time.Millisecond)
	time.AfterFunc(100*time.Millisecond, func() { close(release) })
	require.Equal(t, 0, w.Stop())
	require.True(t, done.Load(), "a later Stop returned before a running callback ended")
	for i, d := range w.pool.done {
		require.True(t, isClosed(d), "worker %d still running after a later Stop returned", i)
	}
	require.Equal(t, 5, <-first)
	require.Equal(t, 0, w.Stop())
	require.Equal(t, 0, w.Len())
	st := booksBalance(t, w)
	require.Equal(t, uint64(5), st.Dropped)
}

// TestReview41PinConcurrentStopsCountOnce: many goroutines call Stop at once; exactly one
// returns the number of pending timers, the others 0.
func TestReview41PinConcurrentStopsCountOnce(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, err := New(WithWorkers(2), WithShards(4))
	require.NoError(t, err)
	const n = 100
	for i := 0; i < n; i++ {
		_, err := w.AfterFunc(time.Hour+time.Duration(i)*time.Millisecond, func() {})
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	res := make([]int, 8)
	for i := range res {
		wg.Add(1)
		go func() { defer wg.Done(); res[i] = w.Stop() }()
	}
	wg.Wait()
	sum, nonzero := 0, 0
	for _, r := range res {
		sum += r
		if r != 0 {
			nonzero++
		}
	}
	require.Equal(t, n, sum)
	require.Equal(t, 1, nonzero)
	require.Equal(t, uint64(n), booksBalance(t, w).Dropped)
}

// TestReview41PinErrorsAfterStop: "After Stop, AfterFunc, AfterFuncArg and Every return
// ErrClosed; Len is 0", and Keyed.Set returns the wheel's error; each counts in Rejected;
// handles of dropped timers report false.
func TestReview41PinErrorsAfterStop(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(2))
	tm, err := w.AfterFunc(time.Millisecond, func() { t.Error("ran after Stop") })
	require.NoError(t, err)
	ev, err := w.Every(time.Millisecond, func() { t.Error("ran after Stop") })
	require.NoError(t, err)
	require.Equal(t, 2, w.Stop())
	_, err = w.AfterFunc(0, func() {})
	require.ErrorIs(t, err, ErrClosed)
	_, err = w.AfterFuncArg(math.MaxInt64, func(any) {}, nil)
	require.ErrorIs(t, err, ErrClosed)
	_, err = w.Every(time.Second, func() {})
	require.ErrorIs(t, err, ErrClosed)
	k := NewKeyed(w, func(int, int) {})
	require.ErrorIs(t, k.Set(1, 1, time.Second), ErrClosed)
	require.Zero(t, k.Len())
	require.False(t, tm.Stop())
	require.False(t, tm.Reset(time.Millisecond))
	require.False(t, ev.Stop())
	clk.Advance(time.Hour)
	require.Zero(t, w.Len())
	st := booksBalance(t, w)
	require.Equal(t, uint64(4), st.Rejected)
	require.Equal(t, uint64(2), st.Dropped)
}

// TestReview41PinMaxPendingExact: WithMaxPending(n): n accepted, the next refused with an error
// that is ErrTooManyTimers and names n; nothing is scheduled then. A timer whose callback has
// started is no longer pending: that callback may schedule in its place.
func TestReview41PinMaxPendingExact(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(3), WithMaxPending(3))
	var inner error
	ran := 0
	for i := 0; i < 3; i++ {
		_, err := w.AfterFunc(time.Millisecond, func() {
			ran++
			_, inner = w.AfterFunc(time.Hour, func() {})
		})
		require.NoError(t, err)
	}
	_, err := w.AfterFunc(time.Millisecond, func() {})
	require.ErrorIs(t, err, ErrTooManyTimers)
	require.Contains(t, err.Error(), "WithMaxPending(3)")
	_, err = w.Every(time.Millisecond, func() {})
	require.ErrorIs(t, err, ErrTooManyTimers)
	require.Equal(t, 3, w.Len())
	clk.Advance(time.Millisecond)
	require.Equal(t, 3, ran)
	require.NoError(t, inner)
	require.Equal(t, 3, w.Len())
	st := booksBalance(t, w)
	require.Equal(t, uint64(2), st.Rejected)
}

// TestReview41PinLatenessBuckets: "Lateness: how late each callback started, against its
// deadline rounded up to the tick", in the Histogram's buckets: [2^(i-1), 2^i) µs.
func TestReview41PinLatenessBuckets(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1), WithTick(time.Millisecond))
	_, err := w.AfterFunc(500*time.Microsecond, func() {}) // rounds up to 1ms: on time at 1ms
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	require.Equal(t, uint64(1), w.Stats().Lateness.Buckets[0])
	_, err = w.AfterFunc(time.Millisecond, func() {}) // due at 2ms, starts at 1001ms
	require.NoError(t, err)
	clk.Advance(time.Second)
	h := w.Stats().Lateness
	require.Equal(t, uint64(1), h.Buckets[20], "999ms late is in [2^19, 2^20) µs: %v", h.Buckets)
	require.Equal(t, uint64(2), h.Count())
	require.Equal(t, BucketBound(20), h.Quantile(1))
	require.Equal(t, time.Microsecond, h.Quantile(0.5))
	booksBalance(t, w)
}

// TestReview41PinHistogramEdges: bucket edges, and Quantile of an empty Histogram.
func TestReview41PinHistogramEdges(t *testing.T) {
	cases := []struct {
		d    time.Duration
		want int
	}{
		{-time.Second, 0}, {0, 0}, {999, 0}, {time.Microsecond, 1}, {2*time.Microsecond - 1, 1},
		{2 * time.Microsecond, 2}, {(1 << 29) * time.Microsecond, 30},
		{(1<<30)*time.Microsecond - 1, 30}, {(1 << 30) * time.Microsecond, 31}, {math.MaxInt64, 31},
	}
	for _, c := range cases {
		require.Equal(t, c.want, bucketOf(c.d), "%v", c.d)
	}
	require.Zero(t, Histogram{}.Quantile(0.5))
	var h Histogram
	h.Buckets[3] = 1
	require.Equal(t, 8*time.Microsecond, h.Quantile(0))
	require.Equal(t, 8*time.Microsecond, h.Quantile(1))
}

// TestReview41PinHugeTickExactDeadline: WithTick is the width of a bucket, and a timer never
// starts before the call plus d: with a one-hour tick, a 1ms timer fires at 1ms, not before, and
// is not late against its deadline rounded up to the tick.
func TestReview41PinHugeTickExactDeadline(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1), WithTick(time.Hour))
	ran := 0
	_, err := w.AfterFunc(time.Millisecond, func() { ran++ })
	require.NoError(t, err)
	clk.Advance(time.Millisecond - 1)
	require.Zero(t, ran)
	clk.Advance(1)
	require.Equal(t, 1, ran)
	require.Equal(t, uint64(1), w.Stats().Lateness.Buckets[0])
}

// TestReview41PinMaxDelayNotEarly: "Any d up to math.MaxInt64 is accepted and fires at its
// time": with the clock already moved, AfterFunc(math.MaxInt64) does not fire one nanosecond
// before the end of time, and fires there.
func TestReview41PinMaxDelayNotEarly(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(2))
	clk.Advance(time.Hour)
	ran := 0
	_, err := w.AfterFunc(math.MaxInt64, func() { ran++ })
	require.NoError(t, err)
	clk.Advance(math.MaxInt64 - time.Hour - 1)
	require.Zero(t, ran)
	require.Equal(t, 1, w.Len())
	clk.Advance(1)
	require.Equal(t, 1, ran)
	booksBalance(t, w)
}

// TestReview41PinStopQueuedCallback: Timer.Stop of a timer whose callback waits in the worker
// pool's queue reports true and the callback never runs; Queued counts it until then.
func TestReview41PinStopQueuedCallback(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(1), WithShards(1), WithQueueSize(64))
	in, release := make(chan struct{}), make(chan struct{})
	_, err := w.AfterFunc(time.Millisecond, func() { close(in); <-release })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	<-in
	var ran atomic.Int32
	tm, err := w.AfterFunc(time.Millisecond, func() { ran.Add(1) })
	require.NoError(t, err)
	clk.Advance(time.Millisecond) // dispatched: in the queue behind the blocked worker
	require.Equal(t, 1, w.Stats().Queued)
	require.Equal(t, 1, w.Len(), "a queued callback is pending until it starts")
	require.True(t, tm.Stop())
	require.False(t, tm.Stop())
	close(release)
	require.Zero(t, w.Stop())
	require.Zero(t, ran.Load())
	st := booksBalance(t, w)
	require.Equal(t, uint64(1), st.Stopped)
	require.Equal(t, 0, st.Queued)
}

// TestReview41PinEveryPanicKeepsRunning: "A panicking callback is recovered, counted in
// Stats.Panics and handed to the panic handler; the wheel and its workers keep working": an
// Every whose f panics keeps its series, each panic counted once.
func TestReview41PinEveryPanicKeepsRunning(t *testing.T) {
	var got []any
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(1),
		WithPanicHandler(func(r any) { got = append(got, r) }))
	n := 0
	tm, err := w.Every(time.Millisecond, func() { n++; panic(n) })
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		clk.Advance(time.Millisecond)
	}
	require.Equal(t, 3, n)
	require.Equal(t, []any{1, 2, 3}, got)
	require.Equal(t, uint64(3), w.Stats().Panics)
	require.True(t, tm.Stop())
	booksBalance(t, w)
}

// TestReview41PinKeyedSetWhileFiring: "A key fires at most once per arming, with the value of
// its latest Set": a Set that comes while the key's callback waits in the queue (due, not
// started) replaces it: the old value never fires, the new one fires once at its own time.
func TestReview41PinKeyedSetWhileFiring(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(1), WithShards(1))
	in, release := make(chan struct{}), make(chan struct{})
	_, err := w.AfterFunc(time.Millisecond, func() { close(in); <-release })
	require.NoError(t, err)
	var mu sync.Mutex
	var fired []string
	k := NewKeyed(w, func(key int, v string) { mu.Lock(); fired = append(fired, v); mu.Unlock() })
	require.NoError(t, k.Set(1, "v1", time.Millisecond))
	clk.Advance(time.Millisecond) // the blocker runs; v1's callback waits in the queue
	<-in
	require.NoError(t, k.Set(1, "v2", 5*time.Millisecond))
	require.Equal(t, 1, k.Len())
	close(release)
	require.Eventually(t, func() bool { return w.Stats().Queued == 0 }, 5*time.Second, time.Millisecond)
	mu.Lock()
	require.Empty(t, fired, "the displaced arming fired")
	mu.Unlock()
	clk.Advance(5 * time.Millisecond)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(fired) == 1 }, 5*time.Second, time.Millisecond)
	require.Zero(t, w.Stop())
	require.Equal(t, []string{"v2"}, fired)
	require.Zero(t, k.Len())
	require.False(t, k.Move(1, time.Second))
	require.False(t, k.Remove(1))
	booksBalance(t, w)
}

// ctxObs is what a test sees of a context: Err, Cause, whether Done is closed, and whether it
// has a deadline; scenarios compare a wheel context's with the standard library's.
type ctxObs struct {
	err, cause error
	done       bool
	deadlineOK bool
}

func observe41(ctx context.Context) ctxObs {
	_, ok := ctx.Deadline()
	o := ctxObs{err: ctx.Err(), cause: context.Cause(ctx), deadlineOK: ok}
	select {
	case <-ctx.Done():
		o.done = true
	default:
	}
	return o
}

// TestReview41PinContextBornExpiredLikeStd: d <= 0 and a past deadline, with and without a cause,
// and a cancel after the deadline, observed as the standard library's.
func TestReview41PinContextBornExpiredLikeStd(t *testing.T) {
	w, _ := newManualWheel(t, WithWorkers(0), WithShards(1))
	cause := errors.New("mine")
	now := w.opts.clock.Now()
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
		require.Equal(t, observe41(s), observe41(x), c.name)
		scancel()
		xcancel()
		require.Equal(t, observe41(s), observe41(x), c.name+" after cancel")
		// a child of each, made after the end
		sc, sccancel := context.WithCancel(s)
		xc, xccancel := context.WithCancel(x)
		require.Equal(t, observe41(sc), observe41(xc), c.name+" child")
		sccancel()
		xccancel()
		ws, wscancel := w.WithTimeoutCause(s, time.Hour, errors.New("other"))
		wx, wxcancel := w.WithTimeoutCause(x, time.Hour, errors.New("other"))
		require.Equal(t, observe41(ws), observe41(wx), c.name+" wheel child")
		wscancel()
		wxcancel()
	}
	require.Zero(t, w.Len())
	booksBalance(t, w)
}

// TestReview41PinContextDoneWhenAdvanceReturns: with WithWorkers(0), when Advance returns every
// timer due has run: a wheel context at its deadline is done, with DeadlineExceeded and its
// cause, and its std child too; Len dropped.
func TestReview41PinContextDoneWhenAdvanceReturns(t *testing.T) {
	w, clk := newManualWheel(t, WithWorkers(0), WithShards(2))
	cause := errors.New("slow backend")
	ctx, cancel := w.WithTimeoutCause(context.Background(), 10*time.Millisecond, cause)
	defer cancel()
	child, ccancel := context.WithCancel(context.WithValue(ctx, ctxObs{}, 1))
	defer ccancel()
	require.Equal(t, 1, w.Len())
	clk.Advance(10*time.Millisecond - 1)
	require.NoError(t, ctx.Err())
	require.NoError(t, child.Err())
	clk.Advance(1)
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
	require.Equal(t, cause, context.Cause(ctx))
	require.Equal(t, context.DeadlineExceeded, child.Err())
	require.Equal(t, cause, context.Cause(child))
	require.Equal(t, 1, child.Value(ctxObs{}))
	require.Zero(t, w.Len())
	cancel()
	require.Equal(t, context.DeadlineExceeded, ctx.Err())
	require.True(t, strings.HasPrefix(child.(interface{ String() string }).String(), "context.Background.WithDeadline("))
	booksBalance(t, w)
}

// TestReview41PinArmStopAllocatesNothing: API.md, "Scheduling": "in steady state, AfterFuncArg
// followed by Stop allocates nothing, on any goroutine (pass a pointer as arg, reuse one func
// value)"; README: Timer.Reset allocates nothing. No existing test measures it with
// testing.AllocsPerRun. Each goroutine warms its shard up first (steady state), then measures.
func TestReview41PinArmStopAllocatesNothing(t *testing.T) {
	for _, manual := range []bool{false, true} {
		var w *Wheel
		if manual {
			w, _ = newManualWheel(t, WithShards(4), WithWorkers(2))
		} else {
			var err error
			w, err = New(WithShards(4), WithWorkers(2))
			require.NoError(t, err)
		}
		type payload struct{ n int }
		p := &payload{}
		f := func(arg any) { arg.(*payload).n++ }
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20000; i++ { // warm up this goroutine's shard
					tm, _ := w.AfterFuncArg(time.Hour, f, p)
					tm.Stop()
				}
				pair := testing.AllocsPerRun(2000, func() {
					tm, err := w.AfterFuncArg(time.Hour, f, p)
					if err != nil {
						panic(err)
					}
					if !tm.Stop() {
						panic("Stop reported false")
					}
				})
				tm, _ := w.AfterFuncArg(time.Hour, f, p)
				reset := testing.AllocsPerRun(2000, func() {
					if !tm.Reset(time.Hour) {
						panic("Reset reported false")
					}
				})
				tm.Stop()
				if pair != 0 || reset != 0 {
					t.Errorf("manual=%v: AfterFuncArg+Stop %.2f allocs, Reset %.2f allocs", manual, pair, reset)
				}
			}()
		}
		wg.Wait()
		require.Zero(t, w.Stop())
		require.Zero(t, p.n)
	}
}

// TestReview41PinAdvanceOrderAcrossShardsWithResets: "with WithWorkers(0) ... timers due within
// one Advance ran in the order of their deadlines (rounded to the tick; ties in any order)", here
// with timers on every shard, over several levels, half of them Reset (earlier or later) and
// some stopped before the Advance, and the clock moved in a few uneven jumps.
func TestReview41PinAdvanceOrderAcrossShardsWithResets(t *testing.T) {
	const tick = time.Millisecond
	for seed := int64(1); seed <= 3; seed++ {
		w, clk := newManualWheel(t, WithWorkers(0), WithShards(4), WithTick(tick))
		type rec struct{ id, when int64 }
		var fired []rec
		want := map[int64]int64{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for g := int64(0); g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				x := uint64(seed*7919 + g*104729)
				rnd := func(n int64) int64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return int64(x % uint64(n)) }
				for i := int64(0); i < 300; i++ {
					id := g*1000 + i
					d := rnd(int64(20 * time.Second))
					var when atomic.Int64
					when.Store(d)
					tm, err := w.AfterFunc(time.Duration(d), func() {
						fired = append(fired, rec{id, when.Load()})
					})
					if err != nil {
						t.Error(err)
						return
					}
					switch rnd(4) {
					case 0, 1:
						d2 := rnd(int64(20 * time.Second))
						when.Store(d2)
						if !tm.Reset(time.Duration(d2)) {
							t.Error("Reset of a pending timer reported false")
						}
						d = d2
					case 2:
						if rnd(3) == 0 {
							if !tm.Stop() {
								t.Error("Stop of a pending timer reported false")
							}
							continue
						}
					}
					mu.Lock()
					want[id] = d
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		for _, step := range []time.Duration{3 * time.Millisecond, 777 * time.Millisecond, 5 * time.Second, 15 * time.Second} {
			before := len(fired)
			clk.Advance(step)
			now := int64(clk.Now().Sub(time.Unix(0, 0)))
			batch := fired[before:]
			for i := 1; i < len(batch); i++ {
				a, b := w.ceil(batch[i-1].when), w.ceil(batch[i].when)
				require.LessOrEqual(t, a, b, "seed %d: %v fired before %v", seed, batch[i-1], batch[i])
			}
			for _, r := range batch {
				require.LessOrEqual(t, r.when, now, "fired early")
			}
			for id, d := range want {
				if d <= now {
					found := false
					for _, r := range fired {
						if r.id == id {
							found = true
							break
						}
					}
					require.True(t, found, "seed %d: timer %d due at %d not run by %d", seed, id, d, now)
				}
			}
		}
		require.Len(t, fired, len(want))
		booksBalance(t, w)
	}
}

// TestReview41PinContextUnderWithoutCancelLikeStd: a deadline context made under
// context.WithoutCancel of a deadline context: the parent's cancel does not reach it; Value
// passes through; its own cancel and its std child end as std's; String names the ancestry.
func TestReview41PinContextUnderWithoutCancelLikeStd(t *testing.T) {
	w, _ := newManualWheel(t, WithWorkers(0), WithShards(1))
	type key struct{}
	base := context.WithValue(context.Background(), key{}, "v")
	sp, spc := context.WithTimeout(base, time.Hour)
	wp, wpc := w.WithTimeout(base, time.Hour)
	sx, sxc := context.WithTimeoutCause(context.WithoutCancel(sp), 2*time.Hour, errors.New("c"))
	wx, wxc := w.WithTimeoutCause(context.WithoutCancel(wp), 2*time.Hour, errors.New("c"))
	_, isWheel := wx.(*deadlineCtx)
	require.True(t, isWheel, "a never-done parent gets a wheel deadline")
	sk, skc := context.WithCancel(sx)
	wk, wkc := context.WithCancel(wx)
	defer skc()
	defer wkc()
	spc()
	wpc()
	require.Equal(t, observe41(sx), observe41(wx))
	require.Equal(t, observe41(sk), observe41(wk))
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
	require.Equal(t, observe41(sx), observe41(wx))
	require.Equal(t, observe41(sk), observe41(wk))
	require.Zero(t, w.Len())
	booksBalance(t, w)
}

// TestReview41FixedLaterStopOnAdvancerWaits: the same sentence on a manual clock, the later Stop
// from a callback that the advancer runs itself (CallerRuns, the queue full). The first Stop,
// from outside, waits for advMu, which that advance holds; the later Stop must still wait for
// the worker's running callback and for the one queued behind it, and must not deadlock.
func TestReview41FixedLaterStopOnAdvancerWaits(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1),
		WithFullPolicy(CallerRuns))
	require.NoError(t, err)

	aIn, aRelease := make(chan struct{}), make(chan struct{})
	var aDone, cDone, doneAtB atomic.Bool
	_, err = w.AfterFunc(time.Millisecond, func() { close(aIn); <-aRelease; aDone.Store(true) })
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	<-aIn // A holds the one worker
	_, err = w.AfterFunc(time.Millisecond, func() { cDone.Store(true) })
	require.NoError(t, err)
	clk.Advance(time.Millisecond) // C waits in the queue, which is now full

	first := make(chan int, 1)
	bIn := make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() { // runs on the advancer: no room in the queue
		close(bIn)
		go func() { first <- w.Stop() }()
		require.Eventually(t, func() bool { return isClosed(w.closing) }, 5*time.Second,
			time.Millisecond, "the first Stop began")
		time.AfterFunc(100*time.Millisecond, func() { close(aRelease) })
		require.Equal(t, 0, w.Stop())
		doneAtB.Store(aDone.Load() && cDone.Load())
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	select {
	case <-bIn:
	default:
		t.Fatal("B did not run on the advancer")
	}
	require.True(t, doneAtB.Load(), "a later Stop on the advancer returned before the worker's callbacks ended")
	require.Equal(t, 0, <-first)
	for i, d := range w.pool.done {
		require.True(t, isClosed(d), "worker %d", i)
	}
}

// TestReview41FixedLaterStopOnWorkerWaitsForAdvancer: a later Stop from a worker's callback
// waits for a callback that the manual advancer runs itself (CallerRuns), which the first Stop
// (from outside, waiting for advMu) also waits for.
func TestReview41FixedLaterStopOnWorkerWaitsForAdvancer(t *testing.T) {
	defer goleak.VerifyNone(t)
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithQueueSize(1),
		WithFullPolicy(CallerRuns))
	require.NoError(t, err)

	aIn, aGo := make(chan struct{}), make(chan struct{})
	var bDone, bDoneAtA atomic.Bool
	aOut := make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() { // on the worker
		close(aIn)
		<-aGo
		require.Equal(t, 0, w.Stop())
		bDoneAtA.Store(bDone.Load())
		close(aOut)
	})
	require.NoError(t, err)
	clk.Advance(time.Millisecond)
	<-aIn
	_, err = w.AfterFunc(time.Millisecond, func() {}) // fills the queue
	require.NoError(t, err)
	clk.Advance(time.Millisecond)

	bIn, bRelease := make(chan struct{}), make(chan struct{})
	_, err = w.AfterFunc(time.Millisecond, func() { close(bIn); <-bRelease; bDone.Store(true) })
	require.NoError(t, err)
	advanced := make(chan struct{})
	go func() { clk.Advance(time.Millisecond); close(advanced) }() // B runs on this advancer
	<-bIn
	first := make(chan int, 1)
	go func() { first <- w.Stop() }()
	require.Eventually(t, func() bool { return isClosed(w.closing) }, 5*time.Second, time.Millisecond)
	time.AfterFunc(100*time.Millisecond, func() { close(bRelease) })
	close(aGo)
	<-aOut
	require.True(t, bDoneAtA.Load(), "a later Stop on a worker returned before the advancer's callback ended")
	<-advanced
	require.Equal(t, 0, <-first)
}

// TestReview41PinLaterStopsFromCallbacksStorm: many callbacks on three workers call Stop while
// a goroutine outside calls it too, on both clocks; the callbacks that do not call Stop sleep a
// little. Every Stop returns (none waits for another callback inside a Stop); a Stop from a
// callback returns only once every callback that was running when it was called has ended (a
// goroutine inside a Stop runs none, so those run on goroutines it waits for); the first Stop,
// whichever it is, returns the pending count; no goroutine is left behind.
func TestReview41PinLaterStopsFromCallbacksStorm(t *testing.T) {
	defer goleak.VerifyNone(t)
	for round := 0; round < 20; round++ {
		var clk *ManualClock
		opts := []Option{WithWorkers(3), WithShards(2), WithQueueSize(2)}
		if round%2 == 1 {
			clk = NewManualClock(time.Unix(0, 0))
			opts = append(opts, WithClock(clk), WithFullPolicy(CallerRuns))
		}
		w, err := New(opts...)
		require.NoError(t, err)
		var mu sync.Mutex
		running := map[int]bool{} // callbacks that do not call Stop, started and not ended
		var bad, sum atomic.Int32
		gate := make(chan struct{}) // no Stop before every timer is armed
		for i := 0; i < 30; i++ {
			f := func() {
				mu.Lock()
				running[i] = true
				mu.Unlock()
				time.Sleep(200 * time.Microsecond)
				mu.Lock()
				delete(running, i)
				mu.Unlock()
			}
			if i%3 == 0 {
				f = func() {
					<-gate
					mu.Lock()
					before := maps.Clone(running)
					mu.Unlock()
					sum.Add(int32(w.Stop()))
					mu.Lock()
					for j := range before {
						if running[j] {
							bad.Add(1)
						}
					}
					mu.Unlock()
				}
			}
			_, err := w.AfterFunc(time.Duration(i%4)*time.Millisecond, f)
			require.NoError(t, err)
		}
		_, err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
		close(gate)
		advanced := make(chan struct{})
		if clk != nil {
			go func() { clk.Advance(4 * time.Millisecond); close(advanced) }()
		}
		sum.Add(int32(w.Stop()))
		if clk != nil {
			<-advanced
		}
		require.GreaterOrEqual(t, sum.Load(), int32(1), "round %d: the hour-long timer was pending", round)
		require.Equal(t, w.Stats().Dropped, uint64(sum.Load()), "round %d: only the first Stop counts", round)
		require.Zero(t, bad.Load(), "round %d: a Stop from a callback returned while a callback it found running ran on", round)
		require.Zero(t, w.Stop())
	}
}
