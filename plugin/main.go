// Command wasm-epp is the Proxy-Wasm plugin Envoy loads
// (GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared). This file is the
// whole glue between Envoy and the two roles, as in the proxy-wasm SDK's
// examples: the VM context, and the plugin (root) context whose
// OnPluginStart decodes the configuration once and starts the role it
// names, the router (package filter) or the metrics push receiver (package
// receiver). Each stream then gets its context from that role.
package main

import (
	"os"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/filter"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/plugin/internal/receiver"
)

// init only registers the plugin: in reactor mode the host runs init during
// _initialize, where any proxy_* call other than logging traps.
func init() { proxywasm.SetVMContext(newVMContext(os.Getenv, filter.Options{})) }

// main is required for package main but never runs (c-shared reactor).
func main() {}

// vmContext creates one plugin context per configured plugin on this VM.
type vmContext struct {
	types.DefaultVMContext
	// getenv reads VM environment variables (vm_config.environment_variables):
	// the receiver's push token.
	getenv func(string) string
	router filter.Options
}

func newVMContext(getenv func(string) string, router filter.Options) *vmContext {
	return &vmContext{getenv: getenv, router: router}
}

func (v *vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	return &pluginContext{vm: v}
}

// role is what a started plugin context hands its streams to: a
// *filter.Router or a *receiver.Receiver.
type role interface {
	NewHttpContext(contextID uint32) types.HttpContext
}

// pluginContext is one configured plugin (root context) on one VM. Its role
// is used from this VM's thread only.
type pluginContext struct {
	types.DefaultPluginContext
	vm   *vmContext
	role role
}

// OnPluginStart decodes the configuration once and starts its role. Any
// mistake fails the start with a message naming the field, so Envoy rejects
// the configuration (the canary VM runs this too) instead of serving with a
// half-understood one.
func (p *pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil {
		proxywasm.LogCriticalf("wasm-epp: cannot read the plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	cfg, err := config.Decode(data)
	if err != nil {
		proxywasm.LogCriticalf("wasm-epp: %v", err)
		return types.OnPluginStartStatusFailed
	}
	switch cfg.Role {
	case config.RoleReceiver:
		token := p.vm.getenv(cfg.Receiver.TokenEnv)
		if token == "" {
			proxywasm.LogCriticalf("wasm-epp: receiver role needs the push token in the VM environment variable %s (vm_config.environment_variables); it is unset or empty", cfg.Receiver.TokenEnv)
			return types.OnPluginStartStatusFailed
		}
		r, err := receiver.New(cfg, token)
		if err != nil {
			proxywasm.LogCriticalf("wasm-epp: %v", err)
			return types.OnPluginStartStatusFailed
		}
		p.role = r
		proxywasm.LogInfof("wasm-epp: receiver started on path %s", cfg.Receiver.Path)
	default: // config.RoleRouter; Decode accepts no other
		r, err := filter.NewRouter(cfg, p.vm.router)
		if err != nil {
			proxywasm.LogCriticalf("wasm-epp: %v", err)
			return types.OnPluginStartStatusFailed
		}
		p.role = r
		if period := r.TickPeriod(); period > 0 {
			if err := proxywasm.SetTickPeriodMilliSeconds(uint32(max(period/time.Millisecond, 1))); err != nil {
				proxywasm.LogCriticalf("wasm-epp: cannot set the tick period: %v", err)
				return types.OnPluginStartStatusFailed
			}
		}
		proxywasm.LogInfof("wasm-epp: router started: %d models, unknown models %s, staleAfter %s, no fresh endpoint: %s, destination header %s",
			len(cfg.Models), cfg.UnknownModels, time.Duration(cfg.StaleAfter), cfg.WhenNoFreshEndpoint, cfg.DestinationHeader)
	}
	return types.OnPluginStartStatusOK
}

// OnTick forwards the root context's tick to a role that has periodic work
// (the router's snapshot re-read, prefix index sync and flow control's
// releases: one tick period per root context, the shortest of theirs).
func (p *pluginContext) OnTick() {
	if t, ok := p.role.(interface{ OnTick() }); ok {
		t.OnTick()
	}
}

func (p *pluginContext) NewHttpContext(contextID uint32) types.HttpContext {
	if p.role == nil {
		// A plugin that failed to start gets no streams from Envoy; if one
		// arrives anyway it must not pass through unrouted.
		return &unconfiguredContext{}
	}
	return p.role.NewHttpContext(contextID)
}

type unconfiguredContext struct{ types.DefaultHttpContext }

const unconfiguredBody = `{"error":{"message":"the wasm-epp plugin is not configured","type":"server_error","code":"internal_error"}}`

func (c *unconfiguredContext) OnHttpRequestHeaders(int, bool) types.Action {
	headers := [][2]string{{"content-type", "application/json"}}
	if err := proxywasm.SendHttpResponseWithDetails(503, "wasm_epp_internal_error", headers, []byte(unconfiguredBody), -1); err != nil {
		proxywasm.LogErrorf("wasm-epp: cannot send the 503 reply: %v", err)
	}
	return types.ActionPause
}
