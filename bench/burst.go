package main

import (
	"flag"
	"fmt"
	"runtime"
	"time"
)

var burstOnly = flag.Bool("burst", false, "run only the burst workload (about 40 s)")

// The burst: what an implementation keeps after a burst of timers that are all over. A server that
// arms a timeout per request sees bursts (a deploy, a retry storm, a failover); once they pass,
// the memory should go back. Each implementation, fresh: arm n timers an hour out from procs
// goroutines, stop them all, drop the handles, wait burstQuiet, collect garbage fully, and
// report the live heap it still holds per burst timer (HeapAlloc against the same reading taken
// after the implementation started). shardwheel also reports its Stats.HeldBytes right after the
// stops and after the quiet, to show the memory come and go.

// burstQuiet is the quiet before the measurement: shardwheel gives blocks back after 5 s of
// quiet on a shard (trim.go), so 10 s leaves room for a loaded machine.
const burstQuiet = 10 * time.Second

// burstSize is the burst of a mode: 2M timers, none in a quick run (the quiet alone would take
// 30 s there).
func burstSize(cfg Config) int {
	if cfg.Mode == "quick" {
		return 0
	}
	return 2_000_000
}

// BurstResult is one burst on one implementation.
type BurstResult struct {
	KeptBytesPerTimer float64 // live heap after the quiet, minus before the burst, per burst timer
	HeldMiBAtStop     float64 // shardwheel only: Stats.HeldBytes once every timer is stopped
	HeldMiBAfterQuiet float64 // shardwheel only: Stats.HeldBytes after the quiet
}

// runBurst measures one burst of n timers on a fresh k. Its records and handles are allocated
// before the baseline, so they never count against k.
func runBurst(k Kind, n, procs int, quiet time.Duration) (BurstResult, error) {
	var res BurstResult
	slab, hs := newSlab(n), make([]Handle, n)
	im, err := newImpl(k)
	if err != nil {
		return res, err
	}
	defer func() { closeImpl(im, nil) }()
	_, al0 := heapInUse()
	if errs := fill(im, slab, hs, 0, n, procs); errs > 0 {
		return res, fmt.Errorf("burst: %d of %d timers refused", errs, n)
	}
	parallel(procs, n, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			im.Stop(hs[i])
		}
	})
	clear(hs) // the caller lets go of its handles
	held := func() float64 {
		if s, ok := im.(*swImpl); ok {
			return float64(s.w.Stats().HeldBytes) / (1 << 20)
		}
		return 0
	}
	res.HeldMiBAtStop = held()
	time.Sleep(quiet)
	res.HeldMiBAfterQuiet = held()
	_, al1 := heapInUse()
	runtime.KeepAlive(slab) // the harness's records and handles stay in both readings
	runtime.KeepAlive(hs)
	res.KeptBytesPerTimer = float64(int64(al1)-int64(al0)) / float64(n)
	return res, nil
}

// burstTasks lists the burst, once per implementation (not per repetition: each costs the
// quiet), and records its figures.
func burstTasks(cfg Config, res *Results) []task {
	n := burstSize(cfg)
	if n == 0 {
		return nil
	}
	var ts []task
	for _, k := range []Kind{Runtime, Shardwheel, GoZero} {
		ts = append(ts, task{"burst " + count(n) + ": " + k.String(), func() error {
			b, err := runBurst(k, n, cfg.Procs, burstQuiet)
			res.add("burst_kept_bytes_per_timer", k, b.KeptBytesPerTimer)
			if k == Shardwheel {
				res.add("burst_held_mib_at_stop", k, b.HeldMiBAtStop)
				res.add("burst_held_mib_after_quiet", k, b.HeldMiBAfterQuiet)
			}
			return err
		}})
	}
	return ts
}

// burstRows are the report's lines for the burst.
func burstRows(cfg Config) []row {
	n := count(burstSize(cfg))
	q := burstQuiet
	return []row{
		{"burst_kept_bytes_per_timer", fmt.Sprintf("(g) kept after a burst of %s timers an hour out, all stopped, %v quiet, full GC: live bytes per burst timer", n, q)},
		{"burst_held_mib_at_stop", "(g) shardwheel Stats.HeldBytes, MiB, once the burst is stopped"},
		{"burst_held_mib_after_quiet", fmt.Sprintf("(g) shardwheel Stats.HeldBytes, MiB, after %v quiet", q)},
	}
}
