//go:build !race

package shardwheel

// Token is a shard token of pick.go, for testing its contention window.
type Token struct{ t shardToken }

const (
	ContentionWindow = contentionWindow
	ContentionLimit  = contentionLimit
)

func NewToken(shard uint32) *Token  { return &Token{shardToken{shard: shard}} }
func (t *Token) Arm()               { t.t.arm() }
func (t *Token) Lose(n uint32) bool { return t.t.lose(n) }
func (t *Token) Shard() uint32      { return t.t.shard }

// raceEnabled reports whether the tests run under the race detector (norace_test.go has the
// external package's).
const raceEnabled = false
