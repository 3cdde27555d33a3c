package shardwheel_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
)

// BenchmarkWithTimeout measures the RPC deadline: WithTimeout(parent, 1 minute) and its cancel,
// from GOMAXPROCS goroutines, with live contexts already waiting; use=done also reads Done and
// polls it first, as RPC code that selects on its context does. The baseline beside it is the
// standard library's context.WithTimeout, and impl=floor is the least a custom context can build
// when Done is read (ctxFloor); compare them with benchstat -col /impl. cpu-ns/op is the process's
// CPU time per op, the steadier figure on a busy machine.
func BenchmarkWithTimeout(b *testing.B) {
	type withTimeout func(context.Context, time.Duration) (context.Context, context.CancelFunc)
	newWheel := func(b *testing.B) *sw.Wheel {
		w, err := sw.New()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { w.Stop() })
		return w
	}
	impls := []struct {
		name string
		make func(b *testing.B) withTimeout
	}{
		{"wheel", func(b *testing.B) withTimeout { return newWheel(b).WithTimeout }},
		{"context", func(*testing.B) withTimeout { return context.WithTimeout }},
		{"floor", func(b *testing.B) withTimeout { return newCtxFloor(newWheel(b)).WithTimeout }},
	}
	for _, use := range []string{"cancel", "done"} {
		for _, live := range []struct {
			name string
			n    int
		}{{"0", 0}, {"1e6", 1_000_000}} {
			for _, impl := range impls {
				if impl.name == "floor" && use != "done" {
					continue // the floor is of what Done builds
				}
				b.Run(fmt.Sprintf("use=%s/live=%s/impl=%s", use, live.name, impl.name), func(b *testing.B) {
					benchWithTimeout(b, impl.make(b), use == "done", live.n)
				})
			}
		}
	}
}

func benchWithTimeout(b *testing.B, withTimeout func(context.Context, time.Duration) (context.Context, context.CancelFunc), done bool, live int) {
	parent := context.Background()
	cancels := make([]context.CancelFunc, live)
	for i := range cancels {
		_, cancels[i] = withTimeout(parent, time.Hour)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx, cancel := withTimeout(parent, time.Minute)
			if done {
				select {
				case <-ctx.Done():
					b.Error("a context a minute out is done")
				default:
				}
			}
			cancel()
		}
	})
	b.StopTimer()
	// The process's CPU per op (GC and the wheel's own goroutines included): on a shared
	// machine, wall time per op mostly measures the neighbours.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
	for _, cancel := range cancels {
		cancel()
	}
}

// ctxFloor makes the least a deadline context can be, keeping its deadline on a wheel timer, once
// its Done is read: standard contexts derived from it (directly or through context.WithValue) must
// end with its error and cost no goroutine, so they must find, through Value, a standard cancel
// context whose Done is its own (there is no other way to join one); and that cancel context must
// end with DeadlineExceeded at the deadline, which only its parent can give it: here a gate that
// registers its cancellation (context.AfterFunc's protocol). What Done costs is that
// context.WithCancel(gate): the cancel context, the registration's closure, the boxed stopCtx, the
// CancelFunc that WithCancel returns, and the Done channel. It leaves out everything the wheel's
// context must also do that this bench does not exercise (a wheel parent's children, causes, a
// deadline already past, String, Stop); it is safe only where, as here, each context is used by one
// goroutine.
type ctxFloor struct{ w *sw.Wheel }

func newCtxFloor(w *sw.Wheel) ctxFloor { return ctxFloor{w: w} }

func (f ctxFloor) WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	c := &floorCtx{parent: parent, deadline: time.Now().Add(d)}
	c.timer, _ = f.w.AfterFuncArg(d, floorExpire, c)
	return c, c.cancel
}

type floorCtx struct {
	parent   context.Context
	deadline time.Time
	timer    sw.Timer
	state    atomic.Uint32 // 0 live, 1 canceled, 2 deadline
	mu       sync.Mutex
	f        func() // the standard library's registration of q
	q        context.Context
}

func floorExpire(arg any) { arg.(*floorCtx).end(2) }

func (c *floorCtx) cancel() { c.end(1) }

func (c *floorCtx) end(code uint32) {
	if !c.state.CompareAndSwap(0, code) {
		return
	}
	c.mu.Lock()
	f := c.f
	c.mu.Unlock()
	if f != nil {
		f()
	}
	if code != 2 {
		c.timer.Stop()
	}
}

func (c *floorCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *floorCtx) Done() <-chan struct{} {
	if c.q == nil {
		q, qcancel := context.WithCancel((*floorGate)(c))
		_ = qcancel // never called: q ends only through the gate, with c's error
		c.q = q
	}
	return c.q.Done()
}

func (c *floorCtx) Err() error {
	switch c.state.Load() {
	case 1:
		return context.Canceled
	case 2:
		return context.DeadlineExceeded
	}
	return nil
}

func (c *floorCtx) Value(key any) any { return c.parent.Value(key) }

// floorGate is the floorCtx seen as q's parent.
type floorGate floorCtx

func (g *floorGate) Deadline() (time.Time, bool) { return g.deadline, true }
func (g *floorGate) Done() <-chan struct{}       { return floorNever }
func (g *floorGate) Err() error                  { return (*floorCtx)(g).Err() }
func (g *floorGate) Value(key any) any           { return g.parent.Value(key) }

func (g *floorGate) AfterFunc(f func()) func() bool {
	g.mu.Lock()
	g.f = f
	g.mu.Unlock()
	return floorStop
}

var floorNever = make(chan struct{})

func floorStop() bool { return false }
