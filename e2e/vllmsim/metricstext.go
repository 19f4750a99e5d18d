package vllmsim

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// MetricsNames selects which generation of vLLM metric names /metrics shows.
type MetricsNames string

const (
	// MetricsV0 is vLLM V0: vllm:gpu_cache_usage_perc, labels {model_name}.
	MetricsV0 MetricsNames = "v0"
	// MetricsV1 is vLLM ≥ 0.12: vllm:kv_cache_usage_perc only, labels
	// {model_name, engine}.
	MetricsV1 MetricsNames = "v1"
	// MetricsBoth is vLLM 0.9.2–0.10: both KV names, V1 labels.
	MetricsBoth MetricsNames = "both"
)

// ParseMetricsNames accepts "v0", "v1" or "both".
func ParseMetricsNames(s string) (MetricsNames, error) {
	switch m := MetricsNames(s); m {
	case MetricsV0, MetricsV1, MetricsBoth:
		return m, nil
	}
	return "", fmt.Errorf("vllmsim: metrics names %q: want v0, v1 or both", s)
}

// loraSeriesCap bounds how many vllm:lora_requests_info label combinations
// are kept. vLLM keeps every combination forever; past this cap the one set
// longest ago is dropped so a long run cannot grow without bound.
const loraSeriesCap = 4096

// loraSeries records vllm:lora_requests_info the way prometheus_client does
// for vLLM: each (running, waiting) combination is its own series whose value
// is the wall time it was last set; older combinations stay exposed
// (vllm/v1/metrics/loggers.py, gauge_lora_info.set_to_current_time()).
type loraSeries struct {
	maxLoRA string
	order   []string // keys, oldest first by creation
	values  map[string]loraSample
}

type loraSample struct {
	running, waiting string
	unixSeconds      float64
}

func newLoRASeries(maxLoRAs int) *loraSeries {
	return &loraSeries{maxLoRA: strconv.Itoa(maxLoRAs), values: map[string]loraSample{}}
}

// set marks the combination current at wall time now.
func (l *loraSeries) set(running, waiting []string, now time.Time) {
	r, w := strings.Join(running, ","), strings.Join(waiting, ",")
	key := r + "\x00" + w
	if _, ok := l.values[key]; !ok {
		if len(l.order) >= loraSeriesCap {
			oldest := 0
			for i, k := range l.order {
				if l.values[k].unixSeconds < l.values[l.order[oldest]].unixSeconds {
					oldest = i
				}
			}
			delete(l.values, l.order[oldest])
			l.order = append(l.order[:oldest], l.order[oldest+1:]...)
		}
		l.order = append(l.order, key)
	}
	l.values[key] = loraSample{running: r, waiting: w, unixSeconds: float64(now.UnixNano()) / 1e9}
}

func (l *loraSeries) snapshot() []loraSample {
	out := make([]loraSample, len(l.order))
	for i, k := range l.order {
		out[i] = l.values[k]
	}
	return out
}

// counterSample is one counter family with a single sample.
type counterSample struct {
	name, help string
	val        int64
}

// metricsView is everything one /metrics response shows.
type metricsView struct {
	names     MetricsNames
	model     string
	replica   Metrics
	lora      []loraSample // nil when LoRA is disabled
	maxLoRA   int
	injected  map[string]int64
	cacheInfo [][2]string
}

// escapeLabel escapes a label value for the text exposition format.
func escapeLabel(v string) string {
	if !strings.ContainsAny(v, "\\\"\n") {
		return v
	}
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// writeMetrics renders the view in the Prometheus text format 0.0.4 with
// # HELP and # TYPE lines, as vLLM's prometheus_client registry does.
func writeMetrics(w io.Writer, v metricsView) error {
	var b strings.Builder
	labels := fmt.Sprintf(`model_name="%s"`, escapeLabel(v.model))
	if v.names != MetricsV0 {
		labels += `,engine="0"`
	}
	family := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	sample := func(name, lbls string, val float64) {
		fmt.Fprintf(&b, "%s{%s} %s\n", name, lbls, formatFloat(val))
	}
	m := v.replica

	family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
	sample("vllm:num_requests_running", labels, float64(m.Running))
	family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
	sample("vllm:num_requests_waiting", labels, float64(m.Waiting))
	if v.names == MetricsV0 || v.names == MetricsBoth {
		family("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.")
		sample("vllm:gpu_cache_usage_perc", labels, m.KVCacheUsage)
	}
	if v.names == MetricsV1 || v.names == MetricsBoth {
		family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
		sample("vllm:kv_cache_usage_perc", labels, m.KVCacheUsage)
	}

	counters := []counterSample{
		{"vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", m.Preemptions},
		{"vllm:prompt_tokens_total", "Number of prefill tokens processed.", m.PromptTokens},
		{"vllm:generation_tokens_total", "Number of generation tokens processed.", m.GenerationTokens},
	}
	if m.PrefixCaching {
		// vLLM ≥ 0.9.2 counts prefix-cache lookups in tokens; 0.9.2–0.10
		// also kept the first V1 names with a gpu_ prefix, hidden in 0.11 and
		// removed in 0.12 (vllm/v1/metrics/loggers.py). prometheus_client
		// exposes a counter with the _total suffix.
		if v.names == MetricsBoth {
			counters = append(counters,
				counterSample{"vllm:gpu_prefix_cache_queries_total", "GPU prefix cache queries, in terms of number of queried tokens.", m.PrefixQueries},
				counterSample{"vllm:gpu_prefix_cache_hits_total", "GPU prefix cache hits, in terms of number of cached tokens.", m.PrefixHits})
		}
		if v.names != MetricsV0 {
			counters = append(counters,
				counterSample{"vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", m.PrefixQueries},
				counterSample{"vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", m.PrefixHits})
		} else {
			// vLLM V0 showed a hit-rate gauge instead of counters.
			rate := 0.0
			if m.PrefixQueries > 0 {
				rate = float64(m.PrefixHits) / float64(m.PrefixQueries)
			}
			family("vllm:gpu_prefix_cache_hit_rate", "gauge", "GPU prefix cache block hit rate.")
			sample("vllm:gpu_prefix_cache_hit_rate", labels, rate)
		}
	}
	for _, c := range counters {
		family(c.name, "counter", c.help)
		sample(c.name, labels, float64(c.val))
	}
	family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
	sample("vllm:request_success_total", labels+`,finished_reason="length"`, float64(m.Completed))

	if v.lora != nil {
		family("vllm:lora_requests_info", "gauge", "Running stats on lora requests.")
		for _, s := range v.lora {
			sample("vllm:lora_requests_info",
				fmt.Sprintf(`max_lora="%d",waiting_lora_adapters="%s",running_lora_adapters="%s"`,
					v.maxLoRA, escapeLabel(s.waiting), escapeLabel(s.running)),
				s.unixSeconds)
		}
	}

	family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
	var cl []string
	for _, kv := range v.cacheInfo {
		cl = append(cl, fmt.Sprintf(`%s="%s"`, kv[0], escapeLabel(kv[1])))
	}
	sample("vllm:cache_config_info", strings.Join(cl, ","), 1)

	// Simulator-only: faults injected so far, for tests and demos.
	family("vllm_sim:injected_faults_total", "counter", "Faults injected by the simulator, by kind.")
	for _, kind := range []string{"error", "latency_spike", "metrics_down"} {
		sample("vllm_sim:injected_faults_total", fmt.Sprintf(`kind="%s"`, kind), float64(v.injected[kind]))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
