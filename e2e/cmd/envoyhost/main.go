// Command envoyhost runs Proxy-Wasm plugins the way Envoy does, on wazero
// (package e2e/envoyhost): either from an Envoy bootstrap YAML (-c, the
// same file real Envoy would run) or from flags for the simple case of one
// listener with one plugin in front of an ORIGINAL_DST or STATIC cluster.
//
//	envoyhost -c envoy/envoy.yaml --concurrency 2
//	envoyhost -wasm bin/wasm-epp.wasm -plugin-config-file cfg.json -listen 127.0.0.1:10000
//
// It stops cleanly on SIGINT or SIGTERM (root contexts get on_done and
// on_delete).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/envoyhost"
)

// multiFlag collects a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

type options struct {
	bootstrap      string
	workers        int
	wasiProfile    string
	logLevel       string
	logFormat      string
	cacheDir       string
	admin          string
	wasm           string
	listen         string
	name           string
	rootID         string
	vmID           string
	pluginConfig   string
	pluginFile     string
	vmConfig       string
	env            multiFlag
	allowStopIter  bool
	failurePolicy  string
	originalHeader string
	upstream       string
	clusters       multiFlag
	bufferLimit    int
	routeTimeout   time.Duration
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("envoyhost", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: envoyhost -c bootstrap.yaml [flags]\n       envoyhost -wasm plugin.wasm [flags]\n\n"+
			"Runs Proxy-Wasm plugins the way Envoy (proxy-wasm-cpp-host, V8) does.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.bootstrap, "c", "", "Envoy bootstrap YAML to run (static listeners with http_connection_manager -> envoy.filters.http.wasm + router; STATIC and ORIGINAL_DST clusters; admin)")
	fs.IntVar(&o.workers, "concurrency", envoyhost.DefaultWorkers, "worker threads, each with its own VM (Envoy's --concurrency)")
	fs.IntVar(&o.workers, "workers", envoyhost.DefaultWorkers, "same as -concurrency")
	fs.StringVar(&o.wasiProfile, "wasi-profile", "current", "cpp-host generation to emulate: current (poll_oneoff succeeds, after cpp-host #533) or legacy (poll_oneoff answers ENOSYS, Envoy before the 2026 fix)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: trace, debug, info, warn, error, critical (also what proxy_get_log_level answers)")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.cacheDir, "compilation-cache", "", "directory for wazero's compiled-code cache (empty: none)")
	fs.StringVar(&o.admin, "admin", "127.0.0.1:9901", "admin listener (/stats, /stats/prometheus, /ready); with -c it overrides the bootstrap's when set explicitly; empty disables it")
	fs.StringVar(&o.wasm, "wasm", "", "plugin .wasm for the flag-configured listener")
	fs.StringVar(&o.listen, "listen", "0.0.0.0:10000", "address of the flag-configured listener")
	fs.StringVar(&o.name, "name", "plugin", "plugin name (property plugin_name)")
	fs.StringVar(&o.rootID, "root-id", "", "plugin root_id")
	fs.StringVar(&o.vmID, "vm-id", "", "vm_config.vm_id")
	fs.StringVar(&o.pluginConfig, "plugin-config", "", "plugin configuration (the bytes on_configure reads)")
	fs.StringVar(&o.pluginFile, "plugin-config-file", "", "read the plugin configuration from this file")
	fs.StringVar(&o.vmConfig, "vm-config", "", "vm_config.configuration (the bytes on_vm_start reads)")
	fs.Var(&o.env, "env", "vm_config.environment_variables entry KEY=VALUE (repeatable)")
	fs.BoolVar(&o.allowStopIter, "allow-on-headers-stop-iteration", false, "let Pause in on_request_headers mean StopIteration (Envoy >= 1.35)")
	fs.StringVar(&o.failurePolicy, "failure-policy", "FAIL_CLOSED", "FAIL_CLOSED, FAIL_OPEN or FAIL_RELOAD")
	fs.StringVar(&o.originalHeader, "original-dst-header", envoyhost.DefaultOriginalDstHeader, "header an ORIGINAL_DST cluster reads the upstream ip:port from")
	fs.StringVar(&o.upstream, "upstream", "", "send to this ip:port (a STATIC cluster) instead of the ORIGINAL_DST header")
	fs.Var(&o.clusters, "cluster", "extra STATIC cluster NAME=IP:PORT for proxy_http_call (repeatable)")
	fs.IntVar(&o.bufferLimit, "buffer-limit", envoyhost.DefaultBufferLimitBytes, "per_connection_buffer_limit_bytes (413 above it while a filter buffers)")
	fs.DurationVar(&o.routeTimeout, "route-timeout", envoyhost.DefaultRouteTimeout, "route timeout (0 disables), Envoy's default 15s")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	adminSet := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "admin" {
			adminSet = true
		}
	})
	if o.bootstrap != "" && !adminSet {
		o.admin = "\x00bootstrap"
	}
	if (o.bootstrap == "") == (o.wasm == "") {
		return nil, errors.New("give either -c bootstrap.yaml or -wasm plugin.wasm")
	}
	return o, nil
}

var levels = map[string]int{"trace": 0, "debug": 1, "info": 2, "warn": 3, "error": 4, "critical": 5}

func slogLevel(l int) slog.Level {
	return []slog.Level{slog.LevelDebug - 4, slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError, slog.LevelError + 4}[l]
}

func buildConfig(o *options) (envoyhost.Config, error) {
	var cfg envoyhost.Config
	if o.bootstrap != "" {
		doc, err := os.ReadFile(o.bootstrap)
		if err != nil {
			return cfg, err
		}
		if cfg, err = envoyhost.LoadBootstrap(doc, envoyhost.BootstrapOptions{}); err != nil {
			return cfg, fmt.Errorf("%s: %w", o.bootstrap, err)
		}
		if o.admin != "\x00bootstrap" {
			cfg.AdminAddress = o.admin
		}
	} else {
		fp, err := envoyhost.ParseFailurePolicy(o.failurePolicy)
		if err != nil {
			return cfg, err
		}
		pluginConfig := []byte(o.pluginConfig)
		if o.pluginFile != "" {
			if o.pluginConfig != "" {
				return cfg, errors.New("give -plugin-config or -plugin-config-file, not both")
			}
			if pluginConfig, err = os.ReadFile(o.pluginFile); err != nil {
				return cfg, err
			}
		}
		env := map[string]string{}
		for _, kv := range o.env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return cfg, fmt.Errorf("-env %q: want KEY=VALUE", kv)
			}
			env[k] = v
		}
		cluster := envoyhost.ClusterConfig{Name: "upstream", Type: envoyhost.ClusterOriginalDst, OriginalDstHeader: o.originalHeader}
		if o.upstream != "" {
			cluster = envoyhost.ClusterConfig{Name: "upstream", Type: envoyhost.ClusterStatic, Endpoints: []string{o.upstream}}
		}
		cfg.Clusters = []envoyhost.ClusterConfig{cluster}
		for _, c := range o.clusters {
			name, addr, ok := strings.Cut(c, "=")
			if !ok || name == "" {
				return cfg, fmt.Errorf("-cluster %q: want NAME=IP:PORT", c)
			}
			cfg.Clusters = append(cfg.Clusters, envoyhost.ClusterConfig{Name: name, Type: envoyhost.ClusterStatic, Endpoints: []string{addr}})
		}
		timeout := o.routeTimeout
		if timeout == 0 {
			timeout = -1
		}
		cfg.Listeners = []envoyhost.ListenerConfig{{
			Name: "main", Address: o.listen, Cluster: "upstream", RouteTimeout: timeout,
			BufferLimitBytes: o.bufferLimit,
			Plugin: &envoyhost.PluginConfig{
				Name: o.name, RootID: o.rootID, Configuration: pluginConfig, FailurePolicy: fp,
				AllowOnHeadersStopIteration: o.allowStopIter,
				VM: envoyhost.VMConfig{VMID: o.vmID, CodePath: o.wasm, Configuration: []byte(o.vmConfig),
					EnvironmentVariables: env},
			},
		}}
		cfg.AdminAddress = o.admin
	}
	profile, err := envoyhost.ParseWASIProfile(o.wasiProfile)
	if err != nil {
		return cfg, err
	}
	cfg.WASIProfile = profile
	cfg.Workers = o.workers
	cfg.CompilationCacheDir = o.cacheDir
	return cfg, nil
}

// run runs the command until ctx ends; it returns the exit code.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "envoyhost:", err)
		return 2
	}
	lvl, ok := levels[o.logLevel]
	if !ok {
		fmt.Fprintf(stderr, "envoyhost: unknown -log-level %q\n", o.logLevel)
		return 2
	}
	hopts := &slog.HandlerOptions{Level: slogLevel(lvl)}
	var handler slog.Handler
	switch o.logFormat {
	case "text":
		handler = slog.NewTextHandler(stderr, hopts)
	case "json":
		handler = slog.NewJSONHandler(stderr, hopts)
	default:
		fmt.Fprintf(stderr, "envoyhost: unknown -log-format %q\n", o.logFormat)
		return 2
	}
	log := slog.New(handler)
	cfg, err := buildConfig(o)
	if err != nil {
		log.Error("configuration", "err", err)
		return 1
	}
	cfg.Logger = log
	cfg.LogLevel = &lvl
	h, err := envoyhost.New(cfg)
	if err != nil {
		log.Error("loading plugins", "err", err)
		return 1
	}
	if err := h.Start(); err != nil {
		log.Error("starting", "err", err)
		h.Close()
		return 1
	}
	log.Info("envoyhost started", "workers", cfg.Workers, "admin", h.AdminAddr())
	<-ctx.Done()
	log.Info("shutting down")
	if err := h.Close(); err != nil {
		log.Error("shutdown", "err", err)
		return 1
	}
	return 0
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}
