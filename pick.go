//go:build !race

package shardwheel

import (
	"math/rand/v2"
	"sync"

	"go.uber.org/atomic"
)

// picker maps the caller's P to a shard, per Wheel.
//
// Tokens live in a sync.Pool, whose per-P caches hand each P back the token it last put, so the
// goroutines of one P keep to one shard without touching a cache line shared by all producers.
// The pool may hand a token to another P (it steals, and drops its caches at GC), and two Ps may
// then share a shard. A shard's ring tells: a push that lost a CAS on the ring's tail to another
// producer (send's contended) counts against the token. One lost CAS means little: Stop and
// Reset push to a timer's home shard from whatever P they run on, so a shard's owner loses some
// to foreign cancels wherever it goes. contentionLimit of them within contentionWindow arms move
// the token to another shard chosen at random (as xsync's striped counters rehash), not to the
// next one, whose owner the +1 step would then collide with in turn.
//
// A token is taken and put back within takeShard, never held across anything that blocks (the
// ring's drain takes the shard's mutex and may yield): the P's next goroutine finds it there.
//
// Fields: tokens and seq are used by any producer; seq is written only when the pool has no
// token for a P (its first arms, after a GC). A token is owned by whoever took it from the pool.
type picker struct {
	tokens sync.Pool
	seq    atomic.Uint32 // tokens made so far: consecutive shards for the first Ps
}

// shardToken is one P's shard and its contention window.
type shardToken struct {
	shard uint32 // index into Wheel.shards
	arms  uint32 // arms counted in the current window
	lost  uint32 // of those, arms whose push lost a CAS race for the ring's tail
}

const (
	contentionWindow = 256 // arms per window
	contentionLimit  = 8   // lost CAS races within one window that move a token
)

// takeShard returns the shard the caller arms its timer on.
func (w *Wheel) takeShard() *shard {
	n := uint32(len(w.shards))
	if n == 1 {
		return w.shards[0]
	}
	t, _ := w.pick.tokens.Get().(*shardToken)
	if t == nil {
		t = &shardToken{shard: (w.pick.seq.Inc() - 1) % n}
	}
	t.arm()
	s := w.shards[t.shard]
	w.pick.tokens.Put(t)
	return s
}

// noteContention records that the caller's arm on s lost a CAS race for s's ring. It counts
// against the caller's token if that token still names s (the caller may have moved to another
// P since takeShard, whose token then names another shard and is left alone).
func (w *Wheel) noteContention(s *shard) {
	t, _ := w.pick.tokens.Get().(*shardToken)
	if t == nil {
		return
	}
	if w.shards[t.shard] == s {
		t.lose(uint32(len(w.shards)))
	}
	w.pick.tokens.Put(t)
}

// arm counts one arm in the token's window, opening a new window after contentionWindow.
func (t *shardToken) arm() {
	if t.arms++; t.arms >= contentionWindow {
		t.arms, t.lost = 0, 0
	}
}

// lose counts one lost CAS race; the contentionLimit-th within a window moves the token to
// another of the n shards (n >= 2), chosen at random, and reports true.
func (t *shardToken) lose(n uint32) bool {
	if t.lost++; t.lost < contentionLimit {
		return false
	}
	t.shard = (t.shard + 1 + rand.Uint32N(n-1)) % n // any shard but this one
	t.arms, t.lost = 0, 0
	return true
}
