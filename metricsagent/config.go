package metricsagent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// EnvPrefix prefixes the environment variable of every flag:
// --scrape-timeout is also WASM_EPP_AGENT_SCRAPE_TIMEOUT.
const EnvPrefix = "WASM_EPP_AGENT_"

// TokenEnv holds the push token itself, for setups without a token file.
// There is deliberately no flag for it: command lines are visible in ps.
const TokenEnv = EnvPrefix + "PUSH_TOKEN"

// Config is everything the agent command reads from flags and environment.
type Config struct {
	// Mode is ModeAgent (scrape and push) or ModeAggregator (relay agents'
	// pushes to the Envoys, aggregator.go).
	Mode    string
	AgentID string

	// Discovery: Targets for static targets, else Kubernetes.
	Targets     string
	PodSelector string
	Namespace   string
	NodeName    string
	Kubeconfig  string
	MetricsPort string
	MetricsPath string

	// The model table: InferencePool names the pool (namespace/name) whose
	// objects are read, from the API server or, for tests and local runs,
	// from TestObjectsFile.
	InferencePool   string
	TestObjectsFile string
	WriteStatus     bool
	ConfigPushPath  string
	ConfigResend    time.Duration
	ConfigRefresh   time.Duration
	// MaxTableBytes and MaxModelNameLength are the receivers' bounds on a
	// record (receiver.maxConfigBytes, maxModelNameLength): objects past
	// them are rejected one by one instead of the whole record.
	MaxTableBytes      int
	MaxModelNameLength int

	// Send says which cycles push: when a value moved beyond its
	// threshold, the endpoints or their adapters changed, or the heartbeat
	// is due (wire.SendThresholds; Heartbeat 0: every cycle).
	Send wire.SendThresholds

	// Scraping.
	Interval      time.Duration
	ScrapeTimeout time.Duration
	MaxBodyBytes  int64
	Names         MetricNames
	AskForNames   bool

	// Pushing: EnvoyTargets or EnvoyDNS.
	EnvoyTargets    string
	EnvoyDNS        string
	EnvoyDNSRefresh time.Duration
	PushPath        string
	PushTimeout     time.Duration
	PushTokenFile   string
	PushToken       string // from TokenEnv only
	// WireVersion is the push format (2; 1 for plugins older than the
	// segmented shared-data layout).
	WireVersion int

	// Agents push to aggregators (Aggregators or AggregatorDNS) when set,
	// falling back to the Envoys after FallbackAfter without an accepted
	// push.
	Aggregators   string
	AggregatorDNS string
	FallbackAfter time.Duration

	// Aggregator mode: where agents push to, how often every block is
	// relayed again, when a silent agent is forgotten.
	AggregatorListen string
	RelayFullEvery   time.Duration
	AgentTTL         time.Duration

	Listen    string
	Pprof     bool
	MaxProcs  int
	LogLevel  slog.Level
	LogFormat string
}

// Modes of the binary (--mode).
const (
	ModeAgent      = "agent"
	ModeAggregator = "aggregator"
)

// EnvName returns the environment variable that stands for flag name.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// newFlagSet defines every flag on a fresh FlagSet bound to cfg.
func newFlagSet(cfg *Config, kvNames *string, logLevel *string) *flag.FlagSet {
	fs := flag.NewFlagSet("metricsagent", flag.ContinueOnError)
	d := DefaultMetricNames()
	st := wire.DefaultSendThresholds()
	fs.DurationVar(&cfg.Send.Heartbeat, "heartbeat", st.Heartbeat, "push the node's state at least this often even when nothing moved beyond the --send-* thresholds; keep it well under the plugin's staleAfter (default 2s): an endpoint's metrics are as old as the last push. 0, or less than --interval: push every cycle")
	fs.Func("send-waiting-delta", "push when an endpoint's waiting queue moved by at least this many requests since the last push (default "+strconv.Itoa(int(st.Waiting))+")", uintFlag(&cfg.Send.Waiting, st.Waiting))
	fs.Func("send-running-delta", "push when an endpoint's running count moved by at least this many requests since the last push (default "+strconv.Itoa(int(st.Running))+")", uintFlag(&cfg.Send.Running, st.Running))
	fs.Float64Var(&cfg.Send.KVCacheUsage, "send-kv-delta", st.KVCacheUsage, "push when an endpoint's KV-cache use (0..1) moved by at least this much since the last push; 0: any change")
	fs.StringVar(&cfg.Mode, "mode", ModeAgent, "agent: scrape this node's pods and push; aggregator: take the agents' pushes and relay them to every Envoy, one push per interval")
	fs.StringVar(&cfg.AgentID, "agent-id", "", "id sent with every push; default: the node name, else the host name")
	fs.StringVar(&cfg.Targets, "targets", "", "static pods to scrape, host:port,... (local runs); empty: discover pods on Kubernetes")
	fs.StringVar(&cfg.PodSelector, "pod-selector", "", "Kubernetes label selector of the vLLM pods, e.g. app=vllm (required without --targets)")
	fs.StringVar(&cfg.Namespace, "namespace", "", "namespace to watch; empty: all namespaces (needs a ClusterRole)")
	fs.StringVar(&cfg.NodeName, "node-name", "", "this node's name (downward API spec.nodeName); NODE_NAME is read too")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster service account")
	fs.StringVar(&cfg.MetricsPort, "metrics-port", "8000", "pod port serving metrics: a number, or the name of a container port")
	fs.StringVar(&cfg.MetricsPath, "metrics-path", "/metrics", "HTTP path of the pods' metrics")
	fs.StringVar(&cfg.InferencePool, "inference-pool", "", "namespace/name of an InferencePool (inference.networking.k8s.io/v1): discover its pods (one endpoint per target port, scraped on that port) and push the model table built from its InferenceObjectives and InferenceModelRewrites (llm-d.ai/v1alpha2)")
	fs.StringVar(&cfg.TestObjectsFile, "test-objects-file", "", "for tests and local runs: read the pool's objects from this multi-document YAML file (re-read when it changes) instead of the API server; needs --targets")
	fs.BoolVar(&cfg.WriteStatus, "write-status", true, "write an Accepted condition on each InferenceObjective and InferenceModelRewrite of the pool (RBAC: update on their /status)")
	fs.StringVar(&cfg.ConfigPushPath, "config-push-path", wire.ConfigPath, "HTTP path of the receiver for the model table")
	fs.DurationVar(&cfg.ConfigResend, "config-resend", time.Second, "push the model table again this often to an Envoy (or through aggregators) that does not say which table it holds (an older receiver); others get it when their answers to the metrics pushes name another table")
	fs.DurationVar(&cfg.ConfigRefresh, "config-refresh", time.Minute, "push the model table again this often to an Envoy that keeps naming another table after it got this one (it holds a newer one: 409)")
	fs.IntVar(&cfg.MaxTableBytes, "max-table-bytes", wire.DefaultConfigLimits().MaxBytes, "largest model-table record: the plugin's receiver.maxConfigBytes (objects that would pass it are rejected, TooLarge)")
	fs.IntVar(&cfg.MaxModelNameLength, "max-model-name-length", wire.DefaultConfigLimits().MaxModelNameLen, "longest model name in the model table: the plugin's maxModelNameLength (objects with longer names are rejected)")
	fs.DurationVar(&cfg.Interval, "interval", 50*time.Millisecond, "time between two scrape-and-push cycles")
	fs.DurationVar(&cfg.ScrapeTimeout, "scrape-timeout", 40*time.Millisecond, "timeout of one scrape; must be shorter than --interval")
	fs.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", 4<<20, "largest metrics body read; a longer one fails the scrape")
	fs.BoolVar(&cfg.AskForNames, "metrics-name-filter", true, "ask pods for only the families read (Prometheus name[] query parameters: prometheus_client's handlers honour them; current vLLM's /metrics route ignores them and sends the whole page)")
	fs.StringVar(&cfg.Names.Waiting, "metric-waiting", d.Waiting, "gauge of waiting requests")
	fs.StringVar(&cfg.Names.Running, "metric-running", d.Running, "gauge of running requests")
	fs.StringVar(kvNames, "metric-kv-usage", strings.Join(d.KVUsage, ","), "gauges of KV-cache usage (0..1), comma-separated, first present wins")
	fs.StringVar(&cfg.Names.LoRAInfo, "metric-lora-info", d.LoRAInfo, "LoRA info gauge (labels max_lora, running_lora_adapters, waiting_lora_adapters); empty: ignore LoRA")
	fs.StringVar(&cfg.EnvoyTargets, "envoy-targets", "", "Envoy push listeners, host:port,...")
	fs.StringVar(&cfg.EnvoyDNS, "envoy-dns", "", "name:port of a headless Service; every address behind it gets every push")
	fs.DurationVar(&cfg.EnvoyDNSRefresh, "envoy-dns-refresh", time.Second, "least time between two lookups of --envoy-dns (0: every cycle)")
	fs.StringVar(&cfg.PushPath, "push-path", wire.PushPath, "HTTP path of the plugin's receiver")
	fs.DurationVar(&cfg.PushTimeout, "push-timeout", 200*time.Millisecond, "timeout of one push to one Envoy (others are not held up by it)")
	fs.StringVar(&cfg.PushTokenFile, "push-token-file", "", "file holding the push bearer token (a mounted Secret); or set "+TokenEnv)
	fs.IntVar(&cfg.WireVersion, "wire-version", 2, "push format: 2, or 1 for plugins older than the segmented shared-data layout (upgrade the plugin first: it reads both)")
	fs.StringVar(&cfg.Aggregators, "aggregators", "", "aggregators to push to, host:port,... (instead of every Envoy; Envoys get pushes directly only while no aggregator accepts them)")
	fs.StringVar(&cfg.AggregatorDNS, "aggregator-dns", "", "name:port of the aggregators' headless Service (instead of --aggregators)")
	fs.DurationVar(&cfg.FallbackAfter, "fallback-after", 500*time.Millisecond, "push to every Envoy directly once no aggregator has accepted a push for this long")
	fs.StringVar(&cfg.AggregatorListen, "aggregator-listen", ":9200", "aggregator mode: address taking the agents' pushes (path --push-path)")
	fs.DurationVar(&cfg.RelayFullEvery, "relay-full-every", 10*time.Second, "aggregator mode: relay every agent's block at least this often, a backstop: every agent pushes at least every --heartbeat, and each push is relayed to every Envoy, so an Envoy that restarted is whole again within the agents' heartbeat")
	fs.DurationVar(&cfg.AgentTTL, "agent-ttl", 10*time.Second, "aggregator mode: stop relaying an agent not heard from for this long")
	fs.StringVar(&cfg.Listen, "listen", ":9100", "address of /metrics, /healthz and /readyz")
	fs.IntVar(&cfg.MaxProcs, "max-procs", 1, "GOMAXPROCS for the agent; 1 suits this I/O-bound work (no wake-ups across threads, a third less CPU at 100 pods); 0 keeps Go's default")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "also serve Go's /debug/pprof/ on --listen (profiling; keep off in production)")
	fs.StringVar(logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", "json", "json or text")
	// Name each flag's environment variable in -h.
	fs.VisitAll(func(f *flag.Flag) { f.Usage += " [$" + EnvName(f.Name) + "]" })
	return fs
}

// uintFlag sets *dst to def and parses a decimal 32-bit count into it.
func uintFlag(dst *uint32, def uint32) func(string) error {
	*dst = def
	return func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return errors.New("want a whole number")
		}
		*dst = uint32(n)
		return nil
	}
}

// ParseConfig reads flags from args and their environment equivalents
// through getenv (a flag given on the command line wins over its variable).
// It reads nothing else from the process: Main passes os.Getenv.
// -h prints the usage to out and returns flag.ErrHelp.
func ParseConfig(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	var cfg Config
	var kvNames, logLevel string
	fs := newFlagSet(&cfg, &kvNames, &logLevel)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "metricsagent scrapes vLLM pods and pushes their state to the wasm-epp plugin in every Envoy.\n\n"+
			"Every flag can also be set by the environment variable shown in brackets; the push token\n"+
			"itself only by %s or --push-token-file.\n\n", TokenEnv)
		fs.PrintDefaults()
	}
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v := getenv(EnvName(f.Name)); v != "" && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", EnvName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return cfg, envErr
	}
	if cfg.NodeName == "" {
		cfg.NodeName = getenv("NODE_NAME")
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	cfg.PushToken = getenv(TokenEnv)
	for _, n := range strings.Split(kvNames, ",") {
		if n = strings.TrimSpace(n); n != "" {
			cfg.Names.KVUsage = append(cfg.Names.KVUsage, n)
		}
	}
	if err := cfg.LogLevel.UnmarshalText([]byte(logLevel)); err != nil {
		return cfg, fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
	}
	return cfg, cfg.validate()
}

// maxBodyLimit bounds --max-body-bytes: a metrics page is kilobytes; a cap
// near the address space would only let a broken pod make the agent
// allocate that much.
const maxBodyLimit = 256 << 20

func (c *Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Interval <= 0 {
		bad("--interval must be positive")
	}
	if c.PushTimeout <= 0 {
		bad("--push-timeout must be positive")
	}
	if (c.EnvoyTargets == "") == (c.EnvoyDNS == "") {
		bad("set exactly one of --envoy-targets and --envoy-dns")
	}
	if c.EnvoyDNSRefresh < 0 {
		bad("--envoy-dns-refresh must not be negative")
	}
	if c.PushTokenFile == "" && c.PushToken == "" {
		bad("no push token: set --push-token-file or %s", TokenEnv)
	}
	if c.MaxProcs < 0 {
		bad("--max-procs must not be negative")
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		bad("--log-format %q: want json or text", c.LogFormat)
	}
	switch c.Mode {
	case ModeAgent:
	case ModeAggregator:
		if c.AggregatorListen == "" {
			bad("aggregator mode needs --aggregator-listen")
		}
		if c.RelayFullEvery < c.Interval || c.AgentTTL <= 0 {
			bad("--relay-full-every must be at least --interval and --agent-ttl positive")
		}
		if c.Targets != "" || c.PodSelector != "" || c.InferencePool != "" || c.Aggregators != "" || c.AggregatorDNS != "" {
			bad("aggregator mode scrapes nothing and relays to the Envoys itself: --targets, --pod-selector, --inference-pool, --aggregators and --aggregator-dns are for agents")
		}
		if !strings.HasPrefix(c.PushPath, "/") {
			bad("--push-path must start with /")
		}
		return errors.Join(errs...)
	default:
		bad("--mode %q: want %s or %s", c.Mode, ModeAgent, ModeAggregator)
		return errors.Join(errs...)
	}
	if c.WireVersion != 1 && c.WireVersion != 2 {
		bad("--wire-version %d: want 1 or 2", c.WireVersion)
	}
	if c.Aggregators != "" && c.AggregatorDNS != "" {
		bad("--aggregators and --aggregator-dns exclude each other")
	}
	if (c.Aggregators != "" || c.AggregatorDNS != "") && (c.WireVersion != 2 || c.FallbackAfter <= 0) {
		bad("pushing to aggregators needs --wire-version 2 and a positive --fallback-after")
	}
	if err := c.Send.Validate(); err != nil {
		bad("--heartbeat, --send-*: %v", err)
	}
	if c.ScrapeTimeout <= 0 || c.ScrapeTimeout >= c.Interval {
		bad("--scrape-timeout %v must be positive and shorter than --interval %v", c.ScrapeTimeout, c.Interval)
	}
	if c.MaxBodyBytes <= 0 || c.MaxBodyBytes > maxBodyLimit {
		bad("--max-body-bytes must be between 1 and %d (256 MiB)", maxBodyLimit)
	}
	if c.Targets == "" {
		if c.NodeName == "" {
			bad("without --targets, pods are discovered on Kubernetes and --node-name (or NODE_NAME) is required")
		}
		if c.PodSelector == "" && c.InferencePool == "" {
			bad("without --targets, --pod-selector or --inference-pool is required")
		}
	} else if c.PodSelector != "" {
		bad("--targets and --pod-selector exclude each other")
	}
	if c.PodSelector != "" && c.InferencePool != "" {
		bad("--pod-selector and --inference-pool exclude each other (the pool's selector picks the pods)")
	}
	if c.InferencePool != "" {
		if ns, _, err := ParsePoolName(c.InferencePool); err != nil {
			bad("--inference-pool: %v", err)
		} else if c.Namespace != "" && c.Namespace != ns {
			bad("--namespace %q differs from the InferencePool's namespace %q (a pool selects pods of its own namespace)", c.Namespace, ns)
		}
	}
	if c.TestObjectsFile != "" && (c.InferencePool == "" || c.Targets == "") {
		bad("--test-objects-file needs --inference-pool (the pool to read) and --targets (no pods can be discovered without a cluster)")
	}
	if c.ConfigResend <= 0 {
		bad("--config-resend must be positive")
	}
	if c.ConfigRefresh <= 0 {
		bad("--config-refresh must be positive")
	}
	if c.MaxTableBytes < 1 || c.MaxTableBytes > maxTableBytes {
		bad("--max-table-bytes must be between 1 and %d (the receiver's bound)", maxTableBytes)
	}
	if c.MaxModelNameLength < 1 {
		bad("--max-model-name-length must be positive")
	}
	if !strings.HasPrefix(c.ConfigPushPath, "/") || c.ConfigPushPath == c.PushPath {
		bad("--config-push-path must start with / and differ from --push-path")
	}
	if !strings.HasPrefix(c.PushPath, "/") || !strings.HasPrefix(c.MetricsPath, "/") {
		bad("--push-path and --metrics-path must start with /")
	}
	if c.Names.Waiting == "" || c.Names.Running == "" || len(c.Names.KVUsage) == 0 {
		bad("--metric-waiting, --metric-running and --metric-kv-usage must not be empty")
	}
	return errors.Join(errs...)
}

// maxTableBytes is the most the plugin's receiver.maxConfigBytes allows.
const maxTableBytes = 16 << 20

// TableLimits are the bounds the model table is built within.
func (c *Config) TableLimits() wire.ConfigLimits {
	return wire.ConfigLimits{MaxBytes: c.MaxTableBytes, MaxModelNameLen: c.MaxModelNameLength}
}

// ParsePoolName splits "namespace/name" and checks both are Kubernetes
// names.
func ParsePoolName(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q: want namespace/name", s)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return "", "", fmt.Errorf("namespace %q: %s", namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", "", fmt.Errorf("name %q: %s", name, strings.Join(errs, "; "))
	}
	return namespace, name, nil
}
