package shardwheel

import (
	"sync"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
)

// Keyed is a set of timers named by key, one per key: the idle timeout of each connection, the
// lease of each session. Each key is either absent or armed; an armed key fires once, with the
// value of its latest Set, and is absent from then on. It is safe for use by any number of
// goroutines, also on the same keys at once (the keep-alive storm of a busy connection).
//
// The map is xsync's MapOf: lock-free Load, which keeps Move (the hot path of a keep-alive)
// free of locks and allocation, and Compute, an atomic read-modify-write of one key under its
// bucket's lock, which the protocol below needs and sync.Map lacks.
//
// The per-key protocol. An arming is one *keyedTimer: its key and its Timer never change; its
// value changes only when a Set re-arms it in place (step 0). Every decision about a key
// (install, supersede, remove, fire) is a Compute on that key, so decisions on one key are
// serialised by its bucket lock; every call into the wheel (AfterFuncArg, Reset, Stop) is made
// outside that lock, so a callback that waits for the bucket lock never waits for the wheel. The
// map maps a key to its current arming. An arming is installed at most once and, once
// displaced, is never current again; whoever displaces an arming stops its timer, after its
// Compute.
//  0. Set of an armed key first tries to re-arm its current arming in place, with no allocation:
//     under the arming's mu it Resets the timer and, only if that succeeded, stores the value.
//     A callback reads the value under mu after its decision, so it fires with the value of the
//     Set whose Reset came last before it. A failed Reset (the timer came due, or was stopped)
//     changes nothing, and Set goes on to step 1; no later Reset of that timer succeeds, so the
//     arming's value is then final. A Reset that succeeds on an arming that a concurrent Set,
//     Move, Remove or callback (step 2) has just displaced, before its Stop, is harmless: that Set
//     is ordered before the displacement, whose Stop of the arming follows (or whose callback
//     finds it displaced). mu is never held with a bucket lock, nor while a callback runs.
//  1. Set arms a new arming (its timer may fire at once, even before step 2), then installs it
//     with Compute and stops the one it displaced, if any. A displaced arming whose callback has
//     started finds in its Compute that it is no longer current and does not fire. If the new
//     arming has already fired (step 2), the Compute leaves the map as it is.
//  2. The callback of arming a, in its Compute: if a is current, it deletes the key and fires;
//     if a was displaced, it does nothing. If a is not installed yet (its Set or Move is between
//     arming it and its Compute), a fires in place of its Set's or Move's install:
//     - a Set's arming fires, marks itself fired, and displaces the arming the key maps to, if
//     any: it deletes the key and stops that arming's timer. That arming was installed before
//     the fire, so the Set is ordered after it, and it must not fire after a (an older value,
//     last); what is current when the Set's Compute then finds the mark was installed after
//     the fire, by a Set or Move ordered after it, and stays.
//     - a Move's arming (a.prev set) does the same if a.prev is still current; otherwise it does
//     nothing, as its Move will not install it (step 3).
//  3. Move loads the current arming a without a lock and Resets its timer: the common path, with
//     no lock and no allocation. If the Reset fails and the key maps to another arming, a was
//     displaced: Move retries on that one. If the key is absent, Move reports false. If the key
//     still maps to a, a's timer has come due (or the Wheel is stopped) but its callback has not
//     decided: the key is armed (Len counts it, Remove would cancel it), a false would precede
//     the fire, and a caller who took it for "fired" and Set the key again would cancel that
//     fire. So Move arms b with a's final value and b.prev = a, d from now; then, in a
//     Compute on the key:
//     - a is still current: Move installs b (clearing b.prev) and then stops a, whose callback,
//     if it has started, finds a displaced. Move reports true.
//     - b has fired, in a's place (step 2): Move reports true; the key was re-armed and fired.
//     - otherwise a's callback fired it, or a Set, Move, Remove or Drain displaced it, before
//     this Compute: Move stops b (whose callback, if it has started, finds b.prev gone for good
//     and does nothing) and starts over; a false that follows is ordered after that fire or
//     removal, and a true re-arms what displaced a.
//     If the wheel refuses b (stopped, or past WithMaxPending), Move reports false and changes
//     nothing.
//  4. Remove deletes the key (whatever arming it maps to), Drain deletes it with Compute if it
//     still maps to the arming Drain saw; then they stop that arming's timer. Its callback, if
//     it has started, finds the arming displaced.
//
// Each arming so fires at most once: when it is current at the moment its callback decides, or
// when, not installed yet, it fires in place of the current arming (for a Move's, only of the one
// it re-arms). Then the key is absent, until a later Set.
type Keyed[K comparable, V any] struct {
	w       *Wheel
	fire    func(key K, value V) // immutable
	onTimer func(arg any)        // immutable: k.expire as one func value, so arming allocates no closure
	m       *xsync.MapOf[K, keyedSlot[K, V]]
}

// keyedSlot is what the map holds for a key: its current arming, and that arming's Timer, copied
// beside it so that Move re-arms without reading the arming itself (one cache miss fewer on the
// keep-alive path). The Timer never changes after the arming is installed.
type keyedSlot[K comparable, V any] struct {
	a *keyedTimer[K, V]
	t Timer
}

// slot returns the map's value for arming a, whose timer is set.
func (a *keyedTimer[K, V]) slot() keyedSlot[K, V] { return keyedSlot[K, V]{a: a, t: a.timer} }

// keyedTimer is one arming of a key. key is immutable; timer is written by Set or Move before
// the arming is installed (so every reader that found it in the map sees it) and never again;
// value is guarded by mu (written by step 0 or before the arming is published, read by the
// callback, Move and Drain under mu); prev is written before the arming is published and then
// guarded by the map's bucket lock for key, as installed and fired are (touched only inside
// Compute on key).
type keyedTimer[K comparable, V any] struct {
	key   K
	timer Timer
	mu    sync.Mutex
	value V
	// prev is the arming that the Move which armed this one re-arms (step 3), nil for a Set's.
	// It is cleared when the arming is installed, so that a chain of Moves keeps no old value
	// reachable.
	prev      *keyedTimer[K, V]
	installed bool
	fired     bool
}

// load returns a's value, under its mu.
func (a *keyedTimer[K, V]) load() V {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.value
}

// reArm re-arms a in place with value, d from now, and reports whether it did (step 0): only if
// its timer is still pending, which Reset decides. The value is stored after the Reset, under
// mu, so a callback that starts in between waits for it.
func (a *keyedTimer[K, V]) reArm(value V, d time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.timer.Reset(d) {
		return false
	}
	a.value = value
	return true
}

// NewKeyed returns an empty Keyed on w that calls fire(key, value) on w's worker pool when an
// armed key's time comes. It panics if w or fire is nil: a Keyed that can never fire is a bug
// at the call site, as time.AfterFunc's nil func is.
func NewKeyed[K comparable, V any](w *Wheel, fire func(key K, value V)) *Keyed[K, V] {
	if w == nil {
		panic("shardwheel: NewKeyed: nil *Wheel")
	}
	if fire == nil {
		panic("shardwheel: NewKeyed: nil fire func")
	}
	k := &Keyed[K, V]{w: w, fire: fire, m: xsync.NewMapOf[K, keyedSlot[K, V]]()}
	k.onTimer = k.expire
	return k
}

// Set arms key to fire with value d from now, or, if key is armed, re-arms it with the new
// value and delay in its place (the old arming never fires). d <= 0 fires as soon as possible.
// It returns the wheel's error, ErrClosed after Stop or ErrTooManyTimers past WithMaxPending,
// and then changes nothing. Set of an armed key re-arms its timer in place: it allocates
// nothing and needs no room under WithMaxPending, as Move. Set of an absent key (or of one whose
// timer has come due but not fired yet) arms a new timer: it allocates (the arming and the
// map's entry) and needs room for one more timer (the new arming is armed before the old one,
// if any, is stopped). Set does not block on the wheel.
func (k *Keyed[K, V]) Set(key K, value V, d time.Duration) error {
	if cur, ok := k.m.Load(key); ok && cur.a.reArm(value, d) {
		return nil
	}
	a := &keyedTimer[K, V]{key: key, value: value}
	t, err := k.w.AfterFuncArg(d, k.onTimer, a)
	if err != nil {
		return err
	}
	a.timer = t
	if testHookKeyedArmed != nil {
		testHookKeyedArmed(false) // tests only: a Set paused between arming a and installing it
	}
	var old keyedSlot[K, V]
	k.m.Compute(key, func(cur keyedSlot[K, V], loaded bool) (keyedSlot[K, V], bool) {
		if a.fired {
			// a fired before it was installed, and its callback displaced what was current
			// then; what is current now came after that fire, and stays (step 2).
			return cur, !loaded
		}
		old = cur // the zero slot when !loaded
		a.installed = true
		return a.slot(), false
	})
	old.t.Stop() // the zero Timer's Stop does nothing
	return nil
}

// Move re-arms key to fire d from now with the value it has, and reports true; it reports false,
// and does nothing, if key is absent (never set, removed, drained or fired). A key whose timer
// has come due but whose fire has not happened yet is still armed: Move re-arms it, and it
// fires d from now, not before. Move allocates nothing and takes no lock, except for such a key:
// then it arms a new timer in its place, as Set of an absent key does (it allocates and needs
// room for one more timer), and if the wheel refuses that timer (after Stop, past
// WithMaxPending, or with its shard's slab full) Move reports false and changes nothing: the key
// fires as it would have (or, after Stop, waits for Drain). Move does not block on the wheel.
func (k *Keyed[K, V]) Move(key K, d time.Duration) bool {
	s, ok := k.m.Load(key)
	for ok {
		if s.t.Reset(d) {
			return true
		}
		cur, ok2 := k.m.Load(key)
		if ok2 && cur.a == s.a {
			// Still current, and its timer came due: its callback has not decided (step 3).
			moved, retry := k.replace(s.a, d)
			if !retry {
				return moved
			}
			cur, ok2 = k.m.Load(key)
		}
		s, ok = cur, ok2 // displaced: retry on the current arming, if any
	}
	return false
}

// testHookKeyedArmed and testHookKeyedExpire, set only by tests, run in Set and in replace
// (with move true) right after a new arming is armed, before its Compute, and in expire before
// its Compute (with the arming): a goroutine paused there.
var (
	testHookKeyedArmed  func(move bool)
	testHookKeyedExpire func(arg any)
)

// replace is Move's slow path (step 3): a was current after its Reset failed. It arms b in a's
// place, d from now, with a's value, and reports moved (the key was re-armed), or retry if a was
// no longer current by the time of its Compute (b is then stopped, and never fires).
func (k *Keyed[K, V]) replace(a *keyedTimer[K, V], d time.Duration) (moved, retry bool) {
	if k.w.closed.Load() {
		return false, false // every Reset fails after Stop: refuse before allocating
	}
	b := &keyedTimer[K, V]{key: a.key, value: a.load(), prev: a}
	t, err := k.w.AfterFuncArg(d, k.onTimer, b)
	if err != nil {
		return false, false // the wheel is stopped or full: a stays as it is
	}
	b.timer = t
	if testHookKeyedArmed != nil {
		testHookKeyedArmed(true) // tests only: a Move paused between arming b and installing it
	}
	installed := false
	k.m.Compute(a.key, func(cur keyedSlot[K, V], loaded bool) (keyedSlot[K, V], bool) {
		switch {
		case loaded && cur.a == a:
			b.installed, b.prev, installed = true, nil, true
			return b.slot(), false
		case b.fired:
			moved = true // b fired in a's place; its callback displaced and stopped a
		}
		return cur, !loaded
	})
	switch {
	case installed:
		a.timer.Stop()
		return true, false
	case moved:
		return true, false
	}
	b.timer.Stop()
	return false, true
}

// Remove disarms key and reports true, or reports false if key was absent. A key whose callback
// has started but not yet decided is removed and does not fire; one that has fired is absent.
func (k *Keyed[K, V]) Remove(key K) bool {
	cur, ok := k.m.LoadAndDelete(key)
	if ok {
		cur.t.Stop()
	}
	return ok
}

// Len returns the number of armed keys.
func (k *Keyed[K, V]) Len() int { return k.m.Size() }

// Drain disarms every armed key and calls fn(key, value) for each, on the calling goroutine,
// instead of letting it fire; it returns how many it disarmed. fn may be nil. Keys set while
// Drain runs (or moved while their timer comes due, which arms a new timer) may or may not be
// drained. After the Wheel is stopped, keys never fire, and Drain is how to collect them (on
// shutdown, say, to close every idle connection).
func (k *Keyed[K, V]) Drain(fn func(key K, value V)) int {
	n := 0
	k.m.Range(func(key K, s keyedSlot[K, V]) bool {
		a := s.a
		if !k.take(a) {
			return true // displaced or fired meanwhile
		}
		a.timer.Stop()
		n++
		if fn != nil {
			fn(key, a.load())
		}
		return true
	})
	return n
}

// take deletes a's key if it still maps to a, and reports whether it did.
func (k *Keyed[K, V]) take(a *keyedTimer[K, V]) bool {
	took := false
	k.m.Compute(a.key, func(cur keyedSlot[K, V], loaded bool) (keyedSlot[K, V], bool) {
		if loaded && cur.a == a {
			took = true
			return keyedSlot[K, V]{}, true
		}
		return cur, !loaded
	})
	return took
}

// expire is the timer callback of every arming (step 2 of the protocol).
func (k *Keyed[K, V]) expire(arg any) {
	if testHookKeyedExpire != nil {
		testHookKeyedExpire(arg) // tests only: a callback paused before its decision
	}
	a := arg.(*keyedTimer[K, V])
	fire := false
	var displaced keyedSlot[K, V]
	k.m.Compute(a.key, func(cur keyedSlot[K, V], loaded bool) (keyedSlot[K, V], bool) {
		switch {
		case loaded && cur.a == a:
			fire = true
			return keyedSlot[K, V]{}, true
		case a.installed:
			// displaced: nothing
		case a.prev == nil || (loaded && cur.a == a.prev):
			// Not installed yet: a Set's arming, or a Move's whose prev is current, fires in
			// place of the current arming, which it displaces.
			a.fired, fire = true, true
			if loaded {
				displaced = cur
				return keyedSlot[K, V]{}, true
			}
		}
		return cur, !loaded
	})
	displaced.t.Stop() // the zero Timer's Stop does nothing
	if fire {
		k.fire(a.key, a.load())
	}
}
