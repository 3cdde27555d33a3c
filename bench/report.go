package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// Results is everything one run measured: the raw figure of every repetition (Samples), the
// lateness distributions, the correctness counters and notes. It is what -json writes.
type Results struct {
	Meta        Meta                            `json:"meta"`
	Samples     map[string]map[string][]float64 `json:"samples"` // metric -> implementation -> one value per repetition
	Metrics     []string                        `json:"metrics"` // the metrics in the order they were first recorded
	Quantiles   []float64                       `json:"lateness_quantiles"`
	LatenessCDF map[string][][]float64          `json:"lateness_ms"` // implementation -> per repetition, lateness at each quantile
	Checks      []*Check                        `json:"correctness"`
	Notes       []string                        `json:"notes"`
	Tasks       []TaskTime                      `json:"tasks"` // how long each step took
	cfg         Config
}

// TaskTime is how long one step of the run took.
type TaskTime struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// Meta describes the run and the machine.
type Meta struct {
	Command    string  `json:"command"`
	Mode       string  `json:"mode"`
	Date       string  `json:"date"`
	GoVersion  string  `json:"go_version"`
	OS         string  `json:"os"`
	NumCPU     int     `json:"num_cpu"`
	GOMAXPROCS int     `json:"gomaxprocs"`
	Reps       int     `json:"reps"`
	GoZero     string  `json:"gozero_config"`
	DurationS  float64 `json:"duration_s"`
	// LoadStart and LoadEnd are /proc/loadavg at the start and the end: other processes on the
	// machine compete for its cores, and these say how much.
	LoadStart string `json:"loadavg_start"`
	LoadEnd   string `json:"loadavg_end"`
}

// loadAvg returns the first three fields of /proc/loadavg, or "" where there is none.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func newResults(cfg Config, command string) *Results {
	gv := runtime.Version()
	if out, err := exec.Command("go", "version").Output(); err == nil {
		gv = strings.TrimSpace(string(out))
	}
	return &Results{
		Meta: Meta{
			Command: command, Mode: cfg.Mode, Date: time.Now().UTC().Format("2006-01-02 15:04 MST"),
			GoVersion: gv, OS: runtime.GOOS + "/" + runtime.GOARCH, NumCPU: runtime.NumCPU(),
			GOMAXPROCS: runtime.GOMAXPROCS(0), Reps: cfg.Reps,
			LoadStart: loadAvg(),
			GoZero:    fmt.Sprintf("NewTimingWheel(%v tick, %d slots): one rotation = %v", goZeroTick, goZeroSlots, goZeroTick*time.Duration(goZeroSlots)),
		},
		Samples:     map[string]map[string][]float64{},
		Quantiles:   cdfQuantiles,
		LatenessCDF: map[string][][]float64{},
		cfg:         cfg,
	}
}

func (r *Results) note(s string) { r.Notes = append(r.Notes, s) }

// add records one repetition's value of metric for k.
func (r *Results) add(metric string, k Kind, v float64) {
	m, ok := r.Samples[metric]
	if !ok {
		m = map[string][]float64{}
		r.Samples[metric] = m
		r.Metrics = append(r.Metrics, metric)
	}
	m[k.key()] = append(m[k.key()], v)
}

// addCheck merges c into the counters of its implementation and workload.
func (r *Results) addCheck(c Check) {
	for _, o := range r.Checks {
		if o.Impl == c.Impl && o.Workload == c.Workload {
			o.merge(c)
			return
		}
	}
	r.Checks = append(r.Checks, &c)
}

// addPairs records a pair measurement under prefix_ns/suffix (and _allocs, _bytes).
func (r *Results) addPairs(prefix, suffix string, k Kind, p PairResult) {
	if suffix != "" {
		suffix = "/" + suffix
	}
	r.add(prefix+"_ns"+suffix, k, p.NsPerPair)
	r.add(prefix+"_allocs"+suffix, k, p.AllocsPerPair)
	r.add(prefix+"_bytes"+suffix, k, p.BytesPerPair)
	if prefix == "pair" {
		r.addCheck(Check{Impl: k.key(), Workload: "schedule+stop pairs", Timers: p.Pairs, Stopped: p.Pairs - p.StopFalse, StopFalse: p.StopFalse, Rejected: p.Errors})
	}
}

func (r *Results) addLadder(n int, k Kind, l LadderResult) {
	c := count(n)
	r.addPairs("pair", "pending="+c, k, l.Pairs)
	r.add("bytes_per_timer/"+c, k, l.BytesPerTimer)
	r.add("live_bytes_per_timer/"+c, k, l.LiveBytesPerTimer)
	r.add("fill_ms/"+c, k, l.FillMs)
	if l.IdleWindowMs > 0 {
		r.add("idle_cpu_ms_per_s/"+c, k, l.IdleCPUMsPerS)
		r.add("idle_gc_cpu_ms_per_s/"+c, k, l.IdleGCCPUMsPerS)
	}
	r.add("gc_wall_ms/"+c, k, l.GCWallMs)
	r.add("gc_cpu_ms/"+c, k, l.GCCPUMs)
	r.add("gc_extra_wall_ms/"+c, k, l.GCExtraWallMs)
	r.add("gc_extra_cpu_ms/"+c, k, l.GCExtraCPUMs)
	for _, p := range r.cfg.Producers {
		if s, ok := l.Scaling[p]; ok {
			r.addPairs("scaling", fmt.Sprintf("procs=%d", p), k, s)
		}
	}
}

func (r *Results) addFlood(k Kind, f FloodResult) {
	r.add("flood_all_fired_ms", k, f.AllFiredMs)
	r.add("flood_schedule_ms", k, f.SchedulerMs)
	r.add("flood_late_p50_ms", k, f.P50)
	r.add("flood_late_p99_ms", k, f.P99)
	r.add("flood_late_max_ms", k, f.Max)
	r.add("flood_cpu_ns_per_timer", k, f.CPUPerTimer)
	r.LatenessCDF[k.key()] = append(r.LatenessCDF[k.key()], f.CDF)
	r.addCheck(f.Check)
}

// ourDefects counts shardwheel's contract violations over every workload.
func (r *Results) ourDefects() int64 {
	var n int64
	for _, c := range r.Checks {
		if c.Impl == Shardwheel.key() {
			n += c.Defects()
		}
	}
	return n
}

func (r *Results) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// row is one line of the Markdown table.
type row struct{ metric, label string }

// rows lists the table's lines in reading order.
func (r *Results) rows() []row {
	cfg := r.cfg
	var rs []row
	levels := append(append([]int{}, cfg.Pending...), cfg.BigN)
	if cfg.HugeN > 0 {
		levels = append(levels, cfg.HugeN)
	}
	for _, n := range levels {
		rs = append(rs, row{"pair_ns/pending=" + count(n), fmt.Sprintf("(a) schedule+stop, ns/pair, %s pending", count(n))})
	}
	for _, n := range levels {
		rs = append(rs, row{"pair_allocs/pending=" + count(n), fmt.Sprintf("(a) allocs/pair, %s pending", count(n))},
			row{"pair_bytes/pending=" + count(n), fmt.Sprintf("(a) bytes/pair, %s pending", count(n))})
	}
	f := count(cfg.FloodN)
	rs = append(rs,
		row{"flood_all_fired_ms", fmt.Sprintf("(b) flood %s in %v: ms until all fired", f, cfg.FloodSpread)},
		row{"flood_late_p50_ms", "(b) flood lateness p50, ms"},
		row{"flood_late_p99_ms", "(b) flood lateness p99, ms"},
		row{"flood_late_max_ms", "(b) flood lateness max, ms"},
		row{"flood_cpu_ns_per_timer", "(b) flood process CPU per timer, ns (schedule + fire + harness callback)"})
	for _, n := range levels[len(cfg.Pending):] {
		rs = append(rs, row{"bytes_per_timer/" + count(n), fmt.Sprintf("(c) heap bytes per pending timer, %s", count(n))})
	}
	rs = append(rs, row{"idle_cpu_ms_per_s/" + count(cfg.BigN), fmt.Sprintf("(d) idle CPU, ms/s, %s pending", count(cfg.BigN))})
	for _, n := range levels[len(cfg.Pending):] {
		rs = append(rs, row{"gc_extra_wall_ms/" + count(n), fmt.Sprintf("(e) a forced GC's wall time, ms, that %s pending timers add", count(n))},
			row{"gc_extra_cpu_ms/" + count(n), fmt.Sprintf("(e) its GC CPU, ms, that %s pending timers add", count(n))},
			row{"gc_wall_ms/" + count(n), fmt.Sprintf("(e) a forced GC's wall time, ms, %s pending, the harness's own memory included", count(n))})
	}
	for _, p := range cfg.Producers {
		rs = append(rs, row{fmt.Sprintf("scaling_ns/procs=%d", p), fmt.Sprintf("(f) ns/pair, %d producers, %s pending", p, count(cfg.BigN))})
	}
	rs = append(rs, producersRows()...) // producers.go
	rs = append(rs, r.sustainedRows()...)
	rs = append(rs,
		row{"ctx_pair_ns", "deadline ctx create+cancel, ns (runtime column: context.WithTimeout)"},
		row{"ctx_pair_allocs", "deadline ctx allocs/op"},
		row{"ctx_rpc_ns", "deadline ctx create+Done+cancel, ns (runtime column: context.WithTimeout)"},
		row{"ctx_rpc_allocs", "deadline ctx create+Done+cancel allocs/op"},
		row{"keyed_move_ns", fmt.Sprintf("keyed re-arm by Move, ns/op, %s keys (runtime: Stop+Reset)", count(cfg.KeyedN))},
		row{"keyed_move_allocs", "keyed Move allocs/op"},
		row{"keyed_set_ns", fmt.Sprintf("keyed re-arm by Set, ns/op, %s keys", count(cfg.KeyedN))},
		row{"keyed_set_allocs", "keyed Set allocs/op"})
	rs = append(rs, burstRows(cfg)...)
	return rs
}

// markdown renders the report: the run, the figures (median, min–max, ratio to the
// runtime), the correctness counters and the notes.
func (r *Results) markdown() string {
	var b strings.Builder
	m := r.Meta
	fmt.Fprintf(&b, "## shardwheel bench: %s mode\n\n", m.Mode)
	fmt.Fprintf(&b, "`%s` — %s, %s, %d CPUs, GOMAXPROCS=%d, %d repetition(s), %s; go-zero: %s.\n\n",
		strings.TrimSpace(m.Command), m.GoVersion, m.OS, m.NumCPU, m.GOMAXPROCS, m.Reps, m.Date, m.GoZero)
	if m.LoadStart != "" {
		fmt.Fprintf(&b, "Load average (1, 5, 15 min) at start: %s; at end: %s (other processes share the cores).\n\n", m.LoadStart, m.LoadEnd)
	}
	b.WriteString("Each cell: median (min–max over repetitions); ×ratio = median / time.AfterFunc's median (lower is better).\n\n")
	b.WriteString("| figure | " + Runtime.String() + " | " + Shardwheel.String() + " | " + GoZero.String() + " |\n")
	b.WriteString("|---|---:|---:|---:|\n")
	for _, rw := range r.rows() {
		s, ok := r.Samples[rw.metric]
		if !ok {
			continue
		}
		base := summarize(s[Runtime.key()])
		fmt.Fprintf(&b, "| %s |", rw.label)
		for k := Runtime; k < numKinds; k++ {
			xs := s[k.key()]
			if len(xs) == 0 {
				b.WriteString(" — |")
				continue
			}
			sm := summarize(xs)
			cell := num(sm.Median)
			if sm.N > 1 {
				cell += " (" + num(sm.Min) + "–" + num(sm.Max) + ")"
			}
			if k != Runtime && base.N > 0 && base.Median > 0 {
				cell += fmt.Sprintf(" ×%.2f", sm.Median/base.Median)
			}
			b.WriteString(" " + cell + " |")
		}
		b.WriteString("\n")
	}

	b.WriteString("\n### Correctness (all repetitions; every figure but \"timers\" should be 0 except stopped/rejected)\n\n")
	b.WriteString("| implementation | workload | timers | fired | stopped | early (worst) | lost | double | Stop true yet ran | other |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for k := Runtime; k < numKinds; k++ {
		for _, c := range r.Checks {
			if c.Impl != k.key() {
				continue
			}
			early := fmt.Sprint(c.Early)
			if c.Early > 0 {
				early += " (" + time.Duration(c.MaxEarlyNs).String() + ")"
			}
			var other []string
			if c.Rejected > 0 {
				other = append(other, fmt.Sprintf("%d rejected", c.Rejected))
			}
			if c.StopFalse > 0 {
				other = append(other, fmt.Sprintf("%d Stop false on a timer not yet due", c.StopFalse))
			}
			if c.Wrong > 0 {
				other = append(other, fmt.Sprintf("%d wrong ctx.Err", c.Wrong))
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %s | %d | %d | %d | %s |\n", k, c.Workload, c.Timers,
				c.Fired, c.Stopped, early, c.Lost, c.Double, c.StopLied, strings.Join(other, ", "))
		}
	}
	if len(r.Notes) > 0 {
		b.WriteString("\nNotes:\n")
		for _, n := range r.Notes {
			b.WriteString("- " + n + "\n")
		}
	}
	if m.DurationS > 0 {
		fmt.Fprintf(&b, "\nRun time: %.0f s.\n", m.DurationS)
	}
	return b.String()
}

// num formats a figure with about three significant digits.
func num(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "—"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	case a == 0:
		return "0"
	}
	return fmt.Sprintf("%.3f", v)
}
