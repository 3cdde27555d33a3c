package shardwheel_test

import (
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestEvery: the first run is one interval after the call, not before; a Stop from inside a run
// reports true and no run follows; a second Stop reports false. Each run counts once in Fired,
// the Stop once in Stopped, and the books balance.
func TestEvery(t *testing.T) {
	w, clk := manualWheel(t)
	var runs atomic.Int32
	var tm sw.Timer
	tm, err := w.Every(10*time.Millisecond, func() {
		if runs.Add(1) == 3 {
			require.True(t, tm.Stop(), "Stop during a run prevents the runs still to come")
		}
	})
	require.NoError(t, err)
	clk.Advance(9 * time.Millisecond)
	require.Zero(t, runs.Load(), "the first run is one interval from now")
	for i := 0; i < 10; i++ {
		clk.Advance(10 * time.Millisecond)
	}
	require.EqualValues(t, 3, runs.Load())
	require.False(t, tm.Stop())
	s := w.Stats()
	require.Equal(t, uint64(3), s.Fired)
	require.Equal(t, uint64(1), s.Stopped)
	requireBalance(t, w)
}

// TestEveryNeverOverlaps: on the system clock with four workers, runs slower than the interval
// never overlap (runs of one Every are never concurrent, whichever worker takes them), and the
// books balance after Stop.
func TestEveryNeverOverlaps(t *testing.T) {
	w, err := sw.New(sw.WithWorkers(4))
	require.NoError(t, err)
	var running, overlaps, runs atomic.Int32
	tm, err := w.Every(time.Millisecond, func() {
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		time.Sleep(3 * time.Millisecond) // slower than the interval
		running.Add(-1)
		runs.Add(1)
	})
	require.NoError(t, err)
	for runs.Load() < 5 {
		time.Sleep(time.Millisecond)
	}
	tm.Stop()
	require.Zero(t, w.Stop())
	require.Zero(t, overlaps.Load())
	requireBalance(t, w)
}

// TestEveryFixedRate: the k-th run is due k intervals after the call, as time.Ticker's k-th tick
// is: an interval of 2.5 ticks, with the clock moved 1ms at a time, runs at 3, 5, 8, 10 ms (the
// first Advance at or after each due instant), not every 3 ticks as a re-arm from each run's
// start would.
func TestEveryFixedRate(t *testing.T) {
	w, clk, tm, runs := everyRuns(t, 2500*time.Microsecond, nil)
	for i := 0; i < 20; i++ {
		clk.Advance(time.Millisecond)
	}
	require.Equal(t, ms(3, 5, 8, 10, 13, 15, 18, 20), *runs)
	require.True(t, tm.Stop())
	requireBalance(t, w)
}

// TestEverySkipsMissedRuns: runs never pile up. A clock that jumps over several due instants
// gives one run, and the series goes on at its rate: the next run is the first one due after it.
func TestEverySkipsMissedRuns(t *testing.T) {
	w, clk, tm, runs := everyRuns(t, 10*time.Millisecond, nil)
	clk.Advance(9 * time.Millisecond)
	require.Empty(t, *runs, "the first run is one interval from the call")
	clk.Advance(time.Millisecond) // 10: due
	clk.Advance(35 * time.Millisecond)
	require.Equal(t, ms(10, 45), *runs, "the runs due at 20, 30 and 40 are one late run")
	clk.Advance(4 * time.Millisecond) // 49
	require.Len(t, *runs, 2, "the next run is due at 50, on the rate, not 10ms after the late one")
	clk.Advance(time.Millisecond) // 50
	clk.Advance(10 * time.Millisecond)
	require.Equal(t, ms(10, 45, 50, 60), *runs)
	s := w.Stats()
	require.Equal(t, uint64(4), s.Fired, "skipped runs are neither fired nor scheduled")
	require.Equal(t, uint64(5), s.Scheduled)
	require.True(t, tm.Stop())
	requireBalance(t, w)
}

// TestEverySlowRunSkipsFromItsEnd: a run that takes longer than the interval is followed by the
// first run due after it ended, not by one due at once: runs never overlap and never pile up.
func TestEverySlowRunSkipsFromItsEnd(t *testing.T) {
	n := 0
	w, clk, tm, runs := everyRuns(t, 10*time.Millisecond, func(clk *sw.ManualClock) {
		if n++; n == 1 {
			clk.Advance(25 * time.Millisecond) // the first run takes 25ms: from 10 to 35
		}
	})
	clk.Advance(10 * time.Millisecond)
	require.Equal(t, ms(10), *runs, "due at 20 and 30 while the run went on: skipped")
	require.Equal(t, 35*time.Millisecond, clk.Now().Sub(epoch))
	clk.Advance(4 * time.Millisecond) // 39
	require.Len(t, *runs, 1)
	clk.Advance(time.Millisecond) // 40
	require.Equal(t, ms(10, 40), *runs)
	require.True(t, tm.Stop())
	requireBalance(t, w)
}

// TestEveryResetRebases: Reset moves the next run, and the series keeps its rate from the instant
// that run was due at.
func TestEveryResetRebases(t *testing.T) {
	w, clk, tm, runs := everyRuns(t, 10*time.Millisecond, nil)
	clk.Advance(10 * time.Millisecond)
	require.True(t, tm.Reset(3*time.Millisecond)) // at 10: the next run at 13 instead of 20
	clk.Advance(3 * time.Millisecond)
	clk.Advance(9 * time.Millisecond) // 22
	require.Equal(t, ms(10, 13), *runs)
	clk.Advance(time.Millisecond) // 23: 10ms after the run the Reset moved
	require.Equal(t, ms(10, 13, 23), *runs)

	// A Reset to a deadline inside a tick re-bases at that deadline, not at a tick boundary.
	clk.Advance(500 * time.Microsecond)                    // 23.5
	require.True(t, tm.Reset(time.Millisecond))            // due 24.5
	clk.Advance(2 * time.Millisecond)                      // 25.5
	clk.Advance(8*time.Millisecond + 900*time.Microsecond) // 34.4
	require.Equal(t, ms(10, 13, 23, 25.5), *runs)
	clk.Advance(100 * time.Microsecond) // 34.5: 10ms after 24.5
	require.Equal(t, ms(10, 13, 23, 25.5, 34.5), *runs)

	// Several Resets before a run: the last one counts.
	require.True(t, tm.Reset(time.Hour))
	require.True(t, tm.Reset(4*time.Millisecond)) // 38.5
	clk.Advance(4 * time.Millisecond)
	clk.Advance(10 * time.Millisecond) // 48.5: 10ms after 38.5
	require.Equal(t, ms(10, 13, 23, 25.5, 34.5, 38.5, 48.5), *runs)
	require.True(t, tm.Stop())
	requireBalance(t, w)
}

// tickerWindow counts, in the same window, the runs of an Every and the ticks of a time.Ticker
// of the same interval, each consumer taking work per run; it returns both counts and the
// window's length, from before either started to after both stopped.
func tickerWindow(t *testing.T, interval, window, work time.Duration) (every, ticks int64, elapsed time.Duration) {
	t.Helper()
	w, err := sw.New()
	require.NoError(t, err)
	defer w.Stop()
	var runs, running, overlaps atomic.Int64
	begin := time.Now()
	tm, err := w.Every(interval, func() {
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		time.Sleep(work)
		running.Add(-1)
		runs.Add(1)
	})
	require.NoError(t, err)
	tk := time.NewTicker(interval)
	done := time.After(window)
loop:
	for {
		select {
		case <-tk.C:
			ticks++
			time.Sleep(work)
		case <-done:
			break loop
		}
	}
	tk.Stop()
	tm.Stop()
	require.Zero(t, w.Stop())
	elapsed = time.Since(begin)
	require.Zero(t, overlaps.Load(), "runs of one Every overlapped")
	return runs.Load(), ticks, elapsed
}

// TestEveryKeepsTickerRate runs an Every and a time.Ticker of 4ms in the same 400ms window: the
// Every keeps the Ticker's rate (a re-arm from each run's start would give about 75% of it: every
// run a tick plus its wake-up late), and never runs more often than the fixed rate allows. The
// bounds leave room for a loaded machine, where both lose runs alike.
func TestEveryKeepsTickerRate(t *testing.T) {
	const interval = 4 * time.Millisecond
	every, ticks, elapsed := tickerWindow(t, interval, 400*time.Millisecond, 0)
	t.Logf("Every: %d runs, Ticker: %d ticks, in %v", every, ticks, elapsed)
	require.LessOrEqual(t, every, int64(elapsed/interval)+1, "more runs than the rate allows")
	require.GreaterOrEqual(t, every, ticks-ticks/10-3, "Every fell behind the Ticker")
}

// TestEverySlowKeepsTickerRate: with a callback slower than the interval (5ms of work every
// 2ms), runs never overlap, never pile up (at most one per 5ms of the window), and the series
// still runs about as often as a Ticker's receiver doing the same work (the Ticker's buffered
// tick lets its receiver start again at once, where Every waits for the next due instant, 6 or
// 8ms after the last, so only a loose lower bound holds).
func TestEverySlowKeepsTickerRate(t *testing.T) {
	const interval, work = 2 * time.Millisecond, 5 * time.Millisecond
	every, ticks, elapsed := tickerWindow(t, interval, 300*time.Millisecond, work)
	t.Logf("Every: %d runs, Ticker: %d ticks, in %v", every, ticks, elapsed)
	require.LessOrEqual(t, every, int64(elapsed/work)+1, "runs piled up")
	require.GreaterOrEqual(t, every, ticks/2-3, "Every fell behind the Ticker")
}
