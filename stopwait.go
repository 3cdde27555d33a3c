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

// stopFrame is one frame of a slot's stack. Guarded by Wheel.stopMu.
type stopFrame struct {
	drain bool // a chunk a Stop took from the queue (else a Stop)
	// excused: for a drain frame, a Stop that a callback of its chunk called has returned.
	excused bool
}

// markStop pushes (d > 0) or pops a Stop frame on worker mine's slot (if mine >= 0) and on the
// manual advancer's (if adv), and wakes those who wait. A Stop that returned (not one a
// runtime.Goexit unwound: review 45, the replacement goroutine runs callbacks the waiters must
// wait for) excuses what runs below it: the chunk of the drain frame it leaves on top, or with
// nothing below, the rest of the goroutine's callback and batch.
func (w *Wheel) markStop(mine int, adv bool, d int, returned bool) {
	w.stopMu.Lock()
	defer w.stopMu.Unlock()
	mark := func(k int) {
		if d > 0 {
			w.frames[k] = append(w.frames[k], &stopFrame{})
			return
		}
		fr := w.frames[k]
		fr[len(fr)-1] = nil
		fr = fr[:len(fr)-1]
		w.frames[k] = fr
		switch {
		case !returned:
		case len(fr) == 0:
			w.excused[k] = true
		case fr[len(fr)-1].drain:
			fr[len(fr)-1].excused = true
		}
	}
	if mine >= 0 {
		mark(mine)
	}
	if adv {
		mark(len(w.pool.done))
	}
	w.stopChangedLocked()
}

// batchOver ends worker k's excuse (markStop): its goroutine is back in its loop (work), or a
// runtime.Goexit ended it and a new one takes its place. Called only once Stop began.
func (w *Wheel) batchOver(k int) {
	w.stopMu.Lock()
	w.excused[k] = false
	w.stopMu.Unlock()
}

// pushDrain pushes a drain frame on slot k, before its Stop looks at the queue (drainOne).
func (w *Wheel) pushDrain(k int) {
	w.stopMu.Lock()
	w.frames[k] = append(w.frames[k], &stopFrame{drain: true})
	w.stopMu.Unlock()
}

// popDrain pops slot k's top frame, a drain frame whose chunk has run, and wakes those who wait.
func (w *Wheel) popDrain(k int) {
	w.stopMu.Lock()
	fr := w.frames[k]
	fr[len(fr)-1] = nil
	w.frames[k] = fr[:len(fr)-1]
	w.stopChangedLocked()
	w.stopMu.Unlock()
}

// stopChangedLocked wakes those who wait in awaitQuiet; the caller holds stopMu.
func (w *Wheel) stopChangedLocked() {
	close(w.stopChanged)
	w.stopChanged = make(chan struct{})
}

// quietLocked reports whether a waiter is done with slot k (see the top of this file); the
// caller holds stopMu.
func (w *Wheel) quietLocked(k int) bool {
	fr := w.frames[k]
	if len(fr) == 0 {
		return w.excused[k]
	}
	top := fr[len(fr)-1]
	return !top.drain || top.excused
}

// awaitQuiet waits until over is closed (worker k exited, or for the advancer's slot, advOver),
// or slot k is quiet.
func (w *Wheel) awaitQuiet(k int, over chan struct{}) {
	for {
		w.stopMu.Lock()
		quiet := w.quietLocked(k)
		changed := w.stopChanged
		w.stopMu.Unlock()
		if quiet {
			return
		}
		select {
		case <-over:
			return
		case <-changed:
		}
	}
}

// awaitExcused waits until done is closed (worker k exited) or worker k's stack is empty and its
// batch excused: the rest of the callback whose Stop returned, and of its batch, are not waited
// for (finishStop, review 48). Unlike quiet, a Stop on top is not enough: the first Stop waits
// once, and that Stop may still drain chunks.
func (w *Wheel) awaitExcused(k int, done chan struct{}) {
	for {
		w.stopMu.Lock()
		excused := len(w.frames[k]) == 0 && w.excused[k]
		changed := w.stopChanged
		w.stopMu.Unlock()
		if excused {
			return
		}
		select {
		case <-done:
			return
		case <-changed:
		}
	}
}
