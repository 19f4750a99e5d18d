// Package kv is the store Envoy's shared data offers, as everything under
// scheduler/ writes through it: a table of keys shared by every worker VM
// of one Envoy, with compare-and-swap and no delete. The wire format's
// writer and cache, the prefix index and flow control's admission record
// all use this one interface; the plugin adapts the Proxy-Wasm calls to it
// once (plugin/internal/shareddata), and tests use in-memory stores.
package kv

import "errors"

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
