package envoyhost

import (
	"os"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
)

// wasmModule assembles small modules for load-time tests: no Go build
// needed.
type wasmModule struct {
	types   []FuncType
	imports []Import
	funcs   []wasmFunc
	exports []Export // Index is a function index (imports first)
	memory  bool
	data    map[uint32]string // memory offset -> bytes
}

type wasmFunc struct {
	typ  FuncType
	body []byte // instructions, without locals and final end
}

var (
	sigVoid   = FuncType{}
	sigI32    = FuncType{Results: []byte{valI32}}
	sigI32I32 = FuncType{Params: []byte{valI32}, Results: []byte{valI32}}
	sig2I32   = FuncType{Params: []byte{valI32, valI32}, Results: []byte{valI32}}
)

func leb(v uint32) []byte {
	var out []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			out = append(out, c|0x80)
			continue
		}
		return append(out, c)
	}
}

func vec(items ...[]byte) []byte {
	out := leb(uint32(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func wname(s string) []byte { return append(leb(uint32(len(s))), s...) }

func (m *wasmModule) typeIndex(t FuncType) uint32 {
	for i, x := range m.types {
		if x.equal(t) {
			return uint32(i)
		}
	}
	m.types = append(m.types, t)
	return uint32(len(m.types) - 1)
}

// importFunc adds a function import and returns its function index.
func (m *wasmModule) importFunc(mod, name string, t FuncType) uint32 {
	m.imports = append(m.imports, Import{Module: mod, Name: name, Kind: kindFunc, Type: t})
	return uint32(len(m.imports) - 1)
}

// export adds a function with a body and exports it under name.
func (m *wasmModule) export(name string, t FuncType, body ...byte) {
	nImports := 0
	for _, im := range m.imports {
		if im.Kind == kindFunc {
			nImports++
		}
	}
	m.funcs = append(m.funcs, wasmFunc{typ: t, body: body})
	m.exports = append(m.exports, Export{Name: name, Kind: kindFunc, Index: uint32(nImports + len(m.funcs) - 1)})
}

func section(id byte, content []byte) []byte {
	return append(append([]byte{id}, leb(uint32(len(content)))...), content...)
}

func (m *wasmModule) bytes() []byte {
	for _, im := range m.imports {
		if im.Kind == kindFunc {
			m.typeIndex(im.Type)
		}
	}
	for _, f := range m.funcs {
		m.typeIndex(f.typ)
	}
	out := []byte("\x00asm\x01\x00\x00\x00")
	var types [][]byte
	for _, t := range m.types {
		types = append(types, append(append([]byte{0x60}, append(leb(uint32(len(t.Params))), t.Params...)...),
			append(leb(uint32(len(t.Results))), t.Results...)...))
	}
	out = append(out, section(1, vec(types...))...)
	var imps [][]byte
	for _, im := range m.imports {
		e := append(wname(im.Module), wname(im.Name)...)
		switch im.Kind {
		case kindFunc:
			e = append(append(e, kindFunc), leb(m.typeIndex(im.Type))...)
		case kindGlobal:
			e = append(e, kindGlobal, valI32, 0)
		case kindMemory:
			e = append(e, kindMemory, 0, 1)
		}
		imps = append(imps, e)
	}
	if len(imps) > 0 {
		out = append(out, section(2, vec(imps...))...)
	}
	var fidx [][]byte
	for _, f := range m.funcs {
		fidx = append(fidx, leb(m.typeIndex(f.typ)))
	}
	out = append(out, section(3, vec(fidx...))...)
	if m.memory {
		out = append(out, section(5, vec([]byte{0, 2}))...)
	}
	var exps [][]byte
	for _, e := range m.exports {
		exps = append(exps, append(append(wname(e.Name), kindFunc), leb(e.Index)...))
	}
	if m.memory {
		exps = append(exps, append(append(wname("memory"), kindMemory), 0))
	}
	out = append(out, section(7, vec(exps...))...)
	var codes [][]byte
	for _, f := range m.funcs {
		body := append(append([]byte{0}, f.body...), 0x0b)
		codes = append(codes, append(leb(uint32(len(body))), body...))
	}
	out = append(out, section(10, vec(codes...))...)
	if len(m.data) > 0 {
		offsets := make([]int, 0, len(m.data))
		for off := range m.data {
			offsets = append(offsets, int(off))
		}
		sort.Ints(offsets)
		var segs [][]byte
		for _, off := range offsets {
			seg := append(append([]byte{0}, i32c(uint32(off))...), 0x0b)
			segs = append(segs, append(seg, wname(m.data[uint32(off)])...))
		}
		out = append(out, section(11, vec(segs...))...)
	}
	return out
}

// i32c is i32.const with its signed LEB128 immediate.
func i32c(v uint32) []byte {
	out := []byte{0x41}
	x := int64(int32(v))
	for {
		c := byte(x & 0x7f)
		x >>= 7
		if (x == 0 && c&0x40 == 0) || (x == -1 && c&0x40 != 0) {
			return append(out, c)
		}
		out = append(out, c|0x80)
	}
}

func call(idx uint32) []byte { return append([]byte{0x10}, leb(idx)...) }
func ops(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// baseModule is a loadable module: ABI 0.2.1, malloc returning a fixed
// address in its memory.
func baseModule() *wasmModule {
	m := &wasmModule{memory: true}
	return m
}

func (m *wasmModule) finishBase() {
	m.export("proxy_abi_version_0_2_1", sigVoid)
	m.export("malloc", sigI32I32, i32c(1024)...)
}

func TestTestPluginImportsAreAllowed(t *testing.T) {
	code, err := os.ReadFile(wasmbuild.Build(t, testPluginPkg))
	require.NoError(t, err)
	info, err := CheckModule(code, WASICurrent)
	require.NoError(t, err)
	assert.Equal(t, ABI021, info.ABI)
	var wasi int
	for _, im := range info.Imports {
		if im.Module == "wasi_snapshot_preview1" {
			wasi++
		}
	}
	assert.NotZero(t, wasi, "a Go module imports WASI")
}

func TestCheckImports(t *testing.T) {
	cases := []struct {
		name    string
		build   func(m *wasmModule)
		profile WASIProfile
		wantErr string
	}{
		{name: "proxy and wasi under both names", build: func(m *wasmModule) {
			m.importFunc("env", "proxy_log", FuncType{Params: []byte{valI32, valI32, valI32}, Results: []byte{valI32}})
			m.importFunc("wasi_unstable", "sched_yield", sigI32)
			m.importFunc("wasi_snapshot_preview1", "sched_yield", sigI32)
			m.importFunc("wasi_snapshot_preview1", "proc_exit", FuncType{Params: []byte{valI32}})
		}},
		{name: "unknown env function", build: func(m *wasmModule) {
			m.importFunc("env", "proxy_nope", sigI32)
		}, wantErr: "Failed to load Wasm module due to a missing import: env.proxy_nope"},
		{name: "unknown module", build: func(m *wasmModule) {
			m.importFunc("wasi_snapshot_preview2", "fd_write", sigI32)
		}, wantErr: "missing import: wasi_snapshot_preview2.fd_write"},
		{name: "first failure in import order", build: func(m *wasmModule) {
			m.importFunc("env", "proxy_b", sigI32)
			m.importFunc("env", "proxy_a", sigI32)
		}, wantErr: "missing import: env.proxy_b"},
		{name: "0.1.0-only call from a 0.2.1 module", build: func(m *wasmModule) {
			m.importFunc("env", "proxy_get_configuration", sig2I32)
		}, wantErr: "missing import: env.proxy_get_configuration"},
		{name: "signature mismatch", build: func(m *wasmModule) {
			m.importFunc("wasi_snapshot_preview1", "fd_write", sig2I32)
		}, wantErr: "Failed to load Wasm module due to an import type mismatch: wasi_snapshot_preview1.fd_write, " +
			"want: i32 i32 -> i32, but host exports: i32 i32 i32 i32 -> i32"},
		{name: "path_link with the WASI spec signature", build: func(m *wasmModule) {
			m.importFunc("wasi_snapshot_preview1", "path_link",
				FuncType{Params: []byte{valI32, valI32, valI32, valI32, valI32, valI32, valI32}, Results: []byte{valI32}})
		}, wantErr: "import type mismatch: wasi_snapshot_preview1.path_link"},
		{name: "imported global", build: func(m *wasmModule) {
			m.imports = append(m.imports, Import{Module: "env", Name: "g", Kind: kindGlobal})
		}, wantErr: "missing import: env.g"},
		{name: "clock_res_get exists since #533", build: func(m *wasmModule) {
			m.importFunc("wasi_snapshot_preview1", "clock_res_get", sig2I32)
		}},
		{name: "clock_res_get missing in the legacy set", profile: WASILegacy, build: func(m *wasmModule) {
			m.importFunc("wasi_snapshot_preview1", "clock_res_get", sig2I32)
		}, wantErr: "missing import: wasi_snapshot_preview1.clock_res_get"},
		{name: "proc_raise is not offered", build: func(m *wasmModule) {
			m.importFunc("wasi_snapshot_preview1", "proc_raise", sigI32I32)
		}, wantErr: "missing import: wasi_snapshot_preview1.proc_raise"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := baseModule()
			c.build(m)
			m.finishBase()
			_, err := CheckModule(m.bytes(), c.profile)
			if c.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.wantErr)
		})
	}
}

func TestABIVersion(t *testing.T) {
	m := &wasmModule{}
	m.export("malloc", sigI32I32, i32c(0)...)
	_, err := CheckModule(m.bytes(), WASICurrent)
	assert.EqualError(t, err, "Missing or unknown Proxy-Wasm ABI version")

	m = &wasmModule{}
	m.export("proxy_abi_version_0_1_0", sigVoid)
	m.export("proxy_abi_version_0_2_1", sigVoid)
	info, err := CheckModule(m.bytes(), WASICurrent)
	require.NoError(t, err)
	assert.Equal(t, ABI010, info.ABI, "the first marker export wins")

	_, err = ParseModuleInfo([]byte("not wasm at all"))
	assert.EqualError(t, err, "Failed to parse corrupted Wasm module")
}

func TestABISpecificImports(t *testing.T) {
	for _, c := range []struct {
		abi     ABIVersion
		name    string
		offered bool
	}{
		{ABI010, "proxy_get_configuration", true},
		{ABI010, "proxy_continue_stream", false},
		{ABI020, "proxy_continue_stream", true},
		{ABI020, "proxy_get_log_level", false},
		{ABI021, "proxy_get_log_level", true},
		{ABI021, "proxy_continue_request", false},
	} {
		_, ok := AllowedImports(c.abi, WASICurrent)["env."+c.name]
		assert.Equal(t, c.offered, ok, "%s %s", c.abi, c.name)
	}
	current := AllowedImportNames(ABI021, WASICurrent)
	legacy := AllowedImportNames(ABI021, WASILegacy)
	assert.Len(t, legacy, len(current)-2*27, "27 WASI functions came with #533, under two module names")
}

func loadModule(t *testing.T, m *wasmModule, mutate ...func(*Config)) error {
	t.Helper()
	cfg := Config{
		Workers:  1,
		Clusters: []ClusterConfig{{Name: "c", Type: ClusterStatic, Endpoints: []string{"127.0.0.1:1"}}},
		Listeners: []ListenerConfig{{Name: "l", Address: "127.0.0.1:0", Cluster: "c",
			Plugin: &PluginConfig{Name: "p", VM: VMConfig{VMID: "v", Code: m.bytes(), Configuration: []byte("cfg")}}}},
	}
	for _, f := range mutate {
		f(&cfg)
	}
	h, err := New(cfg)
	if err == nil {
		h.Close()
	}
	return err
}

func TestLoadChecks(t *testing.T) {
	sharedDataSig := FuncType{Params: []byte{valI32, valI32, valI32, valI32, valI32}, Results: []byte{valI32}}
	bufferBytesSig := sharedDataSig
	logSig := FuncType{Params: []byte{valI32, valI32, valI32}, Results: []byte{valI32}}

	t.Run("missing malloc", func(t *testing.T) {
		m := baseModule()
		m.export("proxy_abi_version_0_2_1", sigVoid)
		assert.ErrorContains(t, loadModule(t, m), "Wasm module is missing malloc function.")
	})
	t.Run("proxy_on_memory_allocate is an allocator too", func(t *testing.T) {
		m := baseModule()
		m.export("proxy_abi_version_0_2_1", sigVoid)
		m.export("proxy_on_memory_allocate", sigI32I32, i32c(1024)...)
		assert.NoError(t, loadModule(t, m))
	})
	t.Run("bad callback signature", func(t *testing.T) {
		m := baseModule()
		m.finishBase()
		m.export("proxy_on_vm_start", sigI32I32, i32c(1)...)
		assert.ErrorContains(t, loadModule(t, m),
			"Bad function signature for: proxy_on_vm_start, want: i32 i32 -> i32, but the module exports: i32 -> i32")
	})
	t.Run("proxy call during _initialize traps", func(t *testing.T) {
		m := baseModule()
		set := m.importFunc("env", "proxy_set_shared_data", sharedDataSig)
		m.finishBase()
		m.export("_initialize", sigVoid, ops(i32c(0), i32c(0), i32c(0), i32c(0), i32c(0), call(set), []byte{0x1a})...)
		err := loadModule(t, m)
		assert.ErrorContains(t, err, "restricted_callback: env.proxy_set_shared_data")
	})
	t.Run("logging during _initialize is allowed", func(t *testing.T) {
		m := baseModule()
		logf := m.importFunc("env", "proxy_log", logSig)
		m.finishBase()
		m.export("_initialize", sigVoid, ops(i32c(2), i32c(0), i32c(0), call(logf), []byte{0x1a})...)
		assert.NoError(t, loadModule(t, m))
	})
	t.Run("proxy call inside the allocator traps", func(t *testing.T) {
		m := baseModule()
		set := m.importFunc("env", "proxy_set_shared_data", sharedDataSig)
		get := m.importFunc("env", "proxy_get_buffer_bytes", bufferBytesSig)
		m.export("proxy_abi_version_0_2_1", sigVoid)
		m.export("malloc", sigI32I32, ops(i32c(0), i32c(0), i32c(0), i32c(0), i32c(0), call(set), []byte{0x1a}, i32c(1024))...)
		// on_vm_start reads the vm configuration: the host allocates. The
		// nested trap fails the VM but on_vm_start itself returns true, so
		// cpp-host accepts the plugin, and every request then fails.
		m.export("proxy_on_vm_start", sig2I32, ops(i32c(bufferVMConfiguration), i32c(0), i32c(100), i32c(16), i32c(20), call(get), []byte{0x1a}, i32c(1))...)
		up := newUpstream(t)
		h, err := New(Config{
			Workers:  1,
			Clusters: []ClusterConfig{{Name: "c", Type: ClusterStatic, Endpoints: []string{up.addr()}}},
			Listeners: []ListenerConfig{{Name: "l", Address: "127.0.0.1:0", Cluster: "c",
				Plugin: &PluginConfig{Name: "p", VM: VMConfig{VMID: "v", Code: m.bytes(), Configuration: []byte("cfg")}}}},
		})
		require.NoError(t, err)
		defer h.Close()
		require.NoError(t, h.Start())
		resp, err := httpClient.Get("http://" + h.ListenerAddr("l") + "/")
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 503, resp.StatusCode)
		assert.Empty(t, up.requests())
	})
	t.Run("logging inside the allocator is allowed", func(t *testing.T) {
		m := baseModule()
		logf := m.importFunc("env", "proxy_log", logSig)
		get := m.importFunc("env", "proxy_get_buffer_bytes", bufferBytesSig)
		m.export("proxy_abi_version_0_2_1", sigVoid)
		m.export("malloc", sigI32I32, ops(i32c(2), i32c(0), i32c(0), call(logf), []byte{0x1a}, i32c(1024))...)
		m.export("proxy_on_vm_start", sig2I32, ops(i32c(bufferVMConfiguration), i32c(0), i32c(100), i32c(16), i32c(20), call(get), []byte{0x1a}, i32c(1))...)
		assert.NoError(t, loadModule(t, m))
	})
}

// send_local_response: the reply is sent after the callback, details have
// their spaces turned into '_', a grpc status of -1 means none.
func TestLocalReplyDetailsFromRawModule(t *testing.T) {
	m := baseModule()
	send := m.importFunc("env", "proxy_send_local_response",
		FuncType{Params: []byte{valI32, valI32, valI32, valI32, valI32, valI32, valI32, valI32}, Results: []byte{valI32}})
	m.data = map[uint32]string{100: "no model here", 200: "hi"}
	m.finishBase()
	m.export("proxy_on_context_create", FuncType{Params: []byte{valI32, valI32}})
	m.export("proxy_on_request_headers", FuncType{Params: []byte{valI32, valI32, valI32}, Results: []byte{valI32}},
		ops(i32c(418), i32c(100), i32c(13), i32c(200), i32c(2), i32c(0), i32c(0), i32c(0xffffffff), call(send), []byte{0x1a},
			i32c(0))...)
	up := newUpstream(t)
	acc := &accessLog{}
	h, err := New(Config{
		Workers:   1,
		AccessLog: acc.add,
		Clusters:  []ClusterConfig{{Name: "c", Type: ClusterStatic, Endpoints: []string{up.addr()}}},
		Listeners: []ListenerConfig{{Name: "l", Address: "127.0.0.1:0", Cluster: "c",
			Plugin: &PluginConfig{Name: "p", VM: VMConfig{VMID: "v", Code: m.bytes()}}}},
	})
	require.NoError(t, err)
	defer h.Close()
	require.NoError(t, h.Start())
	resp, err := httpClient.Get("http://" + h.ListenerAddr("l") + "/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 418, resp.StatusCode, "the callback returned Continue, the reply still wins")
	assert.Equal(t, "2", resp.Header.Get("Content-Length"))
	assert.Empty(t, up.requests())
	require.Eventually(t, func() bool { return len(acc.all()) == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "no_model_here", acc.all()[0].Details)
}
