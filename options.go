package shardwheel

import (
	"fmt"
	"log"
	"runtime"
	"runtime/debug"
	"time"
)

// Limits on option values. They exist so that a typo (a ring of 1<<40 slots, a million shards)
// fails at New with a message instead of exhausting memory.
const (
	maxShards    = 1 << 12
	maxWorkers   = 1 << 16
	maxRingSize  = 1 << 24
	maxQueueSize = 1 << 26
	// maxRingSlots bounds the slots of every shard's ring together (1.5 GiB): each option alone
	// is within its limit at 4096 shards of 1<<24 slots, which would ask for 1.5 TiB.
	maxRingSlots = 1 << 26
)

// Defaults for the options, chosen for a server that arms a timeout per RPC.
const (
	defaultTick      = time.Millisecond
	defaultRingSize  = 1024 // commands a shard buffers before a producer drains it itself
	defaultQueueSize = 8192 // callbacks waiting for a worker before the FullPolicy applies
)

// FullPolicy says what the caller of ManualClock.Advance does when the worker pool's queue is
// full. On the system clock the dispatchers are the workers themselves, and a worker that finds
// the queue full runs the callbacks itself under either policy (that is its wait for room).
// No policy loses a callback.
type FullPolicy int

const (
	// Block makes the dispatcher wait for room in the queue. Timers keep their order, and
	// nothing is lost; while it waits, later timers are dispatched late.
	Block FullPolicy = iota
	// CallerRuns makes the dispatching goroutine run the callback itself.
	CallerRuns
)

// String returns the policy's name.
func (p FullPolicy) String() string {
	switch p {
	case Block:
		return "Block"
	case CallerRuns:
		return "CallerRuns"
	}
	return fmt.Sprintf("FullPolicy(%d)", int(p))
}

// An Option configures a Wheel in New. An invalid value makes New return an error that names the
// option and the value.
type Option func(*options) error

// options is the validated configuration of a Wheel; immutable after New.
type options struct {
	tick       time.Duration
	shards     int
	workers    int
	queueSize  int
	policy     FullPolicy
	ringSize   int
	maxPending int
	clock      Clock
	onPanic    func(recovered any)
}

// check reports the options that are invalid together though each is valid alone.
func (o *options) check() error {
	if slots := int64(o.shards) * int64(ringSlots(o.ringSize)); slots > maxRingSlots {
		return fmt.Errorf("shardwheel: WithShards(%d) with WithRingSize(%d): %d ring slots in all, more than %d",
			o.shards, o.ringSize, slots, maxRingSlots)
	}
	return nil
}

func defaultOptions() options {
	procs := runtime.GOMAXPROCS(0)
	return options{
		tick:      defaultTick,
		shards:    procs,
		workers:   procs,
		queueSize: defaultQueueSize,
		policy:    Block,
		ringSize:  defaultRingSize,
		clock:     systemClock{},
		onPanic:   logPanic,
	}
}

// logPanic is the default panic handler: the value and the stack of the callback that panicked.
func logPanic(recovered any) {
	log.Printf("shardwheel: timer callback panicked: %v\n%s", recovered, debug.Stack())
}

// optionError formats the error for an invalid option value.
func optionError(option string, value any, why string) error {
	return fmt.Errorf("shardwheel: %s(%v): %s", option, value, why)
}

// durationArg prints a duration as it was likely written: 0 as "0", others as time.Duration does.
func durationArg(d time.Duration) any {
	if d == 0 {
		return 0
	}
	return d
}

// WithTick sets the resolution of the wheel's lowest level (default 1ms): the width of a bucket.
// Deadlines are not rounded to it: a bucket comes due at its earliest deadline, and what is later
// in its tick waits for its own moment (wheel.go), so a timer fires at its deadline plus the
// wake-up's delay (at most tick/16 more, the grain a wake inside a tick is rounded to), never
// before. A coarser tick makes fewer, fuller buckets and fewer cascades. It must be positive.
func WithTick(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return optionError("WithTick", durationArg(d), "tick must be positive")
		}
		o.tick = d
		return nil
	}
}

// WithShards sets the number of shards (default runtime.GOMAXPROCS(0)), each with its own ring and
// wheel. It must be between 1 and 4096.
func WithShards(n int) Option {
	return func(o *options) error {
		if n < 1 || n > maxShards {
			return optionError("WithShards", n, fmt.Sprintf("shards must be between 1 and %d", maxShards))
		}
		o.shards = n
		return nil
	}
}

// WithWorkers sets the number of goroutines that keep time and run callbacks (default
// runtime.GOMAXPROCS(0)); the wheel starts no other. 0 runs callbacks on the goroutine that
// advances time: the wheel's one goroutine, or the caller of ManualClock.Advance; a slow
// callback then delays every later timer. With n >= 2, a callback that blocks holds up no timer
// but those of its own batch: another worker keeps time meanwhile.
func WithWorkers(n int) Option {
	return func(o *options) error {
		if n < 0 || n > maxWorkers {
			return optionError("WithWorkers", n, fmt.Sprintf("workers must be between 0 and %d", maxWorkers))
		}
		o.workers = n
		return nil
	}
}

// WithQueueSize bounds the worker pool's queue of callbacks waiting for a worker (default 8192).
// When it is full, the FullPolicy applies. It must be at least 1.
func WithQueueSize(n int) Option {
	return func(o *options) error {
		if n < 1 || n > maxQueueSize {
			return optionError("WithQueueSize", n, fmt.Sprintf("queue size must be between 1 and %d", maxQueueSize))
		}
		o.queueSize = n
		return nil
	}
}

// WithFullPolicy sets what happens when the worker pool's queue is full (default Block).
func WithFullPolicy(p FullPolicy) Option {
	return func(o *options) error {
		if p != Block && p != CallerRuns {
			return optionError("WithFullPolicy", p, "policy must be Block or CallerRuns")
		}
		o.policy = p
		return nil
	}
}

// WithRingSize sets the capacity of each shard's command ring (default 1024), rounded up to a
// power of two, and to 2 at least. A producer that finds the ring full drains it into the wheel
// itself, so a small ring costs speed, never timers. It must be at least 1.
func WithRingSize(n int) Option {
	return func(o *options) error {
		if n < 1 || n > maxRingSize {
			return optionError("WithRingSize", n, fmt.Sprintf("ring size must be between 1 and %d", maxRingSize))
		}
		o.ringSize = n
		return nil
	}
}

// WithMaxPending limits the number of pending timers; scheduling past it returns an error that
// names the limit and is an ErrTooManyTimers (errors.Is). 0 (the default) means no limit.
//
// The bound is exact: never more than n timers are pending, with no slack. It is striped over
// the shards (a stock of free places per shard, refilled from a reserve in batches of up to 256),
// so that the scheduling path writes no counter shared by all producers. The price is on the
// other side of the bound: while goroutines move places between shards, a call may be refused
// with a few fewer than n pending; once the wheel is quiet, n timers are always accepted.
func WithMaxPending(n int) Option {
	return func(o *options) error {
		if n < 0 {
			return optionError("WithMaxPending", n, "max pending must be 0 (no limit) or positive")
		}
		o.maxPending = n
		return nil
	}
}

// WithClock sets the time source (default: the system's monotonic clock). Tests pass a
// *ManualClock to move time by hand.
func WithClock(c Clock) Option {
	return func(o *options) error {
		if c == nil {
			return optionError("WithClock", "nil", "clock must not be nil")
		}
		switch m := c.(type) {
		case *ManualClock:
			if m == nil {
				return optionError("WithClock", "(*ManualClock)(nil)", "clock must not be nil")
			}
		case systemClock:
		default:
			// A type that embeds a *ManualClock (or a systemClock) has the method set too, but
			// the wheel keeps time by the clock's dynamic type (New): it would read the system
			// clock while its contexts read this one.
			return optionError("WithClock", fmt.Sprintf("%T", c), "clock must be a *ManualClock or the default clock, not a type that embeds one")
		}
		o.clock = c
		return nil
	}
}

// WithPanicHandler sets the function that receives the value recovered from a panicking callback
// (default: log it with its stack). It runs on the goroutine that ran the callback; a panic in the
// handler itself is recovered and logged.
func WithPanicHandler(h func(recovered any)) Option {
	return func(o *options) error {
		if h == nil {
			return optionError("WithPanicHandler", "nil", "handler must not be nil")
		}
		o.onPanic = h
		return nil
	}
}
