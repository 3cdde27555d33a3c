package main

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// The sustained workload: RPC-like load at a steady rate, the load a server lives in. Two
// producers arm rate timers a second in total, each with a delay uniform in [5 ms, 50 ms]; 90%
// are stopped about 1 ms after arming (the reply came), 10% fire; background timers an hour out
// stay pending throughout. Lateness is each fired callback's start against its own deadline.
//
// It runs in two shapes. The gentle one arms through Schedule (one func for every timer) and
// its producers sleep 100 µs when they are ahead. The harsh one keeps every P busier: each timer
// is a closure of its own (ScheduleFunc, as most programs arm), its producers sleep only 50 µs
// when ahead, and each rate is held 3 s; there the keeper must win a P from the producers.

// sustainedShape is one shape of the workload.
type sustainedShape struct {
	key     string        // "" for the gentle shape, "harsh_" for the other: in the results' keys
	label   string        // "" or "harsh ": in the rows
	sleep   time.Duration // how long a producer sleeps when it is ahead of its rate
	closure bool          // each timer a closure of its own (ScheduleFunc)
}

var (
	gentleShape = sustainedShape{sleep: 100 * time.Microsecond}
	harshShape  = sustainedShape{key: "harsh_", label: "harsh ", sleep: 50 * time.Microsecond, closure: true}
)

// SustainedResult is one run of the sustained workload at one rate.
type SustainedResult struct {
	Rate      float64 // arms per second reached (all producers)
	CPUPerArm float64 // process CPU over the window per arm, ns (arm, stop, fire, harness)
	P50, P99  float64 // lateness, ms
	P999, Max float64
	Check     Check
}

const (
	sustainedProducers = 2
	sustainedMinDelay  = 5 * time.Millisecond
	sustainedMaxDelay  = 50 * time.Millisecond
	sustainedStopAfter = time.Millisecond
)

// runSustained runs the sustained workload on a fresh instance of k for dur at rate arms per
// second, with background timers pending; recs must hold rate*dur records.
func runSustained(k Kind, shape sustainedShape, rate int, dur time.Duration, background int, bg []Rec, bgh []Handle, recs []Rec) (SustainedResult, error) {
	im, err := newImpl(k)
	if err != nil {
		return SustainedResult{}, err
	}
	if errs := fill(im, bg, bgh, 0, background, sustainedProducers); errs > 0 {
		closeImpl(im, bgh[:background])
		return SustainedResult{}, fmt.Errorf("%d background timers rejected", errs)
	}
	total := int(int64(rate) * int64(dur) / int64(time.Second))
	recs = recs[:total]
	for i := range recs {
		recs[i].reset()
	}
	settle()
	var arms, rejected atomic.Int64
	c0 := cpuTime()
	t0 := mono()
	parallel(sustainedProducers, total, func(g, lo, hi int) {
		n, rj := produce(im, shape, recs[lo:hi], float64(rate)/sustainedProducers, t0, int64(dur), rng(3, g))
		arms.Add(n)
		rejected.Add(rj)
	})
	window := mono() - t0
	cpu := cpuTime() - c0
	// Wait for every timer that was not stopped to fire (the last is due 50 ms after the
	// window), a few seconds at most: after that it is lost. A record once settled (fired,
	// stopped or never armed) stays settled, so each look starts where the last one stopped:
	// the whole wait reads each record about once. (It used to read them all again every 10 ms,
	// a burst of milliseconds on one P at 1M/s while the window's last timers came due.)
	// Every record is looked at, not recs[:arms]: each producer arms from the start of its own
	// half, so a producer that fell short leaves unarmed records (deadline 0) inside that range.
	deadline := time.Now().Add(sustainedMaxDelay + 3*time.Second)
	for from := 0; ; {
		for from < len(recs) {
			r := &recs[from]
			if !r.stopped.Load() && r.fires.Load() == 0 && r.deadline.Load() != 0 {
				break
			}
			from++
		}
		if from == len(recs) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // let a double fire show
	closeImpl(im, bgh[:background])

	c := Check{Impl: k.key(), Workload: "sustained", Rejected: rejected.Load()}
	late := make([]int64, 0, total/8)
	for i := range recs {
		r := &recs[i]
		if r.deadline.Load() == 0 {
			continue // not armed: the producer did not get that far
		}
		c.Timers++
		c.tally(r)
		if r.fires.Load() > 0 {
			late = append(late, r.firedAt.Load()-r.deadline.Load())
		}
	}
	c.Stopped -= c.Rejected // rejected timers were marked stopped only to keep them out of "lost"
	sortInt64(late)
	ms := func(q float64) float64 { return float64(quantileSorted(late, q)) / 1e6 }
	res := SustainedResult{
		Rate:  float64(arms.Load()) / (float64(window) / 1e9),
		P50:   ms(0.50),
		P99:   ms(0.99),
		P999:  ms(0.999),
		Check: c,
	}
	if len(late) > 0 {
		res.Max = float64(late[len(late)-1]) / 1e6
	}
	if n := arms.Load(); n > 0 {
		res.CPUPerArm = float64(cpu) / float64(n)
	}
	return res, nil
}

// produce is one producer: it arms recs at perSec a second from t0 for dur ns (catching up in
// small batches, sleeping shape.sleep when ahead), stops nine in ten of them sustainedStopAfter
// after arming, and returns how many it armed and how many were rejected.
func produce(im Impl, shape sustainedShape, recs []Rec, perSec float64, t0, dur int64, rg interface {
	Int64N(int64) int64
	IntN(int) int
}) (armed, rejected int64) {
	type toStop struct {
		h  Handle
		at int64
	}
	fifo := make([]toStop, 0, 1024)
	head := 0
	i := 0
	stopDue := func(now int64) {
		for head < len(fifo) && fifo[head].at <= now {
			if im.Stop(fifo[head].h) {
				fifo[head].h.rec.stopped.Store(true)
			}
			fifo[head] = toStop{}
			head++
		}
		if head > 4096 && head*2 > len(fifo) { // compact
			n := copy(fifo, fifo[head:])
			clear(fifo[n:])
			fifo, head = fifo[:n], 0
		}
	}
	for {
		now := mono()
		el := now - t0
		if el >= dur || i == len(recs) {
			break
		}
		want := min(len(recs), int(perSec*float64(el)/1e9)+1)
		for ; i < want; i++ {
			r := &recs[i]
			d := sustainedMinDelay + time.Duration(rg.Int64N(int64(sustainedMaxDelay-sustainedMinDelay)+1))
			at := mono()
			r.deadline.Store(at + int64(d))
			var h Handle
			var err error
			if shape.closure {
				h, err = im.ScheduleFunc(d, r, func() { fire(r) })
			} else {
				h, err = im.Schedule(d, r)
			}
			if err != nil {
				rejected++
				r.stopped.Store(true)
				continue
			}
			if rg.IntN(10) != 0 {
				fifo = append(fifo, toStop{h, at + int64(sustainedStopAfter)})
			}
		}
		stopDue(mono())
		if i >= want {
			time.Sleep(shape.sleep)
		}
	}
	for head < len(fifo) { // the replies still to come
		if wait := fifo[head].at - mono(); wait > 0 {
			time.Sleep(time.Duration(wait))
		}
		stopDue(mono())
	}
	return int64(i), rejected
}

// addSustained records one run of shape at rate.
func (r *Results) addSustained(shape sustainedShape, rate int, k Kind, s SustainedResult) {
	c, p := rateLabel(rate), "sustained_"+shape.key
	r.add(p+"rate/"+c, k, s.Rate)
	r.add(p+"cpu_ns_per_arm/"+c, k, s.CPUPerArm)
	r.add(p+"p50_ms/"+c, k, s.P50)
	r.add(p+"p99_ms/"+c, k, s.P99)
	r.add(p+"p999_ms/"+c, k, s.P999)
	r.add(p+"max_ms/"+c, k, s.Max)
	s.Check.Workload = "sustained " + shape.label + c + "/s"
	r.addCheck(s.Check)
}

// sustainedRows are the report's rows for the sustained workload, both shapes.
func (r *Results) sustainedRows() []row {
	var rs []row
	add := func(shape sustainedShape, rate int, dur time.Duration) {
		c, p, l := rateLabel(rate), "sustained_"+shape.key, shape.label
		rs = append(rs,
			row{p + "rate/" + c, fmt.Sprintf("(g) sustained %s%s arms/s for %v: reached arms/s", l, c, dur)},
			row{p + "cpu_ns_per_arm/" + c, fmt.Sprintf("(g) sustained %s%s/s: process CPU per arm, ns", l, c)},
			row{p + "p50_ms/" + c, fmt.Sprintf("(g) sustained %s%s/s: lateness p50, ms", l, c)},
			row{p + "p99_ms/" + c, fmt.Sprintf("(g) sustained %s%s/s: lateness p99, ms", l, c)},
			row{p + "p999_ms/" + c, fmt.Sprintf("(g) sustained %s%s/s: lateness p99.9, ms", l, c)},
			row{p + "max_ms/" + c, fmt.Sprintf("(g) sustained %s%s/s: lateness max, ms", l, c)})
	}
	for _, rate := range r.cfg.Rates {
		add(gentleShape, rate, r.cfg.sustainedDur(rate))
	}
	for _, rate := range r.cfg.HarshRates {
		add(harshShape, rate, r.cfg.HarshDur)
	}
	return rs
}

// rateLabel formats a rate as 50k, 250k, 1M.
func rateLabel(rate int) string { return count(rate) }

// plotSustained draws p99 lateness against the target rate, one line per implementation.
func plotSustained(r *Results, path string) error {
	if len(r.cfg.Rates) == 0 {
		return nil
	}
	p := newPlot(fmt.Sprintf("sustained RPC-like load: p99 lateness (median of %d), %s pending an hour out", r.Meta.Reps, count(r.cfg.SustainedBackground)),
		"target arms per second (90% stopped after 1 ms, 10% fire after 5–50 ms)", "p99 lateness, ms (log scale)")
	logY(p)
	var ticks []plot.Tick
	for i, rate := range r.cfg.Rates {
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: rateLabel(rate)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = -0.2, float64(len(r.cfg.Rates)-1)+0.2
	for k := Runtime; k < numKinds; k++ {
		var xys plotter.XYs
		for i, rate := range r.cfg.Rates {
			xs := r.Samples["sustained_p99_ms/"+rateLabel(rate)][k.key()]
			if len(xs) > 0 {
				xys = append(xys, plotter.XY{X: float64(i), Y: math.Max(summarize(xs).Median, latenessFloor)})
			}
		}
		if err := addLine(p, k, xys); err != nil {
			return err
		}
	}
	p.Y.Max *= 3
	p.Y.Min /= 1.5
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// sustainedTasks adds the sustained workload of one repetition to the plan: the gentle shape at
// every rate of the ladder, then the harsh one (go-zero, which cannot sustain 250k/s, left out).
func sustainedTasks(cfg Config, res *Results, r string, order []Kind, bg func() ([]Rec, []Handle), recs func() []Rec) []task {
	var ts []task
	add := func(shape sustainedShape, rate int, dur time.Duration, k Kind) {
		ts = append(ts, task{r + "sustained " + shape.label + rateLabel(rate) + "/s: " + k.String(), func() error {
			b, bh := bg()
			s, err := runSustained(k, shape, rate, dur, cfg.SustainedBackground, b, bh, recs())
			res.addSustained(shape, rate, k, s)
			return err
		}})
	}
	for _, rate := range cfg.Rates {
		for _, k := range order {
			add(gentleShape, rate, cfg.sustainedDur(rate), k)
		}
	}
	for _, rate := range cfg.HarshRates {
		for _, k := range order {
			if k != GoZero {
				add(harshShape, rate, cfg.HarshDur, k)
			}
		}
	}
	return ts
}
