package prom_test

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	sw "github.com/shardwheel/shardwheel"
	"github.com/shardwheel/shardwheel/prom"
)

// Register a wheel's collector and scrape it. A server exposes the registry with
// http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})); here the example
// gathers it once and prints the counters, on a manual clock so that the output is stable.
func ExampleNewCollector() {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, _ := sw.New(sw.WithClock(clk), sw.WithWorkers(0))
	defer w.Stop()

	reg := prometheus.NewRegistry()
	reg.MustRegister(prom.NewCollector(w, prom.Opts{ConstLabels: prometheus.Labels{"wheel": "rpc"}}))

	answered, _ := w.AfterFunc(100*time.Millisecond, func() {})
	answered.Stop()
	_, _ = w.AfterFunc(100*time.Millisecond, func() { fmt.Println("request timed out") })
	clk.Advance(time.Second)

	families, _ := reg.Gather()
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.Counter != nil:
				fmt.Println(f.GetName(), m.GetCounter().GetValue())
			case m.Histogram != nil:
				fmt.Println(f.GetName(), "count", m.GetHistogram().GetSampleCount())
			}
		}
	}
	// Output:
	// request timed out
	// shardwheel_callback_lateness_seconds count 1
	// shardwheel_callback_panics_total 0
	// shardwheel_timers_dropped_total 0
	// shardwheel_timers_fired_total 1
	// shardwheel_timers_rejected_total 0
	// shardwheel_timers_scheduled_total 2
	// shardwheel_timers_stopped_total 1
}
