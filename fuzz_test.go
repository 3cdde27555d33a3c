package shardwheel_test

import (
	"math"
	"testing"
)

// FuzzWheel decodes random bytes into a sequence of operations (schedule at any delay from
// math.MinInt64 to math.MaxInt64, Every, Stop, Reset, stale-handle Stop and Reset, Advance by
// anything from 0 to math.MaxInt64, and Stops paused between the claim of their ring slot and its
// publication, published later in any order) and runs it against a Wheel on a manual clock and against the
// reference model of model_test.go; see relRun for the decoding and relHarness for what is checked.
//
// Plain `go test` replays the seeds below and the corpus in testdata/fuzz/FuzzWheel. To search:
//
//	go test -run '^$' -fuzz FuzzWheel -fuzztime 3m .
//
// A failing input is written to testdata/fuzz/FuzzWheel by the fuzzer; keep it there, and it
// becomes a regression test.
func FuzzWheel(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 1, 0, 0, 5, 0})
	// Schedule at the top level's edge and at the end of time, then jump to the end of time.
	f.Add([]byte{2, 3, 0, 5, 128, 1, 0, 7, 0, 0, 6, 0, 5, 5})
	// Schedule, reset, stop, stale stop, advance by years.
	f.Add([]byte{0, 0, 0, 3, 10, 0, 0, 4, 4, 0, 0, 3, 3, 0, 0, 9, 5, 4, 2, 3, 1, 0})
	// Every, then huge advances.
	f.Add([]byte{1, 1, 7, 9, 3, 0, 5, 3, 0, 1, 0, 6, 4, 3, 5, 5})
	// The v1 lost wake-up: C (1 tick), D (an hour), D's Stop paused before it publishes, B
	// (5 ticks) armed behind it, Advance fires C, the Stop publishes, Advance a day.
	f.Add([]byte{0, 0, 0, 3, 1, 1, 0, 9, 60, 0, 35, 1, 0, 0, 3, 5, 1, 2, 1, 66, 0, 2, 4, 0})
	big := make([]byte, 0, 256)
	for i := 0; i < 64; i++ {
		big = append(big, byte(i%10), byte(i*7), byte(i*13), byte(math.MaxUint8-i))
	}
	f.Add(big)
	f.Fuzz(func(t *testing.T, data []byte) {
		relRun(t, data, false)
	})
}

// FuzzWheelArmHeld is FuzzWheel with one more operation: an arm paused after it claimed its add's
// ring slot, before it publishes it (a schedule op with bit 32 set), published later in any order
// with the paused Stops. Since a Stop of a timer whose add the shard has not taken sends no
// command, a paused arm is the common shape of a command claimed now and published later; it
// has its own target so that FuzzWheel's corpus keeps its meaning.
//
//	go test -run '^$' -fuzz FuzzWheelArmHeld -fuzztime 3m .
func FuzzWheelArmHeld(f *testing.F) {
	f.Add([]byte{})
	// The v1 lost wake-up with a paused arm in place of the paused Stop: C (1 tick), D (a
	// minute) armed and paused before it publishes, B (5 ticks) armed behind it, Advance 1 tick
	// fires C (its drain stalls at D's slot), D publishes, Advance 4 ticks fires B, a year.
	f.Add([]byte{0, 0, 0, 3, 1, 1, 32, 9, 96, 234, 0, 3, 5, 1, 5, 2, 1, 68, 0, 5, 2, 4, 5, 4, 0})
	big := make([]byte, 0, 256)
	for i := 0; i < 64; i++ {
		big = append(big, byte(i%10)|32, byte(i*7), byte(i*13), byte(math.MaxUint8-i))
	}
	f.Add(big)
	f.Fuzz(func(t *testing.T, data []byte) {
		relRun(t, data, true)
	})
}
