package prefix

import "github.com/wasm-epp/wasm-epp/scheduler/kv"

// Store is Envoy's shared data (kv.Store).
type Store = kv.Store

// Store errors (kv's).
var (
	ErrNotFound    = kv.ErrNotFound
	ErrCASMismatch = kv.ErrCASMismatch
)

// MemStore is kv.MemStore: the fleet benchmark's shared data for the
// worker VMs of one simulated Envoy, and the tests'.
type MemStore = kv.MemStore

// NewMemStore returns an empty store.
func NewMemStore() *MemStore { return &MemStore{} }
