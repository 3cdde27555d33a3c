package shardwheel

import (
	"fmt"
	"math/bits"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
)

// ctxPayload is a value big enough that a weak pointer to it tells whether a context is kept.
type ctxPayload [64 << 10]byte

// collected reports whether p's value has been collected, after two GCs (the second one frees
// what a finaliser or a weak pointer's first cycle kept).
func collected(p weak.Pointer[ctxPayload]) bool {
	runtime.GC()
	runtime.GC()
	return p.Value() == nil
}

// keptArg returns what the first linked entry of w that still has a callback or an argument
// keeps (its argument, or "f kept"), or nil if none does. After Stop every entry still linked is
// dropped, or stopped with its cancel command refused by the closed ring.
func keptArg(w *Wheel) any {
	for _, s := range w.shards {
		s.mu.Lock()
		var arg any
		s.tw.forEach(func(e *entry) {
			if arg == nil && (e.arg != nil || e.f != nil) {
				arg = e.arg
				if arg == nil {
					arg = "f kept"
				}
			}
		})
		s.mu.Unlock()
		if arg != nil {
			return arg
		}
	}
	return nil
}

// resetAheadOfAdd drives TestEveryRearmResetEarlier's interleaving up to the worker's add: the
// Every's worker, having re-armed the entry for 20 ms, is blocked on the shard's mutex inside its
// send; a Reset to 13 ms sends its command and notes 13 ms; an advance of the shard takes the
// command (ignored: the entry is not linked yet) and publishes the wheel's own next. It returns
// with ev.s.mu held; the caller goes on, lets go of mu, and waits for the add (waitAddSent).
func resetAheadOfAdd(t *testing.T) (*Wheel, *ManualClock, Timer, *atomic.Int32) {
	t.Helper()
	w, clk, ev, runs, held := everyStuckInSend(t)
	s := ev.s
	s.mu.Lock()
	waitBlockedInSend(t)
	held.Publish()
	s.drainLocked() // the two cancels: two slots free, and the worker waits for mu
	require.True(t, ev.Reset(3*time.Millisecond), "due at 13 ms")
	require.LessOrEqual(t, s.next.Load(), int64(13*time.Millisecond))
	s.advanceLocked(w.nanos(), 0) // as a manual round does for the shard (nothing is due at 10 ms)
	return w, clk, ev, runs
}

// waitAddSent waits until the worker blocked in its send has published its add and noted its
// deadline: the shard's next, never after resetAheadOfAdd's advance, moves.
func waitAddSent(t *testing.T, s *shard) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); s.next.Load() == never; {
		require.True(t, time.Now().Before(deadline), "the worker never sent its add")
		time.Sleep(time.Millisecond)
	}
}

// holdReset is Timer.Reset(d) paused right after its hold (pending -> resetting), as preemption
// or a GC assist can pause it: it has read the clock (the new deadline) and holds the entry.
// finish is the rest of Reset (finishReset): the store of the deadline, the release with a new
// version, and the command if the deadline is earlier.
func holdReset(t *testing.T, tm Timer, d time.Duration) (finish func()) {
	t.Helper()
	e := tm.s.slab.at(tm.i)
	when := tm.s.w.deadline(d)
	w, ok := tm.hold(e)
	require.True(t, ok, "timer not pending")
	return func() { tm.finishReset(e, w, when) }
}

// armOn is schedule on shard k (internal tests): the tests choose the shard instead of the P's token.
func armOn(t *testing.T, w *Wheel, k int, d time.Duration, f func(any), arg any) Timer {
	s := w.shards[k]
	i, e, gen := s.slab.newEntry(false)
	if e == nil {
		t.Fatal("slab full")
	}
	e.f, e.arg = f, arg
	when := w.deadline(d)
	e.when.Store(when)
	if ok, _ := s.send(i, gen, opAdd); !ok {
		t.Fatal("closed")
	}
	s.scheduled.Inc()
	s.noteDeadline(when)
	return Timer{s: s, i: i, gen: gen}
}

// pausePoint pauses the first goroutine that reaches it until release is closed; later ones
// pass. The rig closes release when the test ends, so that a failed test does not hang.
type pausePoint struct {
	once             sync.Once
	reached, release chan struct{}
	releaseOnce      sync.Once
}

// unpause lets the paused goroutine go on (once; later calls do nothing).
func (p *pausePoint) unpause() { p.releaseOnce.Do(func() { close(p.release) }) }

func newPausePoint() *pausePoint {
	return &pausePoint{reached: make(chan struct{}), release: make(chan struct{})}
}

func (p *pausePoint) pause() {
	first := false
	p.once.Do(func() { first = true })
	if first {
		close(p.reached)
		<-p.release
	}
}

// wait fails the test unless ch delivers within 5 s.
func waitKeyed(t *testing.T, ch <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal(why)
	}
}

// everyStuckInSend builds the real pause of a worker between its re-arm CAS (running ->
// pending|queued) and its add: a one-slot ring whose only slot is held by a paused Stop of
// another timer, so the worker's send finds the ring full and waits for that publish. It
// returns the Every's timer, its run counter, the held slot and the manual clock.
func everyStuckInSend(t *testing.T) (*Wheel, *ManualClock, Timer, *atomic.Int32, *heldSlots) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(1), WithShards(1), WithRingSize(2), WithTick(time.Millisecond))
	require.NoError(t, err)
	var runs atomic.Int32
	ran := make(chan struct{}, 16)
	ev, err := w.Every(10*time.Millisecond, func() { runs.Add(1); ran <- struct{}{} })
	require.NoError(t, err)
	held := &heldSlots{}
	var others [2]Timer
	for k := range others {
		others[k], err = w.AfterFunc(time.Hour, func() {})
		require.NoError(t, err)
	}
	for k := range held {
		ok, h := others[k].StopHeld() // drains, then holds one of the ring's two slots
		require.True(t, ok)
		require.NotNil(t, h)
		held[k] = h
	}
	clk.Advance(10 * time.Millisecond) // the Every fires; the worker runs it and re-arms
	<-ran
	e := ev.s.slab.at(ev.i)
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := e.state.Load()
		if isState(st, stPending) && isQueued(st) {
			break
		}
		require.True(t, time.Now().Before(deadline), "the worker never re-armed (state %#x)", st)
		time.Sleep(time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond) // the worker is in its send, spinning on the full ring
	require.True(t, ev.Queued())
	ev.s.mu.Lock()
	require.Equal(t, ev.s.head+2, commands(ev.s), "only the two held slots are claimed: the re-arm's add is not")
	ev.s.mu.Unlock()
	return w, clk, ev, &runs, held
}

// heldSlots is the ring's two slots, held by paused Stops.
type heldSlots [2]*Held

func (h *heldSlots) Publish() {
	for _, x := range h {
		x.Publish()
	}
}

// parkWheel is a one-shard wheel on a manual clock whose callbacks run inside Advance.
func parkWheel(t *testing.T) (*Wheel, *ManualClock, func() time.Duration) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(WithClock(clk), WithWorkers(0), WithShards(1), WithTick(time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	return w, clk, func() time.Duration { return clk.Now().Sub(time.Unix(0, 0)) }
}

// isParked reports whether tm's entry is linked in the held bucket.
func isParked(w *Wheel, tm Timer) bool {
	s := tm.s
	s.mu.Lock()
	defer s.mu.Unlock()
	lv, _, _, ok := s.tw.position(s.slab.at(tm.i))
	return ok && lv == heldLv
}

func requireBalanced(t *testing.T, w *Wheel) {
	t.Helper()
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "counters: %+v", st)
}

// strongBare is strongVerify's bucket check for a bare wheel: every linked entry sits in a bucket
// that comes due no later than its deadline's tick (or than elapsed, for a deadline already
// behind it). verify checks level 0's bound only; this checks every level, the overflow, the
// cascade in progress and the soon buckets (eachLinked).
func strongBare(w *timingWheel) error {
	return eachLinked(w, func(where string, startTick int64, _ uint32, e *entry) error {
		if when := e.when.Load(); startTick > max(when/w.tick, w.elapsed) {
			return fmt.Errorf("%s: entry due %d (tick %d) in a bucket starting at %d (elapsed %d)",
				where, when, when/w.tick, startTick, w.elapsed)
		}
		return nil
	})
}

// sysShard returns a one-shard wheel on the system clock whose shard the test holds claimed
// (ownerAdvancing): the keeper never collects it, so the test drives shard.expire's system
// branch by hand with readings of its choice (ahead of the true clock: deadlines are an hour
// out, so the wheel's own time never reaches them). drive is one advanceLocked step under mu;
// run runs what it fired as a worker would. The cleanup frees the claim and stops the wheel.
func sysShard(t *testing.T) (w *Wheel, s *shard, drive func(now int64, budget int) bool, run func() int) {
	t.Helper()
	w, err := New(WithShards(1), WithWorkers(1), WithTick(time.Millisecond))
	require.NoError(t, err)
	s = w.shards[0]
	for !s.owner.CompareAndSwap(ownerNone, ownerAdvancing) {
		time.Sleep(time.Millisecond)
	}
	var batch []ref
	drive = func(now int64, budget int) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		require.Nil(t, s.w.manual)
		done := s.advanceLocked(now, budget)
		batch = append(batch, s.fired...)
		clear(s.fired)
		s.fired = s.fired[:0]
		require.NoError(t, s.tw.verify())
		require.NoError(t, strongBare(&s.tw))
		return done
	}
	run = func() int {
		n := len(batch)
		w.runBatch(batch, &w.pool.slots[len(w.pool.done)])
		clear(batch)
		batch = batch[:0]
		return n
	}
	t.Cleanup(func() {
		s.owner.Store(ownerNone)
		w.publishGroup(s)
		w.Stop()
	})
	return w, s, drive, run
}

// cascShard arms n timers about an hour out in one bucket of level 3 on a sysShard, and drives
// one budgeted step at that bucket's start, so that the rest of the bucket is in casc. It returns
// the timers, their deadlines, the reading reached, and the callbacks' record of the reading at
// which each ran (by index).
func cascShard(t *testing.T, n, budget int) (w *Wheel, s *shard, drive func(now int64, budget int) bool, run func() int,
	tms []Timer, cur *int64, ran map[int][]int64) {
	w, s, drive, run = sysShard(t)
	cur = new(int64)
	ran = map[int][]int64{}
	// Deadlines from one hour on, 7 ms apart: one level-3 bucket (262144 ticks, about 4.4 min).
	base := (w.nanos()+int64(time.Hour))/w.tick/(1<<18)*(1<<18) + (1 << 18) // a level-3 start
	for k := 0; k < n; k++ {
		k := k
		d := time.Duration(base*w.tick + int64(k)*7*w.tick + w.tick/2 - w.nanos())
		tm, err := w.AfterFunc(d, func() { ran[k] = append(ran[k], *cur) })
		require.NoError(t, err)
		tms = append(tms, tm)
	}
	*cur = base*w.tick - 1 // everything before the bucket: cascades it into level 3's bucket
	for !drive(*cur, 0) {
	}
	s.mu.Lock()
	lv, _, _, _ := s.tw.position(s.slab.at(tms[0].i))
	s.mu.Unlock()
	require.Equal(t, 3, lv, "the timers are in one bucket of level 3")
	*cur = base * w.tick
	require.False(t, drive(*cur, budget), "the cascade takes more than one step")
	require.Zero(t, run())
	return
}

// resetAt resets timer k of a cascShard test to fire at the instant at (ns on w's clock, or the
// first after it that a Reset from now can reach) and records its new deadline in due.
func resetAt(t *testing.T, w *Wheel, tms []Timer, due map[int]int64, k int, at int64) {
	t.Helper()
	require.True(t, tms[k].Reset(time.Duration(at-w.nanos())), "timer %d", k)
	due[k] = tms[k].s.slab.at(tms[k].i).when.Load()
}

// inCasc reports whether tm's entry is linked in casc.
func inCasc(tm Timer) bool {
	s := tm.s
	s.mu.Lock()
	defer s.mu.Unlock()
	lv, _, _, ok := s.tw.position(s.slab.at(tm.i))
	return ok && lv == cascLv
}

// requireStoppedBooks checks the books of a quiet, stopped wheel, and that what its Stops returned
// in total is Dropped.
func requireStoppedBooks(t *testing.T, w *Wheel, stopReturned int) {
	t.Helper()
	st := w.Stats()
	require.Equal(t, uint64(stopReturned), st.Dropped, "Dropped is the sum of what Stop returned")
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending),
		"Scheduled == Fired + Stopped + Dropped + Pending: %+v", st)
	require.Equal(t, st.Fired, st.Lateness.Count())
}

// requireWorkersExited checks, right after an outside Stop returned, that every worker had
// exited (closed its done channel) by then, and that their goroutines are gone: one may still be
// in its last instructions after it closed its done channel.
func requireWorkersExited(t *testing.T, w *Wheel) {
	t.Helper()
	for i, d := range w.pool.done {
		require.True(t, isClosed(d), "worker %d had not exited when Stop returned", i)
	}
	require.Eventually(t, func() bool { return WorkerGoroutines(w) == 0 }, 5*time.Second, time.Millisecond)
}

// waitUntil waits for cond, failing the test with what after 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(100 * time.Microsecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("timed out waiting: %s", what)
		}
	}
}

// requireBooks checks Scheduled == Fired + Stopped + Dropped + Pending and Lateness.Count() ==
// Fired on a quiet wheel, and returns the Stats it read.
func requireBooks(t *testing.T, w *Wheel) Stats {
	t.Helper()
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "%+v", st)
	require.Equal(t, st.Fired, st.Lateness.Count(), "%+v", st)
	return st
}

// requireQuietBooks checks the books of a quiet wheel (API.md, Introspection), Queued 0 included.
func requireQuietBooks(t *testing.T, w *Wheel) Stats {
	t.Helper()
	st := w.Stats()
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped+uint64(st.Pending), "%+v", st)
	require.Equal(t, st.Fired, st.Lateness.Count(), "%+v", st)
	require.Zero(t, st.Queued, "%+v", st)
	return st
}

// freeCredits sums WithMaxPending's free credits: the reserve and every shard's stock.
func freeCredits(w *Wheel) int64 {
	n := w.credit.Load()
	for _, s := range w.shards {
		n += s.credit.Load()
	}
	return n
}

// newManualWheel returns a wheel on a fresh manual clock at the Unix epoch, stopped at the end of the
// test.
func newManualWheel(t *testing.T, opts ...Option) (*Wheel, *ManualClock) {
	t.Helper()
	clk := NewManualClock(time.Unix(0, 0))
	w, err := New(append([]Option{WithClock(clk)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { w.Stop() })
	return w, clk
}

// commands returns how many commands were ever pushed to s's ring.
func commands(s *shard) uint64 { return s.ring.tail.Load() &^ ringClosed }

// strongVerify checks one shard; the caller holds nothing.
func strongVerify(s *shard) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strongVerifyLocked(s)
}

// strongVerifyLocked is strongVerify for a caller that holds s.mu.
func strongVerifyLocked(s *shard) error {
	next := s.next.Load()
	tail := s.ring.tail.Load() &^ ringClosed
	// Published reset commands, by entry and gen; and the first unpublished position.
	resets := map[[2]uint64]bool{}
	firstHole := tail
	for pos := s.head; pos < tail; pos++ {
		sl := &s.ring.slots[pos&s.ring.mask]
		if sl.seq.Load() != pos+1 {
			if firstHole == tail {
				firstHole = pos
			}
			continue
		}
		i, cmd := sl.i, sl.cmd
		gen := cmd >> opBits
		e := s.slab.at(i)
		st := e.state.Load()
		if cmd&opMask == opReset {
			resets[[2]uint64{uint64(i), gen}] = true
		}
		if pos < firstHole && cmd&opMask != opCancel && isGen(st, gen) && isState(st, stPending) {
			if when := e.when.Load(); next > when {
				return fmt.Errorf("ring pos %d (head %d): op %d of entry %d due %d, but the shard's next is %d (lost wake-up)",
					pos, s.head, cmd&opMask, i, when, next)
			}
		}
	}
	tw := &s.tw
	check := func(where string, startTick int64, i uint32, e *entry) error {
		st := e.state.Load()
		if !isState(st, stPending) {
			return nil // held by a Reset (its new deadline may not be stored), or stopped, awaiting its cancel
		}
		when := e.when.Load()
		if startTick > max(when/tw.tick, tw.elapsed) && !resets[[2]uint64{uint64(i), genOf(st)}] {
			return fmt.Errorf("%s: pending entry %d due %d (tick %d) linked in a bucket starting at tick %d (elapsed %d), no reset command in the ring",
				where, i, when, when/tw.tick, startTick, tw.elapsed)
		}
		if next > when && !resets[[2]uint64{uint64(i), genOf(st)}] {
			return fmt.Errorf("%s: pending entry %d due %d, shard next %d", where, i, when, next)
		}
		return nil
	}
	return eachLinked(tw, check)
}

// eachLinked calls fn for each entry linked in w's levels, its cascade in progress and its
// soon buckets (not the held one), with where it is and the tick its bucket starts at (a soon
// bucket's: elapsed), until fn returns an error, which it returns.
func eachLinked(w *timingWheel, fn func(where string, startTick int64, i uint32, e *entry) error) error {
	walk := func(b *bucket, where string, startTick int64) error {
		for _, h := range b.lanes {
			for i := h; i != 0; {
				e := w.slab.at(i)
				if err := fn(where, startTick, i, e); err != nil {
					return err
				}
				i = e.next
			}
		}
		return nil
	}
	for lv := 0; lv < numLevels; lv++ {
		for occ := w.occupied[lv]; occ != 0; occ &= occ - 1 {
			sl := bits.TrailingZeros64(occ)
			b := &w.buckets[lv][sl]
			if err := walk(b, fmt.Sprintf("level %d slot %d", lv, sl), b.start); err != nil {
				return err
			}
		}
	}
	if err := walk(&w.casc, "cascade", w.casc.start); err != nil {
		return err
	}
	for f := range w.soon {
		if err := walk(&w.soon[f], fmt.Sprintf("soon %d", f), w.elapsed); err != nil {
			return err
		}
	}
	return nil
}

func strongVerifyAll(w *Wheel) error {
	for k, s := range w.shards {
		if err := strongVerify(s); err != nil {
			return fmt.Errorf("shard %d: %w", k, err)
		}
	}
	return nil
}

// waitBlockedInSend waits until a goroutine running runPeriodic is blocked on a shard's
// mutex inside send (its ring full): it cannot claim a slot until the holder of mu lets go.
func waitBlockedInSend(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); ; {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "runPeriodic") && strings.Contains(g, "(*shard).send") &&
				strings.Contains(g, "Mutex") && strings.Contains(g, "Semacquire") {
				return
			}
		}
		require.True(t, time.Now().Before(deadline), "the worker never blocked on mu in send")
		time.Sleep(time.Millisecond)
	}
}

// requireWithin fails the test with why unless ch delivers within 5 s: a deadlock shows as a
// failure, not as a test binary that hangs until its timeout.
func requireWithin(t *testing.T, ch <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal(why)
	}
}
