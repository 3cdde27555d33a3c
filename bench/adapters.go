package main

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	sw "github.com/shardwheel/shardwheel"
	"github.com/zeromicro/go-zero/core/collection"
)

// Impl is the one small interface every timer implementation is measured through. Every
// implementation runs the same callback (fire) with the same Rec, at the same delays, from the
// same goroutines.
type Impl interface {
	// Schedule arranges for fire(r) to run once, d from now.
	Schedule(d time.Duration, r *Rec) (Handle, error)
	// ScheduleFunc arranges for f, a closure made for this timer that calls fire(r), to run
	// once, d from now: the way most programs arm a timer.
	ScheduleFunc(d time.Duration, r *Rec, f func()) (Handle, error)
	// Stop reports whether this call prevented fire from running.
	Stop(h Handle) bool
	// Reset re-arms a still-pending timer to fire d from now and reports true; when the timer
	// already fired or was stopped it reports false and arms nothing.
	Reset(h Handle, d time.Duration) bool
	// Close discards the still-pending timers (pending lists the harness's handles to them) and
	// ends every goroutine the implementation started.
	Close(pending []Handle)
}

// Handle is what Schedule returns: a value, so that no implementation pays an allocation for
// the adapter. Each implementation uses its own fields.
type Handle struct {
	rec *Rec
	sw  sw.Timer
	rt  *time.Timer
	seq int32 // go-zero: rec.fires when scheduled
}

// Kind names one implementation; the order is the order of the columns in every table.
type Kind int

const (
	Runtime Kind = iota // the Go runtime's time.AfterFunc: the baseline of every ratio
	Shardwheel
	GoZero
	numKinds
)

// String is the column title.
func (k Kind) String() string {
	return [...]string{"time.AfterFunc", "shardwheel", "go-zero TimingWheel"}[k]
}

// key is the short name used in JSON.
func (k Kind) key() string { return [...]string{"runtime", "shardwheel", "gozero"}[k] }

// goZeroSlots and goZeroTick configure go-zero's wheel; set from flags.
var (
	goZeroTick  = time.Millisecond
	goZeroSlots = 1024
)

// swTick is shardwheel's tick in this run (-tick); 0 keeps the library's default (1 ms).
var swTick time.Duration

// swOptions are the options every shardwheel instance of the run is made with.
func swOptions() []sw.Option {
	if swTick > 0 {
		return []sw.Option{sw.WithTick(swTick)}
	}
	return nil
}

// newImpl starts a fresh instance of kind k.
func newImpl(k Kind) (Impl, error) {
	switch k {
	case Runtime:
		return runtimeImpl{}, nil
	case Shardwheel:
		w, err := sw.New(swOptions()...)
		if err != nil {
			return nil, err
		}
		return &swImpl{w: w}, nil
	case GoZero:
		tw, err := collection.NewTimingWheel(goZeroTick, goZeroSlots, goZeroFire)
		if err != nil {
			return nil, err
		}
		return &goZeroImpl{tw: tw}, nil
	}
	return nil, fmt.Errorf("unknown implementation %d", k)
}

// runtimeImpl is time.AfterFunc with the Rec's prebuilt func (one allocation: the *time.Timer).
type runtimeImpl struct{}

func (runtimeImpl) Schedule(d time.Duration, r *Rec) (Handle, error) {
	return Handle{rec: r, rt: time.AfterFunc(d, r.fn)}, nil
}

func (runtimeImpl) ScheduleFunc(d time.Duration, r *Rec, f func()) (Handle, error) {
	return Handle{rec: r, rt: time.AfterFunc(d, f)}, nil
}

func (runtimeImpl) Stop(h Handle) bool { return h.rt.Stop() }

// Reset stops first: time.Timer.Reset alone would re-arm a timer that already fired.
func (runtimeImpl) Reset(h Handle, d time.Duration) bool {
	if !h.rt.Stop() {
		return false
	}
	h.rt.Reset(d)
	return true
}

// Close stops every pending timer: the runtime would otherwise keep them until they fire.
func (runtimeImpl) Close(pending []Handle) {
	for _, h := range pending {
		h.rt.Stop()
	}
}

// swImpl is a shardwheel Wheel with default options, scheduled through AfterFuncArg with one
// reused func value and the Rec pointer as the argument (the zero-allocation path).
type swImpl struct{ w *sw.Wheel }

// swFire is the one func value every shardwheel timer uses.
var swFire = func(arg any) { fire(arg.(*Rec)) }

func (s *swImpl) Schedule(d time.Duration, r *Rec) (Handle, error) {
	t, err := s.w.AfterFuncArg(d, swFire, r)
	return Handle{rec: r, sw: t}, err
}

func (s *swImpl) ScheduleFunc(d time.Duration, r *Rec, f func()) (Handle, error) {
	t, err := s.w.AfterFunc(d, f)
	return Handle{rec: r, sw: t}, err
}

func (s *swImpl) Stop(h Handle) bool                   { return h.sw.Stop() }
func (s *swImpl) Reset(h Handle, d time.Duration) bool { return h.sw.Reset(d) }
func (s *swImpl) Close([]Handle)                       { s.w.Stop() }

// goZeroImpl is go-zero's collection.TimingWheel. Its API is keyed and reports nothing, so:
//   - the Rec pointer is the key (unique per timer, boxed without allocation);
//   - d <= 0 becomes 1ns (go-zero rejects d <= 0; it rounds anything below one tick up to a tick);
//   - Stop calls RemoveTimer and reports true when the callback had not run by the time
//     RemoveTimer returned (the wheel goroutine has accepted the removal then). If the callback
//     runs after that, it is counted as "Stop said true, callback ran": a defect a user would see.
//   - Reset is MoveTimer, reporting true on the same terms.
type goZeroImpl struct{ tw *collection.TimingWheel }

func goZeroFire(key, _ any) { fire(key.(*Rec)) }

func (g *goZeroImpl) Schedule(d time.Duration, r *Rec) (Handle, error) {
	if d <= 0 {
		d = 1
	}
	seq := r.fires.Load()
	return Handle{rec: r, seq: seq}, g.tw.SetTimer(r, nil, d)
}

// ScheduleFunc is Schedule: go-zero's callback is one func for the whole wheel.
func (g *goZeroImpl) ScheduleFunc(d time.Duration, r *Rec, _ func()) (Handle, error) {
	return g.Schedule(d, r)
}

func (g *goZeroImpl) Stop(h Handle) bool {
	if g.tw.RemoveTimer(h.rec) != nil {
		return false
	}
	return h.rec.fires.Load() == h.seq
}

func (g *goZeroImpl) Reset(h Handle, d time.Duration) bool {
	if d <= 0 {
		d = 1
	}
	if h.rec.fires.Load() != h.seq || g.tw.MoveTimer(h.rec, d) != nil {
		return false
	}
	return h.rec.fires.Load() == h.seq
}

func (g *goZeroImpl) Close([]Handle) { g.tw.Stop() }

// closeImpl closes im and clears the handles: a handle keeps its timer reachable, and a
// stale one would charge this implementation's memory to the next one measured.
func closeImpl(im Impl, pending []Handle) {
	im.Close(pending)
	clear(pending)
	quiesce()
}

// quiesce makes every P of the runtime go through its timer check a few times. A stopped
// runtime timer stays in its P's heap (a "zombie") until that P next adjusts its heap; after a
// million time.Timer.Stop calls, that clean-up would otherwise land in the next
// implementation's measurement (seen as 3 to 16 ms/s of "idle" CPU charged to it).
func quiesce() {
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) * 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
}
