package envoyhost

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"time"
)

// FailurePolicy is envoy.extensions.wasm.v3.FailurePolicy: what a request
// sees once the plugin's VM failed.
type FailurePolicy int

const (
	// FailClosed answers 503 (details wasm_fail_stream) on a failed VM.
	FailClosed FailurePolicy = iota
	// FailOpen skips the filter on a failed VM.
	FailOpen
	// FailReload creates a new VM after a backoff (503 meanwhile).
	FailReload
)

func (p FailurePolicy) String() string {
	switch p {
	case FailOpen:
		return "FAIL_OPEN"
	case FailReload:
		return "FAIL_RELOAD"
	}
	return "FAIL_CLOSED"
}

// ParseFailurePolicy reads FAIL_CLOSED, FAIL_OPEN or FAIL_RELOAD.
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	switch s {
	case "FAIL_CLOSED":
		return FailClosed, nil
	case "FAIL_OPEN":
		return FailOpen, nil
	case "FAIL_RELOAD":
		return FailReload, nil
	}
	return 0, fmt.Errorf("unknown failure policy %q (want FAIL_CLOSED, FAIL_OPEN or FAIL_RELOAD)", s)
}

// Defaults, Envoy's where Envoy has one.
const (
	DefaultWorkers          = 2
	DefaultBufferLimitBytes = 1 << 20 // listener per_connection_buffer_limit_bytes
	DefaultRouteTimeout     = 15 * time.Second
	// DefaultStreamIdleTimeout is the connection manager's
	// stream_idle_timeout when unset.
	DefaultStreamIdleTimeout = 5 * time.Minute
	DefaultReloadBackoff     = time.Second
	// DefaultOriginalDstHeader is this project's routing header; note that
	// Envoy's own default for use_http_header without a name is
	// x-envoy-original-dst-host (LoadBootstrap keeps Envoy's default).
	DefaultOriginalDstHeader = "x-gateway-destination-endpoint"
	envoyOriginalDstHeader   = "x-envoy-original-dst-host"
)

// Config configures a Host.
type Config struct {
	// Workers is the number of worker threads (one VM each, plus one for
	// the main thread). Default 2.
	Workers int
	// WASIProfile selects the cpp-host generation the WASI layer emulates.
	WASIProfile WASIProfile
	// LogLevel is what proxy_get_log_level answers (0 trace .. 5 critical).
	// Default 2 (info).
	LogLevel *int
	// AdminAddress, if set, serves /stats and /stats/prometheus, e.g.
	// "127.0.0.1:9901" (":0" picks a port).
	AdminAddress string
	Listeners    []ListenerConfig
	Clusters     []ClusterConfig
	// CompilationCacheDir keeps wazero's compiled code across runs.
	CompilationCacheDir string

	Logger *slog.Logger
	Clock  Clock
	// Rand feeds random_get and the reload backoff jitter; default
	// crypto/rand.
	Rand io.Reader
	// AccessLog, if set, receives one entry per finished stream.
	AccessLog func(AccessLogEntry)
}

// ListenerConfig is one HTTP listener: an HTTP connection manager with a
// filter chain of at most one Wasm filter followed by the router.
type ListenerConfig struct {
	Name    string
	Address string // host:port; port 0 picks one (see Host.ListenerAddr)
	// Plugin is the Wasm filter; nil means the router only.
	Plugin *PluginConfig
	// Cluster and RouteTimeout are the short form of VirtualHosts: one
	// route sending every request to Cluster. RouteTimeout 0 means Envoy's
	// default (15 s), negative disables it.
	Cluster      string
	RouteTimeout time.Duration
	// VirtualHosts, if set, is the route table (Envoy's route_config).
	VirtualHosts []VirtualHostConfig
	// BufferLimitBytes is per_connection_buffer_limit_bytes; 0 means 1 MiB.
	BufferLimitBytes int
	// Codec is the connection manager's codec_type: which protocols the
	// listener accepts.
	Codec Codec
	// StreamIdleTimeout is stream_idle_timeout: a stream on which no
	// bytes move for this long gets a local reply (408 if the request was
	// not fully received, 504 if it was). 0 means Envoy's 5 minutes,
	// negative none.
	StreamIdleTimeout time.Duration
	// HTTP connection manager options.
	UseRemoteAddress bool // append the peer address to x-forwarded-for
	NormalizePath    bool // RFC 3986 dot-segment removal before the filters
	MergeSlashes     bool // collapse repeated slashes before the filters
}

// Codec is an HttpConnectionManager codec_type (envoy
// source/common/http/conn_manager_impl.cc createCodec; cleartext here).
type Codec int

const (
	// CodecAuto is AUTO: HTTP/2 when the connection opens with the HTTP/2
	// preface (prior knowledge), HTTP/1.1 otherwise. Without TLS there is
	// no ALPN, and an HTTP/1.1 "Upgrade: h2c" is not taken up.
	CodecAuto Codec = iota
	// CodecHTTP1 accepts HTTP/1.1 only.
	CodecHTTP1
	// CodecHTTP2 accepts HTTP/2 with prior knowledge only.
	CodecHTTP2
)

// VirtualHostConfig is a route_config virtual host.
type VirtualHostConfig struct {
	Name string
	// Domains as Envoy matches them: exact host, "*", "*.suffix" or
	// "prefix*"; the port of :authority is ignored when no domain has one.
	Domains []string
	Routes  []RouteConfig
}

// RouteConfig is one route: a path match and either a cluster or a direct
// response.
type RouteConfig struct {
	Name string
	// Prefix or Path (exact) match the :path without query string.
	Prefix, Path string
	Cluster      string
	// Timeout as RouteAction.timeout: 0 means 15 s, negative none.
	Timeout        time.Duration
	DirectResponse *DirectResponse
	// ResponseHeadersToAdd are appended to the response.
	ResponseHeadersToAdd []Pair
}

// DirectResponse is RouteAction's direct_response.
type DirectResponse struct {
	Status int
	Body   string
}

// PluginConfig mirrors envoy.extensions.wasm.v3.PluginConfig.
type PluginConfig struct {
	Name          string
	RootID        string
	Configuration []byte
	FailurePolicy FailurePolicy
	// AllowOnHeadersStopIteration lets on_request_headers' Pause mean
	// StopIteration instead of StopAllIterationAndWatermark.
	AllowOnHeadersStopIteration bool
	// ReloadBackoff is reload_config.backoff.base_interval; 0 means 1 s.
	ReloadBackoff time.Duration
	VM            VMConfig
}

// VMConfig mirrors envoy.extensions.wasm.v3.VmConfig.
type VMConfig struct {
	VMID string
	// Code is the module; if empty, CodePath is read.
	Code                 []byte
	CodePath             string
	Configuration        []byte
	EnvironmentVariables map[string]string
}

// ClusterType is the cluster discovery type.
type ClusterType int

const (
	// ClusterStatic sends to fixed endpoints, round robin.
	ClusterStatic ClusterType = iota
	// ClusterOriginalDst sends to the address in a request header.
	ClusterOriginalDst
)

// ClusterConfig is an upstream cluster.
type ClusterConfig struct {
	Name string
	Type ClusterType
	// Endpoints are ip:port addresses of a STATIC cluster.
	Endpoints []string
	// OriginalDstHeader is the header an ORIGINAL_DST cluster reads; empty
	// means DefaultOriginalDstHeader.
	OriginalDstHeader string
	ConnectTimeout    time.Duration
}

// AccessLogEntry describes one finished stream.
type AccessLogEntry struct {
	Listener     string
	Method       string
	Path         string
	Status       int
	Details      string // %RESPONSE_CODE_DETAILS%
	UpstreamHost string
	BytesSent    int64
	Duration     time.Duration
}

func (c *Config) withDefaults() (Config, error) {
	out := *c
	if out.Workers == 0 {
		out.Workers = DefaultWorkers
	}
	if out.Workers < 0 {
		return out, errors.New("workers must be positive")
	}
	if out.LogLevel == nil {
		l := logInfo
		out.LogLevel = &l
	} else if *out.LogLevel < 0 || *out.LogLevel > logCritical {
		return out, fmt.Errorf("log level %d out of range 0..5", *out.LogLevel)
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if out.Clock == nil {
		out.Clock = realClock{}
	}
	out.Listeners = append([]ListenerConfig(nil), c.Listeners...)
	out.Clusters = append([]ClusterConfig(nil), c.Clusters...)
	clusters := map[string]bool{}
	for i := range out.Clusters {
		cl := &out.Clusters[i]
		if cl.Name == "" {
			return out, errors.New("cluster without a name")
		}
		if clusters[cl.Name] {
			return out, fmt.Errorf("duplicate cluster %q", cl.Name)
		}
		clusters[cl.Name] = true
		switch cl.Type {
		case ClusterStatic:
			if len(cl.Endpoints) == 0 {
				return out, fmt.Errorf("cluster %q: a STATIC cluster needs endpoints", cl.Name)
			}
			for _, ep := range cl.Endpoints {
				if _, err := netip.ParseAddrPort(ep); err != nil {
					return out, fmt.Errorf("cluster %q: endpoint %q is not ip:port", cl.Name, ep)
				}
			}
		case ClusterOriginalDst:
			if cl.OriginalDstHeader == "" {
				cl.OriginalDstHeader = DefaultOriginalDstHeader
			}
		default:
			return out, fmt.Errorf("cluster %q: unknown type", cl.Name)
		}
		if cl.ConnectTimeout == 0 {
			cl.ConnectTimeout = 5 * time.Second
		}
	}
	names := map[string]bool{}
	for i := range out.Listeners {
		l := &out.Listeners[i]
		if l.Name == "" {
			l.Name = fmt.Sprintf("listener_%d", i)
		}
		if names[l.Name] {
			return out, fmt.Errorf("duplicate listener %q", l.Name)
		}
		names[l.Name] = true
		if l.Address == "" {
			return out, fmt.Errorf("listener %q has no address", l.Name)
		}
		if len(l.VirtualHosts) == 0 {
			l.VirtualHosts = []VirtualHostConfig{{Name: "default", Domains: []string{"*"},
				Routes: []RouteConfig{{Prefix: "/", Cluster: l.Cluster, Timeout: l.RouteTimeout}}}}
		} else {
			l.VirtualHosts = append([]VirtualHostConfig(nil), l.VirtualHosts...)
		}
		for vi := range l.VirtualHosts {
			vh := &l.VirtualHosts[vi]
			if len(vh.Domains) == 0 {
				return out, fmt.Errorf("listener %q: virtual host %q has no domains", l.Name, vh.Name)
			}
			vh.Routes = append([]RouteConfig(nil), vh.Routes...)
			for ri := range vh.Routes {
				r := &vh.Routes[ri]
				if (r.Prefix == "") == (r.Path == "") {
					return out, fmt.Errorf("listener %q: route %d of %q needs exactly one of prefix and path", l.Name, ri, vh.Name)
				}
				if (r.Cluster == "") == (r.DirectResponse == nil) {
					return out, fmt.Errorf("listener %q: route %d of %q needs exactly one of a cluster and a direct response", l.Name, ri, vh.Name)
				}
				if r.Cluster != "" && !clusters[r.Cluster] {
					return out, fmt.Errorf("listener %q routes to unknown cluster %q", l.Name, r.Cluster)
				}
				if r.Timeout == 0 {
					r.Timeout = DefaultRouteTimeout
				}
			}
		}
		if l.BufferLimitBytes == 0 {
			l.BufferLimitBytes = DefaultBufferLimitBytes
		}
		if l.StreamIdleTimeout == 0 {
			l.StreamIdleTimeout = DefaultStreamIdleTimeout
		}
		if l.Plugin != nil {
			p := *l.Plugin
			if p.VM.Code == nil {
				if p.VM.CodePath == "" {
					return out, fmt.Errorf("listener %q: plugin %q has no code", l.Name, p.Name)
				}
				code, err := os.ReadFile(p.VM.CodePath)
				if err != nil {
					return out, fmt.Errorf("listener %q: plugin %q: %w", l.Name, p.Name, err)
				}
				p.VM.Code = code
			}
			if p.ReloadBackoff == 0 {
				p.ReloadBackoff = DefaultReloadBackoff
			}
			l.Plugin = &p
		}
	}
	return out, nil
}

// Clock is the time source: wall time for the guest and timers for ticks
// and timeouts.
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a stoppable timer.
type Timer interface {
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer {
	return time.AfterFunc(d, f)
}
