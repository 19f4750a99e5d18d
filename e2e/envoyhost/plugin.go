package envoyhost

import (
	"fmt"
	"sync"
	"time"
)

// Plugin is one configured Wasm filter (envoy source/extensions/common/
// wasm/plugin.h PluginConfig) with its root context on every thread.
type Plugin struct {
	host          *Host
	group         *vmGroup
	name          string
	rootID        string
	config        []byte
	key           string
	failurePolicy FailurePolicy
	allowStopIter bool
	reloadBase    time.Duration

	mu      sync.Mutex
	handles map[int]*pluginHandle // thread -> handle
}

// pluginHandle is the plugin on one thread: its VM and root context, and
// when it was last (re)loaded (envoy SinglePluginHandle.last_load).
type pluginHandle struct {
	vm       *VM
	root     *wasmContext
	lastLoad time.Time
}

func newPlugin(h *Host, g *vmGroup, pc *PluginConfig) *Plugin {
	return &Plugin{
		host:          h,
		group:         g,
		name:          pc.Name,
		rootID:        pc.RootID,
		config:        pc.Configuration,
		failurePolicy: pc.FailurePolicy,
		allowStopIter: pc.AllowOnHeadersStopIteration,
		reloadBase:    pc.ReloadBackoff,
		// The plugin key covers everything of the plugin configuration, as
		// Envoy's does: equal configurations share root contexts.
		key: hashBytes([]byte(pc.Name), []byte(pc.RootID), pc.Configuration,
			[]byte(pc.FailurePolicy.String()), []byte(fmt.Sprint(pc.AllowOnHeadersStopIteration))),
		handles: map[int]*pluginHandle{},
	}
}

// canary starts the plugin on a throw-away clone: on_context_create(root),
// on_vm_start, on_configure; false from on_configure rejects the
// configuration (cpp-host src/wasm.cc WasmHandleBase::canary). The clone is
// killed without on_done/on_delete; what it wrote to shared data stays.
func (p *Plugin) canary() error {
	vm, err := p.host.newVM(p.group, "canary")
	if err != nil {
		return err
	}
	defer vm.close()
	root, err := vm.startRoot(p)
	if err != nil {
		return fmt.Errorf("canary: %w", err)
	}
	if err := vm.configureRoot(root, p); err != nil {
		return fmt.Errorf("canary rejected the configuration: %w", err)
	}
	return nil
}

// startOnThread gets the thread's VM (creating it) and starts and
// configures the plugin's root context there (cpp-host
// getOrCreateThreadLocalPlugin).
func (p *Plugin) startOnThread(thread int) error {
	vm, err := p.group.threadVM(thread)
	if err != nil {
		return err
	}
	root, err := vm.startRoot(p)
	if err != nil {
		return err
	}
	if err := vm.configureRoot(root, p); err != nil {
		return err
	}
	p.mu.Lock()
	p.handles[thread] = &pluginHandle{vm: vm, root: root, lastLoad: p.host.clock.Now()}
	p.mu.Unlock()
	return nil
}

// filterMode is what the filter does for one stream.
type filterMode int

const (
	filterActive  filterMode = iota // call the VM
	filterFailed                    // a Context without VM: every callback fails the stream
	filterSkipped                   // FAIL_OPEN on a failed VM: no filter at all
)

// contextFor picks the VM for a new stream on a worker, reloading a VM
// that failed with a runtime error under FAIL_RELOAD once the backoff has
// passed (envoy source/extensions/common/wasm/wasm.cc PluginConfig::
// maybeReloadHandleIfNeeded and createContext).
func (p *Plugin) contextFor(thread int) (*VM, *wasmContext, filterMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.handles[thread]
	if h == nil {
		return nil, nil, filterSkipped
	}
	if h.vm.failState() == FailRuntimeError && p.failurePolicy == FailReload {
		interval := p.reloadInterval()
		now := p.host.clock.Now()
		if now.Sub(h.lastLoad) >= interval {
			h.lastLoad = now
			if vm, root, err := p.reload(thread); err != nil {
				p.host.log.Warn("Failed to reload Wasm plugin", "plugin", p.name, "err", err)
			} else {
				h.vm, h.root = vm, root
				p.host.log.Info("reloaded Wasm plugin", "plugin", p.name, "thread", vm.thread)
			}
		}
	}
	if h.vm.Failed() {
		if p.failurePolicy == FailOpen {
			return nil, nil, filterSkipped
		}
		return h.vm, nil, filterFailed
	}
	return h.vm, h.root, filterActive
}

func (p *Plugin) reload(thread int) (*VM, *wasmContext, error) {
	vm, err := p.group.threadVM(thread)
	if err != nil {
		return nil, nil, err
	}
	root, err := vm.startRoot(p)
	if err != nil {
		return nil, nil, err
	}
	if err := vm.configureRoot(root, p); err != nil {
		return nil, nil, err
	}
	return vm, root, nil
}

// reloadInterval is Envoy's JitteredLowerBoundBackOffStrategy: the base
// interval plus a random part below half of it, drawn on every check.
func (p *Plugin) reloadInterval() time.Duration {
	base := p.reloadBase
	half := uint64(base / 2)
	if half == 0 {
		return base
	}
	return base + time.Duration(p.host.randUint64()%half)
}
