package metricsagent

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// MetricNames are the vLLM metric families the agent reads. Every name can be
// overridden by a flag, for model servers that expose the same semantics
// under other names.
type MetricNames struct {
	// Waiting and Running are gauges of queued and running requests.
	Waiting string
	Running string
	// KVUsage are gauges of the KV-cache fraction in use, in order of
	// preference: the first family present is read. vLLM 0.9.2 renamed
	// vllm:gpu_cache_usage_perc (v0) to vllm:kv_cache_usage_perc (v1), and
	// versions in between expose both.
	KVUsage []string
	// LoRAInfo is the LoRA info gauge; empty disables LoRA reading.
	LoRAInfo string
}

// DefaultMetricNames returns vLLM's names.
func DefaultMetricNames() MetricNames {
	return MetricNames{
		Waiting:  "vllm:num_requests_waiting",
		Running:  "vllm:num_requests_running",
		KVUsage:  []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"},
		LoRAInfo: "vllm:lora_requests_info",
	}
}

// Label names of vLLM's LoRA info gauge (the same in its v0 and v1
// engines).
const (
	labelMaxLoRA         = "max_lora"
	labelRunningAdapters = "running_lora_adapters"
	labelWaitingAdapters = "waiting_lora_adapters"
)

// maxQueue bounds a believable queue length; larger values are a bug in the
// model server, not load (and wire.DefaultLimits().MaxCount rejects them).
var maxQueue = float64(wire.DefaultLimits().MaxCount)

// PodMetrics is what one successful scrape yields.
type PodMetrics struct {
	Waiting      uint32
	Running      uint32
	KVCacheUsage float64
	// ActiveAdapters and WaitingAdapters are sorted and unique; an adapter
	// may be in both (newer vLLM lists a running adapter with queued
	// requests as waiting too).
	ActiveAdapters  []string
	WaitingAdapters []string
	// MaxAdapters is max_lora, 0 when LoRA is off.
	MaxAdapters uint32
}

// ScrapeError is a failed scrape: Status is what the agent pushes as the
// endpoint's last error, Err says exactly what went wrong.
type ScrapeError struct {
	Status wire.ScrapeStatus
	Err    error

	fetched bool // the page was read whole; only parsing or values failed
}

func (e *ScrapeError) Error() string { return e.Status.String() + ": " + e.Err.Error() }
func (e *ScrapeError) Unwrap() error { return e.Err }

func scrapeErr(status wire.ScrapeStatus, format string, args ...any) *ScrapeError {
	return &ScrapeError{Status: status, Err: fmt.Errorf(format, args...)}
}

// StatusOf returns the wire status of err (ScrapeParseError for errors that
// are not a *ScrapeError).
func StatusOf(err error) wire.ScrapeStatus {
	if err == nil {
		return wire.ScrapeOK
	}
	var se *ScrapeError
	if errors.As(err, &se) {
		return se.Status
	}
	return wire.ScrapeParseError
}

// ParseMetrics reads a Prometheus text exposition (format 0.0.4) and
// extracts the pod's metrics. Any problem with a family it needs fails the
// whole parse: a partial result would mix fresh and missing values.
//
// Only lines of the needed families are handed to the expfmt parser: a vLLM
// page is mostly histograms the agent never reads, and parsing them 20 times
// a second for every pod would dominate the agent's CPU. The filter keeps
// HELP, TYPE and sample lines whose metric name is wanted, in their order,
// so the parser sees exactly what it would have seen of those families.
//
// A pod scraped again and again is better read with a Parser, which gives
// the same answers for less work.
func ParseMetrics(body []byte, names MetricNames) (PodMetrics, error) {
	if err := wholePage(body); err != nil {
		return PodMetrics{}, err
	}
	fams, err := parseFamilies(filterFamilies(body, names, make([]byte, 0, 1024)))
	if err != nil {
		return PodMetrics{}, err
	}
	return metricsFrom(fams, names)
}

// wholePage refuses a page that does not end with a newline. vLLM ends
// every page with one, so a page without it was cut short (a pod that died
// mid-write, a proxy that gave up) and its last line may be a value cut in
// the middle, "17.0" read as "1". The line filter drops most lines, so the
// cut may be in a line the parser never sees: the page itself is checked.
func wholePage(body []byte) *ScrapeError {
	if len(body) > 0 && body[len(body)-1] != '\n' {
		return scrapeErr(wire.ScrapeParseError, "page truncated: %d bytes without a final newline", len(body))
	}
	return nil
}

// parseFamilies runs expfmt's text parser (with UTF-8 name validation, never
// the zero-value parser) over filtered text.
func parseFamilies(text []byte) (map[string]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, scrapeErr(wire.ScrapeParseError, "exposition text: %w", err)
	}
	return fams, nil
}

// metricsFrom extracts the pod's metrics from parsed families.
func metricsFrom(fams map[string]*dto.MetricFamily, names MetricNames) (PodMetrics, error) {
	var m PodMetrics
	var err error
	if m.Waiting, err = queueGauge(fams, names.Waiting); err != nil {
		return PodMetrics{}, err
	}
	if m.Running, err = queueGauge(fams, names.Running); err != nil {
		return PodMetrics{}, err
	}
	if m.KVCacheUsage, err = kvUsage(fams, names.KVUsage); err != nil {
		return PodMetrics{}, err
	}
	if names.LoRAInfo != "" {
		if err = readLoRA(fams, names.LoRAInfo, &m); err != nil {
			return PodMetrics{}, err
		}
	}
	return m, nil
}

// gaugeFamily returns the family name, which must be a gauge. An untyped
// family (no # TYPE line) is rejected: read as a gauge it would yield 0.
func gaugeFamily(fams map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, *ScrapeError) {
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) == 0 {
		return nil, scrapeErr(wire.ScrapeMissingMetric, "%s: no samples", name)
	}
	switch f.GetType() {
	case dto.MetricType_GAUGE:
		if dup, ok := duplicateSeries(f); ok {
			return nil, scrapeErr(wire.ScrapeParseError, "%s: series {%s} appears twice", name, dup)
		}
		return f, nil
	case dto.MetricType_UNTYPED:
		return nil, scrapeErr(wire.ScrapeInvalidValue, "%s: untyped (no # TYPE line); refusing to guess", name)
	default:
		return nil, scrapeErr(wire.ScrapeInvalidValue, "%s: type %s, want gauge", name, strings.ToLower(f.GetType().String()))
	}
}

// duplicateSeries returns the label set of a series that appears twice in
// f ("" for a series without labels) and whether there is one. The text
// parser keeps both; summing them would double count. A family has a
// handful of series, so they are compared pairwise, which allocates nothing
// (this runs on every scrape); only a duplicate found is formatted.
func duplicateSeries(f *dto.MetricFamily) (string, bool) {
	ms := f.GetMetric()
	for i := 1; i < len(ms); i++ {
		for j := range i {
			if sameLabels(ms[i].GetLabel(), ms[j].GetLabel()) {
				pairs := make([]string, 0, len(ms[i].GetLabel()))
				for _, lp := range ms[i].GetLabel() {
					pairs = append(pairs, lp.GetName()+"="+strconv.Quote(lp.GetValue()))
				}
				slices.Sort(pairs) // the parser keeps labels in page order
				return strings.Join(pairs, ","), true
			}
		}
	}
	return "", false
}

// sameLabels reports whether a and b are the same label set, in any order.
// The parser refuses a label name twice in one series, so equal lengths
// and every pair of a found in b suffice.
func sameLabels(a, b []*dto.LabelPair) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		found := false
		for _, y := range b {
			if x.GetName() == y.GetName() {
				found = x.GetValue() == y.GetValue()
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func checkFinite(name string, v float64) *ScrapeError {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return scrapeErr(wire.ScrapeInvalidValue, "%s: value %v", name, v)
	}
	return nil
}

// queueGauge sums a queue gauge over its series (one per model_name/engine
// when a server runs several).
func queueGauge(fams map[string]*dto.MetricFamily, name string) (uint32, error) {
	f, err := gaugeFamily(fams, name)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, m := range f.GetMetric() {
		v := m.GetGauge().GetValue()
		if err := checkFinite(name, v); err != nil {
			return 0, err
		}
		if v < 0 {
			return 0, scrapeErr(wire.ScrapeInvalidValue, "%s: negative value %v", name, v)
		}
		sum += v
	}
	if sum > maxQueue {
		return 0, scrapeErr(wire.ScrapeInvalidValue, "%s: %v exceeds %v", name, sum, maxQueue)
	}
	return uint32(math.Round(sum)), nil
}

// kvUsage reads the first present family of names. With several series
// (engines) the fullest one counts: a request lands on one engine, and the
// fullest is the one that will refuse it first.
func kvUsage(fams map[string]*dto.MetricFamily, names []string) (float64, error) {
	for _, name := range names {
		if _, ok := fams[name]; !ok {
			continue
		}
		f, err := gaugeFamily(fams, name)
		if err != nil {
			return 0, err
		}
		var usage float64
		for _, m := range f.GetMetric() {
			v := m.GetGauge().GetValue()
			if err := checkFinite(name, v); err != nil {
				return 0, err
			}
			if v < 0 || v > 1 {
				return 0, scrapeErr(wire.ScrapeInvalidValue, "%s: %v outside 0..1", name, v)
			}
			usage = max(usage, v)
		}
		return usage, nil
	}
	return 0, scrapeErr(wire.ScrapeMissingMetric, "none of %s present", strings.Join(names, ", "))
}

// readLoRA reads vLLM's LoRA info gauge. vLLM keeps every label combination
// it ever set as its own series, with the Unix time it was set as value, so
// the series with the largest value is the current state (as GAIE's
// endpoint picker reads it). A server without LoRA has no such family.
func readLoRA(fams map[string]*dto.MetricFamily, name string, m *PodMetrics) error {
	if _, ok := fams[name]; !ok {
		return nil
	}
	f, err := gaugeFamily(fams, name)
	if err != nil {
		return err
	}
	var latest *dto.Metric
	for _, s := range f.GetMetric() {
		v := s.GetGauge().GetValue()
		if err := checkFinite(name, v); err != nil {
			return err
		}
		if latest == nil || v > latest.GetGauge().GetValue() {
			latest = s
		}
	}
	var maxLoRA, running, waiting string
	var haveMax bool
	for _, lp := range latest.GetLabel() {
		switch lp.GetName() {
		case labelMaxLoRA:
			maxLoRA, haveMax = lp.GetValue(), true
		case labelRunningAdapters:
			running = lp.GetValue()
		case labelWaitingAdapters:
			waiting = lp.GetValue()
		}
	}
	if !haveMax {
		return scrapeErr(wire.ScrapeInvalidValue, "%s: no %s label", name, labelMaxLoRA)
	}
	n, perr := strconv.ParseUint(maxLoRA, 10, 32)
	if perr != nil || float64(n) > maxQueue {
		return scrapeErr(wire.ScrapeInvalidValue, "%s: %s=%q is not a small non-negative integer", name, labelMaxLoRA, maxLoRA)
	}
	m.MaxAdapters = uint32(n)
	m.ActiveAdapters = splitAdapters(running)
	m.WaitingAdapters = splitAdapters(waiting)
	return nil
}

// splitAdapters splits vLLM's comma-joined adapter list, sorted and unique.
func splitAdapters(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// familyFilter picks the lines of the wanted families out of a page.
type familyFilter struct {
	wanted []string
	// prefix is what every wanted name starts with ("vllm:"), and next
	// marks the bytes that follow it in some wanted name: most lines of a
	// vLLM page start with "vllm:" too, and the byte after it rules out
	// nearly all of them with one look.
	prefix string
	next   [256]bool
}

func newFamilyFilter(names MetricNames) *familyFilter {
	f := &familyFilter{}
	f.wanted = append(f.wanted, names.Waiting, names.Running)
	if names.LoRAInfo != "" {
		f.wanted = append(f.wanted, names.LoRAInfo)
	}
	f.wanted = append(f.wanted, names.KVUsage...)
	f.wanted = slices.DeleteFunc(f.wanted, func(w string) bool { return w == "" })
	if len(f.wanted) == 0 {
		return f
	}
	f.prefix = f.wanted[0]
	for _, w := range f.wanted[1:] {
		n := 0
		for n < len(f.prefix) && n < len(w) && f.prefix[n] == w[n] {
			n++
		}
		f.prefix = f.prefix[:n]
	}
	for _, w := range f.wanted {
		if len(w) > len(f.prefix) {
			f.next[w[len(f.prefix)]] = true
		} else {
			// w is the prefix itself: a name that ends where others go
			// on; what follows it on a line is '{' or a blank.
			f.next['{'], f.next[' '], f.next['\t'] = true, true, true
		}
	}
	return f
}

// filterFamilies appends to dst the lines of body that belong to a wanted
// family: "# TYPE name" and samples of name. HELP lines, other comments and
// blank lines are dropped (the parser needs none of them). A line whose name
// is quoted (the UTF-8 form) is kept whole and left to the parser. Kept
// lines are copied as received, newline included: a last line without one
// stays without one.
//
// It runs on every scrape of every pod, so it looks at as little as it can:
// the bytes at the start of a line decide whether a name comparison is needed.
func filterFamilies(body []byte, names MetricNames, dst []byte) []byte {
	return newFamilyFilter(names).appendLines(dst, body)
}

func (f *familyFilter) appendLines(dst, body []byte) []byte {
	if len(f.wanted) == 0 {
		return dst
	}
	for len(body) > 0 {
		var line, whole []byte // whole is line with its newline, if it has one
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, whole, body = body[:i], body[:i+1], body[i+1:]
		} else {
			line, whole, body = body, body, nil
		}
		if len(line) == 0 {
			continue
		}
		// The parser allows blanks before a sample and around "#" and "TYPE".
		rest := trimBlank(line)
		if len(rest) == 0 {
			continue
		}
		if rest[0] == '#' {
			rest = trimBlank(rest[1:])
			if len(rest) < 5 || string(rest[:4]) != "TYPE" || (rest[4] != ' ' && rest[4] != '\t') {
				continue // HELP and other comments carry nothing we read
			}
			if rest = trimBlank(rest[5:]); len(rest) == 0 {
				continue
			}
		}
		keep := rest[0] == '"' || rest[0] == '{' // quoted name: the parser judges
		if !keep && len(rest) > len(f.prefix) && string(rest[:len(f.prefix)]) == f.prefix && f.next[rest[len(f.prefix)]] {
			for _, w := range f.wanted {
				if len(rest) > len(w) && string(rest[:len(w)]) == w {
					if c := rest[len(w)]; c == '{' || c == ' ' || c == '\t' {
						keep = true
						break
					}
				}
			}
		}
		if keep {
			dst = append(dst, whole...)
		}
	}
	return dst
}

func trimBlank(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}
