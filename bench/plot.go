package main

import (
	"fmt"
	"image/color"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// newPlot is a plot with its title and axis labels and the legend at the top left.
func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Legend.Left = true
	return p
}

// logY puts p's y axis on a log scale with ticks at 1, 2 and 5 of each decade.
func logY(p *plot.Plot) {
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = ticks125{}
}

// plotPairs draws the median cost of a schedule+stop pair against the number of pending
// timers, one line per implementation, on a log scale of cost.
func plotPairs(r *Results, path string) error {
	p := newPlot(fmt.Sprintf("schedule+stop pair cost, %d producers (median of %d)", r.Meta.GOMAXPROCS, r.Meta.Reps),
		"timers already pending (an hour out)", "ns per pair (log scale)")
	logY(p)
	levels := append(append([]int{}, r.cfg.Pending...), r.cfg.BigN)
	if r.cfg.HugeN > 0 {
		levels = append(levels, r.cfg.HugeN)
	}
	var ticks []plot.Tick
	for i, n := range levels {
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: count(n)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = -0.2, float64(len(levels)-1)+0.2
	for k := Runtime; k < numKinds; k++ {
		var xys plotter.XYs
		for i, n := range levels {
			xs := r.Samples["pair_ns/pending="+count(n)][k.key()]
			if len(xs) > 0 {
				xys = append(xys, plotter.XY{X: float64(i), Y: summarize(xs).Median})
			}
		}
		if err := addLine(p, k, xys); err != nil {
			return err
		}
	}
	p.Y.Max *= 3 // room for the legend above the highest line
	p.Y.Min /= 1.5
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// ticks125 labels a log axis at 1, 2 and 5 times each power of ten.
type ticks125 struct{}

// Ticks returns the 1-2-5 ticks in [lo, hi].
func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for dec := math.Pow(10, math.Floor(math.Log10(lo))); dec <= hi; dec *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := m * dec; v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return ts
}

// latenessFloor is where lateness at or below it (or an early fire) is drawn on the log axis.
const latenessFloor = 0.001 // ms = 1 µs

// plotLateness draws the distribution of lateness in the flood: for each implementation, the
// fraction of timers that fired within x ms of their deadline (the per-quantile median over
// the repetitions).
func plotLateness(r *Results, path string) error {
	p := newPlot(fmt.Sprintf("flood: %s timers due within %v — lateness CDF", count(r.cfg.FloodN), r.cfg.FloodSpread),
		"lateness against the timer's own deadline, ms (log scale; ≤ 1 µs drawn at 1 µs)", "fraction of timers fired")
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	for k := Runtime; k < numKinds; k++ {
		reps := r.LatenessCDF[k.key()]
		if len(reps) == 0 {
			continue
		}
		var xys plotter.XYs
		for qi, q := range r.Quantiles {
			var vs []float64
			for _, rep := range reps {
				if qi < len(rep) {
					vs = append(vs, rep[qi])
				}
			}
			xys = append(xys, plotter.XY{X: math.Max(summarize(vs).Median, latenessFloor), Y: q})
		}
		if err := addLine(p, k, xys); err != nil {
			return err
		}
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// addLine adds one implementation's line with its own colour, dash and glyph.
func addLine(p *plot.Plot, k Kind, xys plotter.XYs) error {
	if len(xys) == 0 {
		return nil
	}
	l, pts, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	c := kindColor(k)
	l.Color, l.Width, l.Dashes = c, vg.Points(1.5), plotutil.Dashes(int(k))
	pts.Color, pts.Shape, pts.Radius = c, plotutil.Shape(int(k)), vg.Points(2.5)
	if len(xys) > 20 { // a CDF: the line alone reads better
		pts.Shape = draw.CircleGlyph{}
		pts.Radius = 0
	}
	p.Add(l, pts)
	p.Legend.Add(k.String(), l, pts)
	return nil
}

// kindColor gives each implementation a fixed colour (shardwheel stands out).
func kindColor(k Kind) color.Color {
	return [...]color.Color{
		color.RGBA{R: 90, G: 90, B: 90, A: 255},  // runtime: grey
		color.RGBA{R: 0, G: 114, B: 178, A: 255}, // shardwheel: blue
		color.RGBA{R: 213, G: 94, B: 0, A: 255},  // go-zero: orange
	}[k]
}
