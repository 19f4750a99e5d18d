package wire

import (
	"sync"
	"time"
)

// MemStore is an in-memory Store with the semantics of Envoy's shared data
// (as e2e/envoyhost/shareddata.go emulates them): one CAS counter for all
// keys; a set with cas 0 or on a new key always succeeds; no delete. Safe
// for concurrent use. Tests and native benchmarks use it.
type MemStore struct {
	mu   sync.Mutex
	cas  uint32
	vals map[string]memValue
	// BeforeSet, if set, runs before every Set (outside the lock): tests
	// use it to interleave another writer at the worst moment.
	BeforeSet func(key string)
}

type memValue struct {
	b   []byte
	cas uint32
}

// Get returns a copy of the value, read into buf when it fits.
func (m *MemStore) Get(key string, buf []byte) ([]byte, uint32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.vals[key]
	if !ok {
		return nil, 0, ErrNotFound
	}
	return append(buf[:0], v.b...), v.cas, nil
}

// Set stores a copy of value.
func (m *MemStore) Set(key string, value []byte, cas uint32) error {
	if m.BeforeSet != nil {
		m.BeforeSet(key)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.vals == nil {
		m.vals = map[string]memValue{}
	}
	v, ok := m.vals[key]
	if ok && cas != 0 && v.cas != cas {
		return ErrCASMismatch
	}
	m.cas++
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

// Each calls f with every key and value, in no particular order.
func (m *MemStore) Each(f func(key string, value []byte)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, v := range m.vals {
		f(k, v.b)
	}
}

// Fill stores one agent's endpoints in st as the receiver would store its
// push at now (keys under prefix): for tests and benchmarks that fill
// shared data directly.
func Fill(st Store, prefix, agentID string, seq uint64, eps []EndpointState, now time.Time) error {
	w := NewWriter(NewKeys(prefix), Limits{}, 24*time.Hour)
	if err := w.Init(st); err != nil {
		return err
	}
	var enc BlockEncoder
	b, err := enc.AppendAgentPush(nil, &Push{AgentID: agentID, Seq: seq, SendTime: now, Endpoints: eps}, Limits{})
	if err != nil {
		return err
	}
	_, err = w.Apply(st, b, now)
	return err
}
