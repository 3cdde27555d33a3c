package shardwheel_test

import (
	"fmt"
	"time"

	sw "github.com/shardwheel/shardwheel"
)

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
