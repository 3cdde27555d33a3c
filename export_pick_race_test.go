//go:build race

package shardwheel

// Picker is the race build's picker (pick_race.go) on its own: the shard, of n, for a
// goroutine whose stack holds addr.
type Picker struct{ p picker }

func (p *Picker) ShardFor(addr uintptr, n uint32) uint32 { return p.p.shardFor(addr, n) }

// raceEnabled reports whether the tests run under the race detector (norace_test.go has the
// external package's).
const raceEnabled = true
