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

// TestContextEndedKidKeepsNoSibling: a parent's ender takes its list of kids and walks it; a kid it
// has ended must not keep its older siblings reachable through its link. Before the ender cleared
// each kid's next, a caller holding the newest kid of a cancelled parent kept every older sibling
// (and what they hold) alive.
func TestContextEndedKidKeepsNoSibling(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, err := New()
	require.NoError(t, err)
	defer w.Stop()

	parent, cancelParent := w.WithTimeout(context.Background(), time.Hour)
	older := func() weak.Pointer[deadlineCtx] {
		a, cancelA := w.WithTimeout(parent, 30*time.Minute)
		_ = cancelA // dropped with a; calling it would unlink a before the parent's end
		return weak.Make(a.(*deadlineCtx))
	}()
	newest, cancelNewest := w.WithTimeout(parent, 30*time.Minute)
	defer cancelNewest()

	cancelParent()
	<-newest.Done()
	runtime.GC()
	runtime.GC()
	require.Nil(t, older.Value(), "an ended kid keeps its older sibling reachable")
	runtime.KeepAlive(newest)
}
