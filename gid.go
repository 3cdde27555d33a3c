package shardwheel

import (
	"runtime"
	"strconv"
	"sync"
)

// goid returns the current goroutine's id, parsed from the header of runtime.Stack
// ("goroutine 123 [running]:"). It costs about a microsecond, so it is used only where a goroutine
// must know whether it is one of the wheel's own: at their start, in Wheel.Stop and in
// ManualClock.Advance, which must not wait for themselves.
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	const prefix = "goroutine "
	if len(b) <= len(prefix) {
		return 0
	}
	b = b[len(prefix):]
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	id, _ := strconv.ParseInt(string(b[:i]), 10, 64)
	return id
}

// goroutineSet is a set of goroutine ids that any goroutine may use.
type goroutineSet struct {
	mu  sync.Mutex // taken alone, never with another lock
	ids map[int64]struct{}
}

func (s *goroutineSet) add(g int64) {
	s.mu.Lock()
	if s.ids == nil {
		s.ids = map[int64]struct{}{}
	}
	s.ids[g] = struct{}{}
	s.mu.Unlock()
}

func (s *goroutineSet) remove(g int64) {
	s.mu.Lock()
	delete(s.ids, g)
	s.mu.Unlock()
}

func (s *goroutineSet) has(g int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ids[g]
	return ok
}
