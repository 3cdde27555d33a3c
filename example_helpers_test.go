package shardwheel_test

import (
	"context"
	"fmt"
	"sort"
	"time"

	sw "github.com/shardwheel/shardwheel"
)

// An RPC handler gives each call a 100ms budget with a deadline on the wheel. The examples run on
// a manual clock with callbacks on the advancing goroutine, so that their output is stable; a
// server uses sw.New() and the system clock.
func ExampleWheel_WithTimeout() {
	clock := sw.NewManualClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clock), sw.WithWorkers(0))
	defer w.Stop()

	// backend stands for a call that takes work and gives up when ctx is done.
	backend := func(ctx context.Context, work time.Duration) (string, error) {
		clock.Advance(work) // time passes while it works
		if err := ctx.Err(); err != nil {
			return "", err
		}
		return "ok", nil
	}
	handle := func(ctx context.Context, work time.Duration) {
		ctx, cancel := w.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel() // releases the wheel's timer at once
		dl, _ := ctx.Deadline()
		reply, err := backend(ctx, work)
		fmt.Printf("deadline %s: reply %q, err %v\n", dl.Format("15:04:05.000"), reply, err)
	}

	handle(context.Background(), 20*time.Millisecond)
	handle(context.Background(), 150*time.Millisecond)
	fmt.Println("pending timers:", w.Len())
	// Output:
	// deadline 12:00:00.100: reply "ok", err <nil>
	// deadline 12:00:00.120: reply "", err context deadline exceeded
	// pending timers: 0
}

// A request's time budget and the deadline of one backend call within it, both on the wheel: when
// the request ends (the client went away), the call's context has ended too, with the same error.
// (Under a context that the standard library can cancel, such as an http.Request's, WithDeadline
// is context.WithDeadline itself, timer and all: see the package comment on deadline contexts.)
func ExampleWheel_WithDeadline() {
	clock := sw.NewManualClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clock), sw.WithWorkers(0))
	defer w.Stop()

	request, hangUp := w.WithTimeout(context.Background(), time.Minute)
	ctx, cancel := w.WithDeadline(request, clock.Now().Add(time.Second))
	defer cancel()
	fmt.Println(ctx.Err(), w.Len())
	hangUp()
	fmt.Println(ctx.Err(), "/", context.Cause(ctx), w.Len())
	// Output:
	// <nil> 2
	// context canceled / context canceled 0
}

// conn is a connection of the examples' server.
type conn struct{ peer string }

func (c *conn) Close() { fmt.Println("close", c.peer) }

// A connection table closes connections that stay idle for 30 seconds: every request moves the
// connection's deadline, and a connection whose deadline comes is closed.
func ExampleKeyed() {
	clock := sw.NewManualClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clock), sw.WithWorkers(0))
	defer w.Stop()

	const idle = 30 * time.Second
	conns := sw.NewKeyed(w, func(peer string, c *conn) { c.Close() })
	for _, peer := range []string{"alice", "bob"} {
		_ = conns.Set(peer, &conn{peer}, idle) // on accept
	}

	clock.Advance(20 * time.Second)
	conns.Move("alice", idle) // alice sent a request
	clock.Advance(10 * time.Second)
	fmt.Println("open:", conns.Len())
	clock.Advance(20 * time.Second)
	fmt.Println("open:", conns.Len())
	// Output:
	// close bob
	// open: 1
	// close alice
	// open: 0
}

// On shutdown, Drain closes every connection still open instead of waiting for its timeout.
func ExampleKeyed_Drain() {
	clock := sw.NewManualClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clock), sw.WithWorkers(0))
	defer w.Stop()

	conns := sw.NewKeyed(w, func(peer string, c *conn) { c.Close() })
	for _, peer := range []string{"carol", "alice", "bob"} {
		_ = conns.Set(peer, &conn{peer}, time.Minute)
	}
	var peers []string
	n := conns.Drain(func(peer string, c *conn) { peers = append(peers, peer) })
	sort.Strings(peers)
	fmt.Println(n, peers, conns.Len(), w.Len())
	// Output:
	// 3 [alice bob carol] 0 0
}
