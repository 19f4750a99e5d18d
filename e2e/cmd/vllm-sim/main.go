// Command vllm-sim serves one simulated vLLM replica over HTTP: the OpenAI
// completions and chat endpoints (plain and SSE), /v1/models, vLLM's
// Prometheus /metrics and /health. Its timing comes from the replica model in
// package vllmsim, run in virtual time scaled from the wall clock.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "vllm-sim:", err)
		os.Exit(2)
	}
}

type options struct {
	addr, name, model, adapters, profile, metricsNames, logLevel, logFormat string
	loraAdmission                                                           string
	maxLoRAs, maxNumSeqs, maxBatchedTokens, kvTokens, maxModelLen           int
	defaultMaxTokens, maxCPULoRAs, blockSize                                int
	timeScale, errorRate, spikeRate                                         float64
	spike, loraDiskLoad, shutdownTimeout                                    time.Duration
	metricsDown, prefixCaching, promptTokensDetails                         bool
	seed                                                                    uint64
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("vllm-sim", flag.ContinueOnError)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8000", "listen address (host:port)")
	fs.StringVar(&o.name, "name", "", "replica name, sent in the "+vllmsim.ReplicaHeader+" response header (default: the listen address)")
	fs.StringVar(&o.model, "model", "meta-llama/Llama-2-7b-hf", "served base model name")
	fs.StringVar(&o.adapters, "adapters", "", "comma-separated LoRA adapter names that may be requested as the model")
	fs.IntVar(&o.maxLoRAs, "max-loras", 4, "adapters per batch (vLLM max_loras); used when --adapters is set")
	fs.IntVar(&o.maxCPULoRAs, "max-cpu-loras", 0, "adapters kept in CPU memory (0: all); others load from disk in --lora-disk-load")
	fs.DurationVar(&o.loraDiskLoad, "lora-disk-load", 0, "extra load time for an adapter not in CPU memory (virtual time; published figures: 0.1s-1s)")
	fs.StringVar(&o.profile, "model-profile", vllmsim.Llama2_7B.Name, "step-time and KV profile: llama-2-7b | llama-3.1-8b")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", 256, "running sequences cap (vLLM max_num_seqs)")
	fs.IntVar(&o.maxBatchedTokens, "max-num-batched-tokens", 2048, "token budget per engine step (chunked prefill)")
	fs.IntVar(&o.kvTokens, "kv-capacity-tokens", 0, "KV cache capacity in tokens, paged in blocks of --block-size (0: the profile's)")
	fs.IntVar(&o.blockSize, "block-size", 16, "tokens per KV block (vLLM --block-size)")
	fs.BoolVar(&o.prefixCaching, "enable-prefix-caching", true, "automatic prefix caching, on by default in vLLM V1 (=false as --no-enable-prefix-caching)")
	fs.BoolVar(&o.promptTokensDetails, "enable-prompt-tokens-details", true, "report usage.prompt_tokens_details.cached_tokens (vLLM's flag of that name; vLLM's default is off, the simulator's on)")
	fs.StringVar(&o.loraAdmission, "lora-admission", "skip", "waiting requests whose adapter has no slot: skip (vLLM V1: later requests of adapters in the batch go first) or fifo (strict arrival order)")
	fs.IntVar(&o.maxModelLen, "max-model-len", 0, "longest prompt+output accepted (0: the profile's)")
	fs.IntVar(&o.defaultMaxTokens, "default-max-tokens", 128, "output tokens of requests without max_tokens")
	fs.Float64Var(&o.timeScale, "time-scale", 1, "virtual seconds per wall second (10 = ten times faster than real)")
	fs.StringVar(&o.metricsNames, "metrics-names", string(vllmsim.MetricsV1), "metric names: v0 (gpu_cache_usage_perc), v1 (kv_cache_usage_perc) or both")
	fs.Float64Var(&o.errorRate, "error-rate", 0, "fraction of generation requests answered with a 500 (fault injection)")
	fs.Float64Var(&o.spikeRate, "latency-spike-rate", 0, "fraction of generation requests delayed by --latency-spike")
	fs.DurationVar(&o.spike, "latency-spike", 0, "delay of a latency spike, in virtual time")
	fs.BoolVar(&o.metricsDown, "metrics-down", false, "answer /metrics with 503 (fault injection)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the fault-injection random stream")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug | info | warn | error")
	fs.StringVar(&o.logFormat, "log-format", "text", "text | json")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long to let requests finish on SIGTERM/SIGINT")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: vllm-sim [flags]\n\nServes one simulated vLLM replica: POST /v1/completions, POST /v1/chat/completions,\nGET /v1/models, GET /metrics, GET /health.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.name == "" {
		o.name = o.addr
	}
	return o, nil
}

func newLogger(level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func serverConfig(o options, log *slog.Logger) (vllmsim.ServerConfig, error) {
	profile, err := vllmsim.ProfileByName(o.profile)
	if err != nil {
		return vllmsim.ServerConfig{}, err
	}
	names, err := vllmsim.ParseMetricsNames(o.metricsNames)
	if err != nil {
		return vllmsim.ServerConfig{}, err
	}
	rc := vllmsim.DefaultReplicaConfig(profile)
	rc.MaxNumSeqs = o.maxNumSeqs
	rc.MaxNumBatchedTokens = o.maxBatchedTokens
	rc.BlockSize = o.blockSize
	rc.EnablePrefixCaching = o.prefixCaching
	if rc.LoRAAdmission, err = vllmsim.ParseLoRAAdmission(o.loraAdmission); err != nil {
		return vllmsim.ServerConfig{}, fmt.Errorf("--lora-admission: %w", err)
	}
	if o.kvTokens != 0 {
		rc.KVCapacityTokens = o.kvTokens
	}
	if o.maxModelLen != 0 {
		rc.MaxModelLen = o.maxModelLen
	}
	var adapters []string
	for _, a := range strings.Split(o.adapters, ",") {
		if a = strings.TrimSpace(a); a != "" {
			adapters = append(adapters, a)
		}
	}
	if len(adapters) > 0 {
		if o.maxLoRAs < 1 {
			return vllmsim.ServerConfig{}, errors.New("--max-loras must be at least 1 when --adapters is set")
		}
		rc.MaxLoRAs = o.maxLoRAs
		rc.AdapterLoad.MaxCPUAdapters = o.maxCPULoRAs
		rc.AdapterLoad.DiskLoad = o.loraDiskLoad
	}
	return vllmsim.ServerConfig{
		Name:                o.name,
		Model:               o.model,
		Adapters:            adapters,
		Replica:             rc,
		TimeScale:           o.timeScale,
		MetricsNames:        names,
		Faults:              vllmsim.Faults{ErrorRate: o.errorRate, LatencySpikeRate: o.spikeRate, LatencySpike: o.spike, MetricsDown: o.metricsDown},
		Seed:                o.seed,
		DefaultMaxTokens:    o.defaultMaxTokens,
		PromptTokensDetails: o.promptTokensDetails,
		Logger:              log,
	}, nil
}

// run serves until ctx ends (SIGINT/SIGTERM in main), then shuts down
// gracefully. ready, if set, receives the bound address once listening.
func run(ctx context.Context, args []string, ready func(addr string)) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	log, err := newLogger(o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	cfg, err := serverConfig(o, log)
	if err != nil {
		return err
	}
	sim, err := vllmsim.NewServer(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	sim.Start()
	srv := &http.Server{Handler: sim.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("vllm-sim listening", "addr", ln.Addr().String(), "replica", cfg.Name, "model", cfg.Model,
		"adapters", cfg.Adapters, "max_loras", cfg.Replica.MaxLoRAs, "profile", cfg.Replica.Profile.Name,
		"kv_capacity_tokens", cfg.Replica.KVCapacityTokens, "block_size", cfg.Replica.BlockSize,
		"prefix_caching", cfg.Replica.EnablePrefixCaching, "prompt_tokens_details", cfg.PromptTokensDetails,
		"lora_admission", cfg.Replica.LoRAAdmission, "time_scale", cfg.TimeScale, "metrics_names", cfg.MetricsNames)
	if ready != nil {
		ready(ln.Addr().String())
	}

	select {
	case err := <-errc:
		sim.Close()
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", o.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	sim.Close() // fails requests still waiting, so no handler outlives us
	if err != nil {
		_ = srv.Close()
		log.Warn("shutdown timed out; closed remaining connections", "err", err)
	}
	log.Info("stopped")
	return nil
}
