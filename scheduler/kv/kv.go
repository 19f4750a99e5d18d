// Package kv is the store Envoy's shared data offers, as everything under
// scheduler/ writes through it: a table of keys shared by every worker VM
// of one Envoy, with compare-and-swap and no delete. The wire format's
// writer and cache, the prefix index and flow control's admission record
// all use this one interface; the plugin adapts the Proxy-Wasm calls to it
// once (plugin/internal/shareddata), and tests use in-memory stores.
package kv

import (
	"errors"
	"sync"
)

// Store is one table of shared data. Get returns a copy of the value,
// appended to buf[:0] (so a caller may reuse buf's storage), with its CAS
// token; an unknown key is ErrNotFound. Set with a non-zero cas fails with
// ErrCASMismatch when the key changed since that cas was read; cas 0, or a
// new key, always writes.
type Store interface {
	Get(key string, buf []byte) (value []byte, cas uint32, err error)
	Set(key string, value []byte, cas uint32) error
}

// Store outcomes.
var (
	ErrNotFound    = errors.New("shared data: key not found")
	ErrCASMismatch = errors.New("shared data: cas mismatch")
)

// MemStore is a Store in process memory with the rules of Envoy's shared
// data as e2e/envoyhost/shareddata.go emulates them: one CAS counter for
// the whole table, starting at 1; a Set with cas 0 or on a new key always
// writes; no delete. The fleet benchmark gives it to the worker VMs of one
// simulated Envoy; tests and native benchmarks use it. The zero value is
// ready; it is safe for concurrent use.
type MemStore struct {
	mu   sync.Mutex
	cas  uint32
	vals map[string]memValue
	// BeforeSet, if set, runs before every Set (outside the lock): tests
	// use it to interleave another writer at the worst moment.
	BeforeSet func(key string)
	// Gets and Sets count calls, GotBytes the bytes Get copied; read them
	// when no call is running.
	Gets, Sets, GotBytes int64
}

type memValue struct {
	b   []byte
	cas uint32
}

// Get implements Store.
func (m *MemStore) Get(key string, buf []byte) ([]byte, uint32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Gets++
	v, ok := m.vals[key]
	if !ok {
		return nil, 0, ErrNotFound
	}
	m.GotBytes += int64(len(v.b))
	return append(buf[:0], v.b...), v.cas, nil
}

// Set implements Store; it stores a copy of value.
func (m *MemStore) Set(key string, value []byte, cas uint32) error {
	if m.BeforeSet != nil {
		m.BeforeSet(key)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Sets++
	if m.vals == nil {
		m.vals = map[string]memValue{}
	}
	v, ok := m.vals[key]
	if ok && cas != 0 && v.cas != cas {
		return ErrCASMismatch
	}
	m.cas++
	if m.cas == 0 {
		m.cas = 1
	}
	// Get hands out copies, so the old value's storage can be reused.
	m.vals[key] = memValue{b: append(v.b[:0], value...), cas: m.cas}
	return nil
}

// Keys counts the keys and their bytes.
func (m *MemStore) Keys() (keys, bytes int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, v := range m.vals {
		keys++
		bytes += len(v.b)
	}
	return keys, bytes
}

// Bytes is what the table holds, keys and values.
func (m *MemStore) Bytes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, v := range m.vals {
		n += len(k) + len(v.b)
	}
	return n
}

// Each calls f with every key and value, in no particular order.
func (m *MemStore) Each(f func(key string, value []byte)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, v := range m.vals {
		f(k, v.b)
	}
}
