package retrybudget

import (
	"sort"
	"sync"
	"time"
)

// Clock is the client's source of time: the refresher, leases, fallback buckets and the
// retry helpers' backoffs read it and wait on it, so tests move time instead of sleeping.
// Implementations must be safe for concurrent use.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer whose channel receives once Now() has advanced by d.
	NewTimer(d time.Duration) Timer
}

// Timer is a Clock's timer.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; false when it already fired or was stopped.
	Stop() bool
}

// RealClock is the process's clock (time.Now, time.NewTimer).
func RealClock() Clock { return realClock{} }

type realClock struct{}

type realTimer struct{ t *time.Timer }

func (realClock) Now() time.Time                 { return time.Now() }
func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }
func (r realTimer) C() <-chan time.Time          { return r.t.C }
func (r realTimer) Stop() bool                   { return r.t.Stop() }

// FakeClock is a Clock that moves only when told to (Advance, Set): tests drive leases,
// refills and backoffs without sleeping. Safe for concurrent use.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

// NewFakeClock starts at `start`.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

type fakeTimer struct {
	clock *FakeClock
	at    time.Time
	ch    chan time.Time
	done  bool
}

// Now is the fake time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer fires once the fake time reaches Now() + d (at once if d <= 0).
func (c *FakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{clock: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		t.done = true
		t.ch <- c.now
		return t
	}
	c.timers = append(c.timers, t)
	return t
}

// Timers is the number of timers waiting to fire (for tests: "a goroutine is waiting").
func (c *FakeClock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Advance moves the time forward by d and fires the timers due.
func (c *FakeClock) Advance(d time.Duration) { c.Set(c.Now().Add(d)) }

// Set moves the time to t (never backwards) and fires the timers due.
func (c *FakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
	sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
	kept := c.timers[:0]
	for _, ft := range c.timers {
		if !ft.at.After(c.now) {
			ft.done = true
			ft.ch <- c.now
		} else {
			kept = append(kept, ft)
		}
	}
	c.timers = kept
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	for i, ft := range c.timers {
		if ft == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			break
		}
	}
	return true
}
