package shardwheel_test

import (
	"encoding/json"
	"expvar"
	"fmt"
	"time"

	sw "github.com/shardwheel/shardwheel"
)

// A server arms a timeout per request and stops it when the reply comes first; the wheel keeps
// the books. The examples run on a manual clock with callbacks on the advancing goroutine
// (WithWorkers(0)), so that their output is stable; a server calls New() with no options, once,
// and uses the system clock.
func Example() {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, err := sw.New(sw.WithClock(clk), sw.WithWorkers(0))
	if err != nil {
		panic(err)
	}
	defer w.Stop()

	for id := 1; id <= 3; id++ {
		t, _ := w.AfterFunc(100*time.Millisecond, func() { fmt.Println("request", id, "timed out") })
		if id != 2 { // requests 1 and 3 are answered in time
			t.Stop()
		}
	}
	clk.Advance(time.Second)
	st := w.Stats()
	fmt.Printf("scheduled %d, fired %d, stopped %d, pending %d\n", st.Scheduled, st.Fired, st.Stopped, st.Pending)
	// Output:
	// request 2 timed out
	// scheduled 3, fired 1, stopped 2, pending 0
}

// New with options: a coarser tick, fewer shards, and a handler for panicking callbacks. An
// invalid option value is an error that names it.
func ExampleNew() {
	w, err := sw.New(
		sw.WithTick(10*time.Millisecond), // buckets of 10ms: fewer cascades; deadlines stay exact
		sw.WithShards(4),
		sw.WithWorkers(2),
		sw.WithPanicHandler(func(r any) { fmt.Println("recovered:", r) }),
	)
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	_, _ = w.AfterFunc(0, func() { defer close(done); panic("bad callback") })
	<-done
	fmt.Println("stopped with", w.Stop(), "pending")

	_, err = sw.New(sw.WithTick(0))
	fmt.Println(err)
	// Output:
	// recovered: bad callback
	// stopped with 0 pending
	// shardwheel: WithTick(0): tick must be positive
}

// Stop reports whether it prevented the callback: true once for a pending timer, false after
// that, after the callback started, and for the zero Timer.
func ExampleTimer_Stop() {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clk), sw.WithWorkers(0))
	defer w.Stop()

	t, _ := w.AfterFunc(time.Second, func() { fmt.Println("never runs") })
	fmt.Println(t.Stop(), t.Stop())
	fired, _ := w.AfterFunc(time.Second, func() { fmt.Println("fired") })
	clk.Advance(time.Second)
	fmt.Println(fired.Stop())
	var zero sw.Timer
	fmt.Println(zero.Stop())
	// Output:
	// true false
	// fired
	// false
	// false
}

// Reset pushes a pending timer's deadline: an idle timeout that every request re-arms. Once the
// timer fired, Reset reports false and does nothing.
func ExampleTimer_Reset() {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clk), sw.WithWorkers(0))
	defer w.Stop()

	start := clk.Now()
	t, _ := w.AfterFunc(time.Second, func() { fmt.Println("idle at", clk.Now().Sub(start)) })
	clk.Advance(600 * time.Millisecond)
	fmt.Println("request, reset:", t.Reset(time.Second)) // now due at 1.6s
	clk.Advance(600 * time.Millisecond)
	clk.Advance(400 * time.Millisecond)
	fmt.Println("reset after firing:", t.Reset(time.Second))
	// Output:
	// request, reset: true
	// idle at 1.6s
	// reset after firing: false
}

// A manual clock makes time a test's input: nothing fires until Advance, and the timers due
// within one Advance run in the order of their deadlines.
func ExampleNewManualClock() {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clk), sw.WithWorkers(0))
	defer w.Stop()

	for _, d := range []time.Duration{3 * time.Second, time.Second, 2 * time.Second} {
		_, _ = w.AfterFunc(d, func() { fmt.Println("due after", d) })
	}
	_, _ = w.AfterFunc(0, func() { fmt.Println("due now") })
	fmt.Println("pending:", w.Len()) // nothing runs until the clock moves
	clk.Advance(0)                   // runs what is due already
	clk.Advance(5 * time.Second)
	fmt.Println(clk.Now().Format("15:04:05"), "pending:", w.Len())
	// Output:
	// pending: 4
	// due now
	// due after 1s
	// due after 2s
	// due after 3s
	// 12:00:05 pending: 0
}

// Stats keeps the books: once the wheel is quiet, Scheduled == Fired + Stopped + Pending, and
// Lateness counts how late each callback started against its deadline rounded up to the tick.
func ExampleWheel_Stats() {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clk), sw.WithWorkers(0))
	defer w.Stop()

	for i := 1; i <= 10; i++ {
		t, _ := w.AfterFunc(time.Duration(i)*time.Millisecond, func() {})
		if i%5 == 0 {
			t.Stop()
		}
	}
	_, _ = w.AfterFunc(time.Hour, func() {})
	clk.Advance(8 * time.Millisecond) // the timers due at 1..8ms start 7..0ms late
	st := w.Stats()
	fmt.Println("scheduled", st.Scheduled, "fired", st.Fired, "stopped", st.Stopped, "pending", st.Pending)
	fmt.Println("started late:", st.Lateness.Count(), "p50 under", st.Lateness.Quantile(0.5),
		"max under", st.Lateness.Quantile(1))
	// Output:
	// scheduled 11 fired 7 stopped 2 pending 2
	// started late: 7 p50 under 4.096ms max under 8.192ms
}

// StatsVar publishes the wheel's Stats at /debug/vars with package expvar; each read is a fresh
// snapshot, as JSON.
func ExampleWheel_StatsVar() {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clk), sw.WithWorkers(0), sw.WithShards(2))
	defer w.Stop()

	expvar.Publish("example_timers", w.StatsVar())

	_, _ = w.AfterFunc(time.Minute, func() {})
	var st struct{ Pending, Shards int }
	_ = json.Unmarshal([]byte(expvar.Get("example_timers").String()), &st)
	fmt.Printf("%+v\n", st)
	// Output:
	// {Pending:1 Shards:2}
}

// An RPC timeout: arm it, and stop it when the reply comes first. The manual clock and
// WithWorkers(0) make the example deterministic; a server uses sw.New() with the defaults.
func ExampleWheel_AfterFunc() {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, err := sw.New(sw.WithClock(clk), sw.WithWorkers(0))
	if err != nil {
		panic(err)
	}
	defer w.Stop()

	slow, _ := w.AfterFunc(100*time.Millisecond, func() { fmt.Println("request 1 timed out") })
	fast, _ := w.AfterFunc(100*time.Millisecond, func() { fmt.Println("request 2 timed out") })
	fmt.Println("reply 2 arrived, timeout stopped:", fast.Stop())

	clk.Advance(99 * time.Millisecond)
	fmt.Println("pending at 99ms:", w.Len())
	clk.Advance(time.Millisecond)
	fmt.Println("stop after firing:", slow.Stop())
	// Output:
	// reply 2 arrived, timeout stopped: true
	// pending at 99ms: 1
	// request 1 timed out
	// stop after firing: false
}

// The zero-allocation form: one func value for all timers, a pointer as the argument.
func ExampleWheel_AfterFuncArg() {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clk), sw.WithWorkers(0))
	defer w.Stop()

	type conn struct{ id int }
	expire := func(arg any) { fmt.Println("conn", arg.(*conn).id, "expired") }
	for i := 1; i <= 3; i++ {
		_, _ = w.AfterFuncArg(time.Duration(i)*time.Second, expire, &conn{id: i})
	}
	clk.Advance(2 * time.Second)
	fmt.Println("stopped with", w.Stop(), "pending")
	// Output:
	// conn 1 expired
	// conn 2 expired
	// stopped with 1 pending
}

// A periodic flush at a fixed rate, as time.Ticker ticks: the k-th run is due k intervals after
// the call to Every.
func ExampleWheel_Every() {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clk), sw.WithWorkers(0))
	defer w.Stop()

	flushes := 0
	t, _ := w.Every(time.Second, func() { flushes++; fmt.Println("flush", flushes) })
	for i := 0; i < 3; i++ {
		clk.Advance(time.Second)
	}
	fmt.Println("stopped:", t.Stop())
	clk.Advance(time.Hour)
	// Output:
	// flush 1
	// flush 2
	// flush 3
	// stopped: true
}
