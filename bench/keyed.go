package main

import (
	"sync"
	"sync/atomic"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/zeromicro/go-zero/core/collection"
)

// KeyedImpl is a set of timers addressed by key: a connection's idle timeout, re-armed on
// every request. Keys are partitioned among goroutines, never shared.
type KeyedImpl interface {
	// Set arms key to run fire(r) d from now, or re-arms it with r if it is armed.
	Set(key int, r *Rec, d time.Duration) error
	// Move re-arms an armed key to d from now; false if the key is not armed.
	Move(key int, d time.Duration) bool
	// Close discards every armed key and ends the implementation's goroutines.
	Close()
}

// newKeyed starts a keyed set of kind k for keys [0, n).
func newKeyed(k Kind, n int) (KeyedImpl, error) {
	switch k {
	case Runtime:
		return &runtimeKeyed{timers: make([]*time.Timer, n)}, nil
	case Shardwheel:
		w, err := sw.New(swOptions()...)
		if err != nil {
			return nil, err
		}
		return &swKeyed{w: w, k: sw.NewKeyed(w, func(_ int, r *Rec) { fire(r) })}, nil
	case GoZero:
		tw, err := collection.NewTimingWheel(goZeroTick, goZeroSlots, func(_, v any) { fire(v.(*Rec)) })
		if err != nil {
			return nil, err
		}
		keys := make([]any, n) // boxed once, so that no call pays for boxing an int
		for i := range keys {
			keys[i] = i
		}
		return &goZeroKeyed{tw: tw, keys: keys}, nil
	}
	return nil, nil
}

// runtimeKeyed keeps one *time.Timer per key in a slice (the way a server keeps it in its
// connection struct); re-arming is Stop then Reset.
type runtimeKeyed struct{ timers []*time.Timer }

func (r *runtimeKeyed) Set(key int, rec *Rec, d time.Duration) error {
	if t := r.timers[key]; t != nil && t.Stop() {
		t.Reset(d)
		return nil
	}
	r.timers[key] = time.AfterFunc(d, rec.fn)
	return nil
}

func (r *runtimeKeyed) Move(key int, d time.Duration) bool {
	t := r.timers[key]
	if t == nil || !t.Stop() {
		return false
	}
	t.Reset(d)
	return true
}

func (r *runtimeKeyed) Close() {
	for _, t := range r.timers {
		if t != nil {
			t.Stop()
		}
	}
}

// swKeyed is shardwheel's Keyed[int, *Rec] on a default wheel.
type swKeyed struct {
	w *sw.Wheel
	k *sw.Keyed[int, *Rec]
}

func (s *swKeyed) Set(key int, r *Rec, d time.Duration) error { return s.k.Set(key, r, d) }
func (s *swKeyed) Move(key int, d time.Duration) bool         { return s.k.Move(key, d) }
func (s *swKeyed) Close()                                     { s.w.Stop() }

// goZeroKeyed is go-zero's TimingWheel with SetTimer and MoveTimer; d <= 0 becomes 1ns, as in
// goZeroImpl.
type goZeroKeyed struct {
	tw   *collection.TimingWheel
	keys []any
}

func (g *goZeroKeyed) Set(key int, r *Rec, d time.Duration) error {
	return g.tw.SetTimer(g.keys[key], r, max(d, 1))
}

func (g *goZeroKeyed) Move(key int, d time.Duration) bool {
	return g.tw.MoveTimer(g.keys[key], max(d, 1)) == nil
}

func (g *goZeroKeyed) Close() { g.tw.Stop() }

// KeyedResult is one run of the keyed workload.
type KeyedResult struct {
	Move, Set PairResult // NsPerPair etc. are per re-arm operation here
	Check     Check
}

// runKeyed arms n keys about a minute out, then has procs goroutines re-arm their own keys
// (30 to 31 s out) for about dur with Move, then for about dur with Set; then it moves every
// key to a delay within spread and checks that each fires once, not early.
func runKeyed(k Kind, n, procs int, dur, spread, grace time.Duration, slab []Rec) (KeyedResult, error) {
	var res KeyedResult
	recs := slab[:n]
	for i := range recs {
		recs[i].reset()
	}
	ki, err := newKeyed(k, n)
	if err != nil {
		return res, err
	}
	defer func() {
		ki.Close()
		quiesce()
	}()
	parallel(procs, n, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			ki.Set(i, &recs[i], time.Minute+time.Duration(i%1000)*time.Millisecond)
		}
	})

	res.Move = measureRearm(ki, n, procs, dur, false, recs)
	res.Set = measureRearm(ki, n, procs, dur, true, recs)

	// Correctness: every key moved (even keys) or set (odd keys) to fire within spread.
	w := startWatch(int64(n))
	var rejected atomic.Int64
	parallel(procs, n, func(g, lo, hi int) {
		rg := rng(4, g)
		for i := lo; i < hi; i++ {
			d := time.Duration(rg.Int64N(int64(spread) + 1))
			r := &recs[i]
			r.fires.Store(0)
			r.deadline.Store(mono() + int64(d))
			ok := true
			if i%2 == 0 {
				ok = ki.Move(i, d)
			} else {
				ok = ki.Set(i, r, d) == nil
			}
			if !ok {
				rejected.Add(1)
				r.stopped.Store(true)
			}
		}
	})
	w.waitDone(spread + grace)
	time.Sleep(20 * time.Millisecond)
	stopWatch()
	c := Check{Impl: k.key(), Workload: "keyed re-arm", Timers: int64(n), Rejected: rejected.Load()}
	for i := range recs {
		c.tally(&recs[i])
	}
	c.Stopped -= c.Rejected
	res.Check = c
	return res, nil
}

// measureRearm has procs goroutines re-arm their own keys of ki (Set when set, else Move) for
// about dur and returns the cost per operation.
func measureRearm(ki KeyedImpl, n, procs int, dur time.Duration, set bool, recs []Rec) PairResult {
	var (
		stop      atomic.Bool
		ops       atomic.Int64
		ready, wg sync.WaitGroup
		start     = make(chan struct{})
	)
	for g := range procs {
		lo, hi := g*n/procs, (g+1)*n/procs
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c int64
			ready.Done()
			<-start
			for i := 0; !stop.Load(); {
				for end := i + 64; i < end; i++ {
					key := lo + i%(hi-lo)
					d := 30*time.Second + time.Duration(i%1000)*time.Millisecond
					if set {
						ki.Set(key, &recs[key], d)
					} else {
						ki.Move(key, d)
					}
				}
				c += 64
			}
			ops.Add(c)
		}()
	}
	ready.Wait()
	settle()
	return measureWindow(&ready, &wg, start, &stop, &ops, dur)
}
