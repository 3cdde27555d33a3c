package shardwheel

import (
	"encoding/json"
	"fmt"
	"weak"
)

// StatsVar returns the wheel's Stats as a variable for package expvar, which a program publishes
// with one call:
//
//	expvar.Publish("shardwheel", w.StatsVar())
//
// Each String call (each read of /debug/vars) takes a fresh snapshot with Stats and returns it as
// a JSON object with the fields of Stats (Lateness as {"Buckets": [...]}); reading costs nothing
// on the scheduling path. After Stop it reads the stopped wheel's final counters. The variable
// holds the wheel weakly, since expvar keeps what it publishes for the life of the process: once
// the wheel is stopped and collected, it reads null. As for any expvar, publishing a name twice
// panics in expvar.Publish.
//
// The package does not import expvar itself: that import registers /debug/vars on
// http.DefaultServeMux and links net/http into every program, which is the program's choice.
func (w *Wheel) StatsVar() fmt.Stringer {
	return statsVar{weak.Make(w)}
}

// statsVar is the expvar.Var that StatsVar returns. Immutable.
type statsVar struct{ w weak.Pointer[Wheel] }

// String returns the JSON of a fresh Stats, or null once the wheel was collected.
func (v statsVar) String() string {
	w := v.w.Value()
	if w == nil {
		return "null"
	}
	b, err := json.Marshal(w.Stats())
	if err != nil { // Stats holds only integers: Marshal cannot fail
		panic(fmt.Sprintf("shardwheel: StatsVar: %v", err))
	}
	return string(b)
}
