//go:build !race

package shardwheel_test

import (
	"testing"

	sw "github.com/shardwheel/shardwheel"
	"github.com/stretchr/testify/require"
)

// TestTokenMovesOnlyAfterRepeatedContention: a shard token keeps its shard through scattered
// lost CAS races (foreign Stops push to the timer's home shard and win some), moves only after
// ContentionLimit of them within one window of ContentionWindow arms, and then to another shard,
// chosen at random: over many moves from one shard, every other shard is reached.
func TestTokenMovesOnlyAfterRepeatedContention(t *testing.T) {
	const n = 8
	tok := sw.NewToken(3)
	for range 10 { // fewer than the limit in each window: never moves
		for range sw.ContentionLimit - 1 {
			require.False(t, tok.Lose(n))
		}
		for range sw.ContentionWindow {
			tok.Arm()
		}
		require.EqualValues(t, 3, tok.Shard())
	}
	for range sw.ContentionLimit - 1 {
		require.False(t, tok.Lose(n))
	}
	require.True(t, tok.Lose(n), "the limit within one window moves the token")
	require.NotEqualValues(t, 3, tok.Shard())

	seen := map[uint32]bool{}
	for range 1000 {
		tok := sw.NewToken(3)
		for !tok.Lose(n) {
		}
		require.NotEqualValues(t, 3, tok.Shard(), "a move goes to another shard")
		require.Less(t, tok.Shard(), uint32(n))
		seen[tok.Shard()] = true
	}
	require.Len(t, seen, n-1, "moves reach every other shard, not only the next one")
}
