package shardwheel

import (
	"runtime"
	"strconv"
)

// goid returns the current goroutine's id, parsed from the header of runtime.Stack
// ("goroutine 123 [running]:"). It costs about a microsecond, so it is used only where a goroutine
// must know whether it is one of the wheel's own: at their start, in Wheel.Stop and in
// ManualClock.Advance, which must not wait for themselves.
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	const prefix = "goroutine "
	if len(b) <= len(prefix) {
		return 0
	}
	b = b[len(prefix):]
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	id, _ := strconv.ParseInt(string(b[:i]), 10, 64)
	return id
}
