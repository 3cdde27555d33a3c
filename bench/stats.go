package main

import (
	"math"
	"runtime"
	"runtime/metrics"
	"slices"
	"syscall"
	"time"
)

// Summary is the median and the range of one figure over the repetitions.
type Summary struct {
	Median, Min, Max float64
	N                int
}

// summarize returns the median, min and max of xs (NaN when xs is empty).
func summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Summary{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// quantileSorted returns the q-quantile (0..1) of sorted, by the nearest-rank method.
func quantileSorted(sorted []int64, q float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

// cdfQuantiles are the points at which the lateness distribution is kept and plotted.
var cdfQuantiles = func() []float64 {
	var qs []float64
	for i := 0; i <= 100; i++ {
		qs = append(qs, float64(i)/100)
	}
	qs = append(qs, 0.995, 0.999, 0.9999)
	slices.Sort(qs)
	return qs
}()

// settle runs two full collections so that the next measurement starts from a quiet heap.
func settle() {
	runtime.GC()
	runtime.GC()
}

// heapInUse returns the bytes of heap in use (HeapInuse) and live (HeapAlloc) after a settle.
func heapInUse() (inuse, alloc uint64) {
	settle()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, ms.HeapAlloc
}

// cpuTime returns the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// gcCPU returns the runtime's estimate of CPU time spent on GC so far.
func gcCPU() time.Duration {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return time.Duration(s[0].Value.Float64() * 1e9)
}

// forcedGC runs one runtime.GC and returns its wall time and the GC CPU time it cost.
func forcedGC() (wall, cpu time.Duration) {
	c0 := gcCPU()
	t0 := time.Now()
	runtime.GC()
	wall = time.Since(t0)
	return wall, gcCPU() - c0
}

// gcTries is how many forced GCs leastForcedGC runs.
const gcTries = 3

// leastForcedGC runs gcTries forced GCs and returns the least wall time and the least GC CPU of
// them: on a shared machine the least is the figure the collector's own work sets, the others
// add what the neighbours took.
func leastForcedGC() (wall, cpu time.Duration) {
	wall, cpu = forcedGC()
	for range gcTries - 1 {
		w, c := forcedGC()
		wall, cpu = min(wall, w), min(cpu, c)
	}
	return wall, cpu
}

// ms converts a duration to float milliseconds.
func ms(d time.Duration) float64 { return float64(d) / 1e6 }
