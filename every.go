package shardwheel

import (
	"math"
	"time"
)

// every is the argument of an Every's entry: the user's func, its interval, and where the series
// stands. The shard a run re-arms on is the one the entry lives in (ref.s).
//
// f and interval are immutable. due, when and version are written by Every before the entry is
// published, and then only by the goroutine that holds the entry running (runPeriodic, endRun):
// one goroutine wins firing -> running, runs of one Every never overlap, and the entry goes back
// to pending (a CAS, then the add through the ring) only after those writes, so the next run's
// goroutine, which reaches the entry through that CAS and the ring, sees them. Timer.Reset never
// touches them: a Reset shows in the entry itself (a new version in the state word and a new
// deadline in when), which runPeriodic compares with version and when.
type every struct {
	f        func()
	interval time.Duration

	// due is the instant (ns on the wheel's clock, not rounded to the tick) the current run is
	// due at: the first run's is Every's reading plus the interval, and each later one whole
	// intervals after it (the fixed rate), unless a Reset moved the run.
	due int64
	// when is the deadline the current run was armed for.
	when int64
	// version is the state word's version when the current run was armed; a Reset bumps it.
	version uint64
}

// nextStep returns how far after due the next run of a series with the given interval is due: the
// smallest whole number of intervals, at least one, that lands strictly after end (the runs due at
// or before end are skipped, as time.Ticker drops the ticks a slow receiver missed). It saturates
// at math.MaxInt64. due, end and interval are non-negative, interval > 0.
func nextStep(due, end, interval int64) int64 {
	k := int64(1)
	if end >= due {
		k = (end-due)/interval + 1
	}
	if k > math.MaxInt64/interval {
		return math.MaxInt64
	}
	return k * interval
}
