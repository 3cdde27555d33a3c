package shardwheel_test

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// manualWheel returns a wheel on a manual clock that runs callbacks inside Advance, and stops it
// when the test ends.
func manualWheel(t *testing.T, opts ...sw.Option) (*sw.Wheel, *sw.ManualClock) {
	t.Helper()
	clk := sw.NewManualClock(epoch)
	w, err := sw.New(append([]sw.Option{sw.WithClock(clk), sw.WithWorkers(0), sw.WithShards(3)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	return w, clk
}

// armStuck arms a callback due after d that blocks its worker until release is closed, then calls
// then (if not nil); started is closed when the callback begins.
func armStuck(t *testing.T, w *sw.Wheel, d time.Duration, then func()) (started, release chan struct{}) {
	t.Helper()
	started, release = make(chan struct{}), make(chan struct{})
	_, err := w.AfterFunc(d, func() {
		close(started)
		<-release
		if then != nil {
			then()
		}
	})
	require.NoError(t, err)
	return started, release
}

// requireBalance checks the exactly-once accounting of a quiet wheel.
func requireBalance(t *testing.T, w *sw.Wheel) {
	t.Helper()
	s := w.Stats()
	require.Equal(t, s.Scheduled, s.Fired+s.Stopped+s.Dropped+uint64(s.Pending), "stats %+v", s)
}

// short is a deadline the std lib reaches quickly on the real clock; the wheel advances to it.
const short = 5 * time.Millisecond

const (
	shortDuration    = 1 * time.Millisecond // a reasonable duration to block in a test
	veryLongDuration = 1000 * time.Hour     // an arbitrary upper bound on the test's running time
)

// afterFuncContext is a context that's not one of the types
// defined in context.go, that supports registering AfterFuncs.
type afterFuncContext struct {
	mu         sync.Mutex
	afterFuncs map[*byte]func()
	done       chan struct{}
	err        error
}

var _ context.Context = (*afterFuncContext)(nil)

func (c *afterFuncContext) Deadline() (time.Time, bool) {
	return time.Time{}, false
}

func (c *afterFuncContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
	}
	return c.done
}

func (c *afterFuncContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *afterFuncContext) Value(key any) any {
	return nil
}

func (c *afterFuncContext) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := new(byte)
	if c.afterFuncs == nil {
		c.afterFuncs = make(map[*byte]func())
	}
	c.afterFuncs[k] = f
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.afterFuncs[k]
		delete(c.afterFuncs, k)
		return ok
	}
}

func (c *afterFuncContext) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	for _, f := range c.afterFuncs {
		go f()
	}
	c.afterFuncs = nil
}

// everyRuns starts an Every on a manual wheel that records the manual time (since the epoch) of
// each run; during each run, f may advance the clock further (a run that takes time).
func everyRuns(t *testing.T, interval time.Duration, f func(clk *sw.ManualClock)) (*sw.Wheel, *sw.ManualClock, sw.Timer, *[]time.Duration) {
	t.Helper()
	w, clk := manualWheel(t)
	var runs []time.Duration
	tm, err := w.Every(interval, func() {
		runs = append(runs, clk.Now().Sub(epoch))
		if f != nil {
			f(clk)
		}
	})
	require.NoError(t, err)
	return w, clk, tm, &runs
}

func ms(n ...float64) []time.Duration {
	out := make([]time.Duration, len(n))
	for i, x := range n {
		out[i] = time.Duration(x * float64(time.Millisecond))
	}
	return out
}

const fltPatience = 60 * time.Second

// fltBook records what happened to each timer of a test, by id.
type fltBook struct {
	runs    []atomic.Int32
	stopped []atomic.Int32
}

func newFltBook(n int) *fltBook {
	return &fltBook{runs: make([]atomic.Int32, n), stopped: make([]atomic.Int32, n)}
}

func (b *fltBook) ran(id int) { b.runs[id].Add(1) }

func (b *fltBook) stop(id int) { b.stopped[id].Add(1) }

// totals returns how many timers ran and how many were stopped, among ids below n.
func (b *fltBook) totals(n int) (ran, stopped int) {
	for i := 0; i < n; i++ {
		ran += int(b.runs[i].Load())
		stopped += int(b.stopped[i].Load())
	}
	return
}

// check requires that each of the first n ids ended at most once, and that those that ended
// neither way number exactly dropped.
func (b *fltBook) check(t testing.TB, n, dropped int) {
	t.Helper()
	neither := 0
	for i := 0; i < n; i++ {
		r, s := b.runs[i].Load(), b.stopped[i].Load()
		require.LessOrEqual(t, r+s, int32(1), "timer %d: ran %d times, stopped %d times", i, r, s)
		if r+s == 0 {
			neither++
		}
	}
	require.Equal(t, dropped, neither, "timers that neither ran nor were stopped, against Wheel.Stop's count")
}

// fltWaitQuiet waits until every accepted timer of w has fired or been stopped.
func fltWaitQuiet(t testing.TB, w *sw.Wheel, want func() bool) {
	t.Helper()
	require.Eventually(t, want, fltPatience, time.Millisecond, "timers lost: %+v", w.Stats())
}

// fltBalance checks the counters once the wheel is stopped.
func fltBalance(t testing.TB, w *sw.Wheel, scheduled, fired, stopped, dropped int) {
	t.Helper()
	st := w.Stats()
	assert.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped, "%+v", st)
	assert.Equal(t, uint64(scheduled), st.Scheduled, "%+v", st)
	assert.Equal(t, uint64(fired), st.Fired, "%+v", st)
	assert.Equal(t, uint64(stopped), st.Stopped, "%+v", st)
	assert.Equal(t, uint64(dropped), st.Dropped, "%+v", st)
	assert.Equal(t, 0, st.Pending)
}

// fltGoid returns the calling goroutine's id, to tell which goroutine ran a callback.
func fltGoid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = b[len("goroutine "):]
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	id, _ := strconv.ParseInt(string(b[:i]), 10, 64)
	return id
}

// fltSpin burns about d of CPU without sleeping (a sleep is much longer than 20µs on most kernels).
func fltSpin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// payload is what a callback keeps alive: 64 KiB, so that a leak is plain in the heap.
type payload [64 << 10]byte

// gone collects garbage and reports whether every weak pointer is nil.
func gone(ws []weak.Pointer[payload]) bool {
	runtime.GC()
	runtime.GC()
	for _, p := range ws {
		if p.Value() != nil {
			return false
		}
	}
	return true
}

// alive collects garbage and reports whether every weak pointer is still set.
func alive(ws []weak.Pointer[payload]) bool {
	runtime.GC()
	for _, p := range ws {
		if p.Value() == nil {
			return false
		}
	}
	return true
}

// within fails the test with why unless ch delivers within 5 s: a deadlock shows as a failure,
// not as a test binary that hangs until its timeout.
func within(t *testing.T, ch <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal(why)
	}
}

// blockingManualWheel is a manual-clock wheel whose one worker and one-slot queue make Advance
// block on the queue as soon as a callback holds the worker (the Block policy).
func blockingManualWheel(t *testing.T) (*sw.Wheel, *sw.ManualClock) {
	return manualWheel(t, sw.WithShards(1), sw.WithWorkers(1), sw.WithQueueSize(1))
}
