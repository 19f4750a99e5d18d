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
	}
	reg.MustRegister(m.ScrapeDuration, m.ScrapeErrors, m.PageParses, m.PushDuration, m.PushErrors, m.EndpointsReported,
		m.EndpointsUnhealthy, m.CycleDuration, m.PushBytes, m.EnvoyTargets, m.DNSErrors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *Metrics) forgetPod(pod string) {
	m.ScrapeDuration.DeletePartialMatch(prometheus.Labels{"pod": pod})
	m.ScrapeErrors.DeletePartialMatch(prometheus.Labels{"pod": pod})
}

func (m *Metrics) forgetTarget(target string) {
	m.PushDuration.DeletePartialMatch(prometheus.Labels{"target": target})
	m.PushErrors.DeletePartialMatch(prometheus.Labels{"target": target})
}
