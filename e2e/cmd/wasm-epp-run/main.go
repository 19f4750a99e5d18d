// Command wasm-epp-run is `make run`: it starts the whole local stack from
// the binaries `make build` put in bin/ (it builds nothing itself): 4
// simulated vLLM replicas serving the 10 LoRA adapters of envoy/envoy.yaml
// with max_loras 4, the metrics agent, and the gateway (real Envoy when
// `envoy` is on PATH, otherwise bin/envoyhost, with the same bootstrap). It
// prints where to send requests and waits; Ctrl-C or SIGTERM stops every
// process it started, whole process groups, and nothing is left running.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

func main() {
	err := run(os.Args[1:], os.Stdout)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	default:
		fmt.Fprintln(os.Stderr, "wasm-epp-run:", err)
		os.Exit(1)
	}
}

type options struct {
	binDir, bootstrap, wasm, gateway, envoy, adapters, logDir, agentAddr string
	clientAddr, pushAddr, adminAddr, compilationCache                    string
	replicas, maxLoRAs, replicaPort                                      int
	timeScale                                                            float64
	interval, readyTimeout                                               time.Duration
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("wasm-epp-run", flag.ContinueOnError)
	fs.StringVar(&o.binDir, "bin", "", "directory with vllm-sim, metricsagent, envoyhost and wasm-epp.wasm (default: this program's directory)")
	fs.StringVar(&o.bootstrap, "config", "", "Envoy bootstrap template (default: envoy/envoy.yaml)")
	fs.StringVar(&o.wasm, "wasm", "", "plugin module (default: <bin>/wasm-epp.wasm)")
	fs.StringVar(&o.gateway, "gateway", "auto", "auto (envoy if on PATH, else envoyhost) | envoy | envoyhost")
	fs.StringVar(&o.envoy, "envoy", "", "envoy binary for --gateway envoy (default: envoy on PATH)")
	fs.IntVar(&o.replicas, "replicas", stack.LocalReplicas, "simulated vLLM replicas")
	fs.StringVar(&o.adapters, "adapters", "", "comma-separated LoRA adapters every replica serves (default: every adapter the router configuration names)")
	fs.IntVar(&o.maxLoRAs, "max-loras", stack.LocalMaxLoRAs, "adapter slots per replica (vLLM max_loras)")
	fs.IntVar(&o.replicaPort, "replica-port", stack.LocalReplicaPort, "replica i listens on 127.0.0.1:<replica-port+i> (0: free ports)")
	fs.Float64Var(&o.timeScale, "time-scale", 1, "simulated seconds per wall second (1: real vLLM speed)")
	fs.DurationVar(&o.interval, "interval", 50*time.Millisecond, "agent scrape and push interval")
	fs.StringVar(&o.agentAddr, "agent-listen", stack.LocalAgentAddr, "agent /metrics, /healthz and /readyz address (port 0: a free port)")
	fs.StringVar(&o.clientAddr, "client-addr", "", "client listener address (default: the bootstrap's, 0.0.0.0:10000; port 0: a free port)")
	fs.StringVar(&o.pushAddr, "push-addr", "", "push listener address (default: the bootstrap's, 127.0.0.1:9002; port 0: a free port)")
	fs.StringVar(&o.adminAddr, "admin-addr", "", "Envoy admin address (default: the bootstrap's, 127.0.0.1:9901; port 0: a free port)")
	fs.StringVar(&o.compilationCache, "compilation-cache", defaultCacheDir(), "envoyhost: directory caching the compiled plugin between runs (empty: compile every time)")
	fs.StringVar(&o.logDir, "log-dir", "", "where the processes' logs and the rendered bootstrap go (default: a new directory under $TMPDIR, kept)")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 90*time.Second, "how long to wait for the stack to route a request")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: wasm-epp-run [flags]\n\nStarts simulated vLLM replicas, the metrics agent and the gateway; Ctrl-C stops them all.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return o, nil
}

func config(o options) (stack.Config, error) {
	if o.binDir == "" {
		dir, err := stack.ExecutableDir()
		if err != nil {
			return stack.Config{}, err
		}
		o.binDir = dir
	}
	if o.bootstrap == "" {
		p, err := stack.FindBootstrap(o.binDir)
		if err != nil {
			return stack.Config{}, err
		}
		o.bootstrap = p
	}
	cfg, err := stack.LocalConfig(o.binDir, o.bootstrap)
	if err != nil {
		return stack.Config{}, err
	}
	switch g := stack.Gateway(o.gateway); g {
	case "auto":
		cfg.Gateway = stack.GatewayAuto
	case stack.GatewayEnvoy, stack.GatewayEnvoyHost:
		cfg.Gateway = g
	default:
		return stack.Config{}, fmt.Errorf("--gateway %q: want auto, envoy or envoyhost", o.gateway)
	}
	cfg.EnvoyBinary = o.envoy
	cfg.WasmPath = o.wasm
	cfg.Replicas = o.replicas
	if o.adapters != "" {
		cfg.Adapters = nil
		for _, a := range strings.Split(o.adapters, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cfg.Adapters = append(cfg.Adapters, a)
			}
		}
	}
	cfg.MaxLoRAs = o.maxLoRAs
	cfg.FirstReplicaPort = o.replicaPort
	cfg.TimeScale = o.timeScale
	cfg.AgentInterval = o.interval
	cfg.AgentAddr = o.agentAddr
	cfg.ReadyTimeout = o.readyTimeout
	cfg.ClientAddr, cfg.PushAddr, cfg.AdminAddr = o.clientAddr, o.pushAddr, o.adminAddr
	cfg.CompilationCache = o.compilationCache
	if o.logDir == "" {
		dir, err := os.MkdirTemp("", "wasm-epp-run-")
		if err != nil {
			return stack.Config{}, err
		}
		o.logDir = dir
	}
	cfg.WorkDir = o.logDir
	return cfg, nil
}

// defaultCacheDir is wasm-epp's directory in the user's cache directory
// ("" when there is none).
func defaultCacheDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "wasm-epp", "wazero")
}

func run(args []string, out io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	cfg, err := config(o)
	if err != nil {
		return err
	}
	cfg.Logf = func(format string, args ...any) { fmt.Fprintf(out, "  "+format+"\n", args...) }

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	fmt.Fprintf(out, "Starting wasm-epp (logs in %s)\n", cfg.WorkDir)
	s, err := stack.Start(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return errors.New("interrupted while starting; everything started was stopped")
		}
		return fmt.Errorf("%w\n(logs in %s)", err, cfg.WorkDir)
	}
	printBanner(out, s, cfg)

	var failure error
	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "\nStopping (press Ctrl-C again to kill at once)...")
	case e := <-s.Failed():
		failure = fmt.Errorf("%w\n(logs in %s)", e, cfg.WorkDir)
		fmt.Fprintln(out, "\nA process stopped unexpectedly; stopping the rest...")
	}
	// From here a second Ctrl-C kills this program at once; the kernel then
	// kills the children too (stack's Pdeathsig), so nothing outlives it.
	stop()
	s.Stop()
	return failure
}

func printBanner(out io.Writer, s *stack.Stack, cfg stack.Config) {
	client, _ := url.Parse(s.ClientURL())
	base := "http://localhost:" + client.Port()
	model := stack.DefaultModel
	if len(cfg.Adapters) > 1 {
		model = cfg.Adapters[1]
	} else if len(cfg.Adapters) == 1 {
		model = cfg.Adapters[0]
	}
	gw := "bin/envoyhost (Envoy-faithful Proxy-Wasm host; put envoy >= 1.40 on PATH to use real Envoy)"
	if s.Gateway() == stack.GatewayEnvoy {
		gw = "Envoy (" + cfg.EnvoyBinary + ")"
	}
	var names []string
	for _, r := range s.Replicas() {
		names = append(names, r.Addr)
	}
	served := s.Info().Router.ServedByHeader
	fmt.Fprintf(out, `
wasm-epp is running.

  Send OpenAI-style requests to  %[1]s/v1/completions
                                 %[1]s/v1/chat/completions

  curl -si %[1]s/v1/completions \
    -H 'Content-Type: application/json' \
    -d '{"model":"%[2]s","prompt":"Write a SQL query that lists the ten newest users","max_tokens":32}'

  Streaming: add "stream":true. Models: %[3]s (base) and the adapters
  %[4]s.

  Prefix-cache-aware routing: send a conversation, then the same
  conversation with one more turn. The second request goes to the same
  replica and its usage.prompt_tokens_details.cached_tokens is > 0:

  M='{"role":"system","content":"You review SQL for the billing team. Be brief and precise about indexes."},{"role":"user","content":"Review: SELECT * FROM invoices WHERE paid = false"}'
  curl -s %[1]s/v1/chat/completions -H 'Content-Type: application/json' \
    -d "{\"model\":\"%[3]s\",\"max_tokens\":16,\"messages\":[$M]}"
  curl -s %[1]s/v1/chat/completions -H 'Content-Type: application/json' \
    -d "{\"model\":\"%[3]s\",\"max_tokens\":16,\"messages\":[$M,{\"role\":\"assistant\",\"content\":\"Add an index.\"},{\"role\":\"user\",\"content\":\"Which one?\"}]}"
`, base, model, stack.DefaultModel, strings.Join(cfg.Adapters, ", "))
	if served != "" {
		fmt.Fprintf(out, "  The %s response header names the replica that served a request.\n", served)
	}
	fmt.Fprintf(out, `
  gateway   %s
            bootstrap %s
            admin     %s/stats
  replicas  %s (max_loras %d, time scale %g)
  agent     scrapes every %s, pushes to %s
  logs      %s

  Load and a summary: make demo (or bin/wasm-epp-demo) in another terminal.
  Ctrl-C stops everything.
`, gw, filepath.Base(s.BootstrapPath())+" in the logs directory (rendered from "+cfg.Bootstrap+")",
		s.AdminURL(), strings.Join(names, " "), cfg.MaxLoRAs, cfg.TimeScale, cfg.AgentInterval, s.PushURL(), cfg.WorkDir)
}
