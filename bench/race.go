//go:build race

package main

// raceFlag names the race detector in the report's command line: the pair figures of a -race
// build (`go -C bench run -race . -quick -only pairs@0`) are the cost users see under -race, not
// the library's cost, and must not be read as such.
const raceFlag = "-race "
