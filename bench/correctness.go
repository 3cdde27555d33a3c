package main

import (
	"slices"
	"sync/atomic"
	"time"
)

// Check counts what went wrong for one implementation in one workload. Every timer ends in
// exactly one of "fired once" or "a Stop reported true"; anything else is counted here.
type Check struct {
	Impl       string `json:"impl"`
	Workload   string `json:"workload"`
	Timers     int64  `json:"timers"`       // scheduled (accepted or not)
	Fired      int64  `json:"fired"`        // callbacks that ran at least once
	Stopped    int64  `json:"stopped"`      // a Stop reported true
	Rejected   int64  `json:"rejected"`     // Schedule returned an error
	Early      int64  `json:"early"`        // fired before its deadline
	MaxEarlyNs int64  `json:"max_early_ns"` // by how much, at worst
	Lost       int64  `json:"lost"`         // never fired though accepted and not stopped
	Double     int64  `json:"double"`       // fired more than once
	StopLied   int64  `json:"stop_lied"`    // Stop reported true, yet the callback ran
	StopFalse  int64  `json:"stop_false"`   // pairs only: Stop reported false on a timer due much later
	Wrong      int64  `json:"wrong"`        // deadline contexts: Err was not DeadlineExceeded
}

// tally adds r's fate to c. Call it once the workload is quiet.
func (c *Check) tally(r *Rec) {
	f := r.fires.Load()
	stopped := r.stopped.Load()
	switch {
	case f > 0 && stopped:
		c.StopLied++
	case f == 0 && !stopped:
		c.Lost++
	}
	if stopped {
		c.Stopped++
	}
	if f == 0 {
		return
	}
	c.Fired++
	if f > 1 {
		c.Double++
	}
	if early := r.deadline.Load() - r.firedAt.Load(); early > 0 {
		c.Early++
		c.MaxEarlyNs = max(c.MaxEarlyNs, early)
	}
}

// Defects is the number of contract violations in c (early, lost, double, Stop lied, wrong Err).
func (c Check) Defects() int64 { return c.Early + c.Lost + c.Double + c.StopLied + c.Wrong }

// merge adds o's counts to c.
func (c *Check) merge(o Check) {
	c.Timers += o.Timers
	c.Fired += o.Fired
	c.Stopped += o.Stopped
	c.Rejected += o.Rejected
	c.Early += o.Early
	c.MaxEarlyNs = max(c.MaxEarlyNs, o.MaxEarlyNs)
	c.Lost += o.Lost
	c.Double += o.Double
	c.StopLied += o.StopLied
	c.StopFalse += o.StopFalse
	c.Wrong += o.Wrong
}

// runCheck is the mixed correctness workload: n timers due within spread, scheduled from procs
// goroutines; then each goroutine walks its timers while they fire, stopping one in three and
// re-arming one in six to a new delay within spread (so Stop and Reset race the firing), and
// the harness waits until every timer has fired or been stopped.
func runCheck(k Kind, n, procs int, spread, grace time.Duration, slab []Rec, hs []Handle) (Check, error) {
	im, err := newImpl(k)
	if err != nil {
		return Check{}, err
	}
	recs := slab[:n]
	for i := range recs {
		recs[i].reset()
	}
	var rejected atomic.Int64
	parallel(procs, n, func(g, lo, hi int) {
		rg := rng(2, g)
		scheduleSpread(im, recs, hs, lo, hi, rg, spread, &rejected)
		for i := lo; i < hi; i++ {
			r := &recs[i]
			if r.stopped.Load() {
				continue
			}
			switch i % 6 {
			case 0, 3:
				if im.Stop(hs[i]) {
					r.stopped.Store(true)
				}
			case 1:
				d := time.Duration(rg.Int64N(int64(spread) + 1))
				now := mono()
				if im.Reset(hs[i], d) {
					r.deadline.Store(now + int64(d))
				}
			}
		}
	})
	// Wait until every timer is accounted for, or the grace runs out (then the rest are lost).
	for end := time.Now().Add(spread + grace); time.Now().Before(end); {
		done := 0
		for i := range recs {
			if recs[i].fires.Load() > 0 || recs[i].stopped.Load() {
				done++
			}
		}
		if done == n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(30 * time.Millisecond) // let a double fire or a late "stopped" callback show
	closeImpl(im, hs[:n])
	c := Check{Impl: k.key(), Workload: "mixed stop/reset", Timers: int64(n), Rejected: rejected.Load()}
	for i := range recs {
		c.tally(&recs[i])
	}
	c.Stopped -= c.Rejected // rejected timers were marked stopped only to keep them out of "lost"
	return c, nil
}

// sortInt64 sorts xs in place.
func sortInt64(xs []int64) { slices.Sort(xs) }
