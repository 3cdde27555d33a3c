package shardwheel

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Deadline contexts across Wheel.Stop (review 27). The dropped entry lets go of its callback and
// argument (letGoDropped), so that a context cancelled after Stop is not kept reachable by the
// stopped wheel.

// ctxPayload is a value big enough that a weak pointer to it tells whether a context is kept.
type ctxPayload [64 << 10]byte

type ctxPayloadKey struct{}

// collected reports whether p's value has been collected, after two GCs (the second one frees
// what a finaliser or a weak pointer's first cycle kept).
func collected(p weak.Pointer[ctxPayload]) bool {
	runtime.GC()
	runtime.GC()
	return p.Value() == nil
}

// TestContextStopLetsGoOfCanceledContext (review 27, was TestReview27StoppedWheelKeepsCanceledContext):
// a context cancelled after Stop is not kept reachable by the stopped wheel: the dropped entry let
// go of its argument.
func TestContextStopLetsGoOfCanceledContext(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w, err := New(WithClock(NewManualClock(time.Unix(0, 0))), WithShards(1), WithWorkers(0))
	require.NoError(t, err)
	// mk makes a context that holds a fresh payload, runs before, cancels the context and
	// keeps nothing of it.
	mk := func(before func()) weak.Pointer[ctxPayload] {
		p := new(ctxPayload)
		_, cancel := w.WithTimeout(context.WithValue(context.Background(), ctxPayloadKey{}, p), time.Hour)
		before()
		cancel()
		return weak.Make(p)
	}
	live := mk(func() {})
	require.True(t, collected(live), "control: cancelled on a running wheel, the context is gone")
	stopped := mk(func() { w.Stop() })
	require.True(t, collected(stopped), "a cancelled context's values are kept reachable by the stopped wheel")
	runtime.KeepAlive(w)
}

// keptArg returns what the first linked entry of w that still has a callback or an argument
// keeps (its argument, or "f kept"), or nil if none does. After Stop every entry still linked is
// dropped, or stopped with its cancel command refused by the closed ring.
func keptArg(w *Wheel) any {
	for _, s := range w.shards {
		s.mu.Lock()
		var arg any
		s.tw.forEach(func(e *entry) {
			if arg == nil && (e.arg != nil || e.f != nil) {
				arg = e.arg
				if arg == nil {
					arg = "f kept"
				}
			}
		})
		s.mu.Unlock()
		if arg != nil {
			return arg
		}
	}
	return nil
}

// TestStopLetsGoOfDroppedCallbacks: every entry Stop drops lets go of its callback and argument
// (AfterFuncArg, AfterFunc, Every, a Keyed arming, a timer whose Reset was paused across the
// drop), while the handles stay inert (Stop and Reset report false) and a Keyed still drains
// its values, which it keeps itself.
func TestStopLetsGoOfDroppedCallbacks(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	w, _, _ := parkWheel(t)
	p := new(ctxPayload)
	var tms []Timer
	tm, err := w.AfterFuncArg(time.Hour, func(any) {}, p)
	require.NoError(t, err)
	tms = append(tms, tm)
	tm, err = w.AfterFunc(time.Hour, func() { _ = p })
	require.NoError(t, err)
	tms = append(tms, tm)
	tm, err = w.Every(time.Hour, func() { _ = p })
	require.NoError(t, err)
	tms = append(tms, tm)
	k := NewKeyed(w, func(string, *ctxPayload) {})
	require.NoError(t, k.Set("a", p, time.Hour))
	held, err := w.AfterFuncArg(time.Hour, func(any) {}, p)
	require.NoError(t, err)
	tms = append(tms, held)
	finish := holdReset(t, held, 2*time.Hour)
	done := make(chan int)
	go func() { done <- w.Stop() }()
	time.Sleep(10 * time.Millisecond) // Stop waits for the Reset
	finish()
	require.Equal(t, 5, <-done)
	require.Nil(t, keptArg(w), "a dropped entry kept its callback or argument")
	for _, tm := range tms {
		require.False(t, tm.Stop())
		require.False(t, tm.Reset(time.Millisecond))
	}
	require.False(t, k.Move("a", time.Millisecond))
	require.ErrorIs(t, k.Set("a", p, time.Hour), ErrClosed)
	var got *ctxPayload
	require.Equal(t, 1, k.Drain(func(_ string, v *ctxPayload) { got = v }))
	require.Same(t, p, got)
	requireBalanced(t, w)
}
