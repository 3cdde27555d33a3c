package shardwheel_test

import (
	"flag"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// soakFor is how long TestSoak runs; 0 (the default) skips it:
//
//	go test -run Soak -soak=10m -v .
//	go test -race -run Soak -soak=30s -v .
var soakFor = flag.Duration("soak", 0, "run TestSoak's mixed workload for this long (0: skip)")

// soakRec is one timer of the soak. Its mutex orders a Reset (and the new deadline it implies)
// before the callback's check, so that the never-early check always compares with the deadline
// the timer actually fired on.
type soakRec struct {
	mu       sync.Mutex
	deadline int64        // monotonic ns since soak.base of the latest arming's call + delay
	armedAt  int64        // monotonic ns of the latest arming's call (for the report of an early fire)
	resets   int          // successful Resets
	state    atomic.Int32 // 0 pending, 1 fired, 2 stopped
	tm       sw.Timer
}

type soak struct {
	t    *testing.T
	w    *sw.Wheel
	base time.Time

	scheduled, fired, stopped, resets atomic.Int64
	early, errs                       atomic.Int64 // never-early and exactly-once violations

	mu   sync.Mutex
	late []int64 // lateness samples (ns) of the current interval
}

func (s *soak) mono() int64 { return int64(time.Since(s.base)) }

// fire is the callback of every soak timer.
func (s *soak) fire(a any) {
	now := s.mono()
	r := a.(*soakRec)
	r.mu.Lock()
	dl, armedAt, resets := r.deadline, r.armedAt, r.resets
	r.mu.Unlock()
	if now < dl {
		if s.early.Add(1) <= 10 {
			s.t.Errorf("early fire: armed at %v with delay %v (after %d resets), started at %v: %v early",
				time.Duration(armedAt), time.Duration(dl-armedAt), resets, time.Duration(now), time.Duration(dl-now))
		}
	}
	if !r.state.CompareAndSwap(0, 1) {
		s.errs.Add(1) // fired twice, or fired after a Stop that reported true
	}
	s.fired.Add(1)
	s.mu.Lock()
	s.late = append(s.late, now-dl)
	s.mu.Unlock()
}

// produce runs one producer: schedule (mostly short delays, a few an hour out), stop and reset
// timers among its most recent ones, until quit.
func (s *soak) produce(seed uint64, quit <-chan struct{}) {
	rng := rand.New(rand.NewPCG(seed, 11))
	recent := make([]*soakRec, 256)
	delay := func() time.Duration {
		if rng.IntN(100) == 0 {
			return time.Hour
		}
		return time.Duration(rng.Int64N(int64(20 * time.Millisecond)))
	}
	for i := 0; ; i++ {
		if i%64 == 0 {
			select {
			case <-quit:
				return
			default:
			}
			time.Sleep(200 * time.Microsecond) // a steady load, not a CPU hog on a shared machine
		}
		switch op := rng.IntN(10); {
		case op < 6:
			r := &soakRec{}
			d := delay()
			r.mu.Lock()
			r.armedAt = s.mono()
			r.deadline = r.armedAt + int64(d)
			tm, err := s.w.AfterFuncArg(d, s.fire, r)
			r.tm = tm
			r.mu.Unlock()
			if err != nil {
				s.errs.Add(1)
				return
			}
			s.scheduled.Add(1)
			recent[rng.IntN(len(recent))] = r
		case op < 8:
			if r := recent[rng.IntN(len(recent))]; r != nil {
				r.mu.Lock()
				if r.tm.Stop() {
					if !r.state.CompareAndSwap(0, 2) {
						s.errs.Add(1) // Stop reported true for a timer that had fired
					}
					s.stopped.Add(1)
				}
				r.mu.Unlock()
			}
		default:
			if r := recent[rng.IntN(len(recent))]; r != nil {
				d := delay()
				r.mu.Lock()
				now := s.mono()
				if r.tm.Reset(d) {
					r.armedAt, r.deadline = now, now+int64(d)
					r.resets++
					s.resets.Add(1)
				}
				r.mu.Unlock()
			}
		}
	}
}

// TestSoak runs a mixed workload of schedule, stop, reset and fire from several producers across
// all shards for -soak, and every second checks and prints: timers fired and stopped (in the
// interval and in all), pending, early fires (must stay 0), exactly-once violations (must stay 0)
// and the interval's p99 lateness. At the end Wheel.Stop's count closes the books exactly.
func TestSoak(t *testing.T) {
	if *soakFor == 0 {
		t.Skip("soak mode is off; run with -soak=10m")
	}
	w, err := sw.New()
	require.NoError(t, err)
	defer w.Stop()
	s := &soak{t: t, w: w, base: time.Now()}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	producers := 2 * runtime.GOMAXPROCS(0)
	for g := 0; g < producers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.produce(uint64(g), quit)
		}()
	}

	end := time.Now().Add(*soakFor)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastFired, lastStopped int64
	var allLate []int64
	for sec := 1; time.Now().Before(end); sec++ {
		<-tick.C
		// Read ours first: the wheel counts a fire before the callback starts and a stop before
		// Stop returns, and we count after, so the wheel's counters are never behind ours.
		fired, stopped, scheduled := s.fired.Load(), s.stopped.Load(), s.scheduled.Load()
		st := w.Stats()
		s.mu.Lock()
		late := s.late
		s.late = nil
		s.mu.Unlock()
		p99 := soakP99(late)
		allLate = append(allLate, p99)
		t.Logf("t=%3ds fired %7d (+%6d) stopped %7d (+%6d) resets %7d pending %6d (Len %6d) early %d errors %d p99-late %v",
			sec, fired, fired-lastFired, stopped, stopped-lastStopped, s.resets.Load(),
			scheduled-fired-stopped, st.Pending, s.early.Load(), s.errs.Load(), time.Duration(p99))
		lastFired, lastStopped = fired, stopped
		require.Zero(t, s.early.Load(), "timers fired early")
		require.Zero(t, s.errs.Load(), "exactly-once violated")
		require.GreaterOrEqual(t, st.Fired, uint64(fired))
		require.GreaterOrEqual(t, st.Stopped, uint64(stopped))
		require.GreaterOrEqual(t, st.Scheduled, uint64(scheduled))
	}
	close(quit)
	wg.Wait()
	dropped := w.Stop()
	fired, stopped, scheduled := s.fired.Load(), s.stopped.Load(), s.scheduled.Load()
	require.Zero(t, s.early.Load())
	require.Zero(t, s.errs.Load())
	require.Equal(t, scheduled, fired+stopped+int64(dropped), "every timer fired, was stopped or was dropped")
	st := w.Stats()
	require.Equal(t, uint64(scheduled), st.Scheduled)
	require.Equal(t, uint64(fired), st.Fired)
	require.Equal(t, uint64(stopped), st.Stopped)
	require.Equal(t, uint64(dropped), st.Dropped)
	slices.Sort(allLate)
	t.Logf("soak done after %v: scheduled %d, fired %d, stopped %d, dropped at Stop %d, resets %d, early 0, errors 0; "+
		"median of the per-second p99 lateness %v, worst %v",
		*soakFor, scheduled, fired, stopped, dropped, s.resets.Load(),
		time.Duration(allLate[len(allLate)/2]), time.Duration(allLate[len(allLate)-1]))
}

func soakP99(s []int64) int64 {
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	return s[len(s)*99/100]
}
