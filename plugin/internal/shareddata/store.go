// Package shareddata adapts Envoy's shared data, through the plugin's
// Proxy-Wasm binding, to the store the wire format's writer and cache use
// (scheduler/wire.Store), so the receiver and the router share one
// translation of host statuses.
package shareddata

import (
	"errors"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Store is this VM's view of shared data (the vm_id's table).
type Store struct{}

var _ wire.Store = Store{}

// Get reads key into buf's storage when it fits (no allocation then).
func (Store) Get(key string, buf []byte) ([]byte, uint32, error) {
	v, cas, err := proxywasm.GetSharedDataInto(buf, key)
	switch {
	case err == nil:
		return v, cas, nil
	case errors.Is(err, types.ErrorStatusNotFound):
		return nil, 0, wire.ErrNotFound
	}
	return nil, 0, err
}

// Set writes key; a stale cas gives wire.ErrCASMismatch.
func (Store) Set(key string, value []byte, cas uint32) error {
	err := proxywasm.SetSharedData(key, value, cas)
	if errors.Is(err, types.ErrorStatusCasMismatch) {
		return wire.ErrCASMismatch
	}
	return err
}
