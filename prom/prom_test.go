package prom_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	sw "github.com/shardwheel/shardwheel"
	"github.com/shardwheel/shardwheel/prom"
)

// newWheel returns a wheel on a manual clock whose callbacks run in Advance, so that every
// count, including each callback's lateness, is known.
func newWheel(t *testing.T) (*sw.Wheel, *sw.ManualClock) {
	t.Helper()
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, err := sw.New(sw.WithClock(clk), sw.WithWorkers(0), sw.WithShards(2),
		sw.WithPanicHandler(func(any) {}))
	if err != nil {
		t.Fatal(err)
	}
	return w, clk
}

// latenessText is the exposition of the lateness histogram for counts of callbacks that started
// on time (bucket 0) and 9ms late (bucket 14: [8.192ms, 16.384ms)).
func latenessText(onTime, late9ms uint64) string {
	var b strings.Builder
	b.WriteString("# HELP shardwheel_callback_lateness_seconds How late each callback started, against its deadline rounded up to the tick.\n")
	b.WriteString("# TYPE shardwheel_callback_lateness_seconds histogram\n")
	for i := 0; i <= 30; i++ {
		n := onTime
		if i >= 14 {
			n += late9ms
		}
		fmt.Fprintf(&b, "shardwheel_callback_lateness_seconds_bucket{le=\"%g\"} %d\n", float64(uint64(1)<<i)*1e-6, n)
	}
	fmt.Fprintf(&b, "shardwheel_callback_lateness_seconds_bucket{le=\"+Inf\"} %d\n", onTime+late9ms)
	fmt.Fprintf(&b, "shardwheel_callback_lateness_seconds_sum NaN\n")
	fmt.Fprintf(&b, "shardwheel_callback_lateness_seconds_count %d\n", onTime+late9ms)
	return b.String()
}

const countersText = `
# HELP shardwheel_callback_panics_total Callbacks that panicked.
# TYPE shardwheel_callback_panics_total counter
shardwheel_callback_panics_total %d
# HELP shardwheel_timers_dropped_total Timers pending at Wheel.Stop, which never run.
# TYPE shardwheel_timers_dropped_total counter
shardwheel_timers_dropped_total %d
# HELP shardwheel_timers_fired_total Callbacks started.
# TYPE shardwheel_timers_fired_total counter
shardwheel_timers_fired_total %d
# HELP shardwheel_timers_pending Timers scheduled, and neither started nor stopped.
# TYPE shardwheel_timers_pending gauge
shardwheel_timers_pending %d
# HELP shardwheel_timers_rejected_total Scheduling calls that returned an error.
# TYPE shardwheel_timers_rejected_total counter
shardwheel_timers_rejected_total %d
# HELP shardwheel_timers_scheduled_total Timers accepted by AfterFunc, AfterFuncArg and the helpers; each Every run once.
# TYPE shardwheel_timers_scheduled_total counter
shardwheel_timers_scheduled_total %d
# HELP shardwheel_timers_stopped_total Timers for which Timer.Stop reported true.
# TYPE shardwheel_timers_stopped_total counter
shardwheel_timers_stopped_total %d
`

var counterNames = []string{
	"shardwheel_callback_panics_total", "shardwheel_timers_dropped_total",
	"shardwheel_timers_fired_total", "shardwheel_timers_pending",
	"shardwheel_timers_rejected_total", "shardwheel_timers_scheduled_total",
	"shardwheel_timers_stopped_total",
}

// TestCollector: every counter and gauge is the Stats field it names, the lateness buckets are
// cumulative over the wheel's power-of-two bounds in seconds, and each scrape is a fresh reading
// (also after Stop).
func TestCollector(t *testing.T) {
	w, clk := newWheel(t)
	defer w.Stop()
	c := prom.NewCollector(w, prom.Opts{})

	expect := func(panics, dropped, fired, pending, rejected, scheduled, stopped int, onTime, late uint64) {
		t.Helper()
		want := fmt.Sprintf(countersText, panics, dropped, fired, pending, rejected, scheduled, stopped)
		if err := testutil.CollectAndCompare(c, strings.NewReader(want), counterNames...); err != nil {
			t.Error(err)
		}
		if err := testutil.CollectAndCompare(c, strings.NewReader(latenessText(onTime, late)),
			"shardwheel_callback_lateness_seconds"); err != nil {
			t.Error(err)
		}
		st := w.Stats()
		gauges := fmt.Sprintf(`
# HELP shardwheel_callbacks_queued Callbacks handed to the worker pool and not yet started.
# TYPE shardwheel_callbacks_queued gauge
shardwheel_callbacks_queued 0
# HELP shardwheel_held_bytes Memory the wheel holds for timers: in use, or kept for reuse.
# TYPE shardwheel_held_bytes gauge
shardwheel_held_bytes %d
# HELP shardwheel_shards Shards of the wheel.
# TYPE shardwheel_shards gauge
shardwheel_shards 2
# HELP shardwheel_workers Worker goroutines of the wheel.
# TYPE shardwheel_workers gauge
shardwheel_workers 0
`, st.HeldBytes)
		if err := testutil.CollectAndCompare(c, strings.NewReader(gauges), "shardwheel_callbacks_queued",
			"shardwheel_held_bytes", "shardwheel_shards", "shardwheel_workers"); err != nil {
			t.Error(err)
		}
	}
	expect(0, 0, 0, 0, 0, 0, 0, 0, 0)

	for i := 0; i < 3; i++ {
		if _, err := w.AfterFunc(time.Millisecond, func() {}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.AfterFunc(time.Millisecond, func() { panic("boom") }); err != nil {
		t.Fatal(err)
	}
	tm, err := w.AfterFunc(time.Hour, func() {})
	if err != nil || !tm.Stop() {
		t.Fatalf("AfterFunc then Stop: %v", err)
	}
	if _, err := w.AfterFunc(time.Second, nil); err == nil {
		t.Fatal("AfterFunc with a nil func: no error")
	}
	expect(0, 0, 0, 4, 1, 5, 1, 0, 0)

	clk.Advance(10 * time.Millisecond) // the four ran 9ms after their deadline at 1ms
	if _, err := w.AfterFunc(0, func() {}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(0) // this one on time
	expect(1, 0, 5, 0, 1, 6, 1, 1, 4)

	if _, err := w.AfterFunc(time.Hour, func() {}); err != nil {
		t.Fatal(err)
	}
	if n := w.Stop(); n != 1 {
		t.Fatalf("Stop returned %d, want 1", n)
	}
	expect(1, 1, 5, 0, 1, 7, 1, 1, 4)
}

// TestCollectorLint: the metrics follow Prometheus' naming and help conventions.
func TestCollectorLint(t *testing.T) {
	w, _ := newWheel(t)
	defer w.Stop()
	problems, err := testutil.CollectAndLint(prom.NewCollector(w, prom.Opts{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestCollectorOpts: Namespace and ConstLabels apply to every metric, so that two wheels can
// share a registry; registering the same wheel's collector twice under the same labels fails.
func TestCollectorOpts(t *testing.T) {
	w1, _ := newWheel(t)
	defer w1.Stop()
	w2, _ := newWheel(t)
	defer w2.Stop()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(prom.NewCollector(w1, prom.Opts{Namespace: "app", ConstLabels: prometheus.Labels{"wheel": "rpc"}}))
	reg.MustRegister(prom.NewCollector(w2, prom.Opts{Namespace: "app", ConstLabels: prometheus.Labels{"wheel": "idle"}}))
	if err := reg.Register(prom.NewCollector(w2, prom.Opts{Namespace: "app", ConstLabels: prometheus.Labels{"wheel": "idle"}})); err == nil {
		t.Error("a second collector with the same names and labels registered")
	}
	if _, err := w1.AfterFunc(time.Hour, func() {}); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP app_timers_pending Timers scheduled, and neither started nor stopped.
# TYPE app_timers_pending gauge
app_timers_pending{wheel="idle"} 0
app_timers_pending{wheel="rpc"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "app_timers_pending"); err != nil {
		t.Error(err)
	}
	n, err := testutil.GatherAndCount(reg)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2*12 {
		t.Errorf("gathered %d metrics, want %d (12 per wheel)", n, 2*12)
	}
}

// TestNewCollectorNilWheel: a nil wheel is a programming error, reported at once.
func TestNewCollectorNilWheel(t *testing.T) {
	defer func() {
		if r := recover(); r != "shardwheel/prom: NewCollector: nil *Wheel" {
			t.Errorf("recovered %v", r)
		}
	}()
	prom.NewCollector(nil, prom.Opts{})
}
