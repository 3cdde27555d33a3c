//go:build !race

package main

// raceFlag is empty in a normal build; see race.go.
const raceFlag = ""
