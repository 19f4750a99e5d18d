//go:build !wasip1

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/wasm-epp/wasm-epp/e2e/envoyhost"
)

// The binding's behaviour through a host (header, body, shared data,
// property and callout calls, (0, 0) as empty, the allocator under GC,
// traps) is tested by running this module in e2e/envoyhost
// (testplugin_test.go, binding_test.go and the others there); here only
// the module's shape is checked.

var (
	wasmOnce sync.Once
	wasmBin  []byte
	wasmErr  error
)

// testWasm builds this package for wasip1 once per test binary.
func testWasm(t testing.TB) []byte {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the wasm module")
	}
	wasmOnce.Do(func() {
		dir, err := os.MkdirTemp("", "testplugin")
		if err != nil {
			wasmErr = err
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "testplugin.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, ".")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if msg, err := cmd.CombinedOutput(); err != nil {
			wasmErr = fmt.Errorf("go build: %v\n%s", err, msg)
			return
		}
		wasmBin, wasmErr = os.ReadFile(out)
	})
	require.NoError(t, wasmErr)
	return wasmBin
}

// TestWasmImportsAllowed checks every import of the test plugin against the
// repository's single copy of cpp-host's import set (e2e/envoyhost), for both
// WASI generations: the binding must load in every Envoy since 1.33.
func TestWasmImportsAllowed(t *testing.T) {
	bin := testWasm(t)
	for _, profile := range []envoyhost.WASIProfile{envoyhost.WASICurrent, envoyhost.WASILegacy} {
		info, err := envoyhost.CheckModule(bin, profile)
		require.NoError(t, err, profile.String())
		assert.Equal(t, envoyhost.ABI021, info.ABI)
	}
}

// TestWasmExports checks the callbacks the binding exports, with the
// signatures cpp-host looks them up with (N parameters and at most one
// result, all i32).
func TestWasmExports(t *testing.T) {
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	compiled, err := rt.CompileModule(ctx, testWasm(t))
	require.NoError(t, err)

	i32 := api.ValueTypeI32
	sig := func(params int, result bool) [2][]api.ValueType {
		var s [2][]api.ValueType
		for range params {
			s[0] = append(s[0], i32)
		}
		if result {
			s[1] = []api.ValueType{i32}
		}
		return s
	}
	want := map[string][2][]api.ValueType{
		"_initialize":                 sig(0, false),
		"proxy_abi_version_0_2_1":     sig(0, false),
		"proxy_on_memory_allocate":    sig(1, true),
		"proxy_on_context_create":     sig(2, false),
		"proxy_on_vm_start":           sig(2, true),
		"proxy_on_configure":          sig(2, true),
		"proxy_on_tick":               sig(1, false),
		"proxy_on_queue_ready":        sig(2, false),
		"proxy_on_request_headers":    sig(3, true),
		"proxy_on_request_body":       sig(3, true),
		"proxy_on_request_trailers":   sig(2, true),
		"proxy_on_response_headers":   sig(3, true),
		"proxy_on_response_body":      sig(3, true),
		"proxy_on_response_trailers":  sig(2, true),
		"proxy_on_http_call_response": sig(5, false),
		"proxy_on_log":                sig(1, false),
		"proxy_on_done":               sig(1, true),
		"proxy_on_delete":             sig(1, false),
	}
	got := map[string][2][]api.ValueType{}
	for name, f := range compiled.ExportedFunctions() {
		got[name] = [2][]api.ValueType{f.ParamTypes(), f.ResultTypes()}
	}
	assert.Equal(t, want, got)
	_, hasMalloc := got["malloc"]
	assert.False(t, hasMalloc, "cpp-host would prefer malloc over proxy_on_memory_allocate")
}
