// Command wasm-epp is the Proxy-Wasm plugin Envoy loads
// (GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared): the wasm-epp
// router filter, or the metrics push receiver, chosen by the plugin
// configuration's "role". See package filter.
package main

import (
	"github.com/wasm-epp/wasm-epp/plugin/internal/filter"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
)

// init only registers the plugin: in reactor mode the host runs init during
// _initialize, where any proxy_* call other than logging traps.
func init() { proxywasm.SetVMContext(filter.NewVMContext(filter.Options{})) }

// main is required for package main but never runs (c-shared reactor).
func main() {}
