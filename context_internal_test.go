package shardwheel

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestContextChildOfEndingParentKeepsCause (found by review): a parent WithTimeoutCause whose
// deadline has fired, its ender paused between the CAS that ends it and the cancel that closes
// its Done and sets its cause. A child made then saw the end bit, was born ended, and read the
// parent's cause before it was set: context.Cause(child) was DeadlineExceeded for good, where
// std gives the parent's cause. The child now waits in the parent's Err for the ender.
func TestContextChildOfEndingParentKeepsCause(t *testing.T) {
	clk := NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, err := New(WithClock(clk), WithWorkers(0))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	cause := errors.New("parent's cause")
	p, cancelP := w.WithTimeoutCause(context.Background(), time.Millisecond, cause)
	defer cancelP()
	p.Done() // q exists: the ender has a Done to close after its CAS
	paused, resume := make(chan struct{}), make(chan struct{})
	hook := func(c *deadlineCtx) {
		if c == p.(*deadlineCtx) {
			close(paused)
			<-resume
		}
	}
	testHookEnded.Store(&hook)
	defer testHookEnded.Store(nil)
	go clk.Advance(time.Millisecond) // fires p's deadline; its ender pauses after the CAS
	<-paused
	made := make(chan context.Context)
	dl, _ := p.Deadline() // no later than the parent's, or std's WithCancel would be returned
	go func() {
		c, cancel := w.WithDeadline(p, dl)
		defer cancel()
		made <- c
	}()
	time.Sleep(20 * time.Millisecond) // time for the child to be made, had it not waited
	close(resume)
	c := <-made
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("child Err = %v, want DeadlineExceeded", c.Err())
	}
	if got := context.Cause(c); got != cause {
		t.Fatalf("context.Cause(child) = %v, want the parent's cause %v", got, cause)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("the child is done while the parent's Done is open")
	}
}
