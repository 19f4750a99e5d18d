package prefix

import (
	"errors"
	"sync"
)

// Store is a key/value store with compare-and-swap and no delete: the
// semantics of Envoy's shared data (one table per vm_id, shared by every
// worker VM of one Envoy), which the plugin adapts to this interface.
type Store interface {
	// Get returns a copy of the value (appended to dst[:0], which may be
	// reused) and its CAS; an unknown key is ErrNotFound.
	Get(key string, dst []byte) (value []byte, cas uint32, err error)
	// Set writes value. A non-zero cas must match the key's current one
	// (ErrCASMismatch otherwise); cas 0 or a new key always succeeds.
	Set(key string, value []byte, cas uint32) error
}

// Store errors.
var (
	ErrNotFound    = errors.New("prefix: key not found")
	ErrCASMismatch = errors.New("prefix: CAS mismatch")
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
