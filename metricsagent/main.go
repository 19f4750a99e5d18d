package metricsagent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Main runs the agent until ctx ends (the command cancels it on SIGTERM)
// and returns the process exit code: 0 after a clean shutdown or -h, 2 for
// bad flags, 1 when startup fails.
func Main(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := ParseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "metricsagent:", err)
		return 2
	}
	if cfg.MaxProcs > 0 {
		runtime.GOMAXPROCS(cfg.MaxProcs)
	}
	log := newLogger(cfg, stderr)
	klog.SetSlogLogger(log) // client-go logs through the same handler
	if err := run(ctx, cfg, log); err != nil {
		log.Error("agent failed", "err", err)
		return 1
	}
	return 0
}

func newLogger(cfg Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if cfg.Mode == ModeAggregator {
		return runAggregator(ctx, cfg, log)
	}
	if cfg.AgentID == "" {
		cfg.AgentID = cfg.NodeName
	}
	if cfg.AgentID == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("no --agent-id, no node name and no host name: %w", err)
		}
		cfg.AgentID = h
	}

	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	kube, err := newKubeClients(cfg)
	if err != nil {
		return err
	}
	sync, beforeCycle, err := newConfigSync(ctx, cfg, kube, log, metrics)
	if err != nil {
		return err
	}
	disc, err := newDiscoverer(ctx, cfg, kube, sync, log)
	if err != nil {
		return err
	}
	envoys, err := newEnvoyTargets(cfg, log, metrics)
	if err != nil {
		return err
	}
	token := &TokenSource{File: cfg.PushTokenFile, Value: cfg.PushToken, Refresh: 10 * time.Second}
	pusher := &Pusher{Client: NewPushClient(), Path: cfg.PushPath, Timeout: cfg.PushTimeout, Token: token, Log: log, Metrics: metrics}
	if _, err := pusher.Token.Token(); err != nil {
		return err
	}
	var publisher *ConfigPublisher
	if sync != nil {
		configPusher := &Pusher{Client: NewPushClient(), Path: cfg.ConfigPushPath, Timeout: cfg.PushTimeout, Token: token,
			Log: log.With("payload", "config"), Metrics: metrics.configPushMetrics(),
			Delivered: func(status int) bool { return status == http.StatusConflict }}
		defer configPusher.Close()
		pusher.Held = &HeldTables{}
		publisher = &ConfigPublisher{Payload: sync.Payload, Pusher: configPusher, Held: pusher.Held,
			Resend: cfg.ConfigResend, Refresh: cfg.ConfigRefresh}
	}
	opts := Options{
		AgentID: cfg.AgentID, Interval: cfg.Interval, Discoverer: disc,
		Scraper: &Scraper{Timeout: cfg.ScrapeTimeout, MaxBodyBytes: cfg.MaxBodyBytes, Names: cfg.Names, AskForNames: cfg.AskForNames},
		Envoys:  envoys, Pusher: pusher, Config: publisher, BeforeCycle: beforeCycle, Log: log, Metrics: metrics,
		WireVersion: cfg.WireVersion, Send: cfg.Send,
	}
	if cfg.Aggregators != "" || cfg.AggregatorDNS != "" {
		aggs, err := newTargets(cfg.Aggregators, cfg.AggregatorDNS, "aggregator", cfg, log, metrics)
		if err != nil {
			return err
		}
		failover := &FailoverTargets{Aggregators: aggs, Envoys: envoys, FallbackAfter: cfg.FallbackAfter,
			RecoverAfter: 2 * cfg.FallbackAfter, Now: time.Now, Log: log,
			Direct: func(direct bool) { metrics.DirectPushes.Set(boolGauge(direct)) }}
		pusher.Sent = failover.Observe
		opts.Envoys, opts.ConfigEnvoys = failover, envoys
		if publisher != nil {
			publisher.Via = aggs
		}
	}
	agent := NewAgent(opts)

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	handler := Handler(reg, agent.Ready)
	if cfg.Pprof {
		mux := http.NewServeMux()
		mux.Handle("/", handler)
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		handler = mux
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("metricsagent started", "agent_id", cfg.AgentID, "listen", ln.Addr().String(),
		"interval", cfg.Interval, "scrape_timeout", cfg.ScrapeTimeout, "static_targets", cfg.Targets != "",
		"inference_pool", cfg.InferencePool, "envoy_targets", cfg.EnvoyTargets, "envoy_dns", cfg.EnvoyDNS)

	runCtx, stop := context.WithCancel(ctx)
	agentDone := make(chan struct{})
	go func() { agent.Run(runCtx); close(agentDone) }()
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err = <-serveErr:
		err = fmt.Errorf("health and metrics server: %w", err)
	}
	stop()
	<-agentDone
	pusher.Close()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := srv.Shutdown(shutdownCtx); serr != nil && err == nil {
		err = serr
	}
	return err
}

// kubeClients are the API clients, built only when something needs the
// cluster (discovery, or the pool's objects from the API server).
type kubeClients struct {
	core  corev1client.CoreV1Interface
	dyn   dynamic.Interface
	disco discovery.DiscoveryInterface
}

func newKubeClients(cfg Config) (*kubeClients, error) {
	if cfg.Targets != "" && (cfg.InferencePool == "" || cfg.TestObjectsFile != "") {
		return nil, nil
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	restCfg.UserAgent = "wasm-epp-metricsagent"
	k := &kubeClients{}
	if k.core, err = corev1client.NewForConfig(restCfg); err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	if k.dyn, err = dynamic.NewForConfig(restCfg); err != nil {
		return nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	if k.disco, err = discovery.NewDiscoveryClientForConfig(restCfg); err != nil {
		return nil, fmt.Errorf("kubernetes discovery client: %w", err)
	}
	return k, nil
}

// newConfigSync starts reading the pool's objects (nil without
// --inference-pool) and waits for them once. With --test-objects-file it
// also returns the function each cycle starts with: it reads the file.
func newConfigSync(ctx context.Context, cfg Config, kube *kubeClients, log *slog.Logger, m *Metrics) (*ConfigSync, func(), error) {
	if cfg.InferencePool == "" {
		return nil, nil, nil
	}
	ns, name, err := ParsePoolName(cfg.InferencePool)
	if err != nil {
		return nil, nil, err
	}
	opts := ConfigSyncOptions{PoolNamespace: ns, PoolName: name, AgentID: cfg.AgentID, Limits: cfg.TableLimits(), Log: log, Metrics: m}
	var status *StatusWriter
	var fileSource *FileObjectSource
	if cfg.TestObjectsFile != "" {
		src, err := NewFileObjectSource(cfg.TestObjectsFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--test-objects-file: %w", err)
		}
		opts.Source, fileSource = src, src
	} else {
		src := NewKubeObjectSource(kube.dyn, ns, Served(kube.disco), log)
		if err := src.Start(ctx, time.Minute); err != nil {
			return nil, nil, err
		}
		opts.Source = src
		if cfg.WriteStatus {
			status = NewStatusWriter(kube.dyn, src.object, log, m, statusJitter)
			go status.Run(ctx)
		}
	}
	opts.Status = status
	sync := NewConfigSync(opts)
	go sync.Run(ctx)
	if fileSource == nil {
		return sync, nil, nil
	}
	var lastErr string
	return sync, func() {
		changed, err := fileSource.Poll()
		switch {
		case err != nil:
			if err.Error() != lastErr {
				log.Warn("objects file unreadable; keeping the objects read before", "file", cfg.TestObjectsFile, "err", err)
			}
			lastErr = err.Error()
		case changed:
			lastErr = ""
			sync.Rebuild()
		}
	}, nil
}

// statusJitter spreads the agents' status writes (see StatusWriter).
const statusJitter = 2 * time.Second

func newDiscoverer(ctx context.Context, cfg Config, kube *kubeClients, sync *ConfigSync, log *slog.Logger) (Discoverer, error) {
	if cfg.Targets != "" {
		return NewStaticDiscovery(ctx, cfg.Targets, cfg.MetricsPath, net.DefaultResolver)
	}
	kc := KubeConfig{Namespace: cfg.Namespace, NodeName: cfg.NodeName,
		Selector: cfg.PodSelector, Port: cfg.MetricsPort, Path: cfg.MetricsPath}
	if sync != nil {
		kc.Pool, kc.Namespace = sync, sync.poolNamespace
	}
	kd, err := NewKubeDiscovery(kube.core, kc, log)
	if err != nil {
		return nil, err
	}
	if err := kd.Start(ctx, time.Minute); err != nil {
		return nil, err
	}
	return kd, nil
}

func newEnvoyTargets(cfg Config, log *slog.Logger, m *Metrics) (EnvoyTargets, error) {
	return newTargets(cfg.EnvoyTargets, cfg.EnvoyDNS, "envoy", cfg, log, m)
}

// newTargets is a static list, or the addresses behind a DNS name.
func newTargets(static, dns, what string, cfg Config, log *slog.Logger, m *Metrics) (EnvoyTargets, error) {
	if static != "" {
		t, err := ParseStaticEnvoys(static)
		if err != nil {
			return nil, fmt.Errorf("%s targets: %w", what, err)
		}
		return t, nil
	}
	name, port, err := ParseEnvoyDNS(dns)
	if err != nil {
		return nil, fmt.Errorf("%s dns: %w", what, err)
	}
	return &DNSEnvoys{Name: name, Port: port, Resolver: net.DefaultResolver, Refresh: cfg.EnvoyDNSRefresh,
		Timeout: cfg.Interval, Now: time.Now, Log: log.With("targets", what), Errors: m.DNSErrors}, nil
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// runAggregator runs the binary in aggregator mode until ctx ends: it takes
// the agents' pushes on --aggregator-listen and relays them to every Envoy
// (aggregator.go).
func runAggregator(ctx context.Context, cfg Config, log *slog.Logger) error {
	name := cfg.AgentID
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("no --agent-id and no host name: %w", err)
		}
		name = h
	}
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	am := NewAggregatorMetrics(reg)
	envoys, err := newEnvoyTargets(cfg, log, metrics)
	if err != nil {
		return err
	}
	token := &TokenSource{File: cfg.PushTokenFile, Value: cfg.PushToken, Refresh: 10 * time.Second}
	if _, err := token.Token(); err != nil {
		return err
	}
	lim := wire.Limits{AgentTTL: cfg.AgentTTL}
	store := NewAggregatorStore(lim.Resolved(), cfg.AgentTTL)
	relayer := &Relayer{Store: store, Sender: name, Envoys: envoys, Interval: cfg.Interval, FullEvery: cfg.RelayFullEvery,
		Client: NewPushClient(), Path: cfg.PushPath, Timeout: cfg.PushTimeout, Token: token, Now: time.Now, Log: log, Metrics: am,
		Held: &HeldTables{}}

	pushLn, err := net.Listen("tcp", cfg.AggregatorListen)
	if err != nil {
		return fmt.Errorf("--aggregator-listen: %w", err)
	}
	healthLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		pushLn.Close()
		return fmt.Errorf("--listen: %w", err)
	}
	pushSrv := &http.Server{Handler: AggregatorHandler(store, cfg.PushPath, token, int64(lim.Resolved().MaxPushBytes), time.Now, am, log, relayer.HeldSummary),
		ReadHeaderTimeout: 5 * time.Second}
	healthSrv := &http.Server{Handler: Handler(reg, func() bool { return true }), ReadHeaderTimeout: 5 * time.Second}
	serveErr := make(chan error, 2)
	go func() { serveErr <- pushSrv.Serve(pushLn) }()
	go func() { serveErr <- healthSrv.Serve(healthLn) }()
	log.Info("metricsagent aggregator started", "name", name, "listen", pushLn.Addr().String(), "health", healthLn.Addr().String(),
		"interval", cfg.Interval, "relay_full_every", cfg.RelayFullEvery, "envoy_targets", cfg.EnvoyTargets, "envoy_dns", cfg.EnvoyDNS)

	runCtx, stop := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	go func() { relayer.Run(runCtx); close(relayDone) }()
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err = <-serveErr:
		err = fmt.Errorf("aggregator server: %w", err)
	}
	stop()
	<-relayDone
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range []*http.Server{pushSrv, healthSrv} {
		if serr := srv.Shutdown(shutdownCtx); serr != nil && err == nil {
			err = serr
		}
	}
	return err
}

// Handler serves /metrics from reg, /healthz (the process answers) and
// /readyz (a first cycle has completed).
func Handler(reg *prometheus.Registry, ready func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !ready() {
			http.Error(w, "no cycle completed yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	return mux
}
