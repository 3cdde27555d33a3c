package shardwheel_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sw "github.com/shardwheel/shardwheel"
)

// keyedTable is what Keyed replaces, and what each of its operations is measured against: the
// idle timeouts of a server's connections, written by hand as a map of *time.Timer under a
// mutex, with the value each timeout fires with stored beside its timer.
type keyedTable[K comparable, V any] struct {
	mu   sync.Mutex
	m    map[K]*keyedTableEntry[V]
	fire func(key K, value V)
}

type keyedTableEntry[V any] struct {
	t     *time.Timer
	value V
}

func newKeyedTable[K comparable, V any](fire func(K, V)) *keyedTable[K, V] {
	return &keyedTable[K, V]{m: map[K]*keyedTableEntry[V]{}, fire: fire}
}

// Set arms key, or re-arms it in place with the new value.
func (k *keyedTable[K, V]) Set(key K, value V, d time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e, ok := k.m[key]; ok && e.t.Stop() {
		e.value = value
		e.t.Reset(d)
		return
	}
	e := &keyedTableEntry[V]{value: value}
	e.t = time.AfterFunc(d, func() { k.expire(key, e) })
	k.m[key] = e
}

// Move re-arms an armed key; false if it is absent.
func (k *keyedTable[K, V]) Move(key K, d time.Duration) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.m[key]
	if !ok || !e.t.Stop() {
		return false
	}
	e.t.Reset(d)
	return true
}

// Remove disarms key; false if it was absent.
func (k *keyedTable[K, V]) Remove(key K) bool {
	k.mu.Lock()
	e, ok := k.m[key]
	delete(k.m, key)
	k.mu.Unlock()
	if ok {
		e.t.Stop()
	}
	return ok
}

// expire is a timer's callback: it fires if its entry is still the key's.
func (k *keyedTable[K, V]) expire(key K, e *keyedTableEntry[V]) {
	k.mu.Lock()
	if k.m[key] != e {
		k.mu.Unlock()
		return
	}
	delete(k.m, key)
	v := e.value
	k.mu.Unlock()
	k.fire(key, v)
}

// keyedOps is one implementation's operations, for BenchmarkKeyed.
type keyedOps struct {
	set    func(key, value int, d time.Duration)
	move   func(key int, d time.Duration) bool
	remove func(key int) bool
	close  func()
}

func newKeyedOps(b *testing.B, impl string, fire func(key, value int)) keyedOps {
	switch impl {
	case "keyed":
		w, err := sw.New()
		if err != nil {
			b.Fatal(err)
		}
		k := sw.NewKeyed(w, fire)
		return keyedOps{
			set: func(key, value int, d time.Duration) {
				if err := k.Set(key, value, d); err != nil {
					b.Error(err)
				}
			},
			move:   k.Move,
			remove: k.Remove,
			close:  func() { w.Stop() },
		}
	case "table":
		k := newKeyedTable(fire)
		return keyedOps{set: k.Set, move: k.Move, remove: k.Remove, close: func() {
			k.mu.Lock()
			for _, e := range k.m {
				e.t.Stop()
			}
			k.mu.Unlock()
		}}
	}
	b.Fatalf("no impl %q", impl)
	return keyedOps{}
}

// BenchmarkKeyed measures Keyed's operations on armed keys chosen at random from GOMAXPROCS
// goroutines, against the table a user writes instead (keyedTable), at 100k and 1M keys, with a
// value stored per key:
//   - set: Set of an armed key with a new value (a keep-alive that re-arms with fresh state);
//   - move: Move of an armed key (a keep-alive), also against a bare *time.Timer Reset held in
//     hand (impl=reset), which a server that keeps the timer in its connection struct pays;
//   - remove+set: Remove of an armed key and Set of it again (a connection closed, another
//     opened), which allocates in both;
//   - fire: per key, the cost of arming it due at once and its callback running with its value,
//     every key of the table at once (ns per key, wall time until the last one fired).
func BenchmarkKeyed(b *testing.B) {
	for _, keys := range []int{100_000, 1_000_000} {
		for _, op := range []string{"set", "move", "remove+set"} {
			impls := []string{"keyed", "table"}
			if op == "move" {
				impls = append(impls, "reset")
			}
			for _, impl := range impls {
				b.Run(fmt.Sprintf("op=%s/keys=%s/impl=%s", op, count(keys), impl), func(b *testing.B) {
					benchKeyedOp(b, op, impl, keys)
				})
			}
		}
		for _, impl := range []string{"keyed", "table"} {
			b.Run(fmt.Sprintf("op=fire/keys=%s/impl=%s", count(keys), impl), func(b *testing.B) {
				benchKeyedFire(b, impl, keys)
			})
		}
	}
}

// benchKeyedOp arms every key an hour out and times op on random armed keys.
func benchKeyedOp(b *testing.B, op, impl string, keys int) {
	if impl == "reset" {
		timers := make([]*time.Timer, keys)
		for i := range timers {
			timers[i] = time.AfterFunc(time.Hour, func() {})
		}
		defer func() {
			for _, t := range timers {
				t.Stop()
			}
		}()
		keyedLoop(b, keys, func(key, _ int) {
			if !timers[key].Reset(time.Hour) {
				b.Error("Reset of an armed timer reported false")
			}
		})
		return
	}
	k := newKeyedOps(b, impl, func(int, int) { b.Error("a key an hour out fired") })
	defer k.close()
	for i := range keys {
		k.set(i, i, time.Hour)
	}
	switch op {
	case "set":
		keyedLoop(b, keys, func(key, i int) { k.set(key, i, time.Hour) })
	case "move":
		keyedLoop(b, keys, func(key, _ int) {
			if !k.move(key, time.Hour) {
				b.Error("Move of an armed key reported false")
			}
		})
	case "remove+set":
		// Each goroutine owns the keys congruent to its index, so that a key it removed is
		// absent until it sets it again.
		keyedLoop(b, keys, func(key, i int) {
			if !k.remove(key) {
				b.Error("Remove of an armed key reported false")
			}
			k.set(key, i, time.Hour)
		})
	}
}

// keyedLoop runs op(key, i) b.N times over GOMAXPROCS goroutines, each on random keys of its
// own residue class modulo keyedStride (so that remove+set never meets another goroutine's
// removal of the same key).
func keyedLoop(b *testing.B, keys int, op func(key, i int)) {
	var ids atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := int(ids.Add(1) - 1)
		rng := rand.New(rand.NewPCG(uint64(g), 7))
		for i := g << 32; pb.Next(); i++ {
			op(rng.IntN(keys/keyedStride)*keyedStride+g%keyedStride, i)
		}
	})
}

// keyedStride is more than the goroutines RunParallel starts at the GOMAXPROCS measured here.
const keyedStride = 64

// benchKeyedFire arms every key due at once and reports the ns per key from the first arm to
// the last callback, which receives the key's value.
func benchKeyedFire(b *testing.B, impl string, keys int) {
	b.ReportAllocs()
	var total time.Duration
	for range b.N {
		var left atomic.Int64
		left.Store(int64(keys))
		done := make(chan struct{})
		k := newKeyedOps(b, impl, func(key, value int) {
			if value != key {
				b.Errorf("key %d fired with value %d", key, value)
			}
			if left.Add(-1) == 0 {
				close(done)
			}
		})
		t0 := time.Now()
		var wg sync.WaitGroup
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := g; i < keys; i += 2 {
					k.set(i, i, 0)
				}
			}()
		}
		wg.Wait()
		<-done
		total += time.Since(t0)
		k.close()
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N)/float64(keys), "ns/key")
	b.ReportMetric(0, "ns/op")
}
