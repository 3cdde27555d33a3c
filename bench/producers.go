package main

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// The producers workload: the server pattern on many goroutines. Half of the producer goroutines
// arm timeouts (an hour out) and hand them, producersBatch at a time, to the
// other half, which stop them: a request's timeout is armed by the goroutine that sends it and
// stopped by the one that reads the reply, on another P. It runs at GOMAXPROCS 2 and 16 (16 Ps on
// this machine's cores: more Ps than cores, as a container sees a big host) with 8, 64 and 256
// producers, beside the runtime; a new instance is made after GOMAXPROCS is set, so shardwheel
// has one shard per P. What to look for: the pair cost stays flat as producers grow, and a stop
// from another goroutine costs no more than one's own (BenchmarkProducers in the library has the
// stop=own variant).

var (
	producerProcs  = []int{2, 16}
	producerCounts = []int{8, 64, 256}
)

const producersBatch = 64

// producersTasks lists one task per GOMAXPROCS, producer count and implementation (the runtime
// and shardwheel; go-zero's single goroutine is measured by the pair figures already).
func producersTasks(cfg Config, res *Results, r string, order []Kind) []task {
	var ts []task
	for _, procs := range producerProcs {
		for _, n := range producerCounts {
			for _, k := range order {
				if k == GoZero {
					continue
				}
				ts = append(ts, task{fmt.Sprintf("%sproducers %d@procs=%d: %s", r, n, procs, k), func() error {
					p, err := runProducers(k, procs, n, cfg.PairTime)
					res.addPairs("producers", fmt.Sprintf("procs=%d/producers=%d", procs, n), k, p)
					if p.StopFalse > 0 {
						return fmt.Errorf("%d Stops of pending timers reported false", p.StopFalse)
					}
					return err
				}})
			}
		}
	}
	return ts
}

// producersRows are the report's rows of the workload.
func producersRows() []row {
	var rs []row
	for _, procs := range producerProcs {
		for _, n := range producerCounts {
			rs = append(rs, row{fmt.Sprintf("producers_ns/procs=%d/producers=%d", procs, n),
				fmt.Sprintf("(h) schedule+stop, ns/pair, %d producers (half arm, half stop), GOMAXPROCS=%d", n, procs)})
		}
	}
	return rs
}

// runProducers measures the workload on a fresh instance of k for dur.
func runProducers(k Kind, procs, producers int, dur time.Duration) (PairResult, error) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
	im, err := newImpl(k)
	if err != nil {
		return PairResult{}, err
	}
	defer closeImpl(im, nil)
	recs := newSlab(producers / 2)
	var (
		stop                       atomic.Bool
		pairs, stopFalse, errCount atomic.Int64
		ready, wg                  sync.WaitGroup
		start                      = make(chan struct{})
	)
	for g := range producers / 2 {
		full, empty := make(chan []Handle, 2), make(chan []Handle, 2)
		empty <- make([]Handle, 0, producersBatch)
		empty <- make([]Handle, 0, producersBatch)
		ready.Add(2)
		wg.Add(2)
		go func() { // arms
			defer wg.Done()
			defer close(full)
			r := &recs[g]
			var ec int64
			ready.Done()
			<-start
			for i := 0; !stop.Load(); {
				batch := <-empty
				for range producersBatch {
					// An hour out, unlike the pairs' 100 ms to 10 s: a batch may wait in the
					// channel for longer than 100 ms when hundreds of goroutines share 2 cores,
					// and a Stop that reports false must then mean a lie, not a timer that fired.
					h, err := im.Schedule(time.Hour+pairDelay(i), r)
					i++
					if err != nil {
						ec++
						continue
					}
					batch = append(batch, h)
				}
				full <- batch
			}
			errCount.Add(ec)
		}()
		go func() { // stops what the other armed
			defer wg.Done()
			var n, sf int64
			ready.Done()
			<-start
			for batch := range full {
				for _, h := range batch {
					if !im.Stop(h) {
						sf++
					}
				}
				n += int64(len(batch))
				empty <- batch[:0]
			}
			pairs.Add(n)
			stopFalse.Add(sf)
		}()
	}
	p := measureWindow(&ready, &wg, start, &stop, &pairs, dur)
	p.StopFalse, p.Errors = stopFalse.Load(), errCount.Load()
	return p, nil
}
