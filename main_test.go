package shardwheel_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test that starts a wheel must stop it: goleak fails the package if any goroutine the
// wheel started is still alive when the tests end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
