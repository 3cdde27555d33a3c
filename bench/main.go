// Command bench compares shardwheel with its peers on the machine it runs on: the Go
// runtime's time.AfterFunc (the baseline of every ratio) and go-zero's collection.TimingWheel.
//
//	go -C bench run .          # the default run, about two minutes on 2 cores
//	go -C bench run . -quick   # a smoke run of a few seconds; exits 1 if shardwheel misbehaves
//	go -C bench run . -full    # every size, 10M pending timers included
//
// Progress goes to stderr, a Markdown report to stdout; the report, the raw figures (JSON) and
// the plots (SVG) are written to the -out directory. See README.md for what each figure means.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
)

// Config sizes every workload. configFor gives the three modes; flags may override a few.
type Config struct {
	Mode        string
	Reps        int
	PairTime    time.Duration // how long each schedule+stop measurement runs
	Pending     []int         // pending levels measured on their own instance (below BigN)
	BigN        int           // the pending level of the memory, idle, GC and scaling ladder
	HugeN       int           // a second ladder (memory, GC, pairs), 0 = none
	FloodN      int           // timers in the flood
	FloodSpread time.Duration // their delays are uniform over [0, FloodSpread]
	Grace       time.Duration // how long past the last deadline a timer may take before it is lost
	Idle        time.Duration // idle CPU window
	Producers   []int         // producer goroutines for the scaling workload
	CheckN      int           // timers in the mixed correctness workload
	CheckSpread time.Duration
	KeyedN      int // keys in the keyed workload
	CtxCheckN   int // deadline contexts in the context correctness check
	GoZeroCap   int // go-zero is not run above this many pending timers (0 = no cap)
	Procs       int // GOMAXPROCS: the producers of every workload but scaling

	Rates        []int         // arms per second of the sustained workload's ladder
	SustainedDur time.Duration // how long each rate is held, at least
	// SustainedArms: a rate is held long enough for at least this many arms, so that a low
	// rate's p99.9 rests on as many fired timers as a high rate's (a tenth fire: 25k here, the
	// p99.9 the 25th latest), not on the few latest of one second.
	SustainedArms       int
	SustainedBackground int // timers pending an hour out meanwhile
	// HarshRates and HarshDur are the rates of the sustained workload's harsh shape and how long
	// each is held (sustained.go).
	HarshRates []int
	HarshDur   time.Duration
}

// configFor returns the sizes of a mode: "quick", "default" or "full".
func configFor(mode string) Config {
	c := Config{
		Mode: mode, Reps: 3, PairTime: 200 * time.Millisecond,
		Pending: []int{0, 100_000}, BigN: 1_000_000, FloodN: 1_000_000,
		FloodSpread: 100 * time.Millisecond, Grace: 5 * time.Second, Idle: 2 * time.Second,
		Producers: []int{1, 2, 4, 8, 16, 32, 64}, CheckN: 200_000, CheckSpread: 50 * time.Millisecond,
		KeyedN: 100_000, CtxCheckN: 50_000, GoZeroCap: 1_000_000, Procs: runtime.GOMAXPROCS(0),
		Rates: []int{50_000, 250_000, 500_000, 1_000_000}, SustainedDur: time.Second, SustainedArms: 250_000,
		SustainedBackground: 1_000_000, HarshRates: []int{250_000, 1_000_000}, HarshDur: 3 * time.Second,
	}
	switch mode {
	case "quick":
		c.Reps, c.PairTime = 1, 25*time.Millisecond
		c.Pending, c.BigN, c.FloodN = []int{0, 10_000}, 100_000, 100_000
		c.Grace, c.Idle, c.Producers = 3*time.Second, 250*time.Millisecond, []int{1, 8, 64}
		c.CheckN, c.KeyedN, c.CtxCheckN = 20_000, 10_000, 5_000
		c.Rates, c.SustainedDur, c.SustainedBackground = []int{50_000, 250_000}, 300*time.Millisecond, 100_000
		c.SustainedArms = 0
		c.HarshRates, c.HarshDur = []int{250_000}, 300*time.Millisecond
	case "full":
		c.Reps, c.PairTime, c.Idle = 5, 300*time.Millisecond, 3*time.Second
		c.HugeN, c.CheckN, c.KeyedN, c.CtxCheckN = 10_000_000, 1_000_000, 1_000_000, 200_000
	}
	return c
}

// sustainedDur is how long the sustained workload holds rate: SustainedDur, or longer if that
// would arm fewer than SustainedArms.
func (c Config) sustainedDur(rate int) time.Duration {
	return max(c.SustainedDur, time.Duration(int64(c.SustainedArms)*int64(time.Second)/int64(rate)))
}

func main() {
	var (
		quick  = flag.Bool("quick", false, "smoke run of a few seconds (CI); exits 1 if shardwheel shows a defect")
		full   = flag.Bool("full", false, "every size, 10M pending timers included, 5 repetitions")
		reps   = flag.Int("reps", 0, "repetitions (0 = the mode's default)")
		out    = flag.String("out", "", "directory for results.json, results.md and the plots (default out/, or a temp dir under -quick)")
		jsonP  = flag.String("json", "", "path of the JSON results (default <out>/results.json)")
		slots  = flag.Int("gozero-slots", goZeroSlots, "slots of go-zero's wheel (its tick is 1ms)")
		gzCap  = flag.Int("gozero-cap", -1, "run go-zero at most at this many pending timers (-1 = mode default, 0 = no cap)")
		idleP  = flag.String("idle-profile", "", "write a CPU profile of every idle-CPU window to this directory")
		tickF  = flag.Duration("tick", 0, "shardwheel's tick (WithTick); 0 keeps the default, 1ms")
		only   = flag.String("only", "", "run only the tasks whose name contains this (e.g. sustained, flood, pairs); writes to a temp dir unless -out is given")
		tallyP = flag.String("tally", "", "run nothing: count, over the sustained reports matching this glob (e.g. 'out/sustained-runs/*.md'), the runs whose lateness tail was at or below the runtime's (tally.go)")
	)
	flag.Parse()
	if *tallyP != "" {
		if err := tally(*tallyP, os.Stdout); err != nil {
			fatal(err)
		}
		return
	}
	mode := "default"
	switch {
	case *quick && *full:
		fmt.Fprintln(os.Stderr, "bench: -quick and -full exclude each other")
		os.Exit(2)
	case *quick:
		mode = "quick"
	case *full:
		mode = "full"
	}
	cfg := configFor(mode)
	if *reps > 0 {
		cfg.Reps = *reps
	}
	if *gzCap >= 0 {
		cfg.GoZeroCap = *gzCap
	}
	goZeroSlots = *slots
	idleProfileDir = *idleP
	swTick = *tickF
	dir := *out
	if dir == "" {
		dir = "out"
		if mode == "quick" {
			dir = filepath.Join(os.TempDir(), "shardwheel-bench-quick")
		}
		if *only != "" { // a partial run must not overwrite the full run's results and plots
			dir = filepath.Join(os.TempDir(), "shardwheel-bench-only")
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fatal(err)
	}
	jsonPath := *jsonP
	if jsonPath == "" {
		jsonPath = filepath.Join(dir, "results.json")
	}

	start := time.Now()
	res := newResults(cfg, "go -C bench run "+raceFlag+". "+strings.Join(os.Args[1:], " ")) // raceFlag: race.go
	tasks := plan(cfg, res)
	if *only != "" {
		kept := tasks[:0]
		for _, t := range tasks {
			if strings.Contains(t.name, *only) || t.name == "allocating timer records" || t.name == "done" {
				kept = append(kept, t)
			}
		}
		tasks = kept
	}
	bar := progressbar.NewOptions(len(tasks),
		progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(os.Stderr) }),
	)
	for _, t := range tasks {
		bar.Describe(fmt.Sprintf("%-44s", t.name))
		t0 := time.Now()
		if err := t.run(); err != nil {
			fatal(fmt.Errorf("%s: %w", t.name, err))
		}
		res.Tasks = append(res.Tasks, TaskTime{t.name, time.Since(t0).Seconds()})
		bar.Add(1)
	}
	bar.Finish()
	res.Meta.DurationS = time.Since(start).Seconds()
	res.Meta.LoadEnd = loadAvg()

	md := res.markdown()
	fmt.Print(md)
	check(os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644))
	check(res.writeJSON(jsonPath))
	if *only == "" || strings.Contains("pairs", *only) {
		check(plotPairs(res, filepath.Join(dir, "pairs.svg")))
	}
	if *only == "" || strings.Contains("flood", *only) {
		check(plotLateness(res, filepath.Join(dir, "lateness.svg")))
	}
	if *only == "" || strings.Contains("sustained", *only) {
		check(plotSustained(res, filepath.Join(dir, "sustained.svg")))
	}
	fmt.Fprintf(os.Stderr, "bench: %s run took %.0f s; wrote %s, results.md, pairs.svg, lateness.svg, sustained.svg in %s\n",
		mode, res.Meta.DurationS, jsonPath, dir)

	if bad := res.ourDefects(); bad > 0 {
		fmt.Fprintf(os.Stderr, "bench: FAIL: shardwheel showed %d contract violations (early, lost, double fire, Stop that lied, wrong Err)\n", bad)
		os.Exit(1)
	}
}

// task is one step of the run, shown on the progress bar.
type task struct {
	name string
	run  func() error
}

// plan lists every step of the run. Correctness comes first; then each repetition runs every
// workload for every implementation, in an order rotated per repetition so that drift on the
// machine hits every implementation alike.
func plan(cfg Config, res *Results) []task {
	maxN := max(cfg.BigN, cfg.HugeN, cfg.FloodN, cfg.CheckN, cfg.KeyedN, cfg.CtxCheckN)
	for _, n := range cfg.Pending {
		maxN = max(maxN, n)
	}
	var slab, sustained []Rec
	var hs []Handle
	maxArms := 0
	for _, rate := range cfg.Rates {
		maxArms = max(maxArms, int(int64(rate)*int64(cfg.sustainedDur(rate))/int64(time.Second)))
	}
	for _, rate := range cfg.HarshRates {
		maxArms = max(maxArms, int(int64(rate)*int64(cfg.HarshDur)/int64(time.Second)))
	}
	alloc := func() error { // once, before any implementation, so it never counts against one
		slab, hs = newSlab(maxN), make([]Handle, maxN)
		sustained = newSlab(maxArms + 1)
		return nil
	}
	if *burstOnly {
		return burstTasks(cfg, res) // -burst: the burst alone (burst.go)
	}
	tasks := []task{{"allocating timer records", alloc}}
	kinds := []Kind{Runtime, Shardwheel, GoZero}
	capped := func(k Kind, n int) bool { return k == GoZero && cfg.GoZeroCap > 0 && n > cfg.GoZeroCap }
	for _, n := range append(append([]int{}, cfg.Pending...), cfg.BigN, cfg.HugeN) {
		if n > 0 && capped(GoZero, n) {
			res.note(fmt.Sprintf("go-zero capped: not run with %s pending timers (over -gozero-cap=%s; it would blow the time budget)", count(n), count(cfg.GoZeroCap)))
		}
	}

	// The first flood in a process pays for growing the runtime's goroutine machinery (time.AfterFunc
	// and go-zero start a goroutine per expiry); a server has long paid it, so pay it unmeasured.
	tasks = append(tasks, task{"warm-up flood (not recorded)", func() error {
		_, err := runFlood(Runtime, cfg.FloodN, cfg.Procs, cfg.FloodSpread, cfg.Grace, slab, hs)
		return err
	}})
	for _, k := range kinds {
		tasks = append(tasks, task{"correctness: " + k.String(), func() error {
			c, err := runCheck(k, cfg.CheckN, cfg.Procs, cfg.CheckSpread, cfg.Grace, slab, hs)
			res.addCheck(c)
			return err
		}})
	}
	ctxOK := hasWheelWithTimeout()
	if !ctxOK {
		res.note("Wheel.WithTimeout does not exist in this build of shardwheel: the deadline-context workload was left out")
	}
	for rep := range cfg.Reps {
		order := append(kinds[rep%len(kinds):len(kinds):len(kinds)], kinds[:rep%len(kinds)]...)
		r := fmt.Sprintf("rep %d/%d ", rep+1, cfg.Reps)
		for _, n := range cfg.Pending {
			for _, k := range order {
				if capped(k, n) {
					continue
				}
				tasks = append(tasks, task{r + "pairs@" + count(n) + ": " + k.String(), func() error {
					p, err := runPairsAt(k, n, cfg.Procs, cfg.PairTime, slab, hs)
					res.addPairs("pair", "pending="+count(n), k, p)
					return err
				}})
			}
		}
		for _, n := range []int{cfg.BigN, cfg.HugeN} {
			if n == 0 {
				continue
			}
			idle, producers := cfg.Idle, cfg.Producers
			if n != cfg.BigN {
				idle, producers = 0, nil
			}
			for _, k := range order {
				if capped(k, n) {
					continue
				}
				tasks = append(tasks, task{r + count(n) + " pending: " + k.String(), func() error {
					l, err := runLadder(k, n, cfg.Procs, idle, cfg.PairTime, producers, slab, hs)
					res.addLadder(n, k, l)
					return err
				}})
			}
		}
		for _, k := range order {
			tasks = append(tasks, task{r + "flood " + count(cfg.FloodN) + ": " + k.String(), func() error {
				f, err := runFlood(k, cfg.FloodN, cfg.Procs, cfg.FloodSpread, cfg.Grace, slab, hs)
				res.addFlood(k, f)
				return err
			}})
		}
		for _, k := range order {
			if k == GoZero || !ctxOK {
				continue
			}
			tasks = append(tasks, task{r + "deadline ctx: " + k.String(), func() error {
				f, closeFn, ok, err := newDeadliner(k)
				if err != nil || !ok {
					return err
				}
				defer quiesce() // context.WithTimeout's stopped timers: see quiesce
				defer closeFn()
				res.addPairs("ctx_pair", "", k, runCtxPairs(f, cfg.Procs, cfg.PairTime))
				res.addPairs("ctx_rpc", "", k, runCtxRPC(f, cfg.Procs, cfg.PairTime))
				res.addCheck(runCtxCheck(k, f, cfg.CtxCheckN, cfg.Procs, cfg.CheckSpread, cfg.Grace, slab))
				return nil
			}})
		}
		tasks = append(tasks, producersTasks(cfg, res, r, order)...) // producers.go
		tasks = append(tasks, sustainedTasks(cfg, res, r, order,
			func() ([]Rec, []Handle) { return slab, hs },
			func() []Rec { return sustained })...)
		for _, k := range order {
			tasks = append(tasks, task{r + "keyed re-arm: " + k.String(), func() error {
				kr, err := runKeyed(k, cfg.KeyedN, cfg.Procs, cfg.PairTime, cfg.CheckSpread, cfg.Grace, slab)
				res.addPairs("keyed_move", "", k, kr.Move)
				res.addPairs("keyed_set", "", k, kr.Set)
				res.addCheck(kr.Check)
				return err
			}})
		}
	}
	tasks = append(tasks, task{"done", func() error { slab, hs, sustained = nil, nil, nil; return nil }})
	tasks = append(tasks, burstTasks(cfg, res)...) // after "done": the burst allocates its own records
	return tasks
}

// count formats a number of timers as 0, 10k, 100k, 1M, 10M.
func count(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

func check(err error) {
	if err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}
