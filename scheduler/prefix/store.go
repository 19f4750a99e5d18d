package prefix

import (
	"sync"

	"github.com/wasm-epp/wasm-epp/scheduler/kv"
)

// Store is Envoy's shared data (kv.Store).
type Store = kv.Store

// Store errors (kv's).
var (
	ErrNotFound    = kv.ErrNotFound
	ErrCASMismatch = kv.ErrCASMismatch
)

// MemStore is a Store in memory with Envoy's CAS rules (one counter for
// the whole table, starting at 1, as e2e/envoyhost's shared data emulates
// them): what the fleet benchmark gives the worker VMs of one simulated
// Envoy, and what tests use. Safe for concurrent use.
type MemStore struct {
	mu   sync.Mutex
	cas  uint32
	data map[string]memValue
	// Gets and Sets count calls; GotBytes the bytes Get copied.
	Gets, Sets, GotBytes int64
}

type memValue struct {
	b   []byte
	cas uint32
}

// NewMemStore returns an empty store.
func NewMemStore() *MemStore { return &MemStore{data: map[string]memValue{}} }

func (s *MemStore) Get(key string, dst []byte) ([]byte, uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Gets++
	v, ok := s.data[key]
	if !ok {
		return dst[:0], 0, ErrNotFound
	}
	s.GotBytes += int64(len(v.b))
	return append(dst[:0], v.b...), v.cas, nil
}

func (s *MemStore) Set(key string, value []byte, cas uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Sets++
	if v, ok := s.data[key]; ok && cas != 0 && v.cas != cas {
		return ErrCASMismatch
	}
	s.cas++
	if s.cas == 0 {
		s.cas = 1
	}
	old := s.data[key].b
	s.data[key] = memValue{b: append(old[:0], value...), cas: s.cas}
	return nil
}

// Keys is the number of keys held.
func (s *MemStore) Keys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.data)
}

// Bytes is the size of every value held.
func (s *MemStore) Bytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, v := range s.data {
		n += len(k) + len(v.b)
	}
	return n
}
