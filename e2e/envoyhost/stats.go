package envoyhost

import (
	"fmt"
	"io"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// customStatNamespace prefixes every metric a plugin defines (envoy
// source/extensions/common/wasm/stats_handler.h CustomStatNamespace). The
// namespace is registered as custom, so /stats and /stats/prometheus print
// the name without it (source/common/stats/custom_stat_namespaces_impl.cc)
// and Prometheus output adds no "envoy_" prefix (source/server/admin/
// prometheus_stats.cc metricName).
const customStatNamespace = "wasmcustom"

// defaultHistogramBuckets are Envoy's default histogram bucket bounds
// (source/common/stats/histogram_impl.h).
var defaultHistogramBuckets = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500,
	5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000}

type statKind int

const (
	statCounter statKind = iota
	statGauge
	statHistogram
)

// stat is one Envoy stat: one object per name in the whole process, so the
// same name defined on several VMs (every worker) is the same stat; counter
// increments and gauge additions from all workers therefore add up.
type stat struct {
	kind statKind
	name string // full dotted name, e.g. "wasmcustom.requests_total"
	// Prometheus form: extracted name and tags (Envoy's tag extraction for
	// built-in stats; custom stats have none).
	promName string
	tags     [][2]string

	value   uint64 // counter and gauge
	buckets []uint64
	sum     float64
	count   uint64
}

type statsStore struct {
	mu    sync.Mutex
	stats map[string]*stat
}

func newStatsStore() *statsStore { return &statsStore{stats: map[string]*stat{}} }

var promSanitize = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// customPromName is the Prometheus name of a custom stat: namespace
// stripped, then sanitised; names starting with a digit are not exported.
func customPromName(name string) (string, bool) {
	s := promSanitize.ReplaceAllString(name, "_")
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return "", false
	}
	return s, true
}

// custom returns (creating if needed) the plugin-defined stat
// wasmcustom.<name>. A name already used by a stat of another kind is
// refused, as Envoy's store cannot hold both.
func (s *statsStore) custom(kind statKind, name string) (*stat, bool) {
	full := customStatNamespace + "." + name
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.stats[full]; ok {
		return st, st.kind == kind
	}
	st := &stat{kind: kind, name: full}
	st.promName, _ = customPromName(name)
	if kind == statHistogram {
		st.buckets = make([]uint64, len(defaultHistogramBuckets))
	}
	s.stats[full] = st
	return st, true
}

// builtin returns a built-in Envoy stat with its tag-extracted Prometheus
// name, e.g. cluster.<name>.original_dst_host_invalid ->
// envoy_cluster_original_dst_host_invalid{envoy_cluster_name="<name>"}.
func (s *statsStore) builtin(kind statKind, name, promName string, tags ...[2]string) *stat {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.stats[name]; ok {
		return st
	}
	st := &stat{kind: kind, name: name, promName: promName, tags: tags}
	s.stats[name] = st
	return st
}

func (s *statsStore) add(st *stat, v uint64) {
	s.mu.Lock()
	st.value += v
	s.mu.Unlock()
}

func (s *statsStore) sub(st *stat, v uint64) {
	s.mu.Lock()
	st.value -= v
	s.mu.Unlock()
}

func (s *statsStore) set(st *stat, v uint64) {
	s.mu.Lock()
	st.value = v
	s.mu.Unlock()
}

func (s *statsStore) get(st *stat) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return st.value
}

func (s *statsStore) record(st *stat, v uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := float64(v)
	for i, b := range defaultHistogramBuckets {
		if f <= b {
			st.buckets[i]++
		}
	}
	st.sum += f
	st.count++
}

// Value returns the current value of a counter or gauge by full name
// ("wasmcustom.x" for plugin metrics), for tests.
func (s *statsStore) Value(name string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.stats[name]
	if !ok || st.kind == statHistogram {
		return 0, false
	}
	return st.value, true
}

func (s *statsStore) snapshot() []stat {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]stat, 0, len(s.stats))
	for _, st := range s.stats {
		c := *st
		c.buckets = append([]uint64(nil), st.buckets...)
		out = append(out, c)
	}
	return out
}

func displayName(name string) string {
	if rest, ok := strings.CutPrefix(name, customStatNamespace+"."); ok {
		return rest
	}
	return name
}

// writeText writes the /stats text format: "name: value" sorted by name,
// custom namespace hidden. Histograms print count and sum (Envoy prints
// quantiles computed at the last flush; this host does not emulate
// flushing).
func (s *statsStore) writeText(w io.Writer) {
	snap := s.snapshot()
	sort.Slice(snap, func(i, j int) bool { return displayName(snap[i].name) < displayName(snap[j].name) })
	for _, st := range snap {
		switch st.kind {
		case statHistogram:
			if st.count == 0 {
				fmt.Fprintf(w, "%s: No recorded values\n", displayName(st.name))
			} else {
				fmt.Fprintf(w, "%s: count=%d sum=%s\n", displayName(st.name), st.count, formatFloat(st.sum))
			}
		case statGauge:
			fmt.Fprintf(w, "%s: %d\n", displayName(st.name), int64(st.value))
		default:
			fmt.Fprintf(w, "%s: %d\n", displayName(st.name), st.value)
		}
	}
}

func formatFloat(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return strconv.FormatInt(int64(f), 10)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

func promTags(tags [][2]string, extra ...[2]string) string {
	parts := make([]string, 0, len(tags)+len(extra))
	for _, t := range append(append([][2]string{}, tags...), extra...) {
		parts = append(parts, fmt.Sprintf("%s=%q", t[0], t[1]))
	}
	return strings.Join(parts, ",")
}

// writePrometheus writes the Prometheus text exposition the way Envoy's
// admin /stats/prometheus does: one "# TYPE" line per metric name, tags in
// braces (empty braces when none), histograms as cumulative buckets with
// _sum and _count.
func (s *statsStore) writePrometheus(w io.Writer) {
	snap := s.snapshot()
	groups := map[string][]stat{}
	for _, st := range snap {
		if st.promName == "" {
			continue
		}
		groups[st.promName] = append(groups[st.promName], st)
	}
	names := make([]string, 0, len(groups))
	for n := range groups {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		g := groups[n]
		sort.Slice(g, func(i, j int) bool { return promTags(g[i].tags) < promTags(g[j].tags) })
		switch g[0].kind {
		case statCounter:
			fmt.Fprintf(w, "# TYPE %s counter\n", n)
			for _, st := range g {
				fmt.Fprintf(w, "%s{%s} %d\n", n, promTags(st.tags), st.value)
			}
		case statGauge:
			fmt.Fprintf(w, "# TYPE %s gauge\n", n)
			for _, st := range g {
				fmt.Fprintf(w, "%s{%s} %d\n", n, promTags(st.tags), int64(st.value))
			}
		case statHistogram:
			fmt.Fprintf(w, "# TYPE %s histogram\n", n)
			for _, st := range g {
				for i, b := range defaultHistogramBuckets {
					fmt.Fprintf(w, "%s_bucket{%s} %d\n", n, promTags(st.tags, [2]string{"le", formatFloat(b)}), st.buckets[i])
				}
				fmt.Fprintf(w, "%s_bucket{%s} %d\n", n, promTags(st.tags, [2]string{"le", "+Inf"}), st.count)
				fmt.Fprintf(w, "%s_sum{%s} %s\n", n, promTags(st.tags), formatFloat(st.sum))
				fmt.Fprintf(w, "%s_count{%s} %d\n", n, promTags(st.tags), st.count)
			}
		}
	}
}
