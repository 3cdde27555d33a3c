package shardwheel_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// record is what the stress test knows of one timer. Written by its producer (armed, d, reset*,
// stopOK) and by its callback (fired, firedAt); read after the wheel has stopped.
type record struct {
	armedAt  time.Time
	d        time.Duration
	resetAt  time.Time
	resetD   time.Duration
	resetOK  bool
	stopOK   bool
	fired    atomic.Int32
	firedAt  atomic.Int64 // nanoseconds since the test's origin, on the monotonic clock
	producer int
}

// TestStress hammers schedule, stop and reset from many goroutines while timers fire, at several
// GOMAXPROCS, then accounts for every timer exactly once: its callback ran once, or one Stop
// reported true, or it was counted in Wheel.Stop's return. No callback may start before the
// moment of its call plus its delay (or of its last successful Reset plus that delay).
func TestStress(t *testing.T) {
	procs := []int{1, 2, 4}
	producers, each := 8, 4000
	if testing.Short() {
		procs, each = []int{2}, 1000
	}
	for _, p := range procs {
		t.Run(fmt.Sprintf("procs=%d", p), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(p))
			stress(t, producers, each)
		})
	}
}

func stress(t *testing.T, producers, each int) {
	w, err := sw.New(sw.WithRingSize(64), sw.WithQueueSize(256))
	require.NoError(t, err)
	origin := time.Now()
	recs := make([][]record, producers)
	fire := func(arg any) {
		r := arg.(*record)
		r.firedAt.Store(int64(time.Since(origin)))
		r.fired.Add(1)
	}
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		recs[p] = make([]record, each)
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), 42))
			var live []sw.Timer
			var liveRecs []*record
			for i := 0; i < each; i++ {
				r := &recs[p][i]
				r.producer = p
				// Mostly short delays so that timers fire during the run; some already due,
				// some far out so that Wheel.Stop finds them.
				switch x := rng.IntN(100); {
				case x < 5:
					r.d = -time.Millisecond
				case x < 10:
					r.d = time.Hour
				default:
					r.d = time.Duration(rng.IntN(3000)) * time.Microsecond
				}
				r.armedAt = time.Now()
				tm, err := w.AfterFuncArg(r.d, fire, r)
				require.NoError(t, err)
				live = append(live, tm)
				liveRecs = append(liveRecs, r)
				// Act on a random earlier timer: stop it, reset it, or leave it.
				if j := rng.IntN(len(live)); rng.IntN(3) == 0 {
					lr := liveRecs[j]
					if rng.IntN(2) == 0 {
						lr.stopOK = live[j].Stop() || lr.stopOK
					} else if !lr.stopOK && lr.resetAt.IsZero() {
						d := time.Duration(rng.IntN(2000)) * time.Microsecond
						at := time.Now()
						if live[j].Reset(d) {
							lr.resetAt, lr.resetD, lr.resetOK = at, d, true
						}
					}
				}
				if len(live) > 256 {
					live, liveRecs = live[128:], liveRecs[128:]
				}
			}
		}(p)
	}
	wg.Wait()
	time.Sleep(5 * time.Millisecond) // let most short timers fire; the rest are dropped
	dropped := w.Stop()

	var ran, stopped int
	for p := range recs {
		for i := range recs[p] {
			r := &recs[p][i]
			f := r.fired.Load()
			require.LessOrEqual(t, f, int32(1), "timer %d/%d fired %d times", p, i, f)
			if r.stopOK {
				require.Zero(t, f, "timer %d/%d: Stop reported true but the callback ran", p, i)
				stopped++
			}
			if f == 1 {
				ran++
				due := r.armedAt.Add(r.d)
				if r.resetOK {
					due = r.resetAt.Add(r.resetD)
				}
				firedAt := origin.Add(time.Duration(r.firedAt.Load()))
				require.False(t, firedAt.Before(due), "timer %d/%d fired %v early", p, i, due.Sub(firedAt))
			}
		}
	}
	total := producers * len(recs[0])
	require.Equal(t, total, ran+stopped+dropped, "ran %d + stopped %d + dropped %d", ran, stopped, dropped)
	s := w.Stats()
	require.EqualValues(t, total, s.Scheduled)
	require.EqualValues(t, ran, s.Fired)
	require.EqualValues(t, stopped, s.Stopped)
	require.EqualValues(t, dropped, s.Dropped)
	require.Zero(t, w.Len())
}

// TestStressStopWhileProducing stops the wheel while producers are still scheduling: the calls
// that returned ErrClosed were not accepted, and every accepted timer is accounted for.
func TestStressStopWhileProducing(t *testing.T) {
	w, err := sw.New(sw.WithRingSize(8))
	require.NoError(t, err)
	var accepted, refused, ran atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for p := 0; p < 8; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; ; i++ {
				_, err := w.AfterFunc(time.Duration(i%4)*time.Millisecond, func() { ran.Add(1) })
				if err != nil {
					require.ErrorIs(t, err, sw.ErrClosed)
					refused.Add(1)
					return
				}
				accepted.Add(1)
			}
		}()
	}
	close(start)
	time.Sleep(20 * time.Millisecond)
	dropped := w.Stop()
	wg.Wait()
	require.EqualValues(t, accepted.Load(), ran.Load()+int64(dropped))
	require.EqualValues(t, 8, refused.Load())
	s := w.Stats()
	require.EqualValues(t, accepted.Load(), s.Scheduled)
	require.EqualValues(t, refused.Load(), s.Rejected)
}
