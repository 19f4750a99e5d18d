package envoy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasm-epp/wasm-epp/envoy/bootstrap"
	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// Names every wasm-epp bootstrap uses.
const (
	HCMFilterName    = "envoy.filters.network.http_connection_manager"
	WasmFilterName   = "envoy.filters.http.wasm"
	RouterFilterName = "envoy.filters.http.router"
	VMID             = "wasm-epp"
	RootID           = "wasm-epp"
	RuntimeV8        = "envoy.wasm.runtime.v8"
	// DefaultBufferLimit is Envoy's per_connection_buffer_limit_bytes when a
	// listener does not set one.
	DefaultBufferLimit = 1 << 20
)

// Plugin is one wasm-epp HTTP filter of a bootstrap and where it runs.
type Plugin struct {
	bootstrap.WasmFilter
	// Config is the plugin configuration as the plugin's own decoder reads
	// it, with its defaults filled in.
	Config *config.Config
}

// Where names the plugin for error messages.
func (p Plugin) Where() string {
	return fmt.Sprintf("listener %q http_filters[%d] (%s)", p.Listener.GetName(), p.Index, p.Wasm.GetConfig().GetName())
}

// Plugins returns every envoy.filters.http.wasm filter of the bootstrap's
// static listeners with its configuration decoded by plugin/config.Decode.
// Any configuration the plugin would refuse at start is an error here.
func Plugins(b *bootstrapv3.Bootstrap) ([]Plugin, error) {
	filters, err := bootstrap.WasmFilters(b)
	errs := []error{err}
	var out []Plugin
	for _, w := range filters {
		p := Plugin{WasmFilter: w}
		cfg, err := pluginConfig(w.Wasm.GetConfig())
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Where(), err))
			continue
		}
		p.Config = cfg
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}

// pluginConfig decodes PluginConfig.configuration, which Envoy hands to the
// plugin as raw bytes only when it is a StringValue (or BytesValue); a
// JSON-object Any would reach the plugin as serialized protobuf instead.
func pluginConfig(pc *wasmv3.PluginConfig) (*config.Config, error) {
	s := &wrapperspb.StringValue{}
	if pc.GetConfiguration() == nil || !pc.GetConfiguration().MessageIs(s) {
		return nil, fmt.Errorf("configuration must be a google.protobuf.StringValue holding the plugin's JSON")
	}
	if err := pc.GetConfiguration().UnmarshalTo(s); err != nil {
		return nil, err
	}
	return config.Decode([]byte(s.GetValue()))
}

// Rules are the deployment-specific parts of Check.
type Rules struct {
	// PushOnLoopback requires every receiver listener to bind a loopback
	// address (local runs; in Kubernetes the pod address is reachable only
	// through the headless Service and a NetworkPolicy).
	PushOnLoopback bool
	// WasmFile, when set, is the code.local.filename every plugin must load.
	WasmFile string
}

// Check enforces what wasm-epp needs from a bootstrap loaded by
// LoadBootstrap. It returns every violation found, joined.
func Check(b *bootstrapv3.Bootstrap, rules Rules) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if addr := b.GetAdmin().GetAddress().GetSocketAddress().GetAddress(); !isLoopback(addr) {
		fail("admin must listen on a loopback address (it can stop Envoy), got %q", addr)
	}

	plugins, err := Plugins(b)
	if err != nil {
		errs = append(errs, err)
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}

	var routers, receivers int
	var firstVM *wasmv3.VmConfig
	listenerRole := map[string]config.Role{}
	for _, p := range plugins {
		pc := p.Wasm.GetConfig()
		where := p.Where()
		if !pc.GetAllowOnHeadersStopIteration().GetValue() {
			fail("%s: allow_on_headers_stop_iteration must be true (without it the body never arrives before the headers leave)", where)
		}
		switch pc.GetFailurePolicy() {
		case wasmv3.FailurePolicy_FAIL_CLOSED, wasmv3.FailurePolicy_FAIL_RELOAD:
		case wasmv3.FailurePolicy_UNSPECIFIED:
			fail("%s: set failure_policy explicitly (its default changed between Envoy versions)", where)
		default:
			fail("%s: failure_policy %s skips the plugin, letting a client-set destination header through", where, pc.GetFailurePolicy())
		}
		if pc.GetFailOpen() {
			fail("%s: fail_open must be false", where)
		}
		if pc.GetRootId() != RootID {
			fail("%s: root_id must be %q, got %q", where, RootID, pc.GetRootId())
		}
		vm := pc.GetVmConfig()
		switch {
		case vm == nil:
			fail("%s: vm_config missing", where)
		case vm.GetVmId() != VMID:
			fail("%s: vm_id must be %q (router and receiver share data by vm_id), got %q", where, VMID, vm.GetVmId())
		case vm.GetRuntime() != RuntimeV8:
			fail("%s: runtime must be %s, got %q", where, RuntimeV8, vm.GetRuntime())
		case vm.GetCode().GetLocal().GetFilename() == "":
			fail("%s: code must be a local file", where)
		case rules.WasmFile != "" && vm.GetCode().GetLocal().GetFilename() != rules.WasmFile:
			fail("%s: code must be %q, got %q", where, rules.WasmFile, vm.GetCode().GetLocal().GetFilename())
		}
		if firstVM == nil {
			firstVM = vm
		} else if !proto.Equal(firstVM, vm) {
			fail("%s: vm_config differs from the first plugin's; every wasm-epp plugin must use the same vm_id, code and environment", where)
		}
		checkFilterOrder(p, fail)

		name := p.Listener.GetName()
		if prev, ok := listenerRole[name]; ok && prev != p.Config.Role {
			fail("listener %q runs both a %s and a %s plugin: give each role its own listener", name, prev, p.Config.Role)
		}
		listenerRole[name] = p.Config.Role

		limit := uint32(DefaultBufferLimit)
		if v := p.Listener.GetPerConnectionBufferLimitBytes(); v != nil {
			limit = v.GetValue()
		}
		switch p.Config.Role {
		case config.RoleRouter:
			routers++
			if int(limit) < p.Config.MaxBodyBytes {
				fail("%s: per_connection_buffer_limit_bytes %d is below maxBodyBytes %d: Envoy would answer 413 before the plugin", where, limit, p.Config.MaxBodyBytes)
			}
			checkRouterRoutes(p, clusters, fail)
		case config.RoleReceiver:
			receivers++
			if int(limit) < p.Config.Receiver.MaxPushBytes {
				fail("%s: per_connection_buffer_limit_bytes %d is below receiver.maxPushBytes %d", where, limit, p.Config.Receiver.MaxPushBytes)
			}
			env := vm.GetEnvironmentVariables()
			if !slices.Contains(env.GetHostEnvKeys(), p.Config.Receiver.TokenEnv) {
				fail("%s: vm_config.environment_variables.host_env_keys must list %s (the push token)", where, p.Config.Receiver.TokenEnv)
			}
			if _, inline := env.GetKeyValues()[p.Config.Receiver.TokenEnv]; inline {
				fail("%s: the push token %s must come from the host environment, not key_values in the config", where, p.Config.Receiver.TokenEnv)
			}
			checkReceiverRoutes(p, fail)
			addr := p.Listener.GetAddress().GetSocketAddress().GetAddress()
			if rules.PushOnLoopback && !isLoopback(addr) {
				fail("%s: the push listener must bind a loopback address here, got %q", where, addr)
			}
		}
	}
	if routers == 0 {
		fail("no wasm-epp plugin in the router role")
	}
	if receivers == 0 {
		fail("no wasm-epp plugin in the receiver role (nothing would accept metric pushes)")
	}
	return errors.Join(errs...)
}

func checkFilterOrder(p Plugin, fail func(string, ...any)) {
	filters := p.HCM.GetHttpFilters()
	if f := filters[p.Index]; f.GetDisabled() || f.GetName() != WasmFilterName {
		fail("%s: the filter must be named %s and enabled", p.Where(), WasmFilterName)
	}
	if len(filters) == 0 || filters[len(filters)-1].GetName() != RouterFilterName {
		fail("listener %q: the last HTTP filter must be %s", p.Listener.GetName(), RouterFilterName)
	}
}

// checkRouterRoutes: every route either goes to an ORIGINAL_DST cluster that
// reads the plugin's destination header, or is answered by Envoy itself; and
// the last route catches everything else with a 404.
func checkRouterRoutes(p Plugin, clusters map[string]*clusterv3.Cluster, fail func(string, ...any)) {
	where := p.Where()
	forwards := 0
	for _, vh := range p.HCM.GetRouteConfig().GetVirtualHosts() {
		routes := vh.GetRoutes()
		for i, r := range routes {
			switch {
			case r.GetDirectResponse() != nil:
			case r.GetRoute() != nil:
				forwards++
				name := r.GetRoute().GetCluster()
				c, ok := clusters[name]
				switch {
				case !ok:
					fail("%s: route %d goes to cluster %q, which is not defined (or not a single static cluster)", where, i, name)
				case c.GetType() != clusterv3.Cluster_ORIGINAL_DST || c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED:
					fail("%s: cluster %q must be type ORIGINAL_DST with lb_policy CLUSTER_PROVIDED", where, name)
				case !c.GetOriginalDstLbConfig().GetUseHttpHeader() || c.GetOriginalDstLbConfig().GetHttpHeaderName() != p.Config.DestinationHeader:
					fail("%s: cluster %q must route on http header %q (the plugin's destinationHeader), got use_http_header=%v %q",
						where, name, p.Config.DestinationHeader, c.GetOriginalDstLbConfig().GetUseHttpHeader(), c.GetOriginalDstLbConfig().GetHttpHeaderName())
				}
				if t := r.GetRoute().GetTimeout(); t == nil || t.AsDuration() != 0 {
					fail("%s: route %d must set timeout: 0s (LLM responses have no useful upper bound; use idle_timeout)", where, i)
				}
			default:
				fail("%s: route %d must either forward to the ORIGINAL_DST cluster or be a direct_response", where, i)
			}
		}
		if len(routes) == 0 || !isCatchAll404(routes[len(routes)-1]) {
			fail("%s: virtual host %q must end with a catch-all (prefix \"/\") direct_response 404 for requests the plugin does not route", where, vh.GetName())
		}
	}
	if forwards == 0 {
		fail("%s: no route forwards to the ORIGINAL_DST cluster", where)
	}
}

// checkReceiverRoutes: the receiver answers pushes itself; nothing on its
// listener may ever be forwarded upstream.
func checkReceiverRoutes(p Plugin, fail func(string, ...any)) {
	for _, vh := range p.HCM.GetRouteConfig().GetVirtualHosts() {
		for i, r := range vh.GetRoutes() {
			if r.GetDirectResponse() == nil {
				fail("%s: route %d of the push listener must be a direct_response, never forwarded", p.Where(), i)
			}
		}
		if routes := vh.GetRoutes(); len(routes) == 0 || !isCatchAll404(routes[len(routes)-1]) {
			fail("%s: virtual host %q must end with a catch-all direct_response 404", p.Where(), vh.GetName())
		}
	}
	if p.HCM.GetRouteConfig() == nil {
		fail("%s: the push listener needs an inline route_config", p.Where())
	}
}

func isCatchAll404(r *routev3.Route) bool {
	return r.GetMatch().GetPrefix() == "/" && len(r.GetMatch().GetHeaders()) == 0 &&
		r.GetDirectResponse().GetStatus() == 404
}

func isLoopback(addr string) bool {
	ip, err := netip.ParseAddr(addr)
	return err == nil && ip.IsLoopback()
}
