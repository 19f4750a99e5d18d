package filter

import (
	"os"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/plugin/internal/receiver"
)

// Options are the filter's injected dependencies; the zero value is what
// the .wasm uses.
type Options struct {
	// Now is the clock for staleness and the snapshot-age gauge; nil means
	// the wall clock (WASI clock_time_get in the .wasm), read once per
	// scheduling decision.
	Now func() time.Time
	// Getenv reads VM environment variables (the receiver's push token);
	// nil means os.Getenv (vm_config.environment_variables in Envoy).
	Getenv func(string) string
	// LogLevel asks the host for its log level (decides whether decisions
	// are logged at debug); nil means proxywasm.GetLogLevel. Native tests
	// and benchmarks set it: proxytest always reports trace.
	LogLevel func() (proxywasm.LogLevel, error)
}

// NewVMContext returns the VM context to register with
// proxywasm.SetVMContext.
func NewVMContext(opts Options) types.VMContext {
	if opts.LogLevel == nil {
		opts.LogLevel = proxywasm.GetLogLevel
	}
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	return &vmContext{opts: opts}
}

type vmContext struct {
	types.DefaultVMContext
	opts Options
}

func (v *vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	return &pluginContext{opts: v.opts}
}

// pluginContext is one configured plugin (root context) on one VM. Its
// router (or receiver) is used from this VM's thread only.
type pluginContext struct {
	types.DefaultPluginContext
	opts     Options
	router   *router
	receiver *receiver.Receiver
}

// OnPluginStart decodes the configuration once. Any mistake fails the start
// with a message naming the field, so Envoy rejects the configuration (the
// canary VM runs this too) instead of serving with a half-understood one.
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
	if cfg.Role == config.RoleReceiver {
		token := p.opts.Getenv(cfg.Receiver.TokenEnv)
		if token == "" {
			proxywasm.LogCriticalf("wasm-epp: receiver role needs the push token in the VM environment variable %s (vm_config.environment_variables); it is unset or empty", cfg.Receiver.TokenEnv)
			return types.OnPluginStartStatusFailed
		}
		r, err := receiver.New(cfg, token)
		if err != nil {
			proxywasm.LogCriticalf("wasm-epp: %v", err)
			return types.OnPluginStartStatusFailed
		}
		p.receiver = r
		proxywasm.LogInfof("wasm-epp: receiver started on path %s", cfg.Receiver.Path)
		return types.OnPluginStartStatusOK
	}
	r, err := newRouter(cfg, p.opts)
	if err != nil {
		proxywasm.LogCriticalf("wasm-epp: %v", err)
		return types.OnPluginStartStatusFailed
	}
	p.router = r
	proxywasm.LogInfof("wasm-epp: router started: %d models, unknown models %s, staleAfter %s, no fresh endpoint: %s, destination header %s",
		len(cfg.Models), cfg.UnknownModels, time.Duration(cfg.StaleAfter), cfg.WhenNoFreshEndpoint, cfg.DestinationHeader)
	return types.OnPluginStartStatusOK
}

func (p *pluginContext) NewHttpContext(contextID uint32) types.HttpContext {
	switch {
	case p.receiver != nil:
		return p.receiver.NewHttpContext(contextID)
	case p.router != nil:
		return p.router.newHTTPContext()
	}
	// A plugin that failed to start gets no streams from Envoy; if one
	// arrives anyway it must not pass through unrouted.
	return &unconfiguredContext{}
}

type unconfiguredContext struct{ types.DefaultHttpContext }

func (c *unconfiguredContext) OnHttpRequestHeaders(int, bool) types.Action {
	sendError(503, "wasm_epp_internal_error", "server_error", "internal_error", "the wasm-epp plugin is not configured")
	return types.ActionPause
}
