package metricsagent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the agent's own Prometheus metrics, served at /metrics.
// Per-pod and per-target series are deleted when the pod or target goes
// away, so cardinality follows what exists now.
type Metrics struct {
	ScrapeDuration     *prometheus.HistogramVec // pod
	ScrapeErrors       *prometheus.CounterVec   // pod, reason
	PageParses         *prometheus.CounterVec   // path
	PushDuration       *prometheus.HistogramVec // target
	PushErrors         *prometheus.CounterVec   // target, reason
	EndpointsReported  prometheus.Gauge
	EndpointsUnhealthy prometheus.Gauge
	CycleDuration      prometheus.Histogram
	PushBytes          prometheus.Gauge
	EnvoyTargets       prometheus.Gauge
	DNSErrors          prometheus.Counter
	// Cycles counts scrape cycles by what was sent: the reason of a send
	// (wire.Reason: first, always, heartbeat, endpoints, values, forced),
	// or not_due when the state stayed within the send thresholds.
	Cycles *prometheus.CounterVec // sent
	// DirectPushes is 1 while no aggregator accepts pushes and the agent
	// pushes to the Envoys itself (FailoverTargets).
	DirectPushes prometheus.Gauge

	// The model table from Kubernetes objects (ConfigSync) and its pushes.
	ConfigObjects      *prometheus.GaugeVec     // kind, state
	ConfigRejected     *prometheus.GaugeVec     // kind, namespace, name, reason
	ConfigConflicts    *prometheus.CounterVec   // kind
	ConfigTableEntries *prometheus.GaugeVec     // entry
	ConfigPayloadBytes prometheus.Gauge         //
	ConfigBuilds       prometheus.Counter       //
	ConfigPushDuration *prometheus.HistogramVec // target
	ConfigPushErrors   *prometheus.CounterVec   // target, reason
	StatusWrites       *prometheus.CounterVec   // result
}

// NewMetrics creates the metrics and registers them, plus the Go and
// process collectors, with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	ms := []float64{.0005, .001, .0025, .005, .01, .02, .04, .08, .16, .32}
	m := &Metrics{
		ScrapeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "wasm_epp_agent_scrape_duration_seconds", Help: "Time from the cycle's requests going out to this pod's page being read and parsed (or its scrape failing).", Buckets: ms,
		}, []string{"pod"}),
		ScrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasm_epp_agent_scrape_errors_total", Help: "Failed scrapes by pod and reason (timeout, http_status, invalid_value, ...).",
		}, []string{"pod", "reason"}),
		PageParses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasm_epp_agent_page_parses_total", Help: "Metrics pages read, by path: full (expfmt parsed the page) or values_only (the page matched the pod's previous one but for sample values).",
		}, []string{"path"}),
		PushDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "wasm_epp_agent_push_duration_seconds", Help: "Time to push one payload to one Envoy, failed pushes included.", Buckets: ms,
		}, []string{"target"}),
		PushErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasm_epp_agent_push_errors_total", Help: "Failed pushes by Envoy target and reason (connect, timeout, http_401, http_409, ...).",
		}, []string{"target", "reason"}),
		EndpointsReported: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wasm_epp_agent_endpoints_reported", Help: "Endpoints in the latest push.",
		}),
		EndpointsUnhealthy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wasm_epp_agent_endpoints_unhealthy", Help: "Endpoints in the latest push whose latest scrape failed (they carry their last good values).",
		}),
		CycleDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "wasm_epp_agent_cycle_duration_seconds", Help: "Time from the start of a cycle to its payload being handed to the pushers.", Buckets: ms,
		}),
		PushBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wasm_epp_agent_push_payload_bytes", Help: "Size of the latest encoded push.",
		}),
		EnvoyTargets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wasm_epp_agent_envoy_targets", Help: "Envoy replicas the latest payload was handed to.",
		}),
		DNSErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wasm_epp_agent_envoy_dns_errors_total", Help: "Failed lookups of --envoy-dns (the previous addresses are kept).",
		}),
		Cycles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasm_epp_agent_cycles_total", Help: "Scrape cycles by what they sent: the reason a push went out (first, always, heartbeat, endpoints, values, forced) or not_due (every value within the send thresholds; nothing pushed).",
		}, []string{"sent"}),
		DirectPushes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wasm_epp_agent_direct_pushes", Help: "1 while no aggregator accepts pushes and the agent pushes to every Envoy itself; 0 otherwise (or without aggregators).",
		}),
		ConfigObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "wasm_epp_agent_config_objects", Help: "InferenceObjectives and InferenceModelRewrites of the pool, by kind and state (accepted, rejected).",
		}, []string{"kind", "state"}),
		ConfigRejected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "wasm_epp_agent_config_rejected", Help: "1 for each object rejected now (the pool, objectives, rewrites), with the reason; the log and the object's Accepted condition say why.",
		}, []string{"kind", "namespace", "name", "reason"}),
		ConfigConflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasm_epp_agent_config_conflicts_total", Help: "Precedence conflicts found (a model claimed by two rewrites, a shadowed rule), counted when they appear or change.",
		}, []string{"kind"}),
		ConfigTableEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "wasm_epp_agent_config_table_entries", Help: "Entries of the latest model table: rewritten_models, objectives.",
		}, []string{"entry"}),
		ConfigPayloadBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "wasm_epp_agent_config_record_bytes", Help: "Size of the latest encoded configuration record.",
		}),
		ConfigBuilds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wasm_epp_agent_config_builds_total", Help: "Model tables built (once per change of the objects).",
		}),
		ConfigPushDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "wasm_epp_agent_config_push_duration_seconds", Help: "Time to push the configuration record to one Envoy.", Buckets: ms,
		}, []string{"target"}),
		ConfigPushErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasm_epp_agent_config_push_errors_total", Help: "Failed configuration pushes by Envoy target and reason (409, the Envoy has a newer table, is not a failure).",
		}, []string{"target", "reason"}),
		StatusWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasm_epp_agent_status_writes_total", Help: "Accepted conditions written on objectives and rewrites, by result (written, conflict, forbidden, error).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.ScrapeDuration, m.ScrapeErrors, m.PageParses, m.PushDuration, m.PushErrors, m.EndpointsReported,
		m.EndpointsUnhealthy, m.CycleDuration, m.PushBytes, m.EnvoyTargets, m.DNSErrors, m.DirectPushes, m.Cycles,
		m.ConfigObjects, m.ConfigRejected, m.ConfigConflicts, m.ConfigTableEntries, m.ConfigPayloadBytes, m.ConfigBuilds,
		m.ConfigPushDuration, m.ConfigPushErrors, m.StatusWrites,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *Metrics) forgetPod(pod string) {
	m.ScrapeDuration.DeletePartialMatch(prometheus.Labels{"pod": pod})
	m.ScrapeErrors.DeletePartialMatch(prometheus.Labels{"pod": pod})
}

// configPushMetrics are the metrics a config Pusher reports to: the push
// series of the configuration record, under the names Pusher uses.
func (m *Metrics) configPushMetrics() *Metrics {
	return &Metrics{PushDuration: m.ConfigPushDuration, PushErrors: m.ConfigPushErrors}
}

func (m *Metrics) forgetTarget(target string) {
	m.PushDuration.DeletePartialMatch(prometheus.Labels{"target": target})
	m.PushErrors.DeletePartialMatch(prometheus.Labels{"target": target})
}
