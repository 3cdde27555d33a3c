//go:build race

package shardwheel_test

// raceEnabled reports whether the tests run under the race detector, which makes every atomic
// and channel operation many times slower: loop counts shrink accordingly.
const raceEnabled = true
