package envoyhost

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// Host runs Wasm plugins behind HTTP listeners, the way Envoy does.
type Host struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	rt     wazero.Runtime
	cache  wazero.CompilationCache

	clock  Clock
	rand   io.Reader
	randMu sync.Mutex
	mono   time.Time // monotonic clock origin

	shared *sharedData
	queues *sharedQueues
	stats  *statsStore

	clusters  map[string]*cluster
	modules   map[string]*codeModule // by code hash
	groups    map[string]*vmGroup    // by vm key
	plugins   []*Plugin
	listeners []*listener
	admin     *http.Server
	adminLn   net.Listener

	// testHookRequestData, set by tests only, sees every downstream body
	// chunk after the stream handled it.
	testHookRequestData atomic.Pointer[func(listener string, n int, eos bool)]

	started atomic.Bool
	closed  atomic.Bool
	bg      sync.WaitGroup // callouts, queue deliveries, servers
}

// New loads every plugin (base VM, canary, main and worker VMs) and
// returns a host ready to Start. A configuration the plugin rejects, or a
// module Envoy would refuse to load, is an error here.
func New(cfg Config) (*Host, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	h := &Host{
		cfg:      c,
		log:      c.Logger,
		clock:    c.Clock,
		rand:     c.Rand,
		mono:     time.Now(),
		shared:   newSharedData(),
		queues:   newSharedQueues(),
		stats:    newStatsStore(),
		clusters: map[string]*cluster{},
		modules:  map[string]*codeModule{},
		groups:   map[string]*vmGroup{},
	}
	if h.rand == nil {
		h.rand = rand.Reader
	}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	if reserveLinearMemory {
		h.ctx = withReservedMemory(h.ctx) // memory.go: grow in place, as V8 does
	}
	// No WithCloseOnContextDone: it costs a goroutine per call, and Envoy
	// does not interrupt a running callback either.
	rc := wazero.NewRuntimeConfigCompiler().
		WithMemoryLimitPages(16384) // 1 GiB, PROXY_WASM_HOST_MAX_WASM_MEMORY_SIZE_BYTES
	if c.CompilationCacheDir != "" {
		cache, err := wazero.NewCompilationCacheWithDir(c.CompilationCacheDir)
		if err != nil {
			return nil, fmt.Errorf("compilation cache: %w", err)
		}
		h.cache = cache
		rc = rc.WithCompilationCache(cache)
	}
	h.rt = wazero.NewRuntimeWithConfig(h.ctx, rc)
	if err := h.registerHostModules(); err != nil {
		h.Close()
		return nil, err
	}
	for _, cc := range c.Clusters {
		h.clusters[cc.Name] = newCluster(h, cc)
	}
	if err := h.loadPlugins(); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// registerHostModules instantiates "env" with the ABI table (hostcalls.go)
// and "wasi_unstable" and "wasi_snapshot_preview1" with every WASI function
// (wasi.go). Which of them a module may import is decided by CheckImports
// (ABI version, WASI profile); a function called while callbacks are
// restricted traps.
func (h *Host) registerHostModules() error {
	builders := map[string]wazero.HostModuleBuilder{}
	builder := func(mod string) wazero.HostModuleBuilder {
		if b, ok := builders[mod]; ok {
			return b
		}
		b := h.rt.NewHostModuleBuilder(mod)
		builders[mod] = b
		return b
	}
	export := func(mod, name string, impl hostImpl, sig FuncType) {
		qname := mod + "." + name
		fn := func(ctx context.Context, _ api.Module, stack []uint64) {
			vm := vmFromContext(ctx)
			if vm.allowed != nil && !vm.allowed[qname] {
				panic(restrictedCallback{name: qname})
			}
			impl(vm, stack)
		}
		builder(mod).NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(fn), valueTypes(sig.Params), valueTypes(sig.Results)).
			Export(name)
	}
	for _, c := range proxyABI {
		impl, sig, err := adaptProxyCall(c.fn)
		if err != nil {
			return fmt.Errorf("internal: %s: %w", c.name, err)
		}
		export("env", c.name, impl, sig)
	}
	for _, w := range wasiSpecs {
		impl, ok := wasiImpls[w.name]
		if !ok {
			return fmt.Errorf("internal: no implementation of %s", w.name)
		}
		for _, mod := range wasiModules {
			export(mod, w.name, impl, parseSig(w.sig))
		}
	}
	names := make([]string, 0, len(builders))
	for n := range builders {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if _, err := builders[n].Instantiate(h.ctx); err != nil {
			return fmt.Errorf("host module %s: %w", n, err)
		}
	}
	return nil
}

func valueTypes(b []byte) []api.ValueType {
	out := make([]api.ValueType, len(b))
	for i, t := range b {
		out[i] = api.ValueType(t)
	}
	return out
}

func hashBytes(parts ...[]byte) string {
	s := sha256.New()
	for _, p := range parts {
		s.Write(p)
		s.Write([]byte("||"))
	}
	return hex.EncodeToString(s.Sum(nil))
}

// loadPlugins creates, per listener plugin in order, the VM group (base VM
// on first use), runs the canary, then starts the plugin on the main
// thread and every worker (envoy PluginConfig: createWasm, then the
// thread-local slot set on every thread).
func (h *Host) loadPlugins() error {
	for i := range h.cfg.Listeners {
		lc := &h.cfg.Listeners[i]
		var p *Plugin
		if lc.Plugin != nil {
			var err error
			if p, err = h.loadPlugin(lc.Plugin); err != nil {
				return fmt.Errorf("listener %q: plugin %q: %w", lc.Name, lc.Plugin.Name, err)
			}
		}
		h.listeners = append(h.listeners, newListener(h, *lc, p))
	}
	return nil
}

func (h *Host) loadPlugin(pc *PluginConfig) (*Plugin, error) {
	codeHash := hashBytes(pc.VM.Code)
	mod, ok := h.modules[codeHash]
	if !ok {
		var err error
		if mod, err = h.compileModule(pc.VM.Code); err != nil {
			return nil, err
		}
		h.modules[codeHash] = mod
	}
	env := make([]Pair, 0, len(pc.VM.EnvironmentVariables))
	for k, v := range pc.VM.EnvironmentVariables {
		env = append(env, Pair{Key: k, Value: v})
	}
	env = sortedEnv(env)
	var envBytes []byte
	for _, e := range env {
		envBytes = append(envBytes, e.Key+"="+e.Value+"\x00"...)
	}
	vmKey := hashBytes([]byte(pc.VM.VMID), pc.VM.Configuration, []byte(codeHash), envBytes)
	g, ok := h.groups[vmKey]
	if !ok {
		g = &vmGroup{host: h, key: vmKey, vmID: pc.VM.VMID, vmConfig: pc.VM.Configuration,
			env: env, mod: mod, threads: map[int]*VM{}}
		base, err := h.newVM(g, "base")
		if err != nil {
			return nil, err
		}
		g.base = base
		h.groups[vmKey] = g
	}
	p := newPlugin(h, g, pc)
	for _, existing := range h.plugins {
		if existing.key == p.key && existing.group == g {
			return existing, nil // same plugin on another listener
		}
	}
	if err := p.canary(); err != nil {
		return nil, err
	}
	for t := 0; t <= h.cfg.Workers; t++ {
		if err := p.startOnThread(t); err != nil {
			return nil, err
		}
	}
	h.plugins = append(h.plugins, p)
	return p, nil
}

// Start binds the listeners and the admin listener and serves them.
func (h *Host) Start() error {
	if !h.started.CompareAndSwap(false, true) {
		return errors.New("host already started")
	}
	for _, l := range h.listeners {
		if err := l.start(); err != nil {
			h.Close()
			return err
		}
	}
	if h.cfg.AdminAddress != "" {
		if err := h.startAdmin(); err != nil {
			h.Close()
			return err
		}
	}
	return nil
}

// ListenerAddr is the bound address of a listener (after Start).
func (h *Host) ListenerAddr(name string) string {
	for _, l := range h.listeners {
		if l.cfg.Name == name && l.ln != nil {
			return l.ln.Addr().String()
		}
	}
	return ""
}

// VMInfo is one VM running a listener's plugin, for tests that look for
// leaks: its linear memory and the contexts in its table.
type VMInfo struct {
	Thread      string // "main", "worker_0", ...
	MemoryBytes uint64 // the guest's linear memory size
	Roots       int    // root contexts in the VM's context table
	Streams     int    // stream contexts in it (created and not yet deleted)
}

// VMInfo reports the VMs running the plugin of the named listener, by
// thread (main first); nil for a listener without a plugin.
func (h *Host) VMInfo(listener string) []VMInfo {
	for _, l := range h.listeners {
		if l.cfg.Name != listener || l.plugin == nil {
			continue
		}
		p := l.plugin
		p.mu.Lock()
		threads := make([]int, 0, len(p.handles))
		for t := range p.handles {
			threads = append(threads, t)
		}
		sort.Ints(threads)
		vms := make([]*VM, len(threads))
		for i, t := range threads {
			vms[i] = p.handles[t].vm
		}
		p.mu.Unlock()
		out := make([]VMInfo, 0, len(vms))
		for _, vm := range vms {
			vm.mu.Lock()
			info := VMInfo{Thread: vm.thread}
			if vm.mem != nil && !vm.closed {
				info.MemoryBytes = uint64(vm.mem.Size())
			}
			for _, c := range vm.contexts {
				switch {
				case c.stream != nil:
					info.Streams++
				case c.isRoot():
					info.Roots++
				}
			}
			vm.mu.Unlock()
			out = append(out, info)
		}
		return out
	}
	return nil
}

// AdminAddr is the bound admin address (after Start), or "".
func (h *Host) AdminAddr() string {
	if h.adminLn == nil {
		return ""
	}
	return h.adminLn.Addr().String()
}

// StatValue returns a counter or gauge by its full name, e.g.
// "wasmcustom.my_counter" or "cluster.upstream.original_dst_host_invalid".
func (h *Host) StatValue(name string) (uint64, bool) { return h.stats.Value(name) }

// SharedData reads the shared-data table of a vm_id (value and cas), for
// tests.
func (h *Host) SharedData(vmID, key string) ([]byte, uint32, bool) {
	v, cas, r := h.shared.get(vmID, key)
	return v, cas, r == ResultOK
}

// SharedDataKeys lists the keys of a vm_id's shared-data table, for tests
// that bound them.
func (h *Host) SharedDataKeys(vmID string) []string {
	h.shared.mu.Lock()
	defer h.shared.mu.Unlock()
	keys := make([]string, 0, len(h.shared.data[vmID]))
	for k := range h.shared.data[vmID] {
		keys = append(keys, k)
	}
	return keys
}

// Close stops listeners, runs on_done/on_delete on every root context and
// releases the VMs.
func (h *Host) Close() error {
	if !h.closed.CompareAndSwap(false, true) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, l := range h.listeners {
		l.stop(ctx)
	}
	if h.admin != nil {
		_ = h.admin.Shutdown(ctx)
	}
	for _, g := range h.groups {
		g.mu.Lock()
		threads := make([]*VM, 0, len(g.threads))
		for _, vm := range g.threads {
			threads = append(threads, vm)
		}
		g.mu.Unlock()
		for _, vm := range threads {
			vm.shutdownRoots()
		}
	}
	// Give roots that delayed their shutdown a moment to call proxy_done.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		pending := false
		for _, g := range h.groups {
			g.mu.Lock()
			for _, vm := range g.threads {
				if vm.donePending() {
					pending = true
				}
			}
			g.mu.Unlock()
		}
		if !pending {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.cancel()
	h.bg.Wait()
	for _, g := range h.groups {
		for _, vm := range g.threads {
			vm.close()
		}
		if g.base != nil {
			g.base.close()
		}
	}
	if h.rt != nil {
		_ = h.rt.Close(context.Background())
	}
	if h.cache != nil {
		_ = h.cache.Close(context.Background())
	}
	return nil
}

func (h *Host) monotonicNanos() uint64 {
	return uint64(time.Since(h.mono).Nanoseconds()) + 1
}

// randUint64 draws from the configured randomness.
func (h *Host) randUint64() uint64 {
	var b [8]byte
	h.randMu.Lock()
	_, _ = io.ReadFull(h.rand, b[:])
	h.randMu.Unlock()
	v := uint64(0)
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}
