// Package hosttest holds what tests of the real .wasm in e2e/envoyhost
// share: a clock the test moves (the guests' clocks read it) and a
// read-only view of the host's shared data as a router VM reads it.
package hosttest

import (
	"errors"
	"sync"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/envoyhost"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Clock is a host clock the test sets: the guests' realtime clock reads
// it, so the test decides staleness; timers run in real time.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock starts a clock at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d (which may be negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// AfterFunc runs f after d of real time.
func (c *Clock) AfterFunc(d time.Duration, f func()) envoyhost.Timer { return time.AfterFunc(d, f) }

// Store reads a host's shared data for one vm_id (scheduler/wire.Store);
// it never writes.
type Store struct {
	Host *envoyhost.Host
	VMID string
}

// Get reads key.
func (s Store) Get(key string, buf []byte) ([]byte, uint32, error) {
	v, cas, ok := s.Host.SharedData(s.VMID, key)
	if !ok {
		return nil, 0, wire.ErrNotFound
	}
	return append(buf[:0], v...), cas, nil
}

// Set refuses: tests look, the plugin writes.
func (Store) Set(string, []byte, uint32) error { return errors.New("hosttest.Store is read only") }

// Snapshot reads the endpoints a router VM with the default key prefix
// would schedule on.
func Snapshot(h *envoyhost.Host, vmID string) (*scheduler.Snapshot, error) {
	snap, _, err := wire.NewCache(wire.NewKeys(wire.DefaultKeyPrefix), wire.Limits{}).Refresh(Store{Host: h, VMID: vmID})
	return snap, err
}
