package shardwheel_test

import (
	"math/rand/v2"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
)

// BenchmarkManualAdvance arms 100k timers at distinct deadlines spread over 100 ms on a manual
// clock and fires them all with one Advance (arming included): what a test suite that drives
// many timers through a ManualClock pays. Advance runs one round per tick, not per deadline (a
// round per distinct deadline took about 20x as long: clock.go).
//
//	go test -run '^$' -bench BenchmarkManualAdvance -count 6 .
func BenchmarkManualAdvance(b *testing.B) {
	const n = 100_000
	for it := 0; it < b.N; it++ {
		clk := sw.NewManualClock(time.Unix(0, 0))
		w, err := sw.New(sw.WithClock(clk), sw.WithWorkers(0), sw.WithShards(4))
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		fired := 0
		for i := 0; i < n; i++ {
			if _, err := w.AfterFunc(time.Duration(rng.Int64N(int64(100*time.Millisecond))), func() { fired++ }); err != nil {
				b.Fatal(err)
			}
		}
		clk.Advance(time.Second)
		if fired != n {
			b.Fatalf("%d of %d fired", fired, n)
		}
		w.Stop()
	}
}
