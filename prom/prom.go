// Package prom exports the Stats of a shardwheel.Wheel to Prometheus: a prometheus.Collector
// that takes one snapshot with Wheel.Stats per scrape.
//
// It is a module of its own, github.com/shardwheel/shardwheel/prom, so that the library itself
// depends on no Prometheus package. Register one collector per wheel:
//
//	reg.MustRegister(prom.NewCollector(w, prom.Opts{}))
//
// The metrics, with the default namespace "shardwheel":
//
//	shardwheel_timers_scheduled_total      counter    Stats.Scheduled
//	shardwheel_timers_fired_total          counter    Stats.Fired
//	shardwheel_timers_stopped_total        counter    Stats.Stopped
//	shardwheel_timers_rejected_total       counter    Stats.Rejected
//	shardwheel_timers_dropped_total        counter    Stats.Dropped
//	shardwheel_callback_panics_total       counter    Stats.Panics
//	shardwheel_timers_pending              gauge      Stats.Pending
//	shardwheel_callbacks_queued            gauge      Stats.Queued
//	shardwheel_held_bytes                  gauge      Stats.HeldBytes
//	shardwheel_shards                      gauge      Stats.Shards
//	shardwheel_workers                     gauge      Stats.Workers
//	shardwheel_callback_lateness_seconds   histogram  Stats.Lateness
//
// The lateness histogram has the wheel's own power-of-two buckets, with upper bounds 1µs, 2µs,
// 4µs, ... 2^30µs (about 18 minutes) in seconds, and +Inf. The wheel counts a duration equal to
// a bound in the bucket above it, so a bucket "le" b counts the durations under b. The wheel
// does not keep the sum of the durations: the histogram's sum is NaN, so that an average
// computed from it reads as unknown rather than as a wrong number. Use histogram_quantile on the
// buckets.
package prom

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"

	sw "github.com/shardwheel/shardwheel"
)

// Opts configures a Collector. The zero value is ready to use.
type Opts struct {
	// Namespace prefixes every metric name; "shardwheel" if empty.
	Namespace string
	// ConstLabels are added to every metric, e.g. {"wheel": "rpc"} to tell several wheels apart
	// in one registry.
	ConstLabels prometheus.Labels
}

// Collector is a prometheus.Collector for one Wheel. Each Collect takes one Stats snapshot, so
// the metrics of one scrape come from the same reading. After the wheel's Stop it keeps
// reporting the final counters; unregister it to drop them. Safe for concurrent use.
//
// Fields are immutable after NewCollector.
type Collector struct {
	w *sw.Wheel

	metrics  []metricDesc // the counters, then the gauges
	lateness *prometheus.Desc
	bounds   []float64 // the lateness buckets' upper bounds in seconds, +Inf left implicit
}

// metricDesc is one counter or gauge: its descriptor, its kind and how to read it from Stats.
type metricDesc struct {
	d   *prometheus.Desc
	vt  prometheus.ValueType
	get func(*sw.Stats) float64
}

// NewCollector returns a Collector of w's Stats. It panics if w is nil.
func NewCollector(w *sw.Wheel, o Opts) *Collector {
	if w == nil {
		panic("shardwheel/prom: NewCollector: nil *Wheel")
	}
	ns := o.Namespace
	if ns == "" {
		ns = "shardwheel"
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, nil, o.ConstLabels)
	}
	counter := func(name, help string, get func(*sw.Stats) uint64) metricDesc {
		return metricDesc{desc(name, help), prometheus.CounterValue, func(s *sw.Stats) float64 { return float64(get(s)) }}
	}
	gauge := func(name, help string, get func(*sw.Stats) float64) metricDesc {
		return metricDesc{desc(name, help), prometheus.GaugeValue, get}
	}
	c := &Collector{w: w}
	c.metrics = []metricDesc{
		counter("timers_scheduled_total", "Timers accepted by AfterFunc, AfterFuncArg and the helpers; each Every run once.",
			func(s *sw.Stats) uint64 { return s.Scheduled }),
		counter("timers_fired_total", "Callbacks started.",
			func(s *sw.Stats) uint64 { return s.Fired }),
		counter("timers_stopped_total", "Timers for which Timer.Stop reported true.",
			func(s *sw.Stats) uint64 { return s.Stopped }),
		counter("timers_rejected_total", "Scheduling calls that returned an error.",
			func(s *sw.Stats) uint64 { return s.Rejected }),
		counter("timers_dropped_total", "Timers pending at Wheel.Stop, which never run.",
			func(s *sw.Stats) uint64 { return s.Dropped }),
		counter("callback_panics_total", "Callbacks that panicked.",
			func(s *sw.Stats) uint64 { return s.Panics }),
		gauge("timers_pending", "Timers scheduled, and neither started nor stopped.",
			func(s *sw.Stats) float64 { return float64(s.Pending) }),
		gauge("callbacks_queued", "Callbacks handed to the worker pool and not yet started.",
			func(s *sw.Stats) float64 { return float64(s.Queued) }),
		gauge("held_bytes", "Memory the wheel holds for timers: in use, or kept for reuse.",
			func(s *sw.Stats) float64 { return float64(s.HeldBytes) }),
		gauge("shards", "Shards of the wheel.",
			func(s *sw.Stats) float64 { return float64(s.Shards) }),
		gauge("workers", "Worker goroutines of the wheel.",
			func(s *sw.Stats) float64 { return float64(s.Workers) }),
	}
	c.lateness = desc("callback_lateness_seconds",
		"How late each callback started, against its deadline rounded up to the tick.")
	var h sw.Histogram
	c.bounds = make([]float64, len(h.Buckets)-1) // the last bucket is +Inf
	for i := range c.bounds {
		c.bounds[i] = sw.BucketBound(i).Seconds()
	}
	return c
}

// Describe sends the descriptors of every metric of the Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.d
	}
	ch <- c.lateness
}

// Collect takes one Stats snapshot and sends every metric from it.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.w.Stats()
	for _, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(m.d, m.vt, m.get(&st))
	}
	// Prometheus buckets are cumulative: bucket "le" bounds[i] counts Buckets[0..i].
	buckets := make(map[float64]uint64, len(c.bounds))
	var cum uint64
	for i, b := range c.bounds {
		cum += st.Lateness.Buckets[i]
		buckets[b] = cum
	}
	count := cum + st.Lateness.Buckets[len(c.bounds)]
	ch <- prometheus.MustNewConstHistogram(c.lateness, count, math.NaN(), buckets)
}
