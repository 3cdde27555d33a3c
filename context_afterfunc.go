package shardwheel

// The list of callbacks a deadlineCtx runs when it ends: registrations through its AfterFunc
// method (how context.AfterFunc and the standard library's children attach without a goroutine)
// and child deadlineCtx of this wheel, linked directly.

// afterFunc is one callback to run when a deadlineCtx ends: a registration through its AfterFunc
// method (f), or a child deadlineCtx (child). f and child are immutable; prev and next are
// guarded by the mu of the context whose list holds the node. A node is in the list, waiting, if
// and only if it is the head or has a prev; nodes leave with prev == nil.
type afterFunc struct {
	prev, next *afterFunc
	f          func()
	child      *deadlineCtx
}

// AfterFunc arranges for f to be called when c ends, and returns a func that cancels the
// arrangement, reporting whether it stopped f from being called. It is the method that
// context.AfterFunc and the standard library's children use instead of a goroutine per child.
// f runs on the goroutine that ends c, after Done is closed and before a CancelFunc returns, so it
// must not block (the standard library passes funcs that cancel a child context, and
// context.AfterFunc wraps user funcs in a goroutine of their own). If c has already ended, f is
// called at once in a new goroutine, as context.AfterFunc does.
func (c *deadlineCtx) AfterFunc(f func()) (stop func() bool) {
	n := &afterFunc{f: f}
	if !c.addAfterFunc(n) {
		go f()
		return func() bool { return false }
	}
	return func() bool { return c.removeAfterFunc(n) }
}

// addAfterFunc links n into c's list and reports true, or reports false if c has ended. It
// takes c.mu. The afters bit is set after linking and under mu: an ender whose CAS saw the bit
// takes the list (under mu, so after this call); one whose CAS came first made our Or see its end
// code, and then n is unlinked again and left to the caller.
func (c *deadlineCtx) addAfterFunc(n *afterFunc) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aftersDone {
		return false
	}
	n.next = c.afters
	if n.next != nil {
		n.next.prev = n
	}
	c.afters = n
	if old := c.state.Or(ctxAfters); old&endMask != 0 {
		c.unlinkLocked(n)
		return false
	}
	return true
}

// removeAfterFunc unlinks n if it is still waiting and reports whether it did. It takes c.mu.
func (c *deadlineCtx) removeAfterFunc(n *afterFunc) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n.prev == nil && c.afters != n {
		return false // started, or stopped before
	}
	c.unlinkLocked(n)
	return true
}

// unlinkLocked removes n from c's list. c.mu must be held.
func (c *deadlineCtx) unlinkLocked(n *afterFunc) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		c.afters = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	}
	n.prev, n.next = nil, nil
}

// runAfterFuncs takes the whole list under mu, closes it to later registrations, and calls each
// node with no lock held. Taken nodes get prev == nil under mu, so their stop funcs report false
// from then on and nobody else touches their next pointers.
func (c *deadlineCtx) runAfterFuncs() {
	c.mu.Lock()
	head := c.afters
	c.afters, c.aftersDone = nil, true
	for n := head; n != nil; n = n.next {
		n.prev = nil
	}
	c.mu.Unlock()
	for n := head; n != nil; {
		next := n.next
		if n.child != nil {
			n.child.endFromParent()
		} else {
			n.f()
		}
		n = next
	}
}
