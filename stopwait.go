package shardwheel

// What a later Stop from a callback waits for on the other goroutines that run callbacks
// (laterStop). Stop's doc: such a Stop waits for every other callback, but not for callbacks that
// are themselves inside a Stop, nor for the rest of them after that Stop returns (two callbacks
// that each waited for the other would never return).
//
// Each goroutine that runs callbacks (a worker, or the manual advancer) has a slot, and the slot
// a stack of frames, innermost last: a Stop called on that goroutine, or a chunk that a Stop on it
// took from the queue and runs (drainOne). Below every Stop frame runs a callback: the one that
// called the outermost Stop; for a Stop above a drain frame, a callback of that chunk; or a
// callback of an Advance that such a callback called (review 46: it is inside the Stop too).
// The top of the stack says what runs on that goroutine now:
//
//   - a Stop frame: no callback; each one below waits in a Stop.
//   - a drain frame: a callback of its chunk, one after another. Once a Stop that one of them
//     called has returned (the frame's excused), the rest of that callback and of its chunk are
//     not waited for: the callbacks that fired with a callback that was inside a Stop run after
//     that Stop returns, as on the goroutine's own batch below. Waiting for them would deadlock
//     a callback that, its Stop returned, waits for the waiter's Stop (review 47). Until then
//     they are waited for: they were handed to the pool.
//   - nothing: the goroutine's own callback and batch, or its loop. Once a Stop with nothing
//     below it has returned (Wheel.excused), the rest of that callback and batch are not waited
//     for (review 44), by any Stop, also one called after (review 50: a callback that, its Stop
//     returned, waits for a Stop that another callback calls later). The excuse ends with the
//     batch: a worker clears it when it comes back to its loop (work, batchOver), since what it
//     takes from the queue then was handed to the pool and is in no Stop.
//
// A waiter is done with a slot (quiet) when its top is a Stop frame or an excused chunk or batch.
// A frame below the top is a Stop, or a chunk whose callback is in the Stop above it, excused as
// long as that Stop runs and, once it returned, by its own excused. A chunk that a Stop takes
// from the queue later pushes a frame of its own, which the waiter's second look (laterStop step
// 4) sees: the queue only shrinks once Stop began, and the waiter empties it before that look.

// stopFrame is one frame of a slot's stack (a value in Wheel.frames). Guarded by Wheel.stopMu.
type stopFrame struct {
	drain bool // a chunk a Stop took from the queue (else a Stop)
	// excused: for a drain frame, a Stop that a callback of its chunk called has returned.
	excused bool
}

// enterStop pushes a Stop frame on worker mine's slot (if mine >= 0) and on the manual
// advancer's (if adv), and wakes those who wait: a slot with a Stop on top is quiet.
func (w *Wheel) enterStop(mine int, adv bool) {
	w.stopMu.Lock()
	defer w.stopMu.Unlock()
	if mine >= 0 {
		w.frames[mine] = append(w.frames[mine], stopFrame{})
	}
	if adv {
		w.frames[len(w.pool.done)] = append(w.frames[len(w.pool.done)], stopFrame{})
	}
	w.stopChangedLocked()
}

// leaveStop pops the Stop frames enterStop pushed, and wakes those who wait. A Stop that returned
// (not one a runtime.Goexit unwound: review 45, the replacement goroutine runs callbacks the
// waiters must wait for) excuses what runs below it: the chunk of the drain frame it leaves on
// top, or with nothing below, the rest of the goroutine's callback and batch.
func (w *Wheel) leaveStop(mine int, adv bool, returned bool) {
	w.stopMu.Lock()
	defer w.stopMu.Unlock()
	if mine >= 0 {
		w.popLocked(mine, returned)
	}
	if adv {
		w.popLocked(len(w.pool.done), returned)
	}
	w.stopChangedLocked()
}

// popLocked pops slot k's top frame; excuse says whether what runs below it is excused (a
// Stop that returned; a drain frame, whose chunk ran, excuses nothing). The caller holds stopMu.
func (w *Wheel) popLocked(k int, excuse bool) {
	fr := w.frames[k][:len(w.frames[k])-1]
	w.frames[k] = fr
	switch {
	case !excuse:
	case len(fr) == 0:
		w.excused[k] = true
	case fr[len(fr)-1].drain:
		fr[len(fr)-1].excused = true
	}
}

// batchOver ends worker k's excuse (leaveStop): its goroutine is about to take a chunk from the
// queue in its loop (work), or a runtime.Goexit ended it and a new one takes its place. Called
// only once Stop began. It wakes nobody: the slot only gets busier.
func (w *Wheel) batchOver(k int) {
	w.stopMu.Lock()
	w.excused[k] = false
	w.stopMu.Unlock()
}

// pushDrain pushes a drain frame on slot k, before its Stop looks at the queue (drainOne). It
// wakes nobody: the slot only gets busier.
func (w *Wheel) pushDrain(k int) {
	w.stopMu.Lock()
	w.frames[k] = append(w.frames[k], stopFrame{drain: true})
	w.stopMu.Unlock()
}

// popDrain pops slot k's top frame, a drain frame whose chunk has run, and wakes those who wait.
func (w *Wheel) popDrain(k int) {
	w.stopMu.Lock()
	w.popLocked(k, false)
	w.stopChangedLocked()
	w.stopMu.Unlock()
}

// stopChangedLocked wakes those who wait in awaitSlot; the caller holds stopMu.
func (w *Wheel) stopChangedLocked() {
	close(w.stopChanged)
	w.stopChanged = make(chan struct{})
}

// quietLocked reports whether a later Stop is done with slot k (see the top of this file): the
// top frame is a Stop, or an excused chunk or batch. The caller holds stopMu.
func (w *Wheel) quietLocked(k int) bool {
	fr := w.frames[k]
	if len(fr) == 0 {
		return w.excused[k]
	}
	top := fr[len(fr)-1]
	return !top.drain || top.excused
}

// excusedLocked reports whether the first Stop is done with worker k (finishStop, review 48):
// nothing on its stack, and its batch excused. Unlike quiet, a Stop on top is not enough: the
// first Stop looks once, and that Stop may still drain chunks. The caller holds stopMu.
func (w *Wheel) excusedLocked(k int) bool {
	return len(w.frames[k]) == 0 && w.excused[k]
}

// awaitSlot waits until over is closed (worker k exited, or for the advancer's slot, advOver)
// or done(k) holds (quietLocked or excusedLocked). It reads done(k) and the channel to wait on
// under one hold of stopMu, and every change that can make done(k) true closes that channel
// (leaveStop, popDrain, and enterStop for quiet), so a change between the read and the wait is
// never missed.
func (w *Wheel) awaitSlot(k int, over chan struct{}, done func(int) bool) {
	for {
		w.stopMu.Lock()
		ok := done(k)
		changed := w.stopChanged
		w.stopMu.Unlock()
		if ok {
			return
		}
		select {
		case <-over:
			return
		case <-changed:
		}
	}
}
