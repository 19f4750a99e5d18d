// Package shareddata adapts Envoy's shared data, through the plugin's
// Proxy-Wasm binding, to scheduler/kv.Store, which the wire format's
// writer and cache, the prefix index and flow control's admission record
// all use: one translation of host statuses for the receiver and the
// router.
package shareddata

import (
	"errors"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/scheduler/kv"
)

// Store is this VM's view of shared data (the vm_id's table).
type Store struct{}

var _ kv.Store = Store{}

// Get reads key into buf's storage when it fits (no allocation then).
func (Store) Get(key string, buf []byte) ([]byte, uint32, error) {
	v, cas, err := proxywasm.GetSharedDataInto(buf, key)
	switch {
	case err == nil:
		return v, cas, nil
	case errors.Is(err, types.ErrorStatusNotFound):
		return nil, 0, kv.ErrNotFound
	}
	return nil, 0, err
}

// Set writes key; a stale cas gives kv.ErrCASMismatch.
func (Store) Set(key string, value []byte, cas uint32) error {
	err := proxywasm.SetSharedData(key, value, cas)
	if errors.Is(err, types.ErrorStatusCasMismatch) {
		return kv.ErrCASMismatch
	}
	return err
}
