// Copyright 2014 The Go Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

// This file ports the tests of Go's package context (src/context: context_test.go, x_test.go,
// afterfunc_test.go, net_test.go, example_test.go, go1.26) that involve a timer context, with the
// wheel's WithTimeout, WithDeadline, WithTimeoutCause and WithDeadlineCause in the place of the
// standard library's. Every assertion is kept; where the original reads unexported internals
// (a cancelCtx's children map, the goroutines counter, parentCancelCtx), the port asserts the
// observable consequence (a canceled child is no longer reachable from its parent; a goroutine
// of package context is or is not running; the subtree ends synchronously). Tests marked
// "wheel path" are added: the originals mostly root their trees in context.WithCancel, under which
// the wheel hands out the standard library's own context (see withDeadline), so the same
// scenarios are repeated with trees the wheel's timers serve, and check that they do (Len).

//lint:file-ignore SA1029 ported from Go's src/context tests, which use string keys on purpose; kept as written
//lint:file-ignore SA1019 Go's net_test asserts that DeadlineExceeded reports Temporary(), as the standard library's does

package shardwheel_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	sw "github.com/shardwheel/shardwheel"
)

// ctxFuncs are the timer-context constructors of one wheel, named as package context names them.
type ctxFuncs struct {
	w                 *sw.Wheel
	WithTimeout       func(context.Context, time.Duration) (context.Context, context.CancelFunc)
	WithDeadline      func(context.Context, time.Time) (context.Context, context.CancelFunc)
	WithTimeoutCause  func(context.Context, time.Duration, error) (context.Context, context.CancelFunc)
	WithDeadlineCause func(context.Context, time.Time, error) (context.Context, context.CancelFunc)
}

// newCtxFuncs starts a wheel on the system clock for one test.
func newCtxFuncs(t testing.TB) ctxFuncs {
	w, err := sw.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop() })
	return ctxFuncs{w, w.WithTimeout, w.WithDeadline, w.WithTimeoutCause, w.WithDeadlineCause}
}

// ctxRoots names the roots the ported trees are grown from: "std", context.WithCancel as in Go's
// tests, under which the wheel hands out the standard library's own contexts (see withDeadline),
// and "wheel", a wheel context, under which the wheel's timers serve the tree.
var ctxRoots = []string{"std", "wheel"}

// root makes the cancelable root named by one of ctxRoots. The wheel root's deadline is later
// than any child's in these tests: a parent deadline before the child's makes the child
// context.WithCancel(parent), as in the standard library.
func (f ctxFuncs) root(name string) (context.Context, context.CancelFunc) {
	if name == "wheel" {
		return f.WithTimeout(context.Background(), 2*veryLongDuration)
	}
	return context.WithCancel(context.Background())
}

// otherContext is a Context that's not one of the types defined in context.go.
type otherContext struct {
	context.Context
}

// quiescent returns an arbitrary duration by which the program should have
// completed any remaining work and reached a steady (idle) state.
func quiescent(t *testing.T) time.Duration {
	deadline, ok := t.Deadline()
	if !ok {
		return 5 * time.Second
	}
	const arbitraryCleanupMargin = 1 * time.Second
	return time.Until(deadline) - arbitraryCleanupMargin
}

// ctxWatchers counts the live goroutines that package context started to watch a parent it
// cannot register with (propagateCancel's fallback: the std's goroutines counter counts their
// starts), and any goroutine started by this package's context code.
func ctxWatchers() int {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	s := string(buf)
	return strings.Count(s, "created by context.(*cancelCtx).propagateCancel") +
		strings.Count(s, "created by github.com/shardwheel/shardwheel.(*deadlineCtx)") +
		strings.Count(s, "created by github.com/shardwheel/shardwheel.(*ctxGate)")
}

// eventually polls cond; the time limit only turns a hang into a failure.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not after a minute", what)
		}
	}
}

// From context_test.go: XTestParentFinishesChild. The linkage checks (pc.children holds the
// three cancelable children, parentCancelCtx finds pc through each) are asserted by their
// consequences: no goroutine watches any child, the children end synchronously with the parent,
// and after the parent's cancel none of them is reachable from it.
func TestParentFinishesChild(t *testing.T) {
	f := newCtxFuncs(t)
	for _, root := range ctxRoots {
		t.Run("root="+root, func(t *testing.T) {
			// Context tree:
			// parent -> cancelChild
			// parent -> valueChild -> timerChild
			// parent -> afterChild
			g := ctxWatchers()
			parent, cancel := f.root(root)
			cancelChild, stop := context.WithCancel(parent)
			defer stop()
			valueChild := context.WithValue(parent, "key", "value")
			p := new(payload)
			// Its CancelFunc is dropped: what must not keep timerChild reachable is the parent.
			timerChild, _ := f.WithTimeout(context.WithValue(valueChild, "payload", p), veryLongDuration)
			afterStop := context.AfterFunc(parent, func() {})
			defer afterStop()
			if root == "wheel" && f.w.Len() != 2 {
				t.Errorf("wheel root: Len = %d, want 2 (parent and timerChild on the wheel)", f.w.Len())
			}

			select {
			case x := <-parent.Done():
				t.Errorf("<-parent.Done() == %v want nothing (it should block)", x)
			case x := <-cancelChild.Done():
				t.Errorf("<-cancelChild.Done() == %v want nothing (it should block)", x)
			case x := <-timerChild.Done():
				t.Errorf("<-timerChild.Done() == %v want nothing (it should block)", x)
			case x := <-valueChild.Done():
				t.Errorf("<-valueChild.Done() == %v want nothing (it should block)", x)
			default:
			}
			if n := ctxWatchers() - g; n != 0 {
				t.Errorf("bad linkage: %d goroutines watch the children", n)
			}

			ws := []weak.Pointer[payload]{weak.Make(p)}
			p = nil
			timerChild = nil
			cancel()
			if n := f.w.Len(); n != 0 {
				t.Errorf("pc.cancel didn't release the children: Len = %d", n)
			}
			// Under the std root, timerChild is the standard library's own timerCtx (see
			// withDeadline), and its stopped *time.Timer keeps it reachable from Go's timer heap
			// until that P next cleans up, an unbounded time: reachability says nothing about
			// pc.children there, and std's own test covers that code.
			if root == "wheel" && !gone(ws) {
				t.Errorf("pc.cancel didn't clear pc.children: timerChild still reachable")
			}

			// parent and children should all be finished.
			check := func(ctx context.Context, name string) {
				select {
				case <-ctx.Done():
				default:
					t.Errorf("<-%s.Done() blocked, but shouldn't have", name)
				}
				if e := ctx.Err(); e != context.Canceled {
					t.Errorf("%s.Err() == %v want %v", name, e, context.Canceled)
				}
			}
			check(parent, "parent")
			check(cancelChild, "cancelChild")
			check(valueChild, "valueChild")

			// WithCancel should return a canceled context on a canceled parent.
			precanceledChild := context.WithValue(parent, "key", "value")
			select {
			case <-precanceledChild.Done():
			default:
				t.Errorf("<-precanceledChild.Done() blocked, but shouldn't have")
			}
			if e := precanceledChild.Err(); e != context.Canceled {
				t.Errorf("precanceledChild.Err() == %v want %v", e, context.Canceled)
			}
			runtime.KeepAlive(parent)
		})
	}
}

// From context_test.go: XTestCancelRemoves. "the parent has n children" is asserted as: what
// only the child holds (a payload in a value between parent and child) stays reachable while the
// child is registered, and is collectible, with the parent alive, as soon as the child is
// canceled. The wheel's Len drops at once.
func TestCancelRemoves(t *testing.T) {
	f := newCtxFuncs(t)
	type key struct{}
	children := map[string]func(parent context.Context, p *payload) func(){
		"WithCancel": func(parent context.Context, p *payload) func() {
			_, cancel := context.WithCancel(context.WithValue(parent, key{}, p))
			return cancel
		},
		"WithTimeout": func(parent context.Context, p *payload) func() {
			_, cancel := f.WithTimeout(context.WithValue(parent, key{}, p), 60*time.Minute)
			return cancel
		},
		"WithTimeout/direct": func(parent context.Context, p *payload) func() {
			ctx, cancel := f.WithTimeout(parent, 60*time.Minute)
			return func() {
				cancel()
				p[0] = byte(len(fmt.Sprint(ctx))) // p lives as long as this func
			}
		},
		"AfterFunc": func(parent context.Context, p *payload) func() {
			stop := context.AfterFunc(parent, func() { p[0]++ })
			return func() {
				if !stop() {
					t.Error("AfterFunc: stop() = false, want true")
				}
			}
		},
	}
	for _, rname := range ctxRoots {
		for cname, child := range children {
			t.Run(rname+"/"+cname, func(t *testing.T) {
				ctx, cancelRoot := f.root(rname)
				defer cancelRoot()
				base := f.w.Len()
				p := new(payload)
				ws := []weak.Pointer[payload]{weak.Make(p)}
				cancel := child(ctx, p)
				p = nil
				if !alive(ws) {
					t.Fatalf("with %s child: child not held", cname)
				}
				cancel()
				if n := f.w.Len(); n > base {
					t.Errorf("after canceling %s child: Len = %d, want at most %d", cname, n, base)
				}
				cancel = nil
				if rname == "std" && strings.HasPrefix(cname, "WithTimeout") {
					// The standard library's own timerCtx (see withDeadline): its stopped
					// *time.Timer keeps it reachable from Go's timer heap until that P next cleans
					// up, an unbounded time. Std's own test covers its children map.
					if n := f.w.Len(); n != 0 {
						t.Errorf("std root: Len = %d, want 0 (std's own timer)", n)
					}
				} else if !gone(ws) {
					t.Errorf("after canceling %s child: context still has it", cname)
				}
				runtime.KeepAlive(ctx)
			})
		}
	}
}

type myCtx struct {
	context.Context
}

type myDoneCtx struct {
	context.Context
}

func (d *myDoneCtx) Done() <-chan struct{} {
	c := make(chan struct{})
	return c
}

// From context_test.go: XTestCustomContextGoroutines. The goroutines counter counts starts;
// the port counts live watchers, so "created one" is checked while the context is live, and its
// exit after cancel.
func TestCustomContextGoroutines(t *testing.T) {
	f := newCtxFuncs(t)
	for _, root := range ctxRoots {
		t.Run("root="+root, func(t *testing.T) {
			g := ctxWatchers()
			checkNoGoroutine := func() {
				t.Helper()
				now := ctxWatchers()
				if now != g {
					t.Fatalf("%d goroutines created", now-g)
				}
			}
			checkCreatedGoroutine := func(cancel context.CancelFunc) {
				t.Helper()
				now := ctxWatchers()
				if now != g+1 {
					t.Fatalf("%d goroutines created, want 1", now-g)
				}
				if cancel != nil {
					cancel()
					eventually(t, "watcher exits after cancel", func() bool { return ctxWatchers() == g })
				} else {
					g = now
				}
			}

			_, cancel0 := context.WithCancel(&myDoneCtx{context.Background()})
			checkCreatedGoroutine(cancel0)

			_, cancel0 = f.WithTimeout(&myDoneCtx{context.Background()}, veryLongDuration)
			checkCreatedGoroutine(cancel0)

			checkNoGoroutine()
			defer checkNoGoroutine()

			ctx1, cancel1 := f.root(root)
			defer cancel1()
			checkNoGoroutine()

			ctx2 := &myCtx{ctx1}
			ctx3, cancel3 := context.WithCancel(ctx2)
			defer cancel3()
			checkNoGoroutine()

			_, cancel3b := context.WithCancel(&myDoneCtx{ctx2})
			checkCreatedGoroutine(cancel3b) // ctx1 is not providing Done, must not be used

			ctx4, cancel4 := f.WithTimeout(ctx3, veryLongDuration)
			defer cancel4()
			checkNoGoroutine()

			ctx4b, cancel4b := f.WithTimeout(ctx2, veryLongDuration) // through the wrapper
			defer cancel4b()
			checkNoGoroutine()
			if root == "wheel" && f.w.Len() != 2 {
				t.Errorf("wheel root: Len = %d, want 2 (ctx1, ctx4b)", f.w.Len())
			}
			ctx4c, cancel4c := context.WithCancel(&myCtx{ctx4b})
			defer cancel4c()
			checkNoGoroutine()

			ctx5, cancel5 := context.WithCancel(ctx4)
			defer cancel5()
			checkNoGoroutine()

			cancel5()
			checkNoGoroutine()

			_, cancel6 := f.WithTimeout(ctx5, veryLongDuration)
			defer cancel6()
			checkNoGoroutine()

			// Check applied to canceled context.
			cancel6()
			cancel1()
			_, cancel7 := context.WithCancel(ctx5)
			defer cancel7()
			checkNoGoroutine()
			for _, c := range []context.Context{ctx4, ctx4b, ctx4c} {
				if c.Err() != context.Canceled {
					t.Errorf("%v: Err = %v after cancel1, want Canceled", c, c.Err())
				}
			}
		})
	}
}

// From x_test.go: TestWithCancel, with a wheel context as c1 (the original's c1 is
// context.WithCancel, which has no timer). cancel must end c2, derived through a wrapper,
// synchronously.
func TestWithCancel(t *testing.T) {
	f := newCtxFuncs(t)
	c1, cancel := f.WithTimeout(context.Background(), veryLongDuration)

	if got, prefix := fmt.Sprint(c1), "context.Background.WithDeadline("; !strings.HasPrefix(got, prefix) {
		t.Errorf("c1.String() = %q want prefix %q", got, prefix)
	}

	o := otherContext{c1}
	c2, c2cancel := context.WithCancel(o)
	defer c2cancel()
	if got, prefix := fmt.Sprint(c2), "shardwheel_test.otherContext.WithCancel"; got != prefix {
		t.Errorf("c2.String() = %q want %q", got, prefix)
	}
	c3, c3cancel := context.WithCancel(c1)
	defer c3cancel()
	if got, prefix := fmt.Sprint(c3), "context.Background.WithDeadline("; !strings.HasPrefix(got, prefix) || !strings.HasSuffix(got, "]).WithCancel") {
		t.Errorf("c3.String() = %q want %q...]).WithCancel", got, prefix)
	}
	contexts := []context.Context{c1, o, c2, c3}

	for i, c := range contexts {
		if d := c.Done(); d == nil {
			t.Errorf("c[%d].Done() == %v want non-nil", i, d)
		}
		if e := c.Err(); e != nil {
			t.Errorf("c[%d].Err() == %v want nil", i, e)
		}

		select {
		case x := <-c.Done():
			t.Errorf("<-c.Done() == %v want nothing (it should block)", x)
		default:
		}
	}

	cancel() // Should propagate synchronously.
	for i, c := range contexts {
		select {
		case <-c.Done():
		default:
			t.Errorf("<-c[%d].Done() blocked, but shouldn't have", i)
		}
		if e := c.Err(); e != context.Canceled {
			t.Errorf("c[%d].Err() == %v want %v", i, e, context.Canceled)
		}
	}
}

func testDeadline(c context.Context, name string, t *testing.T) {
	t.Helper()
	d := quiescent(t)
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		t.Fatalf("%s: context not timed out after %v", name, d)
	case <-c.Done():
	}
	if e := c.Err(); e != context.DeadlineExceeded {
		t.Errorf("%s: c.Err() == %v; want %v", name, e, context.DeadlineExceeded)
	}
}

func TestDeadline(t *testing.T) {
	t.Parallel()
	f := newCtxFuncs(t)
	WithDeadline := f.WithDeadline

	c, _ := WithDeadline(context.Background(), time.Now().Add(shortDuration))
	if got, prefix := fmt.Sprint(c), "context.Background.WithDeadline("; !strings.HasPrefix(got, prefix) {
		t.Errorf("c.String() = %q want prefix %q", got, prefix)
	}
	testDeadline(c, "WithDeadline", t)

	c, _ = WithDeadline(context.Background(), time.Now().Add(shortDuration))
	o := otherContext{c}
	testDeadline(o, "WithDeadline+otherContext", t)

	c, _ = WithDeadline(context.Background(), time.Now().Add(shortDuration))
	o = otherContext{c}
	c, _ = WithDeadline(o, time.Now().Add(veryLongDuration))
	testDeadline(c, "WithDeadline+otherContext+WithDeadline", t)

	c, _ = WithDeadline(context.Background(), time.Now().Add(-shortDuration))
	testDeadline(c, "WithDeadline+inthepast", t)

	c, _ = WithDeadline(context.Background(), time.Now())
	testDeadline(c, "WithDeadline+now", t)

	// Wheel path: a std context under a wrapper of a wheel context sees DeadlineExceeded.
	c, _ = WithDeadline(context.Background(), time.Now().Add(shortDuration))
	c, cancel := context.WithCancel(otherContext{c})
	defer cancel()
	testDeadline(c, "WithDeadline+otherContext+WithCancel", t)
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	f := newCtxFuncs(t)
	WithTimeout := f.WithTimeout

	c, _ := WithTimeout(context.Background(), shortDuration)
	if got, prefix := fmt.Sprint(c), "context.Background.WithDeadline("; !strings.HasPrefix(got, prefix) {
		t.Errorf("c.String() = %q want prefix %q", got, prefix)
	}
	testDeadline(c, "WithTimeout", t)

	c, _ = WithTimeout(context.Background(), shortDuration)
	o := otherContext{c}
	testDeadline(o, "WithTimeout+otherContext", t)

	c, _ = WithTimeout(context.Background(), shortDuration)
	o = otherContext{c}
	c, _ = WithTimeout(o, veryLongDuration)
	testDeadline(c, "WithTimeout+otherContext+WithTimeout", t)
}

func TestCanceledTimeout(t *testing.T) {
	f := newCtxFuncs(t)
	c, _ := f.WithTimeout(context.Background(), time.Second)
	o := otherContext{c}
	c, cancel := f.WithTimeout(o, veryLongDuration)
	cancel() // Should propagate synchronously.
	select {
	case <-c.Done():
	default:
		t.Errorf("<-c.Done() blocked, but shouldn't have")
	}
	if e := c.Err(); e != context.Canceled {
		t.Errorf("c.Err() == %v want %v", e, context.Canceled)
	}
}

// From x_test.go: TestAllocs, its timer entries, with the original limits; plus the wheel's own
// bound for WithTimeout+cancel (fewer than the standard library's 4).
func TestAllocs(t *testing.T) {
	f := newCtxFuncs(t)
	bg := context.Background()
	for _, test := range []struct {
		desc  string
		f     func()
		limit float64
	}{
		{
			desc: "WithTimeout(bg, 1*time.Nanosecond)",
			f: func() {
				c, _ := f.WithTimeout(bg, 1*time.Nanosecond)
				<-c.Done()
			},
			limit: 12,
		},
		{
			desc: "WithTimeout(bg, 5*time.Millisecond)",
			f: func() {
				c, cancel := f.WithTimeout(bg, 5*time.Millisecond)
				cancel()
				<-c.Done()
			},
			limit: 8,
		},
		{
			desc: "wheel: WithTimeout(bg, time.Minute) and cancel",
			f: func() {
				_, cancel := f.WithTimeout(bg, time.Minute)
				cancel()
			},
			limit: 2,
		},
	} {
		numRuns := 100
		if testing.Short() {
			numRuns = 10
		}
		if n := testing.AllocsPerRun(numRuns, test.f); n > test.limit {
			t.Errorf("%s allocs = %f want %d", test.desc, n, int(test.limit))
		}
	}
}

func TestLayersCancel(t *testing.T) {
	for _, mode := range []string{"std", "wheel"} {
		t.Run(mode, func(t *testing.T) { testLayers(t, time.Now().UnixNano(), false, mode == "wheel") })
	}
}

func TestLayersTimeout(t *testing.T) {
	for _, mode := range []string{"std", "wheel"} {
		t.Run(mode, func(t *testing.T) { testLayers(t, time.Now().UnixNano(), true, mode == "wheel") })
	}
}

// testLayers is x_test.go's. With wheelOnly ("wheel path"), the cancelable layers are wheel
// contexts too (WithTimeout with a very long timeout: its CancelFunc is the cancel), so that
// every layer is on the wheel, and the deepest context is also checked through a std child.
func testLayers(t *testing.T, seed int64, testTimeout, wheelOnly bool) {
	t.Parallel()
	f := newCtxFuncs(t)

	r := rand.New(rand.NewSource(seed))
	prefix := fmt.Sprintf("seed=%d", seed)
	errorf := func(format string, a ...any) {
		t.Errorf(prefix+format, a...)
	}
	const (
		minLayers = 30
	)
	type value int
	var (
		vals      []*value
		cancels   []context.CancelFunc
		numTimers int
		ctx       = context.Background()
	)
	for i := 0; i < minLayers || numTimers == 0 || len(cancels) == 0 || len(vals) == 0; i++ {
		switch r.Intn(3) {
		case 0:
			v := new(value)
			ctx = context.WithValue(ctx, v, v)
			vals = append(vals, v)
		case 1:
			var cancel context.CancelFunc
			if wheelOnly {
				// Each deadline before its parent's, or the wheel (as std) makes a WithCancel.
				ctx, cancel = f.WithTimeout(ctx, veryLongDuration-time.Duration(i)*time.Minute)
			} else {
				ctx, cancel = context.WithCancel(ctx)
			}
			cancels = append(cancels, cancel)
		case 2:
			var cancel context.CancelFunc
			d := veryLongDuration - time.Duration(i)*time.Minute
			if testTimeout {
				d = shortDuration
			}
			ctx, cancel = f.WithTimeout(ctx, d)
			cancels = append(cancels, cancel)
			numTimers++
		}
	}
	leaf, leafCancel := context.WithCancel(ctx)
	defer leafCancel()
	checkValues := func(when string) {
		for _, key := range vals {
			if val := ctx.Value(key).(*value); key != val {
				errorf("%s: ctx.Value(%p) = %p want %p", when, key, val, key)
			}
		}
	}
	if !testTimeout {
		select {
		case <-ctx.Done():
			errorf("ctx should not be canceled yet")
		default:
		}
	}
	if s, prefix := fmt.Sprint(ctx), "context.Background."; !strings.HasPrefix(s, prefix) {
		t.Errorf("ctx.String() = %q want prefix %q", s, prefix)
	}
	t.Log(ctx)
	checkValues("before cancel")
	if testTimeout {
		d := quiescent(t)
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-ctx.Done():
		case <-timer.C:
			errorf("ctx should have timed out after %v", d)
		}
		checkValues("after timeout")
		if wheelOnly {
			// Every layer on the wheel (or a WithCancel under one): whichever timer fired, it
			// was a deadline. The leaf ends after ctx's Done is closed, as in std: a timer's end
			// is not synchronous with anything the test did.
			<-leaf.Done()
			if ctx.Err() != context.DeadlineExceeded || leaf.Err() != context.DeadlineExceeded {
				errorf("after timeout: Err = %v, leaf %v, want DeadlineExceeded", ctx.Err(), leaf.Err())
			}
		}
	} else {
		if wheelOnly && f.w.Len() != len(cancels) {
			errorf("wheel only: Len = %d, want %d", f.w.Len(), len(cancels))
		}
		cancel := cancels[r.Intn(len(cancels))]
		cancel()
		select {
		case <-ctx.Done():
		default:
			errorf("ctx should be canceled")
		}
		select {
		case <-leaf.Done():
		default:
			errorf("leaf should be canceled")
		}
		checkValues("after cancel")
	}
}

func TestInvalidDerivedFail(t *testing.T) {
	f := newCtxFuncs(t)
	for name, fn := range map[string]func(){
		"WithDeadline":      func() { _, _ = f.WithDeadline(nil, time.Now().Add(shortDuration)) },
		"WithTimeout":       func() { _, _ = f.WithTimeout(nil, shortDuration) },
		"WithDeadlineCause": func() { _, _ = f.WithDeadlineCause(nil, time.Now().Add(shortDuration), nil) },
		"WithTimeoutCause":  func() { _, _ = f.WithTimeoutCause(nil, shortDuration, nil) },
	} {
		if panicVal := recoveredValue(fn); panicVal == nil {
			t.Errorf("%s: expected panic", name)
		}
	}
}

func recoveredValue(fn func()) (v any) {
	defer func() { v = recover() }()
	fn()
	return
}

// From net_test.go, on the error a wheel context reports.
func TestDeadlineExceededIsNetError(t *testing.T) {
	f := newCtxFuncs(t)
	ctx, cancel := f.WithTimeout(context.Background(), 0)
	defer cancel()
	err, ok := ctx.Err().(net.Error)
	if !ok {
		t.Fatal("DeadlineExceeded does not implement net.Error")
	}
	if !err.Timeout() || !err.Temporary() {
		t.Fatalf("Timeout() = %v, Temporary() = %v, want true, true", err.Timeout(), err.Temporary())
	}
}

func TestCause(t *testing.T) {
	f := newCtxFuncs(t)
	WithTimeout, WithTimeoutCause := f.WithTimeout, f.WithTimeoutCause
	var (
		forever       = 1e6 * time.Second
		parentCause   = fmt.Errorf("parentCause")
		childCause    = fmt.Errorf("childCause")
		tooSlow       = fmt.Errorf("tooSlow")
		finishedEarly = fmt.Errorf("finishedEarly")
	)
	for _, test := range []struct {
		name  string
		ctx   func() context.Context
		err   error
		cause error
	}{
		{
			name:  "Background",
			ctx:   context.Background,
			err:   nil,
			cause: nil,
		},
		{
			name: "WithCancelCause: parent cause before child",
			ctx: func() context.Context {
				ctx, cancelParent := context.WithCancelCause(context.Background())
				ctx, cancelChild := context.WithCancelCause(ctx)
				cancelParent(parentCause)
				cancelChild(childCause)
				return ctx
			},
			err:   context.Canceled,
			cause: parentCause,
		},
		{
			name: "WithTimeout",
			ctx: func() context.Context {
				ctx, cancel := WithTimeout(context.Background(), 0)
				cancel()
				return ctx
			},
			err:   context.DeadlineExceeded,
			cause: context.DeadlineExceeded,
		},
		{
			name: "WithTimeout canceled",
			ctx: func() context.Context {
				ctx, cancel := WithTimeout(context.Background(), forever)
				cancel()
				return ctx
			},
			err:   context.Canceled,
			cause: context.Canceled,
		},
		{
			name: "WithTimeoutCause",
			ctx: func() context.Context {
				ctx, cancel := WithTimeoutCause(context.Background(), 0, tooSlow)
				cancel()
				return ctx
			},
			err:   context.DeadlineExceeded,
			cause: tooSlow,
		},
		{
			name: "WithTimeoutCause canceled",
			ctx: func() context.Context {
				ctx, cancel := WithTimeoutCause(context.Background(), forever, tooSlow)
				cancel()
				return ctx
			},
			err:   context.Canceled,
			cause: context.Canceled,
		},
		{
			name: "WithTimeoutCause stacked",
			ctx: func() context.Context {
				ctx, cancel := context.WithCancelCause(context.Background())
				ctx, _ = WithTimeoutCause(ctx, 0, tooSlow)
				cancel(finishedEarly)
				return ctx
			},
			err:   context.DeadlineExceeded,
			cause: tooSlow,
		},
		{
			name: "WithTimeoutCause stacked canceled",
			ctx: func() context.Context {
				ctx, cancel := context.WithCancelCause(context.Background())
				ctx, _ = WithTimeoutCause(ctx, forever, tooSlow)
				cancel(finishedEarly)
				return ctx
			},
			err:   context.Canceled,
			cause: finishedEarly,
		},
		{
			name: "WithoutCancel timeout",
			ctx: func() context.Context {
				ctx, cancel := WithTimeoutCause(context.Background(), 0, tooSlow)
				ctx = context.WithoutCancel(ctx)
				cancel()
				return ctx
			},
			err:   nil,
			cause: nil,
		},
		{
			name: "parent of custom context not canceled",
			ctx: func() context.Context {
				ctx, _ := WithTimeoutCause(context.Background(), forever, tooSlow)
				ctx, cancel2 := newCustomContext(ctx)
				cancel2()
				return ctx
			},
			err:   context.Canceled,
			cause: context.Canceled,
		},
		// Wheel path: the timers below are all on the wheel.
		{
			name: "wheel: WithTimeoutCause stacked on a wheel deadline",
			ctx: func() context.Context {
				ctx, cancel := WithTimeout(context.Background(), forever)
				ctx, _ = WithTimeoutCause(ctx, 0, tooSlow)
				cancel()
				return ctx
			},
			err:   context.DeadlineExceeded,
			cause: tooSlow,
		},
		{
			name: "wheel: canceled parent, child with a cause",
			ctx: func() context.Context {
				ctx, cancel := WithTimeout(context.Background(), forever)
				ctx, _ = WithTimeoutCause(ctx, forever, tooSlow)
				cancel()
				return ctx
			},
			err:   context.Canceled,
			cause: context.Canceled,
		},
		{
			name: "wheel: parent's deadline with a cause, through a value",
			ctx: func() context.Context {
				ctx, cancel := WithTimeoutCause(context.Background(), forever, tooSlow)
				ctx2, _ := WithTimeoutCause(context.WithValue(ctx, "k", "v"), 2*forever, childCause)
				ctx3, cancel3 := context.WithCancelCause(ctx2)
				cancel()
				cancel3(finishedEarly) // after the parent's end: changes nothing
				return ctx3
			},
			err:   context.Canceled,
			cause: context.Canceled,
		},
		{
			name: "wheel: std child of an expired parent with a cause",
			ctx: func() context.Context {
				ctx, _ := WithTimeoutCause(context.Background(), 0, tooSlow)
				ctx, _ = WithTimeoutCause(otherContext{ctx}, forever, childCause)
				ctx = context.WithValue(ctx, "k", "v")
				ctx, cancel := context.WithCancelCause(ctx)
				defer cancel(finishedEarly) // born canceled: changes nothing
				return ctx
			},
			err:   context.DeadlineExceeded,
			cause: tooSlow,
		},
		{
			name: "wheel: child canceled before parent",
			ctx: func() context.Context {
				ctx, cancelParent := WithTimeout(context.Background(), forever)
				ctx, cancelChild := context.WithCancelCause(ctx)
				cancelChild(childCause)
				cancelParent()
				return ctx
			},
			err:   context.Canceled,
			cause: childCause,
		},
	} {
		t.Run(test.name, func(t *testing.T) {
			t.Parallel()
			ctx := test.ctx()
			if got, want := ctx.Err(), test.err; want != got {
				t.Errorf("ctx.Err() = %v want %v", got, want)
			}
			if got, want := context.Cause(ctx), test.cause; want != got {
				t.Errorf("Cause(ctx) = %v want %v", got, want)
			}
		})
	}
}

// TestCauseDeadline is the wheel path of TestCause for a deadline that passes: the cause given to
// WithTimeoutCause reaches every context under it, std ones through a wrapper included.
func TestCauseDeadline(t *testing.T) {
	f := newCtxFuncs(t)
	tooSlow := errors.New("tooSlow")
	ctx, cancel := f.WithTimeoutCause(context.Background(), shortDuration, tooSlow)
	defer cancel()
	child, cancelChild := f.WithTimeout(otherContext{ctx}, veryLongDuration)
	defer cancelChild()
	std, cancelStd := context.WithCancel(context.WithValue(child, "k", "v"))
	defer cancelStd()
	<-std.Done()
	for _, c := range []context.Context{ctx, child, std} {
		if c.Err() != context.DeadlineExceeded || context.Cause(c) != tooSlow {
			t.Errorf("%v: Err = %v, Cause = %v, want DeadlineExceeded, tooSlow", c, c.Err(), context.Cause(c))
		}
	}
}

// customContext is a custom Context implementation.
type customContext struct {
	parent context.Context

	doneOnce sync.Once
	donec    chan struct{}
	err      error
}

func newCustomContext(parent context.Context) (context.Context, context.CancelFunc) {
	c := &customContext{
		parent: parent,
		donec:  make(chan struct{}),
	}
	context.AfterFunc(parent, func() {
		c.doneOnce.Do(func() {
			c.err = parent.Err()
			close(c.donec)
		})
	})
	return c, func() {
		c.doneOnce.Do(func() {
			c.err = context.Canceled
			close(c.donec)
		})
	}
}

func (c *customContext) Deadline() (time.Time, bool) {
	return c.parent.Deadline()
}

func (c *customContext) Done() <-chan struct{} {
	return c.donec
}

func (c *customContext) Err() error {
	select {
	case <-c.donec:
		return c.err
	default:
		return nil
	}
}

func (c *customContext) Value(key any) any {
	return c.parent.Value(key)
}

func TestAfterFuncCalledAfterTimeout(t *testing.T) {
	f := newCtxFuncs(t)
	ctx, cancel := f.WithTimeout(context.Background(), shortDuration)
	defer cancel()
	donec := make(chan struct{})
	context.AfterFunc(ctx, func() {
		close(donec)
	})
	select {
	case <-donec:
	case <-time.After(veryLongDuration):
		t.Fatalf("AfterFunc not called after context is canceled")
	}
}

// From x_test.go: TestContextErrDoneRace (golang/go#75533), on wheel contexts: ended by their
// CancelFunc, by their deadline, by a wheel parent's cancel, and seen through a std child.
// errDoneRounds iterations per variant keep the default cost small; run it many times with
// go test -race -count=2000 -run TestContextErrDoneRace.
func TestContextErrDoneRace(t *testing.T) {
	f := newCtxFuncs(t)
	const errDoneRounds = 10 // 4 iterations reliably reproduced #75533.
	variants := map[string]func() (ctx context.Context, end func(), release func()){
		"cancel": func() (context.Context, func(), func()) {
			ctx, cancel := f.WithTimeout(context.Background(), veryLongDuration)
			return ctx, cancel, cancel
		},
		"deadline": func() (context.Context, func(), func()) {
			ctx, cancel := f.WithTimeout(context.Background(), shortDuration)
			return ctx, func() {}, cancel
		},
		"parent": func() (context.Context, func(), func()) {
			parent, pcancel := f.WithTimeout(context.Background(), veryLongDuration)
			ctx, cancel := f.WithTimeout(otherContext{parent}, veryLongDuration)
			return ctx, pcancel, cancel
		},
		"std child": func() (context.Context, func(), func()) {
			parent, pcancel := f.WithTimeout(context.Background(), veryLongDuration)
			ctx, cancel := context.WithCancel(parent)
			return ctx, pcancel, cancel
		},
	}
	for name, mk := range variants {
		t.Run(name, func(t *testing.T) {
			for range errDoneRounds {
				ctx, end, release := mk()
				donec := ctx.Done()
				go end()
				for ctx.Err() == nil {
					if runtime.GOARCH == "wasm" {
						runtime.Gosched() // need to explicitly yield
					}
				}
				select {
				case <-donec:
				default:
					t.Fatalf("ctx.Err is non-nil, but ctx.Done is not closed")
				}
				if d := ctx.Done(); d != donec {
					t.Fatalf("ctx.Done returned another channel after the end")
				}
				release()
			}
		})
	}
}

func TestCustomContextAfterFuncTimeout(t *testing.T) {
	f := newCtxFuncs(t)
	ctx0 := &afterFuncContext{}
	ctx1, cancel := f.WithTimeout(ctx0, veryLongDuration)
	defer cancel()
	ctx0.cancel(context.Canceled)
	<-ctx1.Done()
}

func TestCustomContextAfterFuncUnregisterTimeout(t *testing.T) {
	f := newCtxFuncs(t)
	ctx0 := &afterFuncContext{}
	_, cancel := f.WithTimeout(ctx0, veryLongDuration)
	if got, want := len(ctx0.afterFuncs), 1; got != want {
		t.Errorf("after WithTimeout(ctx0, d): ctx0 has %v afterFuncs, want %v", got, want)
	}
	cancel()
	if got, want := len(ctx0.afterFuncs), 0; got != want {
		t.Errorf("after canceling WithTimeout(ctx0, d): ctx0 has %v afterFuncs, want %v", got, want)
	}
}

var neverReady = make(chan struct{})

// From example_test.go: ExampleWithDeadline.
func Example_stdWithDeadline() {
	w, _ := sw.New()
	defer w.Stop()
	d := time.Now().Add(shortDuration)
	ctx, cancel := w.WithDeadline(context.Background(), d)

	// Even though ctx will be expired, it is good practice to call its
	// cancellation function in any case. Failure to do so may keep the
	// context and its parent alive longer than necessary.
	defer cancel()

	select {
	case <-neverReady:
		fmt.Println("ready")
	case <-ctx.Done():
		fmt.Println(ctx.Err())
	}

	// Output:
	// context deadline exceeded
}

// From example_test.go: ExampleWithTimeout.
func Example_stdWithTimeout() {
	w, _ := sw.New()
	defer w.Stop()
	// Pass a context with a timeout to tell a blocking function that it
	// should abandon its work after the timeout elapses.
	ctx, cancel := w.WithTimeout(context.Background(), shortDuration)
	defer cancel()

	select {
	case <-neverReady:
		fmt.Println("ready")
	case <-ctx.Done():
		fmt.Println(ctx.Err()) // prints "context deadline exceeded"
	}

	// Output:
	// context deadline exceeded
}

// From example_test.go: ExampleAfterFunc_cond.
func Example_stdAfterFuncCond() {
	w, _ := sw.New()
	defer w.Stop()
	waitOnCond := func(ctx context.Context, cond *sync.Cond, conditionMet func() bool) error {
		stopf := context.AfterFunc(ctx, func() {
			// We need to acquire cond.L here to be sure that the Broadcast
			// below won't occur before the call to Wait, which would result
			// in a missed signal (and deadlock).
			cond.L.Lock()
			defer cond.L.Unlock()

			// If multiple goroutines are waiting on cond simultaneously,
			// we need to make sure we wake up exactly this one.
			// That means that we need to Broadcast to all of the goroutines,
			// which will wake them all up.
			cond.Broadcast()
		})
		defer stopf()

		// Since the wakeups are using Broadcast instead of Signal, this call to
		// Wait may unblock due to some other goroutine's context being canceled,
		// so to be sure that ctx is actually canceled we need to check it in a loop.
		for !conditionMet() {
			cond.Wait()
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}

		return nil
	}

	cond := sync.NewCond(new(sync.Mutex))

	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()

			ctx, cancel := w.WithTimeout(context.Background(), 1*time.Millisecond)
			defer cancel()

			cond.L.Lock()
			defer cond.L.Unlock()

			err := waitOnCond(ctx, cond, func() bool { return false })
			fmt.Println(err)
		}()
	}
	wg.Wait()

	// Output:
	// context deadline exceeded
	// context deadline exceeded
	// context deadline exceeded
	// context deadline exceeded
}

// From example_test.go: ExampleAfterFunc_connection.
func Example_stdAfterFuncConnection() {
	w, _ := sw.New()
	defer w.Stop()
	readFromConn := func(ctx context.Context, conn net.Conn, b []byte) (n int, err error) {
		stopc := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			conn.SetReadDeadline(time.Now())
			close(stopc)
		})
		n, err = conn.Read(b)
		if !stop() {
			// The AfterFunc was started.
			// Wait for it to complete, and reset the Conn's deadline.
			<-stopc
			conn.SetReadDeadline(time.Time{})
			return n, ctx.Err()
		}
		return n, err
	}

	listener, err := net.Listen("tcp", "localhost:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer listener.Close()

	conn, err := net.Dial(listener.Addr().Network(), listener.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()

	ctx, cancel := w.WithTimeout(context.Background(), 1*time.Millisecond)
	defer cancel()

	b := make([]byte, 1024)
	_, err = readFromConn(ctx, conn, b)
	fmt.Println(err)

	// Output:
	// context deadline exceeded
}
