package prom_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test stops the wheels it starts: goleak fails the package if a goroutine is left.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
