//go:build !wasip1

package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// These tests run the real testplugin.wasm (Go wasip1, c-shared) in a minimal
// wazero host, to prove the binding's ABI side: exports and their signatures,
// host-call argument layout, the allocator and pinned buffers under GC,
// (0, 0) as empty, status mapping, effective context for callouts, traps.
// The Envoy-faithful host with its full semantics is e2e/envoyhost.

// compilationCache makes every fakeHost after the first skip compiling the
// module.
var compilationCache = wazero.NewCompilationCache()

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

type stream struct {
	headers  [4][][2]string // request headers, request trailers, response headers, response trailers
	reqBody  []byte
	respBody []byte
	local    *sentReply
	resumed  []uint32
}

type sentReply struct {
	status  uint32
	details string
	body    []byte
	headers [][2]string
	grpc    int32
}

type shared struct {
	value []byte
	cas   uint32
}

type callout struct {
	token   uint32
	cluster string
	headers [][2]string
	root    uint32
}

// fakeHost is just enough host for the ABI checks above.
type fakeHost struct {
	t   testing.TB
	ctx context.Context
	rt  wazero.Runtime
	mod api.Module

	vmConfig, pluginConfig []byte
	inConfigure            bool
	initializing           bool
	initCalls              []string

	root      uint32
	current   uint32
	effective uint32
	streams   map[uint32]*stream
	callResp  *stream // HTTP call response during on_http_call_response

	shared    map[string]*shared
	casSeq    uint32
	props     map[string][]byte
	metrics   []int64
	metricIDs map[string]uint32
	calls     []callout
	tick      uint32
	done      int
	logs      []string
	allocs    int
	alloc     api.Function
	exports   map[string]api.Function

	stdout, stderr bytes.Buffer
}

func newFakeHost(t testing.TB, pluginConfig string, env ...string) *fakeHost {
	h := &fakeHost{
		t: t, ctx: context.Background(), root: 1, streams: map[uint32]*stream{},
		pluginConfig: []byte(pluginConfig), shared: map[string]*shared{},
		props:     map[string][]byte{"source\x00address": []byte("10.1.2.3:4567"), "plugin_name": []byte("tp")},
		metricIDs: map[string]uint32{}, exports: map[string]api.Function{},
	}
	h.rt = wazero.NewRuntimeWithConfig(h.ctx, wazero.NewRuntimeConfig().WithCompilationCache(compilationCache))
	t.Cleanup(func() { h.rt.Close(h.ctx) })
	_, err := wasi_snapshot_preview1.Instantiate(h.ctx, h.rt)
	require.NoError(t, err)
	h.exportHost()
	compiled, err := h.rt.CompileModule(h.ctx, testWasm(t))
	require.NoError(t, err)
	cfg := wazero.NewModuleConfig().WithStartFunctions().WithStdout(&h.stdout).WithStderr(&h.stderr)
	for i := 0; i+1 < len(env); i += 2 {
		cfg = cfg.WithEnv(env[i], env[i+1])
	}
	h.mod, err = h.rt.InstantiateModule(h.ctx, compiled, cfg)
	require.NoError(t, err)
	h.initializing = true
	_, err = h.mod.ExportedFunction("_initialize").Call(h.ctx)
	h.initializing = false
	require.NoError(t, err)
	return h
}

// call invokes a guest export as the host does for context id.
func (h *fakeHost) call(id uint32, name string, args ...uint64) (uint64, error) {
	h.current, h.effective = id, 0
	f, ok := h.exports[name]
	if !ok {
		if f = h.mod.ExportedFunction(name); f == nil {
			return 0, fmt.Errorf("no export %s", name)
		}
		h.exports[name] = f
	}
	res, err := f.Call(h.ctx, args...)
	if err != nil || len(res) == 0 {
		return 0, err
	}
	return res[0], nil
}

// mustCall fails the test on a trap. The helpers on the request path avoid
// t.Helper and testify, whose stack walks would dominate the benchmark.
func (h *fakeHost) mustCall(id uint32, name string, args ...uint64) uint64 {
	r, err := h.call(id, name, args...)
	if err != nil {
		h.t.Fatalf("%s: %v", name, err)
	}
	return r
}

func (h *fakeHost) start() {
	h.t.Helper()
	h.mustCall(h.root, "proxy_on_context_create", uint64(h.root), 0)
	require.EqualValues(h.t, 1, h.mustCall(h.root, "proxy_on_vm_start", uint64(h.root), uint64(len(h.vmConfig))))
	h.inConfigure = true
	r := h.mustCall(h.root, "proxy_on_configure", uint64(h.root), uint64(len(h.pluginConfig)))
	h.inConfigure = false
	require.EqualValues(h.t, 1, r)
}

// request runs headers (and a body if non-nil) through a new stream, then
// response headers unless a local reply was made; it returns the stream.
func (h *fakeHost) request(id uint32, headers [][2]string, body []byte) *stream {
	s := &stream{}
	s.headers[0] = headers
	h.streams[id] = s
	h.mustCall(id, "proxy_on_context_create", uint64(id), uint64(h.root))
	h.mustCall(id, "proxy_on_request_headers", uint64(id), uint64(len(headers)), b2u(body == nil))
	if body != nil && s.local == nil {
		s.reqBody = body
		h.mustCall(id, "proxy_on_request_body", uint64(id), uint64(len(body)), 1)
	}
	return s
}

func (h *fakeHost) respond(id uint32, headers [][2]string) {
	h.streams[id].headers[2] = headers
	h.mustCall(id, "proxy_on_response_headers", uint64(id), uint64(len(headers)), 0)
}

func (h *fakeHost) finish(id uint32) {
	h.mustCall(id, "proxy_on_log", uint64(id))
	h.mustCall(id, "proxy_on_done", uint64(id))
	h.mustCall(id, "proxy_on_delete", uint64(id))
	delete(h.streams, id)
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// --- memory helpers ---

func (h *fakeHost) read(m api.Module, ptr, size uint32) []byte {
	b, ok := m.Memory().Read(ptr, size)
	if !ok {
		panic(fmt.Sprintf("guest passed memory out of range: %d+%d", ptr, size))
	}
	return bytes.Clone(b)
}

// returnData hands data to the guest like cpp-host copyToPointerSize:
// allocate only when non-empty, else (0, 0).
func (h *fakeHost) returnData(ctx context.Context, m api.Module, data []byte, ptrPtr, sizePtr uint32) uint32 {
	var ptr uint32
	if len(data) > 0 {
		if h.alloc == nil {
			h.alloc = m.ExportedFunction("proxy_on_memory_allocate")
		}
		res, err := h.alloc.Call(ctx, uint64(len(data)))
		if err != nil {
			panic(fmt.Sprintf("allocator trapped: %v", err))
		}
		ptr = uint32(res[0])
		h.allocs++
		if !m.Memory().Write(ptr, data) {
			panic("allocator returned memory out of range")
		}
	}
	if !m.Memory().WriteUint32Le(ptrPtr, ptr) || !m.Memory().WriteUint32Le(sizePtr, uint32(len(data))) {
		panic("guest passed out-parameters out of range")
	}
	return 0
}

func encodePairs(pairs [][2]string) []byte {
	var b []byte
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pairs)))
	for _, p := range pairs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[1])))
	}
	for _, p := range pairs {
		b = append(append(b, p[0]...), 0)
		b = append(append(b, p[1]...), 0)
	}
	return b
}

func decodePairs(b []byte) [][2]string {
	if len(b) < 4 {
		return nil
	}
	n := int(binary.LittleEndian.Uint32(b))
	out := make([][2]string, n)
	off := 4 + 8*n
	for i := range out {
		kl := int(binary.LittleEndian.Uint32(b[4+8*i:]))
		vl := int(binary.LittleEndian.Uint32(b[8+8*i:]))
		out[i][0] = string(b[off : off+kl])
		off += kl + 1
		out[i][1] = string(b[off : off+vl])
		off += vl + 1
	}
	return out
}

// target is the stream the host call acts on (effective context first).
func (h *fakeHost) target() *stream {
	id := h.current
	if h.effective != 0 {
		id = h.effective
	}
	return h.streams[id]
}

func (h *fakeHost) headerMap(mapType uint32) (*[][2]string, bool) {
	if mapType == 6 || mapType == 7 {
		if h.callResp == nil {
			return nil, false
		}
		return &h.callResp.headers[mapType-6], true
	}
	s := h.target()
	if s == nil || mapType > 3 {
		return nil, false
	}
	return &s.headers[mapType], true
}

const (
	stOK          = 0
	stNotFound    = 1
	stBadArgument = 2
	stCasMismatch = 8
)

type hostFn struct {
	name    string
	params  string
	results string
	fn      func(ctx context.Context, m api.Module, a []uint64) uint32
}

func valueTypes(s string) []api.ValueType {
	var out []api.ValueType
	for _, c := range s {
		if c == 'I' {
			out = append(out, api.ValueTypeI64)
		} else {
			out = append(out, api.ValueTypeI32)
		}
	}
	return out
}

// u32 reads an i32 argument: wazero leaves the upper half of the uint64 stack
// slot undefined for i32 values, so it must be masked off.
func u32(v uint64) uint32 { return uint32(v) }

func (h *fakeHost) exportHost() {
	fns := []hostFn{
		{"proxy_log", "iii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			h.logs = append(h.logs, fmt.Sprintf("%d:%s", u32(a[0]), h.read(m, u32(a[1]), u32(a[2]))))
			return stOK
		}},
		{"proxy_get_log_level", "i", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			m.Memory().WriteUint32Le(u32(a[0]), 2)
			return stOK
		}},
		{"proxy_set_tick_period_milliseconds", "i", "i", func(_ context.Context, _ api.Module, a []uint64) uint32 {
			h.tick = u32(a[0])
			return stOK
		}},
		{"proxy_set_effective_context", "i", "i", func(_ context.Context, _ api.Module, a []uint64) uint32 {
			if _, ok := h.streams[u32(a[0])]; !ok && u32(a[0]) != h.root {
				return stBadArgument
			}
			h.effective = u32(a[0])
			return stOK
		}},
		{"proxy_done", "", "i", func(context.Context, api.Module, []uint64) uint32 { h.done++; return stOK }},
		{"proxy_get_buffer_bytes", "iiiii", "i", func(ctx context.Context, m api.Module, a []uint64) uint32 {
			var buf []byte
			switch u32(a[0]) {
			case 0, 1:
				s := h.target()
				if s == nil {
					return stNotFound
				}
				buf = map[uint32][]byte{0: s.reqBody, 1: s.respBody}[u32(a[0])]
			case 4:
				if h.callResp == nil {
					return stNotFound
				}
				buf = h.callResp.respBody
			case 6:
				buf = h.vmConfig
			case 7:
				if !h.inConfigure {
					return stNotFound
				}
				buf = h.pluginConfig
			default:
				return stNotFound
			}
			start, n := int(u32(a[1])), int(u32(a[2]))
			if start > len(buf) {
				start = len(buf)
			}
			end := min(start+n, len(buf))
			return h.returnData(ctx, m, buf[start:end], u32(a[3]), u32(a[4]))
		}},
		{"proxy_set_buffer_bytes", "iiiii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			s := h.target()
			if s == nil || u32(a[0]) > 1 {
				return stNotFound
			}
			buf := &s.reqBody
			if u32(a[0]) == 1 {
				buf = &s.respBody
			}
			data := h.read(m, u32(a[3]), u32(a[4]))
			start, n := int(u32(a[1])), int(u32(a[2]))
			switch {
			case start == 0:
				*buf = append(data, (*buf)[min(n, len(*buf)):]...)
			case start >= len(*buf):
				*buf = append(*buf, data...)
			default:
				return stBadArgument
			}
			return stOK
		}},
		{"proxy_get_header_map_value", "iiiii", "i", func(ctx context.Context, m api.Module, a []uint64) uint32 {
			hm, ok := h.headerMap(u32(a[0]))
			if !ok {
				return stBadArgument
			}
			key := string(h.read(m, u32(a[1]), u32(a[2])))
			for _, p := range *hm {
				if p[0] == key {
					return h.returnData(ctx, m, []byte(p[1]), u32(a[3]), u32(a[4]))
				}
			}
			return stNotFound
		}},
		{"proxy_add_header_map_value", "iiiii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			hm, ok := h.headerMap(u32(a[0]))
			if !ok {
				return stBadArgument
			}
			*hm = append(*hm, [2]string{string(h.read(m, u32(a[1]), u32(a[2]))), string(h.read(m, u32(a[3]), u32(a[4])))})
			return stOK
		}},
		{"proxy_replace_header_map_value", "iiiii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			hm, ok := h.headerMap(u32(a[0]))
			if !ok {
				return stBadArgument
			}
			key, value := string(h.read(m, u32(a[1]), u32(a[2]))), string(h.read(m, u32(a[3]), u32(a[4])))
			*hm = removeKey(*hm, key)
			*hm = append(*hm, [2]string{key, value})
			return stOK
		}},
		{"proxy_remove_header_map_value", "iii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			hm, ok := h.headerMap(u32(a[0]))
			if !ok {
				return stBadArgument
			}
			*hm = removeKey(*hm, string(h.read(m, u32(a[1]), u32(a[2]))))
			return stOK
		}},
		{"proxy_get_header_map_pairs", "iii", "i", func(ctx context.Context, m api.Module, a []uint64) uint32 {
			hm, ok := h.headerMap(u32(a[0]))
			if !ok || len(*hm) == 0 {
				return h.returnData(ctx, m, nil, u32(a[1]), u32(a[2]))
			}
			return h.returnData(ctx, m, encodePairs(*hm), u32(a[1]), u32(a[2]))
		}},
		{"proxy_set_header_map_pairs", "iii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			hm, ok := h.headerMap(u32(a[0]))
			if !ok {
				return stBadArgument
			}
			*hm = decodePairs(h.read(m, u32(a[1]), u32(a[2])))
			return stOK
		}},
		{"proxy_continue_stream", "i", "i", func(_ context.Context, _ api.Module, a []uint64) uint32 {
			s := h.target()
			if s == nil {
				return stNotFound
			}
			s.resumed = append(s.resumed, u32(a[0]))
			return stOK
		}},
		{"proxy_send_local_response", "iiiiiiii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			s := h.target()
			if s == nil {
				return stNotFound
			}
			s.local = &sentReply{status: u32(a[0]), details: string(h.read(m, u32(a[1]), u32(a[2]))),
				body: h.read(m, u32(a[3]), u32(a[4])), headers: decodePairs(h.read(m, u32(a[5]), u32(a[6]))), grpc: int32(u32(a[7]))}
			return stOK
		}},
		{"proxy_get_shared_data", "iiiii", "i", func(ctx context.Context, m api.Module, a []uint64) uint32 {
			e, ok := h.shared[string(h.read(m, u32(a[0]), u32(a[1])))]
			if !ok {
				return stNotFound
			}
			h.returnData(ctx, m, e.value, u32(a[2]), u32(a[3]))
			m.Memory().WriteUint32Le(u32(a[4]), e.cas)
			return stOK
		}},
		{"proxy_set_shared_data", "iiiii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			key := string(h.read(m, u32(a[0]), u32(a[1])))
			if h.initializing {
				h.initCalls = append(h.initCalls, "proxy_set_shared_data "+key)
			}
			e, ok := h.shared[key]
			if ok && u32(a[4]) != 0 && u32(a[4]) != e.cas {
				return stCasMismatch
			}
			h.casSeq++
			h.shared[key] = &shared{value: h.read(m, u32(a[2]), u32(a[3])), cas: h.casSeq}
			return stOK
		}},
		{"proxy_get_property", "iiii", "i", func(ctx context.Context, m api.Module, a []uint64) uint32 {
			v, ok := h.props[string(h.read(m, u32(a[0]), u32(a[1])))]
			if !ok {
				return stNotFound
			}
			return h.returnData(ctx, m, v, u32(a[2]), u32(a[3]))
		}},
		{"proxy_set_property", "iiii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			h.props[string(h.read(m, u32(a[0]), u32(a[1])))] = h.read(m, u32(a[2]), u32(a[3]))
			return stOK
		}},
		{"proxy_http_call", "iiiiiiiiii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			cluster := string(h.read(m, u32(a[0]), u32(a[1])))
			if cluster != "backend" {
				return stBadArgument
			}
			token := uint32(100 + len(h.calls))
			h.calls = append(h.calls, callout{token: token, cluster: cluster, headers: decodePairs(h.read(m, u32(a[2]), u32(a[3]))), root: h.root})
			m.Memory().WriteUint32Le(u32(a[9]), token)
			return stOK
		}},
		{"proxy_define_metric", "iiii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			name := string(h.read(m, u32(a[1]), u32(a[2])))
			id, ok := h.metricIDs[name]
			if !ok {
				id = uint32(len(h.metrics))
				h.metricIDs[name] = id
				h.metrics = append(h.metrics, 0)
			}
			m.Memory().WriteUint32Le(u32(a[3]), id)
			return stOK
		}},
		{"proxy_increment_metric", "iI", "i", func(_ context.Context, _ api.Module, a []uint64) uint32 {
			if int(u32(a[0])) >= len(h.metrics) {
				return stNotFound
			}
			h.metrics[u32(a[0])] += int64(a[1])
			return stOK
		}},
		{"proxy_record_metric", "iI", "i", func(_ context.Context, _ api.Module, a []uint64) uint32 {
			if int(u32(a[0])) >= len(h.metrics) {
				return stNotFound
			}
			h.metrics[u32(a[0])] = int64(a[1])
			return stOK
		}},
		{"proxy_get_metric", "ii", "i", func(_ context.Context, m api.Module, a []uint64) uint32 {
			if int(u32(a[0])) >= len(h.metrics) {
				return stNotFound
			}
			m.Memory().WriteUint64Le(u32(a[1]), uint64(h.metrics[u32(a[0])]))
			return stOK
		}},
	}
	b := h.rt.NewHostModuleBuilder("env")
	for _, f := range fns {
		fn := f.fn
		b = b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, stack []uint64) {
			stack[0] = uint64(fn(ctx, m, stack))
		}), valueTypes(f.params), valueTypes(f.results)).Export(f.name)
	}
	_, err := b.Instantiate(h.ctx)
	require.NoError(h.t, err)
}

func removeKey(pairs [][2]string, key string) [][2]string {
	out := pairs[:0:0]
	for _, p := range pairs {
		if p[0] != key {
			out = append(out, p)
		}
	}
	return out
}

func hv(pairs [][2]string, key string) string { return headerValue(pairs, key) }

func req(path string, extra ...[2]string) [][2]string {
	return append([][2]string{{":method", "POST"}, {":path", path}, {":authority", "a"}}, extra...)
}

func TestWasmHeadersAndBody(t *testing.T) {
	h := newFakeHost(t, `{"tick_period_ms": 50}`)
	h.start()
	assert.Equal(t, uint32(50), h.tick)

	s := h.request(2, req("/x",
		[2]string{"x-tp-add", "added=1"}, [2]string{"x-tp-remove", "gone"}, [2]string{"gone", "x"},
		[2]string{"x-tp-set-pairs", "paired=2"}, [2]string{"x-tp-get", "x-tp-add"},
		[2]string{"x-tp-body", "replace:new body"}, [2]string{"content-length", "5"}, [2]string{"empty", ""},
	), []byte("hello"))
	assert.Nil(t, s.local)
	assert.Equal(t, "new body", string(s.reqBody))
	assert.Equal(t, "1", hv(s.headers[0], "added"))
	assert.Equal(t, "2", hv(s.headers[0], "paired"))
	assert.Equal(t, "5", hv(s.headers[0], "x-tp-body-seen"))
	assert.Empty(t, hv(s.headers[0], "gone"))
	assert.Empty(t, hv(s.headers[0], "content-length"))

	h.respond(2, [][2]string{{":status", "200"}})
	resp := s.headers[2]
	assert.Equal(t, "added=1", hv(resp, "x-tp-got"))
	assert.Equal(t, "5:true", hv(resp, "x-tp-req-body-calls"))
	assert.Equal(t, "5", hv(resp, "x-tp-req-body-len"))
	assert.Equal(t, "ok", hv(resp, "x-tp-req-header-after-body"))
	assert.Len(t, hv(resp, "x-tp-vm-nonce"), 16)
	h.finish(2)
	assert.Contains(t, h.logs, "2:testplugin log: path=/x status=200")
	assert.Positive(t, h.allocs)
}

// get runs a GET through a fresh stream and returns its local reply.
func (h *fakeHost) get(id uint32, path string, extra ...[2]string) *sentReply {
	h.t.Helper()
	s := h.request(id, append([][2]string{{":method", "GET"}, {":path", path}, {":authority", "a"}}, extra...), nil)
	require.NotNil(h.t, s.local, path)
	return s.local
}

func TestWasmEndpoints(t *testing.T) {
	h := newFakeHost(t, `{}`, "TESTPLUGIN_PROBE", "from-env")
	h.start()
	id := uint32(10)
	next := func() uint32 { id++; return id }

	r := h.get(next(), "/tp/config")
	assert.Equal(t, uint32(500), r.status)
	assert.Equal(t, "not_found", hv(r.headers, "x-tp-error"), "plugin configuration outside on_configure")

	r = h.get(next(), "/tp/start-info")
	var info map[string]any
	require.NoError(t, json.Unmarshal(r.body, &info))
	assert.Equal(t, "not_found", info["vm_start_plugin_config_error"])
	assert.Equal(t, "{}", info["plugin_configuration"])
	assert.Equal(t, "info", info["log_level"])
	assert.Equal(t, "", info["vm_configuration"], "(0, 0) is empty, not an error")

	r = h.get(next(), "/tp/echo", [2]string{"x-empty", ""})
	var echo struct{ Headers [][2]string }
	require.NoError(t, json.Unmarshal(r.body, &echo))
	assert.Contains(t, echo.Headers, [2]string{"x-empty", ""})

	r = h.get(next(), "/tp/shared/get?key=k")
	assert.Equal(t, uint32(404), r.status)
	r = h.get(next(), "/tp/shared/set?key=k&value=")
	require.Equal(t, uint32(200), r.status)
	cas := hv(r.headers, "x-tp-cas")
	r = h.get(next(), "/tp/shared/get?key=k")
	assert.Equal(t, uint32(200), r.status)
	assert.Empty(t, r.body, "empty value is (0, 0)")
	assert.Equal(t, cas, hv(r.headers, "x-tp-cas"))
	r = h.get(next(), "/tp/shared/set?key=k&value=v&cas=12345")
	assert.Equal(t, uint32(409), r.status)
	r = h.get(next(), "/tp/shared/set?key=k&value=v&cas="+cas)
	assert.Equal(t, uint32(200), r.status)
	for _, want := range []string{"1", "2"} {
		r = h.get(next(), "/tp/shared/incr?key=n")
		assert.Equal(t, want, string(r.body))
	}

	r = h.get(next(), "/tp/property?path=source.address")
	assert.Equal(t, "10.1.2.3:4567", string(r.body))
	r = h.get(next(), "/tp/property?path=nope")
	assert.Equal(t, uint32(404), r.status)
	r = h.get(next(), "/tp/set-property?path=a.b&value=zz")
	assert.Equal(t, uint32(200), r.status)
	assert.Equal(t, "zz", string(h.props["a\x00b"]))

	r = h.get(next(), "/tp/env?name=TESTPLUGIN_PROBE")
	assert.Equal(t, "from-env", string(r.body))

	r = h.get(next(), "/tp/gc", [2]string{"x-pad", strings.Repeat("p", 3000)})
	assert.Equal(t, uint32(200), r.status, hv(r.headers, "x-tp-error"))
	assert.Equal(t, "ok", string(r.body))

	r = h.get(next(), "/tp/log")
	assert.Equal(t, "info", hv(r.headers, "x-tp-log-level"))
	assert.Contains(t, h.logs, "5:testplugin level critical")

	h.get(next(), "/tp/stdout")
	assert.Equal(t, "testplugin stdout\n", h.stdout.String())
	assert.Equal(t, "testplugin stderr\n", h.stderr.String())

	r = h.get(next(), "/tp/metrics")
	var m map[string]int64
	require.NoError(t, json.Unmarshal(r.body, &m))
	assert.Equal(t, int64(id-10), m["requests_total"])

	r = h.get(next(), "/x", [2]string{"x-tp-local-reply", "503"}, [2]string{"x-tp-local-reply-grpc", "14"},
		[2]string{"x-tp-local-reply-header", "a=b"}, [2]string{"x-tp-local-reply-body", "down"})
	assert.Equal(t, sentReply{status: 503, body: []byte("down"), headers: [][2]string{{"a", "b"}}, grpc: 14}, *r)

	r = h.get(next(), "/x", [2]string{"x-tp-local-reply", "429"}, [2]string{"x-tp-local-reply-details", "too many"})
	assert.Equal(t, sentReply{status: 429, details: "too many", body: []byte{}, headers: [][2]string{}, grpc: -1}, *r)
}

func TestWasmHTTPCall(t *testing.T) {
	h := newFakeHost(t, "")
	h.start()
	s := h.request(2, req("/tp/http-call?cluster=backend&path=/p"), nil)
	require.Nil(t, s.local)
	require.Len(t, h.calls, 1)
	assert.Equal(t, [][2]string{{":method", "GET"}, {":path", "/p"}, {":authority", "backend"}}, h.calls[0].headers)

	h.callResp = &stream{respBody: []byte("pong")}
	h.callResp.headers[0] = [][2]string{{":status", "203"}}
	h.mustCall(h.root, "proxy_on_http_call_response", uint64(h.root), uint64(h.calls[0].token), 1, 4, 0)
	h.callResp = nil
	require.NotNil(t, s.local, "reply made in the stream via the effective context")
	assert.Equal(t, uint32(200), s.local.status)
	assert.Equal(t, "pong", string(s.local.body))
	assert.Equal(t, "203", hv(s.local.headers, "x-tp-call-status"))

	s = h.request(3, req("/tp/http-call?cluster=unknown"), nil)
	require.NotNil(t, s.local)
	assert.Equal(t, "bad_argument", hv(s.local.headers, "x-tp-error"))
}

func TestWasmTrapAndInit(t *testing.T) {
	h := newFakeHost(t, "")
	h.start()
	_, err := h.call(2, "proxy_on_context_create", 2, 1)
	require.NoError(t, err)
	h.streams[2] = &stream{headers: [4][][2]string{req("/tp/panic")}}
	_, err = h.call(2, "proxy_on_request_headers", 2, 3, 1)
	require.Error(t, err, "a Go panic traps")
	assert.Contains(t, h.stderr.String(), "panic: testplugin: /tp/panic")

	h = newFakeHost(t, "", "TESTPLUGIN_INIT_HOSTCALL", "1")
	assert.Equal(t, []string{"proxy_set_shared_data testplugin/init"}, h.initCalls)
}

func TestWasmConfigureFailures(t *testing.T) {
	h := newFakeHost(t, `{"fail_configure": true}`)
	h.mustCall(1, "proxy_on_context_create", 1, 0)
	h.mustCall(1, "proxy_on_vm_start", 1, 0)
	h.inConfigure = true
	assert.EqualValues(t, 0, h.mustCall(1, "proxy_on_configure", 1, uint64(len(h.pluginConfig))))
}

// BenchmarkWasmRequest is one request through the test plugin in the
// minimal host: headers, a 4 KiB buffered body, response headers, log, done,
// delete. It measures the binding plus the test plugin, not Envoy semantics.
func BenchmarkWasmRequest(b *testing.B) {
	h := newFakeHost(b, "")
	h.start()
	body := bytes.Repeat([]byte("x"), 4096)
	headers := req("/bench", [2]string{"x-tp-body", "buffer"}, [2]string{"content-type", "application/json"})
	id := uint32(2)
	b.ReportAllocs()
	for b.Loop() {
		id++
		h.request(id, headers, body)
		h.respond(id, [][2]string{{":status", "200"}})
		h.finish(id)
	}
}
