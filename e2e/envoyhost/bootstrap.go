package envoyhost

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasm-epp/wasm-epp/envoy/bootstrap"
)

// Reading an Envoy bootstrap (YAML, envoy.config.bootstrap.v3.Bootstrap)
// into a Config, so the host runs the very file real Envoy would. Only the
// subset this host emulates is accepted; any other field that is set is an
// error naming it, rather than a silent difference.

// BootstrapOptions tunes LoadBootstrap.
type BootstrapOptions struct {
	// Getenv resolves vm_config.environment_variables.host_env_keys;
	// default os.LookupEnv. Unset keys are skipped, as Envoy does.
	Getenv func(string) (string, bool)
	// BaseDir resolves relative code.local.filename paths; default the
	// working directory (Envoy's behaviour).
	BaseDir string
}

// supportedFields lists, per message type, the fields the host implements.
// Listed but not enforced: circuit breaker thresholds, request_timeout,
// request_headers_timeout, route idle_timeout, node and stat_prefix
// (accepted so the project's bootstrap loads; they change no tested
// behaviour).
var supportedFields = map[protoreflect.FullName][]string{
	"envoy.config.bootstrap.v3.Bootstrap":                                               {"admin", "node", "static_resources"},
	"envoy.config.bootstrap.v3.Bootstrap.StaticResources":                               {"listeners", "clusters"},
	"envoy.config.bootstrap.v3.Admin":                                                   {"address"},
	"envoy.config.core.v3.Node":                                                         {"id", "cluster", "metadata", "locality"},
	"envoy.config.core.v3.Locality":                                                     {"region", "zone", "sub_zone"},
	"envoy.config.core.v3.Address":                                                      {"socket_address"},
	"envoy.config.core.v3.SocketAddress":                                                {"address", "port_value", "protocol"},
	"envoy.config.listener.v3.Listener":                                                 {"name", "address", "filter_chains", "per_connection_buffer_limit_bytes"},
	"envoy.config.listener.v3.FilterChain":                                              {"filters", "name"},
	"envoy.config.listener.v3.Filter":                                                   {"name", "typed_config"},
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager": {"stat_prefix", "codec_type", "route_config", "http_filters", "use_remote_address", "normalize_path", "merge_slashes", "request_timeout", "request_headers_timeout", "stream_idle_timeout", "generate_request_id"},
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter":            {"name", "typed_config"},
	"envoy.config.route.v3.RouteConfiguration":                                          {"name", "virtual_hosts"},
	"envoy.config.route.v3.VirtualHost":                                                 {"name", "domains", "routes"},
	"envoy.config.route.v3.Route":                                                       {"name", "match", "route", "direct_response", "response_headers_to_add"},
	"envoy.config.route.v3.RouteMatch":                                                  {"prefix", "path"},
	"envoy.config.route.v3.RouteAction":                                                 {"cluster", "timeout", "idle_timeout"},
	"envoy.config.route.v3.DirectResponseAction":                                        {"status", "body"},
	"envoy.config.core.v3.DataSource":                                                   {"filename", "inline_bytes", "inline_string"},
	"envoy.config.core.v3.HeaderValueOption":                                            {"header"},
	"envoy.config.core.v3.HeaderValue":                                                  {"key", "value"},
	"envoy.extensions.filters.http.wasm.v3.Wasm":                                        {"config"},
	"envoy.extensions.filters.http.router.v3.Router":                                    {},
	"envoy.extensions.wasm.v3.PluginConfig":                                             {"name", "root_id", "vm_config", "configuration", "failure_policy", "fail_open", "allow_on_headers_stop_iteration", "reload_config"},
	"envoy.extensions.wasm.v3.VmConfig":                                                 {"vm_id", "runtime", "code", "configuration", "environment_variables", "allow_precompiled", "nack_on_code_cache_miss"},
	"envoy.extensions.wasm.v3.EnvironmentVariables":                                     {"host_env_keys", "key_values"},
	"envoy.extensions.wasm.v3.ReloadConfig":                                             {"backoff"},
	"envoy.config.core.v3.BackoffStrategy":                                              {"base_interval", "max_interval"},
	"envoy.config.core.v3.AsyncDataSource":                                              {"local"},
	"envoy.config.cluster.v3.Cluster":                                                   {"name", "type", "lb_policy", "connect_timeout", "original_dst_lb_config", "load_assignment", "circuit_breakers"},
	"envoy.config.cluster.v3.Cluster.OriginalDstLbConfig":                               {"use_http_header", "http_header_name"},
	"envoy.config.cluster.v3.CircuitBreakers":                                           {"thresholds"},
	"envoy.config.cluster.v3.CircuitBreakers.Thresholds":                                {"priority", "max_connections", "max_pending_requests", "max_requests", "max_retries"},
	"envoy.config.endpoint.v3.ClusterLoadAssignment":                                    {"cluster_name", "endpoints"},
	"envoy.config.endpoint.v3.LocalityLbEndpoints":                                      {"lb_endpoints"},
	"envoy.config.endpoint.v3.LbEndpoint":                                               {"endpoint"},
	"envoy.config.endpoint.v3.Endpoint":                                                 {"address"},
	"google.protobuf.StringValue":                                                       {"value"},
	"google.protobuf.BytesValue":                                                        {"value"},
	"google.protobuf.BoolValue":                                                         {"value"},
	"google.protobuf.UInt32Value":                                                       {"value"},
	"google.protobuf.Duration":                                                          {"seconds", "nanos"},
}

// opaqueMessages are accepted whole (node metadata).
var opaqueMessages = map[protoreflect.FullName]bool{"google.protobuf.Struct": true}

// checkSupported walks every set field and refuses the ones this host does
// not implement, naming their path. Typed configs are unpacked and walked.
func checkSupported(m protoreflect.Message, path string) error {
	name := m.Descriptor().FullName()
	if opaqueMessages[name] {
		return nil
	}
	if name == "google.protobuf.Any" {
		a := m.Interface().(*anypb.Any)
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: unsupported typed_config %s", path, a.GetTypeUrl())
		}
		return checkSupported(inner.ProtoReflect(), path+"<"+string(inner.ProtoReflect().Descriptor().FullName())+">")
	}
	allowed, ok := supportedFields[name]
	if !ok {
		return fmt.Errorf("%s: %s is not supported by envoyhost", path, name)
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		fname := string(fd.Name())
		if !contains(allowed, fname) {
			err = fmt.Errorf("%s.%s: field not supported by envoyhost", path, fname)
			return false
		}
		if fd.Kind() != protoreflect.MessageKind {
			return true
		}
		p := path + "." + fname
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = checkSupported(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i))
			}
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					err = checkSupported(mv.Message(), p+"["+k.String()+"]")
					return err == nil
				})
			}
		default:
			err = checkSupported(v.Message(), p)
		}
		return err == nil
	})
	return err
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// LoadBootstrap reads a bootstrap with the project's one bootstrap reader
// (envoy/bootstrap: strict decoding, as in Envoy, and the generated proto
// validation), checks every set field is one this host implements and
// converts it to a Config.
func LoadBootstrap(doc []byte, opts BootstrapOptions) (Config, error) {
	b, err := bootstrap.Load(doc)
	if err != nil {
		return Config{}, err
	}
	if err := checkSupported(b.ProtoReflect(), "bootstrap"); err != nil {
		return Config{}, err
	}
	if opts.Getenv == nil {
		opts.Getenv = os.LookupEnv
	}
	var cfg Config
	if a := b.GetAdmin().GetAddress(); a != nil {
		if cfg.AdminAddress, err = socketAddress(a, "admin.address"); err != nil {
			return Config{}, err
		}
	}
	sr := b.GetStaticResources()
	for i, c := range sr.GetClusters() {
		cc, err := convertCluster(c)
		if err != nil {
			return Config{}, fmt.Errorf("static_resources.clusters[%d] %q: %w", i, c.GetName(), err)
		}
		cfg.Clusters = append(cfg.Clusters, cc)
	}
	for i, l := range sr.GetListeners() {
		lc, err := convertListener(l, opts)
		if err != nil {
			return Config{}, fmt.Errorf("static_resources.listeners[%d] %q: %w", i, l.GetName(), err)
		}
		cfg.Listeners = append(cfg.Listeners, lc)
	}
	if len(cfg.Listeners) == 0 {
		return Config{}, errors.New("bootstrap has no static listeners")
	}
	return cfg, nil
}

func socketAddress(a *corev3.Address, path string) (string, error) {
	addr, err := bootstrap.SocketAddress(a)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return addr, nil
}

func convertListener(l *listenerv3.Listener, opts BootstrapOptions) (ListenerConfig, error) {
	lc := ListenerConfig{Name: l.GetName()}
	var err error
	if lc.Address, err = socketAddress(l.GetAddress(), "address"); err != nil {
		return lc, err
	}
	if v := l.GetPerConnectionBufferLimitBytes(); v != nil {
		lc.BufferLimitBytes = int(v.GetValue())
	}
	if len(l.GetFilterChains()) != 1 || len(l.GetFilterChains()[0].GetFilters()) != 1 {
		return lc, errors.New("exactly one filter chain with one filter (the HTTP connection manager) is supported")
	}
	cms, err := bootstrap.ConnectionManagers(l)
	if err != nil {
		return lc, err
	}
	if len(cms) != 1 {
		return lc, fmt.Errorf("filter %q: only the HTTP connection manager is supported", l.GetFilterChains()[0].GetFilters()[0].GetName())
	}
	hcm := cms[0].HCM
	switch hcm.GetCodecType() {
	case hcmv3.HttpConnectionManager_AUTO:
		lc.Codec = CodecAuto
	case hcmv3.HttpConnectionManager_HTTP1:
		lc.Codec = CodecHTTP1
	case hcmv3.HttpConnectionManager_HTTP2:
		lc.Codec = CodecHTTP2
	default:
		return lc, fmt.Errorf("codec_type %s is not supported (AUTO, HTTP1 or HTTP2)", hcm.GetCodecType())
	}
	lc.UseRemoteAddress = hcm.GetUseRemoteAddress().GetValue()
	lc.NormalizePath = hcm.GetNormalizePath().GetValue()
	lc.MergeSlashes = hcm.GetMergeSlashes()
	if d := hcm.GetStreamIdleTimeout(); d != nil {
		// 0s disables it (envoy http_connection_manager.proto).
		lc.StreamIdleTimeout = -1
		if v := d.AsDuration(); v > 0 {
			lc.StreamIdleTimeout = v
		}
	}
	rc := hcm.GetRouteConfig()
	if rc == nil {
		return lc, errors.New("an inline route_config is required (no RDS)")
	}
	for _, vh := range rc.GetVirtualHosts() {
		v := VirtualHostConfig{Name: vh.GetName(), Domains: vh.GetDomains()}
		for i, r := range vh.GetRoutes() {
			rt, err := convertRoute(r)
			if err != nil {
				return lc, fmt.Errorf("virtual host %q route %d: %w", vh.GetName(), i, err)
			}
			v.Routes = append(v.Routes, rt)
		}
		lc.VirtualHosts = append(lc.VirtualHosts, v)
	}
	if len(lc.VirtualHosts) == 0 {
		return lc, errors.New("route_config has no virtual hosts")
	}
	filters := hcm.GetHttpFilters()
	if len(filters) == 0 {
		return lc, errors.New("no http_filters: the router is required")
	}
	for i, hf := range filters {
		m, err := hf.GetTypedConfig().UnmarshalNew()
		if err != nil {
			return lc, fmt.Errorf("http filter %q: %w", hf.GetName(), err)
		}
		switch c := m.(type) {
		case *routerv3.Router:
			if i != len(filters)-1 {
				return lc, errors.New("the router must be the last HTTP filter")
			}
		case *wasmfilterv3.Wasm:
			if lc.Plugin != nil {
				return lc, errors.New("only one Wasm filter per listener is supported")
			}
			p, err := convertPlugin(c.GetConfig(), opts)
			if err != nil {
				return lc, fmt.Errorf("http filter %q: %w", hf.GetName(), err)
			}
			lc.Plugin = &p
		default:
			return lc, fmt.Errorf("http filter %q: %T is not supported", hf.GetName(), m)
		}
	}
	if _, ok := mustLast(filters).(*routerv3.Router); !ok {
		return lc, errors.New("the last HTTP filter must be the router")
	}
	return lc, nil
}

func mustLast(filters []*hcmv3.HttpFilter) proto.Message {
	m, _ := filters[len(filters)-1].GetTypedConfig().UnmarshalNew()
	return m
}

func convertRoute(r *routev3.Route) (RouteConfig, error) {
	rc := RouteConfig{Name: r.GetName()}
	switch m := r.GetMatch().GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		rc.Prefix = m.Prefix
	case *routev3.RouteMatch_Path:
		rc.Path = m.Path
	default:
		return rc, errors.New("only prefix and path matches are supported")
	}
	for _, h := range r.GetResponseHeadersToAdd() {
		rc.ResponseHeadersToAdd = append(rc.ResponseHeadersToAdd, Pair{h.GetHeader().GetKey(), h.GetHeader().GetValue()})
	}
	switch a := r.GetAction().(type) {
	case *routev3.Route_Route:
		c, ok := a.Route.GetClusterSpecifier().(*routev3.RouteAction_Cluster)
		if !ok {
			return rc, errors.New("only a single cluster is supported as route target")
		}
		rc.Cluster = c.Cluster
		rc.Timeout = routeTimeout(a.Route.GetTimeout())
	case *routev3.Route_DirectResponse:
		rc.DirectResponse = &DirectResponse{Status: int(a.DirectResponse.GetStatus())}
		if body := a.DirectResponse.GetBody(); body != nil {
			switch s := body.GetSpecifier().(type) {
			case *corev3.DataSource_InlineString:
				rc.DirectResponse.Body = s.InlineString
			case *corev3.DataSource_InlineBytes:
				rc.DirectResponse.Body = string(s.InlineBytes)
			default:
				return rc, errors.New("direct_response body must be inline")
			}
		}
	default:
		return rc, errors.New("a route needs route or direct_response")
	}
	return rc, nil
}

// routeTimeout: unset is Envoy's 15 s default, 0s disables.
func routeTimeout(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	if v := d.AsDuration(); v > 0 {
		return v
	}
	return -1
}

// convertPlugin reads envoy.extensions.wasm.v3.PluginConfig.
func convertPlugin(pc *wasmv3.PluginConfig, opts BootstrapOptions) (PluginConfig, error) {
	p := PluginConfig{Name: pc.GetName(), RootID: pc.GetRootId(),
		AllowOnHeadersStopIteration: pc.GetAllowOnHeadersStopIteration().GetValue()}
	// envoy source/extensions/common/wasm/wasm.cc PluginConfig: fail_open
	// and failure_policy exclude each other; unspecified is FAIL_CLOSED.
	if pc.GetFailOpen() {
		if pc.GetFailurePolicy() != wasmv3.FailurePolicy_UNSPECIFIED {
			return p, errors.New("only one of fail_open or failure_policy can be set")
		}
		p.FailurePolicy = FailOpen
	} else {
		switch pc.GetFailurePolicy() {
		case wasmv3.FailurePolicy_UNSPECIFIED, wasmv3.FailurePolicy_FAIL_CLOSED:
			p.FailurePolicy = FailClosed
		case wasmv3.FailurePolicy_FAIL_OPEN:
			p.FailurePolicy = FailOpen
		case wasmv3.FailurePolicy_FAIL_RELOAD:
			p.FailurePolicy = FailReload
		default:
			return p, errors.New("unknown failure policy")
		}
	}
	if b := pc.GetReloadConfig().GetBackoff().GetBaseInterval(); b != nil {
		p.ReloadBackoff = b.AsDuration()
	}
	var err error
	if p.Configuration, err = anyToBytes(pc.GetConfiguration()); err != nil {
		return p, fmt.Errorf("configuration: %w", err)
	}
	vm := pc.GetVmConfig()
	if vm == nil {
		return p, errors.New("vm_config is required")
	}
	if rt := vm.GetRuntime(); rt != "envoy.wasm.runtime.v8" {
		return p, fmt.Errorf("runtime %q is not supported: envoyhost emulates envoy.wasm.runtime.v8", rt)
	}
	p.VM.VMID = vm.GetVmId()
	if p.VM.Configuration, err = anyToBytes(vm.GetConfiguration()); err != nil {
		return p, fmt.Errorf("vm_config.configuration: %w", err)
	}
	local := vm.GetCode().GetLocal()
	if local == nil {
		return p, errors.New("vm_config.code: only code.local is supported")
	}
	switch s := local.GetSpecifier().(type) {
	case *corev3.DataSource_Filename:
		path := s.Filename
		if !filepath.IsAbs(path) && opts.BaseDir != "" {
			path = filepath.Join(opts.BaseDir, path)
		}
		p.VM.CodePath = path
	case *corev3.DataSource_InlineBytes:
		p.VM.Code = s.InlineBytes
	case *corev3.DataSource_InlineString:
		p.VM.Code = []byte(s.InlineString)
	default:
		return p, errors.New("vm_config.code.local needs filename, inline_bytes or inline_string")
	}
	if ev := vm.GetEnvironmentVariables(); ev != nil {
		p.VM.EnvironmentVariables = map[string]string{}
		for _, k := range ev.GetHostEnvKeys() {
			if v, ok := opts.Getenv(k); ok && k != "" {
				p.VM.EnvironmentVariables[k] = v
			}
		}
		keys := make([]string, 0, len(ev.GetKeyValues()))
		for k := range ev.GetKeyValues() {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p.VM.EnvironmentVariables[k] = ev.GetKeyValues()[k]
		}
	}
	return p, nil
}

// anyToBytes is envoy's MessageUtil::anyToBytes: a StringValue or
// BytesValue gives its value, anything else its serialised bytes.
func anyToBytes(a *anypb.Any) ([]byte, error) {
	if a == nil {
		return nil, nil
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		return a.GetValue(), nil
	}
	switch v := m.(type) {
	case *wrapperspb.StringValue:
		return []byte(v.GetValue()), nil
	case *wrapperspb.BytesValue:
		return v.GetValue(), nil
	}
	return a.GetValue(), nil
}

func convertCluster(c *clusterv3.Cluster) (ClusterConfig, error) {
	cc := ClusterConfig{Name: c.GetName()}
	if d := c.GetConnectTimeout(); d != nil {
		cc.ConnectTimeout = d.AsDuration()
	}
	st, ok := c.GetClusterDiscoveryType().(*clusterv3.Cluster_Type)
	if !ok {
		return cc, errors.New("only a discovery type (STATIC or ORIGINAL_DST) is supported")
	}
	switch st.Type {
	case clusterv3.Cluster_ORIGINAL_DST:
		// envoy source/extensions/clusters/original_dst/original_dst_cluster.cc
		// OriginalDstClusterFactory::createClusterImpl.
		if c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
			return cc, fmt.Errorf("LB policy %s is not valid for Cluster type ORIGINAL_DST. Only 'CLUSTER_PROVIDED' is allowed with cluster type 'ORIGINAL_DST'", c.GetLbPolicy())
		}
		if c.GetLoadAssignment() != nil {
			return cc, errors.New("ORIGINAL_DST clusters must have no load assignment configured")
		}
		od := c.GetOriginalDstLbConfig()
		if !od.GetUseHttpHeader() {
			if od.GetHttpHeaderName() != "" {
				return cc, fmt.Errorf("ORIGINAL_DST cluster: invalid config http_header_name=%s and use_http_header is false. Set use_http_header to true if http_header_name is desired.", od.GetHttpHeaderName())
			}
			return cc, errors.New("ORIGINAL_DST without use_http_header needs the connection's original destination, which envoyhost does not emulate")
		}
		cc.Type = ClusterOriginalDst
		cc.OriginalDstHeader = od.GetHttpHeaderName()
		if cc.OriginalDstHeader == "" {
			cc.OriginalDstHeader = envoyOriginalDstHeader
		}
	case clusterv3.Cluster_STATIC:
		if c.GetLbPolicy() != clusterv3.Cluster_ROUND_ROBIN {
			return cc, fmt.Errorf("lb_policy %s is not supported (ROUND_ROBIN only)", c.GetLbPolicy())
		}
		cc.Type = ClusterStatic
		for _, lle := range c.GetLoadAssignment().GetEndpoints() {
			for _, lbe := range lle.GetLbEndpoints() {
				addr, err := socketAddress(lbe.GetEndpoint().GetAddress(), "endpoint.address")
				if err != nil {
					return cc, err
				}
				cc.Endpoints = append(cc.Endpoints, addr)
			}
		}
	default:
		return cc, fmt.Errorf("cluster type %s is not supported (STATIC or ORIGINAL_DST)", st.Type)
	}
	return cc, nil
}
