package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
)

// tally reads stored reports of the sustained workload (results.md files, as -only sustained
// writes them) and counts, for each lateness cell, in how many runs shardwheel's median was below,
// equal to or above time.AfterFunc's. One run's cell compares two medians of three repetitions that did
// not run at the same moment, and a p99.9 is set by the few latest callbacks, so a pause of the
// whole process decides it either way: the count over many runs, with a sign test, says
// whether one is later than the other, where one run cannot.
func tally(pattern string, w io.Writer) error {
	files, err := filepath.Glob(pattern)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("tally: no file matches %q", pattern)
	}
	// | (g) sustained 50k/s: lateness p99, ms | 1.18 (1.16–2.41) | 1.15 (1.14–1.22) ×0.97 | ...
	// | (g) sustained harsh 250k/s: lateness p99, ms | ... (the harsh shape, sustained.go)
	re := regexp.MustCompile(`^\| \(g\) sustained ((?:harsh )?\S+)/s: lateness (p99|p99\.9), ms \| ([0-9.]+) [^|]*\| ([0-9.]+) `)
	type cell struct{ rate, q string }
	var order []cell
	ratios := map[cell][]float64{}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			m := re.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			rt, err1 := strconv.ParseFloat(m[3], 64)
			sw, err2 := strconv.ParseFloat(m[4], 64)
			if err1 != nil || err2 != nil || rt <= 0 {
				continue
			}
			c := cell{m[1], m[2]}
			if _, ok := ratios[c]; !ok {
				order = append(order, c)
			}
			ratios[c] = append(ratios[c], sw/rt)
		}
		fh.Close()
		if err := sc.Err(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "%d reports matching %s\n\n", len(files), pattern)
	fmt.Fprintln(w, "| cell | runs | shardwheel below the runtime | equal | above | sign test p (one-sided, ties dropped) | ratio median (min–max) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---|")
	for _, c := range order {
		rs := ratios[c]
		below, equal := 0, 0
		for _, r := range rs {
			switch {
			case r < 1:
				below++
			case r == 1:
				equal++
			}
		}
		above := len(rs) - below - equal
		m := summarize(rs) // as every other figure of the report
		fmt.Fprintf(w, "| %s/s %s | %d | %d | %d | %d | %.2g | %.2f (%.2f–%.2f) |\n", c.rate, c.q, len(rs),
			below, equal, above, signTest(below, below+above), m.Median, m.Min, m.Max)
	}
	return nil
}

// signTest is P(X >= k) for X binomial(n, 1/2): how likely k or more of n runs below the runtime
// are if neither implementation's tail were the later one (n leaves out the ties, which the
// medians' three significant digits make now and then).
func signTest(k, n int) float64 {
	p := 0.0
	lg, _ := math.Lgamma(float64(n + 1))
	for i := k; i <= n; i++ {
		a, _ := math.Lgamma(float64(i + 1))
		b, _ := math.Lgamma(float64(n - i + 1))
		p += math.Exp(lg - a - b - float64(n)*math.Ln2)
	}
	return p
}
