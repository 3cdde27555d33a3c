package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"
)

// parallel runs fn(g, lo, hi) on procs goroutines, goroutine g owning indices [lo, hi) of n,
// and returns when all are done.
func parallel(procs, n int, fn func(g, lo, hi int)) {
	var wg sync.WaitGroup
	for g := range procs {
		lo, hi := g*n/procs, (g+1)*n/procs
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(g, lo, hi)
		}()
	}
	wg.Wait()
}

// rng returns the deterministic generator of goroutine g in a workload, so that every
// implementation sees the same delays.
func rng(seed uint64, g int) *rand.Rand { return rand.New(rand.NewPCG(seed, uint64(g))) }

// pairDelay is the delay of the i-th schedule+stop pair: 100 ms to 10 s, the range of RPC
// timeouts; the pair is stopped at once, so it never fires.
func pairDelay(i int) time.Duration {
	return 100*time.Millisecond + time.Duration(i%100)*100*time.Millisecond
}

// PairResult is one measurement of schedule+stop pairs.
type PairResult struct {
	NsPerPair     float64 // wall time / pairs (all producers together, as testing.B.RunParallel)
	AllocsPerPair float64 // runtime.MemStats.Mallocs delta / pairs, whole process
	BytesPerPair  float64 // runtime.MemStats.TotalAlloc delta / pairs, whole process
	Pairs         int64
	StopFalse     int64 // Stop reported false although the timer was due far later
	Errors        int64 // Schedule returned an error
}

// runPairs has procs goroutines schedule and at once stop timers on im for about dur. It does
// not collect garbage first: callers settle the heap where a phase begins, and back-to-back
// measurements (the scaling series) run in the steady state a server lives in.
func runPairs(im Impl, procs int, dur time.Duration) PairResult {
	recs := newSlab(procs)
	var (
		stop                       atomic.Bool
		pairs, stopFalse, errCount atomic.Int64
		ready, wg                  sync.WaitGroup
		start                      = make(chan struct{})
	)
	for g := range procs {
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &recs[g]
			var n, sf, ec int64
			ready.Done()
			<-start
			for i := 0; !stop.Load(); {
				for end := i + 64; i < end; i++ {
					h, err := im.Schedule(pairDelay(i), r)
					if err != nil {
						ec++
						continue
					}
					if !im.Stop(h) {
						sf++
					}
				}
				n += 64
			}
			pairs.Add(n)
			stopFalse.Add(sf)
			errCount.Add(ec)
		}()
	}
	r := measureWindow(&ready, &wg, start, &stop, &pairs, dur)
	r.StopFalse, r.Errors = stopFalse.Load(), errCount.Load()
	return r
}

// fill schedules timers [from, to) of slab on im from procs goroutines, each an hour out
// (spread over one more second so that they do not share one slot), keeping the handles in hs.
// It returns how many Schedule calls failed.
func fill(im Impl, slab []Rec, hs []Handle, from, to, procs int) int64 {
	var errs atomic.Int64
	parallel(procs, to-from, func(_, lo, hi int) {
		for i := from + lo; i < from+hi; i++ {
			d := time.Hour + time.Duration(i%1000)*time.Millisecond
			h, err := im.Schedule(d, &slab[i])
			if err != nil {
				errs.Add(1)
			}
			hs[i] = h
		}
	})
	return errs.Load()
}

// FloodResult is one run of the flood: n timers due within spread.
type FloodResult struct {
	AllFiredMs  float64   // from the first schedule call to the last callback
	P50, P99    float64   // lateness, ms, against each timer's own deadline
	Max         float64   // ms
	CDF         []float64 // lateness in ms at cdfQuantiles
	Check       Check
	SchedulerMs float64 // how long scheduling the n timers took
	CPUPerTimer float64 // process CPU (getrusage) from the first schedule call to the last callback, ns per timer
}

// runFlood schedules n timers with delays uniform over [0, spread] from procs goroutines and
// waits (at most spread+grace) for them to fire.
func runFlood(k Kind, n, procs int, spread, grace time.Duration, slab []Rec, hs []Handle) (FloodResult, error) {
	im, err := newImpl(k)
	if err != nil {
		return FloodResult{}, err
	}
	recs := slab[:n]
	for i := range recs {
		recs[i].reset()
	}
	settle()
	w := startWatch(int64(n))
	var rejected atomic.Int64
	c0 := cpuTime()
	t0 := mono()
	parallel(procs, n, func(g, lo, hi int) {
		scheduleSpread(im, recs, hs, lo, hi, rng(1, g), spread, &rejected)
	})
	sched := mono() - t0
	w.waitDone(spread + grace)
	cpu := cpuTime() - c0
	time.Sleep(20 * time.Millisecond) // let a double fire show
	stopWatch()
	closeImpl(im, hs[:n])

	c := Check{Impl: k.key(), Workload: "flood", Timers: int64(n), Rejected: rejected.Load()}
	late := make([]int64, 0, n)
	var last int64
	for i := range recs {
		r := &recs[i]
		c.tally(r)
		if r.fires.Load() > 0 {
			late = append(late, r.firedAt.Load()-r.deadline.Load())
			last = max(last, r.firedAt.Load())
		}
	}
	c.Stopped -= c.Rejected // rejected timers were marked stopped only to keep them out of "lost"
	sortInt64(late)
	res := FloodResult{
		AllFiredMs:  float64(last-t0) / 1e6,
		P50:         float64(quantileSorted(late, 0.50)) / 1e6,
		P99:         float64(quantileSorted(late, 0.99)) / 1e6,
		Max:         float64(quantileSorted(late, 1)) / 1e6,
		Check:       c,
		SchedulerMs: float64(sched) / 1e6,
		CPUPerTimer: float64(cpu.Nanoseconds()) / float64(n),
	}
	for _, q := range cdfQuantiles {
		res.CDF = append(res.CDF, float64(quantileSorted(late, q))/1e6)
	}
	return res, nil
}

// LadderResult holds what is measured with n timers pending an hour out.
type LadderResult struct {
	BytesPerTimer     float64 // HeapInuse delta / n (baseline taken before the implementation started)
	LiveBytesPerTimer float64 // HeapAlloc delta / n
	IdleCPUMsPerS     float64 // process CPU ms per wall second while the timers wait
	IdleGCCPUMsPerS   float64 // of which the runtime attributes to GC
	GCWallMs, GCCPUMs float64 // a forced runtime.GC: the least of gcTries
	// GCExtraWallMs and GCExtraCPUMs are what the timers add to a forced GC: GCWallMs and GCCPUMs
	// minus the same figures measured before the implementation started, when only the harness's
	// own memory (its timer records, their closures and the handles) was there to mark.
	GCExtraWallMs, GCExtraCPUMs float64
	FillMs                      float64 // scheduling the n timers
	Pairs                       PairResult
	Scaling                     map[int]PairResult // producers -> pair cost
	FillErrors                  int64
	IdleWindowMs                float64
	ScalingPairsStopFs          int64
}

// runLadder starts a fresh k, fills it with n timers an hour out and measures memory, idle CPU
// (when idle > 0), one forced GC, pairs at procs producers and, for each entry of producers,
// pairs at that many producers.
func runLadder(k Kind, n, procs int, idle, pairTime time.Duration, producers []int, slab []Rec, hs []Handle) (LadderResult, error) {
	var res LadderResult
	// The harness's own memory (its timer records and handles) costs the collector too: a forced
	// GC before the implementation starts is the baseline that GCExtraWallMs and GCExtraCPUMs
	// subtract.
	settle()
	gwBase, gcBase := leastForcedGC()
	in0, al0 := heapInUse()
	im, err := newImpl(k)
	if err != nil {
		return res, err
	}
	defer func() { closeImpl(im, hs[:n]) }()
	t0 := time.Now()
	res.FillErrors = fill(im, slab, hs, 0, n, procs)
	res.FillMs = ms(time.Since(t0))
	in1, al1 := heapInUse()
	res.BytesPerTimer = float64(int64(in1)-int64(in0)) / float64(n)
	res.LiveBytesPerTimer = float64(int64(al1)-int64(al0)) / float64(n)
	if idle > 0 {
		// Return freed pages to the OS now: otherwise the runtime's background scavenger does
		// it during the window (madvise, seen as 3 to 17 ms/s charged to whoever runs there).
		debug.FreeOSMemory()
		stopProfile := profileIdle(k, n)
		c0, g0, w0 := cpuTime(), gcCPU(), time.Now()
		time.Sleep(idle)
		c1, g1, w1 := cpuTime(), gcCPU(), time.Now()
		stopProfile()
		secs := w1.Sub(w0).Seconds()
		res.IdleWindowMs = ms(w1.Sub(w0))
		res.IdleCPUMsPerS = ms(c1-c0) / secs
		res.IdleGCCPUMsPerS = ms(g1-g0) / secs
	}
	settle()
	gw, gc := leastForcedGC()
	res.GCWallMs, res.GCCPUMs = ms(gw), ms(gc)
	res.GCExtraWallMs, res.GCExtraCPUMs = ms(gw-gwBase), ms(gc-gcBase)
	res.Pairs = runPairs(im, procs, pairTime)
	if len(producers) > 0 {
		res.Scaling = map[int]PairResult{}
		for _, p := range producers {
			res.Scaling[p] = runPairs(im, p, pairTime)
		}
	}
	return res, nil
}

// runPairsAt starts a fresh k with n timers pending an hour out and measures pairs.
func runPairsAt(k Kind, n, procs int, pairTime time.Duration, slab []Rec, hs []Handle) (PairResult, error) {
	im, err := newImpl(k)
	if err != nil {
		return PairResult{}, err
	}
	defer func() { closeImpl(im, hs[:n]) }()
	fill(im, slab, hs, 0, n, procs)
	runtime.GC()
	return runPairs(im, procs, pairTime), nil
}

// idleProfileDir, when set (-idle-profile), receives a CPU profile of every idle window, to
// find out what an implementation does while nothing is due.
var idleProfileDir string

var idleProfiles atomic.Int64

// profileIdle starts a CPU profile of the idle window of k at n pending, if asked to, and
// returns the func that ends it.
func profileIdle(k Kind, n int) func() {
	if idleProfileDir == "" {
		return func() {}
	}
	path := filepath.Join(idleProfileDir, fmt.Sprintf("idle-%s-%s-%d.pprof", k.key(), count(n), idleProfiles.Add(1)))
	f, err := os.Create(path)
	if err != nil {
		return func() {}
	}
	if pprof.StartCPUProfile(f) != nil {
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// measureWindow releases the producers waiting on start (each has called ready.Done and counts
// its operations in ops), lets them run for dur, stops them and returns the cost per operation:
// wall time, and allocations and bytes from runtime.MemStats over the whole process.
func measureWindow(ready, wg *sync.WaitGroup, start chan struct{}, stop *atomic.Bool, ops *atomic.Int64, dur time.Duration) PairResult {
	ready.Wait()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	t0 := time.Now()
	close(start)
	time.Sleep(dur)
	stop.Store(true)
	wg.Wait()
	el := time.Since(t0)
	runtime.ReadMemStats(&m1)
	n := float64(ops.Load())
	return PairResult{
		NsPerPair:     float64(el.Nanoseconds()) / n,
		AllocsPerPair: float64(m1.Mallocs-m0.Mallocs) / n,
		BytesPerPair:  float64(m1.TotalAlloc-m0.TotalAlloc) / n,
		Pairs:         ops.Load(),
	}
}

// scheduleSpread schedules recs[lo:hi] on im with delays uniform over [0, spread], noting each
// deadline (the monotonic time just before the call, plus d) and handle. A rejected timer is
// counted in rejected and marked stopped: not accepted, so neither expected to fire nor lost.
func scheduleSpread(im Impl, recs []Rec, hs []Handle, lo, hi int, rg *rand.Rand, spread time.Duration, rejected *atomic.Int64) {
	for i := lo; i < hi; i++ {
		d := time.Duration(rg.Int64N(int64(spread) + 1))
		r := &recs[i]
		r.deadline.Store(mono() + int64(d))
		h, err := im.Schedule(d, r)
		if err != nil {
			rejected.Add(1)
			r.stopped.Store(true)
		}
		hs[i] = h
	}
}
