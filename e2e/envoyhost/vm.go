package envoyhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// FailState says why a VM stopped working (cpp-host include/proxy-wasm/
// wasm_vm.h FailState). Only RuntimeError (a trap) is reloaded by
// FAIL_RELOAD.
type FailState int

// Fail states.
const (
	FailOK FailState = iota
	FailUnableToInitializeCode
	FailMissingFunction
	FailStartFailed
	FailConfigureFailed
	FailRuntimeError
)

// codeModule is one compiled .wasm, shared by every VM running it.
type codeModule struct {
	code     []byte
	info     *ModuleInfo
	compiled wazero.CompiledModule
}

// compileModule checks a module the way cpp-host WasmBase::load and
// V8::link do (ABI version export, imports, malloc), then compiles it.
func (h *Host) compileModule(code []byte) (*codeModule, error) {
	info, err := CheckModule(code, h.cfg.WASIProfile)
	if err != nil {
		return nil, err
	}
	compiled, err := h.rt.CompileModule(h.ctx, code)
	if err != nil {
		return nil, fmt.Errorf("Failed to load Wasm bytecode: %w", err)
	}
	m := &codeModule{code: code, info: info, compiled: compiled}
	exports := compiled.ExportedFunctions()
	// cpp-host src/wasm.cc getFunctions: malloc first, then
	// proxy_on_memory_allocate; neither is a load failure.
	if _, ok := exports["malloc"]; !ok {
		if _, ok := exports["proxy_on_memory_allocate"]; !ok {
			return nil, errors.New("Wasm module is missing malloc function.")
		}
	}
	// cpp-host src/v8/v8.cc getModuleFunctionImpl: an export with the name
	// of a callback but another signature is a load failure.
	for name, want := range moduleFunctionSigs(info.ABI) {
		def, ok := exports[name]
		if !ok {
			continue
		}
		got := FuncType{Params: toValBytes(def.ParamTypes()), Results: toValBytes(def.ResultTypes())}
		if !got.equal(want) {
			return nil, fmt.Errorf("Bad function signature for: %s, want: %s, but the module exports: %s",
				name, want, got)
		}
	}
	return m, nil
}

func toValBytes(ts []api.ValueType) []byte {
	out := make([]byte, len(ts))
	for i, t := range ts {
		out[i] = byte(t)
	}
	return out
}

// moduleFunctionSigs are the exports cpp-host calls (include/proxy-wasm/
// wasm.h WasmCallVoid<N>/WasmCallWord<N>: N i32 parameters, no result or
// one i32 result).
func moduleFunctionSigs(abi ABIVersion) map[string]FuncType {
	void := func(n int) FuncType { return FuncType{Params: i32s(n)} }
	word := func(n int) FuncType { return FuncType{Params: i32s(n), Results: []byte{valI32}} }
	m := map[string]FuncType{
		"_initialize": void(0), "_start": void(0), "main": word(2), "__main_void": word(0),
		"malloc": word(1), "proxy_on_memory_allocate": word(1),
		"proxy_validate_configuration": word(2), "proxy_on_vm_start": word(2),
		"proxy_on_configure": word(2), "proxy_on_tick": void(1),
		"proxy_on_context_create": void(2), "proxy_on_new_connection": word(1),
		"proxy_on_downstream_data": word(3), "proxy_on_upstream_data": word(3),
		"proxy_on_downstream_connection_close": void(2), "proxy_on_upstream_connection_close": void(2),
		"proxy_on_request_body": word(3), "proxy_on_request_trailers": word(2),
		"proxy_on_request_metadata": word(2), "proxy_on_response_body": word(3),
		"proxy_on_response_trailers": word(2), "proxy_on_response_metadata": word(2),
		"proxy_on_http_call_response": void(5), "proxy_on_grpc_receive": void(3),
		"proxy_on_grpc_close": void(3), "proxy_on_grpc_receive_initial_metadata": void(3),
		"proxy_on_grpc_receive_trailing_metadata": void(3), "proxy_on_queue_ready": void(2),
		"proxy_on_done": word(1), "proxy_on_log": void(1), "proxy_on_delete": void(1),
	}
	if abi == ABI010 {
		m["proxy_on_request_headers"] = word(2)
		m["proxy_on_response_headers"] = word(2)
	} else {
		m["proxy_on_request_headers"] = word(3)
		m["proxy_on_response_headers"] = word(3)
		m["proxy_on_foreign_function"] = void(3)
	}
	return m
}

func i32s(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = valI32
	}
	return b
}

// vmGroup is everything sharing one vm key (vm_id, vm configuration, code):
// the base VM and, per thread, the current VM (cpp-host src/wasm.cc
// base_wasms and local_wasms).
type vmGroup struct {
	host     *Host
	key      string
	vmID     string
	vmConfig []byte
	env      []Pair
	mod      *codeModule
	base     *VM

	mu      sync.Mutex
	threads map[int]*VM // thread index -> current VM on that thread
}

// threadVM returns the thread's VM, creating one (a clone of the base: a
// fresh instance that runs _initialize) when there is none or the current
// one failed with a runtime error (getOrCreateThreadLocalWasm; the fail
// callback erases failed VMs from the thread-local cache).
func (g *vmGroup) threadVM(thread int) (*VM, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if vm := g.threads[thread]; vm != nil && vm.failState() != FailRuntimeError {
		return vm, nil
	}
	vm, err := g.host.newVM(g, g.host.threadName(thread))
	if err != nil {
		return nil, err
	}
	g.threads[thread] = vm
	return vm, nil
}

// VM is one instance of a module: the base, a canary, the main thread's or
// a worker's. All calls into it are serialised by mu, as a VM belongs to
// one Envoy thread.
type VM struct {
	host   *Host
	group  *vmGroup
	thread string
	ctx    context.Context
	inst   api.Module
	mem    api.Memory
	fns    map[string]api.Function
	// allocName and allocFn are the allocator the host calls to return
	// data: malloc, else proxy_on_memory_allocate (found once: it runs
	// for every host call that returns data).
	allocName string
	allocFn   api.Function
	abi       ABIVersion
	log       *slog.Logger

	mu       sync.Mutex
	fail     FailState
	closed   bool
	allowed  allowSet // non-nil while callbacks are restricted
	current  *wasmContext
	effect   uint32 // effective context id, 0 = none
	stopNext bool   // send_local_response forces the next status to stop
	after    []func()

	vmContext *wasmContext
	nextCtxID uint32
	contexts  map[uint32]*wasmContext
	roots     map[string]*wasmContext // plugin key -> root context

	timers map[uint32]*vmTimer // root context id -> timer

	pendingDone map[uint32]bool // roots whose on_done answered false

	metricIDs    map[string]uint32 // type + name -> id
	metrics      map[uint32]*stat
	nextMetricID [3]uint32

	nextHTTPCall uint32
	httpCalls    map[uint32]*httpCallout
}

type vmKeyType struct{}

// vmFromContext finds the VM a host function serves: every call into a
// guest carries its VM in the context.
func vmFromContext(ctx context.Context) *VM {
	return ctx.Value(vmKeyType{}).(*VM)
}

func (h *Host) threadName(i int) string {
	if i == 0 {
		return "main"
	}
	return fmt.Sprintf("worker_%d", i-1)
}

// newVM instantiates the module and runs its start functions with
// callbacks restricted (cpp-host WasmBase::initialize and startVm).
func (h *Host) newVM(g *vmGroup, thread string) (*VM, error) {
	vm := &VM{
		host:         h,
		group:        g,
		thread:       thread,
		abi:          g.mod.info.ABI,
		fns:          map[string]api.Function{},
		nextCtxID:    1, // 0 is the VM context.
		contexts:     map[uint32]*wasmContext{},
		roots:        map[string]*wasmContext{},
		timers:       map[uint32]*vmTimer{},
		pendingDone:  map[uint32]bool{},
		metricIDs:    map[string]uint32{},
		metrics:      map[uint32]*stat{},
		nextMetricID: [3]uint32{metricCounter, metricGauge, metricHistogram},
		nextHTTPCall: 0, // tokens are 4, 8, ...: CalloutType::HttpCall is 0.
		httpCalls:    map[uint32]*httpCallout{},
	}
	vm.log = h.log.With("vm_id", g.vmID, "thread", thread)
	vm.ctx = context.WithValue(h.ctx, vmKeyType{}, vm)
	vm.vmContext = &wasmContext{vm: vm, id: 0}
	vm.vmContext.root = vm.vmContext
	vm.contexts[0] = vm.vmContext
	inst, err := h.rt.InstantiateModule(vm.ctx, g.mod.compiled,
		wazero.NewModuleConfig().WithName("").WithStartFunctions())
	if err != nil {
		return nil, fmt.Errorf("Failed to load Wasm module: %w", err)
	}
	vm.inst = inst
	vm.mem = inst.Memory()
	for name := range g.mod.compiled.ExportedFunctions() {
		vm.fns[name] = inst.ExportedFunction(name)
	}
	vm.allocName = "malloc"
	if vm.fns[vm.allocName] == nil {
		vm.allocName = "proxy_on_memory_allocate"
	}
	vm.allocFn = vm.fns[vm.allocName]
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if err := vm.startVM(); err != nil {
		vm.closeLocked()
		return nil, err
	}
	return vm, nil
}

// startVM: _initialize then main(0,0) or __main_void, or _start when there
// is no _initialize; only the start allow-list may be called meanwhile.
func (vm *VM) startVM() error {
	if vm.host.cfg.WASIProfile == WASILegacy {
		vm.allowed = initAllowedLegacySet
	} else {
		vm.allowed = initAllowedCurrentSet
	}
	defer func() { vm.allowed = nil }()
	run := func(name string, args ...uint64) error {
		if _, err := vm.callRaw(vm.vmContext, name, args...); err != nil {
			return fmt.Errorf("Failed to initialize Wasm code: %s: %w", name, err)
		}
		return nil
	}
	if vm.fns["_initialize"] != nil {
		if err := run("_initialize"); err != nil {
			return err
		}
		if vm.fns["main"] != nil {
			return run("main", 0, 0)
		}
		if vm.fns["__main_void"] != nil && vm.host.cfg.WASIProfile == WASICurrent {
			return run("__main_void")
		}
		return nil
	}
	if vm.fns["_start"] != nil {
		return run("_start")
	}
	return nil
}

// errVMFailed is returned for calls into a VM that already failed.
var errVMFailed = errors.New("wasm VM failed")

// TrapError is a runtime failure of a call into the guest.
type TrapError struct {
	Function string
	Err      error
}

func (e *TrapError) Error() string {
	return fmt.Sprintf("Function: %s failed: %v", e.Function, e.Err)
}

func (e *TrapError) Unwrap() error { return e.Err }

// restrictedCallback is what a host function panics with when called while
// it is not allowed; V8 traps with this text (cpp-host src/v8/v8.cc).
type restrictedCallback struct{ name string }

func (r restrictedCallback) Error() string { return "restricted_callback: " + r.name }

// callRaw calls an export with the given context as current (cpp-host
// SaveRestoreContext: the effective context is reset for the call). A
// trap marks the VM failed for good. vm.mu must be held.
func (vm *VM) callRaw(c *wasmContext, name string, args ...uint64) (uint64, error) {
	return vm.callFn(c, name, vm.fns[name], args...)
}

// callFn is callRaw with the export already looked up.
func (vm *VM) callFn(c *wasmContext, name string, fn api.Function, args ...uint64) (uint64, error) {
	if vm.fail != FailOK || vm.closed {
		return 0, errVMFailed
	}
	if fn == nil {
		return 0, fmt.Errorf("missing export %s", name)
	}
	savedCur, savedEff := vm.current, vm.effect
	vm.current, vm.effect = c, 0
	res, err := fn.Call(vm.ctx, args...)
	vm.current, vm.effect = savedCur, savedEff
	if err != nil {
		vm.failWith(FailRuntimeError, &TrapError{Function: name, Err: err})
		return 0, &TrapError{Function: name, Err: err}
	}
	if len(res) > 0 {
		return res[0], nil
	}
	return 0, nil
}

func (vm *VM) failWith(state FailState, err error) {
	if vm.fail != FailOK {
		return
	}
	vm.fail = state
	vm.log.Error("wasm VM failed", "state", state, "err", err)
	vm.stopTimersLocked()
}

func (vm *VM) failState() FailState {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.fail
}

// Failed reports whether the VM stopped working.
func (vm *VM) Failed() bool { return vm.failState() != FailOK }

// has reports whether the module exports a callback.
func (vm *VM) has(name string) bool { return vm.fns[name] != nil }

// callback runs one callback for context c and then the after-call
// actions (cpp-host DeferAfterCallActions): it returns the guest's result,
// whether send_local_response asked to stop iteration, and false if the VM
// failed (before or during the call). vm.mu must be held.
func (vm *VM) callback(c *wasmContext, name string, args ...uint64) (res uint64, stopped, ok bool) {
	if vm.fail != FailOK || vm.closed {
		return 0, false, false
	}
	res, err := vm.callRaw(c, name, args...)
	stopped = vm.stopNext
	vm.stopNext = false
	vm.runAfterCall()
	return res, stopped, err == nil
}

func (vm *VM) runAfterCall() {
	for len(vm.after) > 0 {
		f := vm.after[0]
		vm.after = vm.after[1:]
		f()
	}
}

// context returns the context host calls act on: the effective one if set
// and still alive, else the current one (cpp-host contextOrEffectiveContext).
func (vm *VM) context() *wasmContext {
	if vm.effect != 0 {
		if c, ok := vm.contexts[vm.effect]; ok {
			return c
		}
	}
	if vm.current == nil {
		return vm.vmContext
	}
	return vm.current
}

func (vm *VM) allocContextID() uint32 {
	for {
		id := vm.nextCtxID
		vm.nextCtxID++
		if _, used := vm.contexts[id]; !used && id != 0 {
			return id
		}
	}
}

// alloc asks the guest for memory with only the allocator allow-list
// callable meanwhile (cpp-host WasmBase::allocMemory; it switches
// restriction off afterwards, whatever it was before).
func (vm *VM) alloc(size uint32) (uint32, bool) {
	if vm.host.cfg.WASIProfile == WASILegacy {
		vm.allowed = allocAllowedLegacySet
	} else {
		vm.allowed = allocAllowedCurrentSet
	}
	p, err := vm.callFn(vm.vmContext, vm.allocName, vm.allocFn, uint64(size))
	vm.allowed = nil
	if err != nil || p == 0 {
		return 0, false
	}
	if _, ok := vm.mem.Read(uint32(p), size); !ok {
		return 0, false
	}
	return uint32(p), true
}

// copyOut hands data to the guest as cpp-host copyToPointerSize does: one
// allocation only when there is data, (0, 0) for empty data.
func (vm *VM) copyOut(data []byte, ptrPtr, sizePtr uint32) bool {
	var ptr uint32
	if len(data) > 0 {
		p, ok := vm.alloc(uint32(len(data)))
		if !ok {
			return false
		}
		if !vm.mem.Write(p, data) {
			return false
		}
		ptr = p
	}
	return vm.mem.WriteUint32Le(ptrPtr, ptr) && vm.mem.WriteUint32Le(sizePtr, uint32(len(data)))
}

// read copies guest memory; ok is false when out of bounds.
func (vm *VM) read(ptr, size uint32) ([]byte, bool) {
	if size == 0 {
		if ptr > vm.mem.Size() {
			return nil, false
		}
		return []byte{}, true
	}
	b, ok := vm.mem.Read(ptr, size)
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}

func (vm *VM) readString(ptr, size uint32) (string, bool) {
	if size == 0 {
		_, ok := vm.read(ptr, size)
		return "", ok
	}
	b, ok := vm.mem.Read(ptr, size)
	if !ok {
		return "", false
	}
	return string(b), true // one copy, straight from guest memory
}

// closeLocked tears the VM down: timers stop, the instance is closed.
func (vm *VM) closeLocked() {
	if vm.closed {
		return
	}
	vm.closed = true
	vm.stopTimersLocked()
	if vm.inst != nil {
		_ = vm.inst.Close(context.Background())
	}
}

func (vm *VM) close() {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	vm.closeLocked()
}

// startRoot creates the plugin's root context on this VM, or reuses it,
// and runs on_context_create (plugin configuration readable) and
// on_vm_start (cpp-host WasmBase::start and ContextBase::onStart).
func (vm *VM) startRoot(p *Plugin) (*wasmContext, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	root, ok := vm.roots[p.key]
	if !ok {
		root = &wasmContext{vm: vm, id: vm.allocContextID(), plugin: p}
		root.root = root
		vm.contexts[root.id] = root
		vm.roots[p.key] = root
	}
	if vm.has("proxy_on_context_create") {
		root.tempPlugin = p
		_, _, okCall := vm.callback(root, "proxy_on_context_create", uint64(root.id), 0)
		root.tempPlugin = nil
		root.created = true
		if !okCall {
			// cpp-host goes on to on_vm_start even so; this host does not
			// call into a VM that trapped, and refuses the plugin.
			return nil, vm.failureError("Failed to start thread-local Wasm")
		}
	}
	if vm.has("proxy_on_vm_start") {
		res, _, okCall := vm.callback(root, "proxy_on_vm_start", uint64(root.id), uint64(len(vm.group.vmConfig)))
		if !okCall {
			return nil, vm.failureError("Failed to start thread-local Wasm")
		}
		if uint32(res) == 0 {
			vm.failWith(FailStartFailed, errors.New("on_vm_start returned false"))
			return nil, errors.New("Failed to start thread-local Wasm: proxy_on_vm_start returned false")
		}
	}
	return root, nil
}

// configureRoot runs on_configure; false means the configuration is
// rejected (cpp-host ContextBase::onConfigure).
func (vm *VM) configureRoot(root *wasmContext, p *Plugin) error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.fail != FailOK {
		// cpp-host ContextBase::onConfigure answers true on a failed VM: a
		// VM that failed without a callback returning false (a trap inside
		// a nested call, such as the allocator) is accepted and then fails
		// every request.
		return nil
	}
	if !root.created && vm.has("proxy_on_context_create") {
		_, _, ok := vm.callback(root, "proxy_on_context_create", uint64(root.id), 0)
		if !ok {
			return vm.failureError("Failed to configure Wasm plugin")
		}
	}
	root.created = true
	if !vm.has("proxy_on_configure") {
		return nil
	}
	root.tempPlugin = p
	res, _, ok := vm.callback(root, "proxy_on_configure", uint64(root.id), uint64(len(p.config)))
	root.tempPlugin = nil
	if !ok {
		return vm.failureError("Failed to configure Wasm plugin")
	}
	if uint32(res) == 0 {
		vm.failWith(FailConfigureFailed, errors.New("on_configure returned false"))
		return errors.New("Failed to configure Wasm plugin: proxy_on_configure returned false")
	}
	return nil
}

func (vm *VM) failureError(msg string) error {
	return fmt.Errorf("%s (VM %s failed: state %d)", msg, vm.thread, vm.fail)
}

// shutdownRoots runs on_done then on_delete for every root context (cpp-host
// WasmBase::startShutdown); a root whose on_done answers false stays
// pending until it calls proxy_done (its timers keep running meanwhile).
func (vm *VM) shutdownRoots() {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	keys := make([]string, 0, len(vm.roots))
	for k := range vm.roots {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		root := vm.roots[k]
		if vm.fail != FailOK || vm.closed {
			return
		}
		done := true
		if vm.has("proxy_on_done") {
			res, _, ok := vm.callback(root, "proxy_on_done", uint64(root.id))
			done = !ok || uint32(res) != 0
		}
		if !done {
			vm.pendingDone[root.id] = true
			continue
		}
		if root.created && vm.has("proxy_on_delete") {
			vm.callback(root, "proxy_on_delete", uint64(root.id))
		}
	}
}

// donePending reports whether some root still waits for proxy_done.
func (vm *VM) donePending() bool {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return len(vm.pendingDone) > 0 && vm.fail == FailOK && !vm.closed
}

// logGuest logs a message from the guest with Envoy's prefix (plugin name,
// root id, vm id) as attributes.
func (vm *VM) logGuest(level uint32, msg string) {
	c := vm.context()
	attrs := []any{"source", "wasm"}
	if root := c.root; root != nil && root.plugin != nil {
		attrs = append(attrs, "plugin", root.plugin.name, "root_id", root.plugin.rootID)
	} else if c.stream != nil {
		attrs = append(attrs, "plugin", c.stream.plugin.name, "root_id", c.stream.plugin.rootID)
	}
	var l slog.Level
	switch level {
	case logTrace:
		l = slog.LevelDebug - 4
	case logDebug:
		l = slog.LevelDebug
	case logInfo:
		l = slog.LevelInfo
	case logWarn:
		l = slog.LevelWarn
	case logError:
		l = slog.LevelError
	default:
		l = slog.LevelError + 4
	}
	vm.log.Log(vm.ctx, l, strings.TrimSuffix(msg, "\n"), attrs...)
}

// vmTimer is the tick timer of one root context (envoy
// source/extensions/common/wasm/wasm.cc setTickPeriod and tickHandler: the
// timer re-arms after each tick with the current period, 0 stops it).
type vmTimer struct {
	period time.Duration
	timer  Timer
	gen    int
}

func (vm *VM) setTickPeriod(rootID uint32, period time.Duration) {
	t := vm.timers[rootID]
	if t == nil {
		t = &vmTimer{}
		vm.timers[rootID] = t
	}
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
	}
	t.gen++
	t.period = period
	if period > 0 {
		vm.armTimer(rootID, t)
	}
}

func (vm *VM) armTimer(rootID uint32, t *vmTimer) {
	gen := t.gen
	t.timer = vm.host.clock.AfterFunc(t.period, func() { vm.tick(rootID, gen) })
}

// tick is envoy wasm.cc Wasm::tickHandler: on_tick for the root context,
// then the root's current timer (a new one if on_tick changed the period)
// is armed again with the current period, so the real period is the
// period plus the time on_tick took.
func (vm *VM) tick(rootID uint32, gen int) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	t := vm.timers[rootID]
	if t == nil || t.gen != gen || vm.closed || vm.fail != FailOK || !vm.has("proxy_on_tick") {
		return
	}
	t.timer = nil // this timer fired
	if root := vm.contexts[rootID]; root != nil {
		vm.callback(root, "proxy_on_tick", uint64(rootID))
	}
	if t.period > 0 && !vm.closed && vm.fail == FailOK {
		if t.timer != nil {
			t.timer.Stop()
		}
		t.gen++
		vm.armTimer(rootID, t)
	}
}

func (vm *VM) stopTimersLocked() {
	for _, t := range vm.timers {
		t.gen++
		if t.timer != nil {
			t.timer.Stop()
			t.timer = nil
		}
	}
}
