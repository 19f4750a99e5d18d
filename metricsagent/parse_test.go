package metricsagent

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

func golden(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

func TestParseGoldenCaptures(t *testing.T) {
	tests := []struct {
		file string
		want PodMetrics
	}{
		{"vllm-v0.6.txt", PodMetrics{
			Waiting: 3, Running: 14, KVCacheUsage: 0.4171, MaxAdapters: 4,
			// the series set last (largest value) wins, not the first or the longest
			ActiveAdapters: []string{"sql-lora", "tweet-summary"}, WaitingAdapters: []string{"code-lora"},
		}},
		{"vllm-v1.txt", PodMetrics{
			// only vllm:kv_cache_usage_perc; sql-lora both running and waiting
			Waiting: 7, Running: 31, KVCacheUsage: 0.8125, MaxAdapters: 2,
			ActiveAdapters: []string{"fin-lora", "sql-lora"}, WaitingAdapters: []string{"sql-lora"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			got, err := ParseMetrics(golden(t, tc.file), DefaultMetricNames())
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// page builds an exposition from the gauges given, each with TYPE gauge.
func page(lines ...string) []byte { return []byte(strings.Join(lines, "\n") + "\n") }

const (
	waiting2 = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 2"
	running5 = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 5"
	kvV1     = "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5"
)

func TestParseMetrics(t *testing.T) {
	tests := []struct {
		name   string
		body   []byte
		names  MetricNames
		want   PodMetrics
		status wire.ScrapeStatus // ScrapeOK: success expected
		msg    string
	}{
		{"minimal v1", page(waiting2, running5, kvV1), DefaultMetricNames(), PodMetrics{Waiting: 2, Running: 5, KVCacheUsage: 0.5}, wire.ScrapeOK, ""},
		{"blanks the parser accepts", page("#  TYPE\tvllm:num_requests_waiting gauge", "  vllm:num_requests_waiting 2", running5, kvV1),
			DefaultMetricNames(), PodMetrics{Waiting: 2, Running: 5, KVCacheUsage: 0.5}, wire.ScrapeOK, ""},
		{"v0 name only", page(waiting2, running5, "# TYPE vllm:gpu_cache_usage_perc gauge", "vllm:gpu_cache_usage_perc 0.25"),
			DefaultMetricNames(), PodMetrics{Waiting: 2, Running: 5, KVCacheUsage: 0.25}, wire.ScrapeOK, ""},
		{"both names: v1 preferred", page(waiting2, running5, "# TYPE vllm:gpu_cache_usage_perc gauge", "vllm:gpu_cache_usage_perc 0.9", kvV1),
			DefaultMetricNames(), PodMetrics{Waiting: 2, Running: 5, KVCacheUsage: 0.5}, wire.ScrapeOK, ""},
		{"series summed over model_name", page(
			"# TYPE vllm:num_requests_waiting gauge", `vllm:num_requests_waiting{model_name="a"} 2`, `vllm:num_requests_waiting{model_name="b"} 3`,
			running5, kvV1), DefaultMetricNames(), PodMetrics{Waiting: 5, Running: 5, KVCacheUsage: 0.5}, wire.ScrapeOK, ""},
		{"kv: fullest engine", page(waiting2, running5,
			"# TYPE vllm:kv_cache_usage_perc gauge", `vllm:kv_cache_usage_perc{engine="0"} 0.2`, `vllm:kv_cache_usage_perc{engine="1"} 0.7`),
			DefaultMetricNames(), PodMetrics{Waiting: 2, Running: 5, KVCacheUsage: 0.7}, wire.ScrapeOK, ""},
		{"kv exactly 1 and 0 queues", page("# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting 0", "# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running 0",
			"# TYPE vllm:kv_cache_usage_perc gauge", "vllm:kv_cache_usage_perc 1"),
			DefaultMetricNames(), PodMetrics{KVCacheUsage: 1}, wire.ScrapeOK, ""},
		{"renamed metrics", page("# TYPE sgl:waiting gauge", "sgl:waiting 4", "# TYPE sgl:running gauge", "sgl:running 1", "# TYPE sgl:kv gauge", "sgl:kv 0.1", waiting2),
			MetricNames{Waiting: "sgl:waiting", Running: "sgl:running", KVUsage: []string{"sgl:kv"}},
			PodMetrics{Waiting: 4, Running: 1, KVCacheUsage: 0.1}, wire.ScrapeOK, ""},
		{"lora: largest value wins, spaces and duplicates cleaned", page(waiting2, running5, kvV1,
			"# TYPE vllm:lora_requests_info gauge",
			`vllm:lora_requests_info{max_lora="3",running_lora_adapters="z",waiting_lora_adapters=""} 1.7e9`,
			`vllm:lora_requests_info{max_lora="3",running_lora_adapters="b, a,b",waiting_lora_adapters="c"} 1.8e9`,
			`vllm:lora_requests_info{max_lora="3",running_lora_adapters="y",waiting_lora_adapters="x"} 1.75e9`),
			DefaultMetricNames(), PodMetrics{Waiting: 2, Running: 5, KVCacheUsage: 0.5, MaxAdapters: 3,
				ActiveAdapters: []string{"a", "b"}, WaitingAdapters: []string{"c"}}, wire.ScrapeOK, ""},
		{"lora disabled by empty name", page(waiting2, running5, kvV1, "# TYPE vllm:lora_requests_info gauge", `vllm:lora_requests_info{running_lora_adapters="a"} 1`),
			MetricNames{Waiting: "vllm:num_requests_waiting", Running: "vllm:num_requests_running", KVUsage: []string{"vllm:kv_cache_usage_perc"}},
			PodMetrics{Waiting: 2, Running: 5, KVCacheUsage: 0.5}, wire.ScrapeOK, ""},

		// Values that are not counts or fractions.
		{"NaN queue", page("# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting NaN", running5, kvV1), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "NaN"},
		{"+Inf queue", page(waiting2, "# TYPE vllm:num_requests_running gauge", "vllm:num_requests_running +Inf", kvV1), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "+Inf"},
		{"NaN kv", page(waiting2, running5, "# TYPE vllm:kv_cache_usage_perc gauge", `vllm:kv_cache_usage_perc{model_name="m"} NaN`), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "vllm:kv_cache_usage_perc: value NaN"},
		{"NaN v0 kv", page(waiting2, running5, "# TYPE vllm:gpu_cache_usage_perc gauge", "vllm:gpu_cache_usage_perc NaN"), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "vllm:gpu_cache_usage_perc: value NaN"},
		{"-Inf kv", page(waiting2, running5, "# TYPE vllm:kv_cache_usage_perc gauge", "vllm:kv_cache_usage_perc -Inf"), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "-Inf"},
		{"negative queue", page("# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting -1", running5, kvV1), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "negative"},
		{"kv above 1", page(waiting2, running5, "# TYPE vllm:kv_cache_usage_perc gauge", "vllm:kv_cache_usage_perc 1.01"), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "outside 0..1"},
		{"kv negative", page(waiting2, running5, "# TYPE vllm:kv_cache_usage_perc gauge", "vllm:kv_cache_usage_perc -0.1"), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "outside 0..1"},
		{"absurd queue", page("# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting 1e12", running5, kvV1), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "exceeds"},
		{"lora NaN", page(waiting2, running5, kvV1, "# TYPE vllm:lora_requests_info gauge", `vllm:lora_requests_info{max_lora="1"} NaN`), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "NaN"},
		{"lora without max_lora", page(waiting2, running5, kvV1, "# TYPE vllm:lora_requests_info gauge", `vllm:lora_requests_info{running_lora_adapters="a"} 1`), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "max_lora"},
		{"lora max_lora not a number", page(waiting2, running5, kvV1, "# TYPE vllm:lora_requests_info gauge", `vllm:lora_requests_info{max_lora="four"} 1`), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "max_lora"},
		// Families without a TYPE line.
		{"untyped waiting", page("vllm:num_requests_waiting 3", running5, kvV1), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "untyped"},
		{"untyped kv", page(waiting2, running5, "vllm:kv_cache_usage_perc 0.3"), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "untyped"},
		{"counter instead of gauge", page("# TYPE vllm:num_requests_waiting counter", "vllm:num_requests_waiting 3", running5, kvV1), DefaultMetricNames(), PodMetrics{}, wire.ScrapeInvalidValue, "type counter"},
		// partial pages
		{"missing running", page(waiting2, kvV1), DefaultMetricNames(), PodMetrics{}, wire.ScrapeMissingMetric, "vllm:num_requests_running"},
		{"missing kv", page(waiting2, running5), DefaultMetricNames(), PodMetrics{}, wire.ScrapeMissingMetric, "none of vllm:kv_cache_usage_perc, vllm:gpu_cache_usage_perc"},
		{"TYPE without samples", page("# TYPE vllm:num_requests_waiting gauge", running5, kvV1), DefaultMetricNames(), PodMetrics{}, wire.ScrapeMissingMetric, "no samples"},
		// A page cut short: vLLM ends every page with a newline.
		{"truncated in the last sample's value", []byte(strings.TrimSuffix(string(page(running5, kvV1, "# TYPE vllm:num_requests_waiting gauge", `vllm:num_requests_waiting{model_name="m"} 17.0`)), "7.0\n")),
			DefaultMetricNames(), PodMetrics{}, wire.ScrapeParseError, "truncated"},
		{"truncated in a line the agent does not read", []byte(string(page(waiting2, running5, kvV1, "# TYPE vllm:e2e_request_latency_seconds histogram")) + `vllm:e2e_request_latency_seconds_bucket{le="0.`),
			DefaultMetricNames(), PodMetrics{}, wire.ScrapeParseError, "truncated"},
		{"truncated after a blank", []byte(string(page(waiting2, running5, kvV1)) + "  "), DefaultMetricNames(), PodMetrics{}, wire.ScrapeParseError, "truncated"},
		{"empty body", nil, DefaultMetricNames(), PodMetrics{}, wire.ScrapeMissingMetric, ""},
		{"HTML page", []byte("<!DOCTYPE html><html><body>502 Bad Gateway</body></html>\n"), DefaultMetricNames(), PodMetrics{}, wire.ScrapeMissingMetric, ""},
		{"garbage in a wanted line", page(waiting2, running5, "# TYPE vllm:kv_cache_usage_perc gauge", "vllm:kv_cache_usage_perc{engine=\"0\" 0.5"), DefaultMetricNames(), PodMetrics{}, wire.ScrapeParseError, "exposition text"},
		{"duplicate series", page(waiting2, "vllm:num_requests_waiting{model_name=\"m\"} 3", running5, kvV1), DefaultMetricNames(), PodMetrics{}, wire.ScrapeParseError, "appears twice"},
		{"duplicate series without labels", page("# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting 3", "vllm:num_requests_waiting 99", running5, kvV1),
			DefaultMetricNames(), PodMetrics{}, wire.ScrapeParseError, "vllm:num_requests_waiting: series {} appears twice"},
		{"duplicate KV series without labels", page(waiting2, running5, "# TYPE vllm:kv_cache_usage_perc gauge", "vllm:kv_cache_usage_perc 0.1", "vllm:kv_cache_usage_perc 0.9"),
			DefaultMetricNames(), PodMetrics{}, wire.ScrapeParseError, "vllm:kv_cache_usage_perc: series {} appears twice"},
		{"duplicate series, labels in another order", page("# TYPE vllm:num_requests_waiting gauge", `vllm:num_requests_waiting{engine="0",model_name="m"} 1`,
			`vllm:num_requests_waiting{engine="1",model_name="m"} 2`, `vllm:num_requests_waiting{model_name="m",engine="0"} 3`, running5, kvV1),
			DefaultMetricNames(), PodMetrics{}, wire.ScrapeParseError, `vllm:num_requests_waiting: series {engine="0",model_name="m"} appears twice`},
		{"series that differ in one label value or in their label names", page("# TYPE vllm:num_requests_waiting gauge", `vllm:num_requests_waiting{engine="0",model_name="m"} 1`,
			`vllm:num_requests_waiting{engine="1",model_name="m"} 2`, `vllm:num_requests_waiting{engine="0",model="m"} 3`, `vllm:num_requests_waiting{engine="0"} 4`, running5, kvV1),
			DefaultMetricNames(), PodMetrics{Waiting: 10, Running: 5, KVCacheUsage: 0.5}, wire.ScrapeOK, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseMetrics(tc.body, tc.names)
			if tc.status == wire.ScrapeOK {
				require.NoError(t, err)
				assert.Equal(t, tc.want, got)
				return
			}
			require.Error(t, err)
			assert.Equal(t, tc.status, StatusOf(err), "%v", err)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Equal(t, PodMetrics{}, got, "nothing partial returned")
		})
	}
}

func TestFilterFamiliesHandsOnTheBytesReceived(t *testing.T) {
	// A last line without its newline stays without one: the parser must
	// see a page cut short as it was received.
	cut := "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1"
	assert.Equal(t, cut, string(filterFamilies([]byte(cut), DefaultMetricNames(), nil)))
	assert.Equal(t, "# TYPE vllm:num_requests_waiting gauge\n", string(filterFamilies([]byte("# TYPE vllm:num_requests_waiting gauge\nvllm:other 1"), DefaultMetricNames(), nil)))
}

func TestFilterFamiliesKeepsOnlyWantedLines(t *testing.T) {
	in := page("# HELP vllm:num_requests_waiting Queued.", waiting2, "# some comment", "",
		"# TYPE vllm:num_requests_waiting_other gauge", "vllm:num_requests_waiting_other 1",
		"vllm:num_requests_running{a=\"b\"}\t1", "vllm:num_requests_running", `{"vllm:odd name"} 1`,
		"#  TYPE   vllm:kv_cache_usage_perc gauge", "# TYPE  vllm:kv_cache_usage_perc gauge", "# TYPE ")
	got := string(filterFamilies(in, DefaultMetricNames(), nil))
	assert.Equal(t, waiting2+"\n"+"vllm:num_requests_running{a=\"b\"}\t1\n"+`{"vllm:odd name"} 1`+"\n"+
		"#  TYPE   vllm:kv_cache_usage_perc gauge\n"+"# TYPE  vllm:kv_cache_usage_perc gauge\n", got)
}

// referenceFilter is filterFamilies written for clarity, not speed: the
// line's metric name (after "# TYPE" for TYPE lines) must be wanted.
func referenceFilter(body []byte, wanted []string) string {
	var out strings.Builder
	for line := range strings.SplitAfterSeq(string(body), "\n") {
		rest := strings.TrimLeft(strings.TrimSuffix(line, "\n"), " \t")
		if rest == "" {
			continue
		}
		if r, ok := strings.CutPrefix(rest, "#"); ok {
			r = strings.TrimLeft(r, " \t")
			after, ok := strings.CutPrefix(r, "TYPE")
			if !ok || after == "" || (after[0] != ' ' && after[0] != '\t') {
				continue
			}
			if rest = strings.TrimLeft(after, " \t"); rest == "" {
				continue
			}
		}
		keep := rest[0] == '"' || rest[0] == '{'
		if end := strings.IndexAny(rest, "{ \t"); !keep && end > 0 {
			keep = slices.Contains(wanted, rest[:end])
		}
		if keep {
			out.WriteString(line)
		}
	}
	return out.String()
}

// filterNameSets are name choices with different shapes of common prefix.
var filterNameSets = []MetricNames{
	DefaultMetricNames(),
	{Waiting: "q", Running: "q_running", KVUsage: []string{"kv"}, LoRAInfo: "q_lora"}, // one name is the common prefix
	{Waiting: "waiting", Running: "running", KVUsage: []string{"kv"}},                 // no common prefix, no LoRA
	{Waiting: "x:w", Running: "x:w", KVUsage: []string{"x:w"}, LoRAInfo: "x:w"},       // all the same
}

func TestFilterFamiliesMatchesTheReference(t *testing.T) {
	body := page(string(golden(t, "vllm-v1.txt")), string(golden(t, "vllm-v0.6.txt")),
		"q 1", "q{a=\"b\"} 2", "q_running 3", "q_runningx 4", "qq 5", "# TYPE q gauge", "# TYPE q_lora gauge", "q_lora{} 1",
		"waiting 1", "running\t2", "kv 3", "kvx 4", "x:w 1", "x:wx 2", "x: 3", "  x:w 4", "\tq 5")
	for _, names := range filterNameSets {
		wanted := append([]string{names.Waiting, names.Running, names.LoRAInfo}, names.KVUsage...)
		assert.Equal(t, referenceFilter(body, wanted), string(filterFamilies(body, names, nil)), "%+v", names)
	}
}

func FuzzFilterFamilies(f *testing.F) {
	f.Add(golden(f, "vllm-v1.txt"), uint8(0))
	f.Add([]byte("q 1\nq_running 2\n# TYPE q gauge\nqq 3\n"), uint8(1))
	f.Add([]byte("waiting 1\n\trunning 2\nkv{a=\"b\"} 3\n"), uint8(2))
	f.Add([]byte("waiting 1\n\trunning 2\nkv{a=\"b\"} 3"), uint8(2))
	f.Fuzz(func(t *testing.T, body []byte, set uint8) {
		names := filterNameSets[int(set)%len(filterNameSets)]
		wanted := append([]string{names.Waiting, names.Running, names.LoRAInfo}, names.KVUsage...)
		require.Equal(t, referenceFilter(body, wanted), string(filterFamilies(body, names, nil)))
	})
}

func TestStatusOf(t *testing.T) {
	assert.Equal(t, wire.ScrapeOK, StatusOf(nil))
	assert.Equal(t, wire.ScrapeParseError, StatusOf(assert.AnError))
	assert.Equal(t, wire.ScrapeTimeout, StatusOf(scrapeErr(wire.ScrapeTimeout, "x")))
}

// FuzzParseMetrics: any text gives either an error or metrics the wire
// format accepts; never a panic.
func FuzzParseMetrics(f *testing.F) {
	f.Add(golden(f, "vllm-v0.6.txt"))
	f.Add(golden(f, "vllm-v1.txt"))
	f.Add(page(waiting2, running5, kvV1))
	f.Add(page(waiting2, running5, kvV1, "# TYPE vllm:lora_requests_info gauge", `vllm:lora_requests_info{max_lora="3",running_lora_adapters="b,a",waiting_lora_adapters="c"} 1.8e9`))
	f.Add(bytes.TrimSuffix(page(running5, kvV1, "# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting 17.0"), []byte("7.0\n")))
	f.Add(page("# TYPE vllm:num_requests_waiting gauge", "vllm:num_requests_waiting 3", "vllm:num_requests_waiting 99", running5, kvV1))
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := ParseMetrics(body, DefaultMetricNames())
		// A page without its final newline was cut short, whatever the
		// cut line holds.
		if len(body) > 0 && body[len(body)-1] != '\n' {
			require.Equal(t, wire.ScrapeParseError, StatusOf(err), "%v", err)
			require.ErrorContains(t, err, "truncated")
			return
		}
		// The line filter must not change the meaning: whenever the whole
		// page parses, reading it unfiltered gives the same answer.
		parser := expfmt.NewTextParser(model.UTF8Validation)
		if fams, perr := parser.TextToMetricFamilies(bytes.NewReader(body)); perr == nil {
			want, werr := metricsFrom(fams, DefaultMetricNames())
			require.Equal(t, StatusOf(werr), StatusOf(err), "filtered: %v, unfiltered: %v", err, werr)
			require.Equal(t, want, m)
		}
		if err != nil {
			require.NotEqual(t, wire.ScrapeOK, StatusOf(err))
			return
		}
		require.False(t, math.IsNaN(m.KVCacheUsage))
		require.True(t, m.KVCacheUsage >= 0 && m.KVCacheUsage <= 1)
		require.LessOrEqual(t, m.Waiting, uint32(wire.DefaultLimits().MaxCount))
		require.LessOrEqual(t, m.Running, uint32(wire.DefaultLimits().MaxCount))
		for _, list := range [][]string{m.ActiveAdapters, m.WaitingAdapters} {
			for i, a := range list {
				require.NotEmpty(t, a)
				require.NotContains(t, a, ",")
				if i > 0 {
					require.Less(t, list[i-1], a)
				}
			}
		}
	})
}

// BenchmarkParseMetrics reads the vLLM v1 golden page, whole (26 KB) and
// restricted to the families asked for by name[] (about 1 KB), with
// ParseMetrics (expfmt every time) and with a Parser over pages whose
// values change on every scrape, as a pod's PodScraper does.
func BenchmarkParseMetrics(b *testing.B) {
	names := DefaultMetricNames()
	asked := append([]string{names.Waiting, names.Running, names.LoRAInfo}, names.KVUsage...)
	live := livePage(golden(b, "vllm-v1.txt"))
	const variants = 16
	for _, size := range []struct {
		name  string
		pages [variants][]byte
	}{{name: "whole"}, {name: "restricted"}} {
		for i := range variants {
			size.pages[i] = live(int64(i))
			if size.name == "restricted" {
				size.pages[i] = restrict(size.pages[i], asked)
			}
		}
		b.Run(size.name+"/expfmt", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(size.pages[0])))
			n := 0
			for b.Loop() {
				if _, err := ParseMetrics(size.pages[n%variants], names); err != nil {
					b.Fatal(err)
				}
				n++
			}
		})
		b.Run(size.name+"/parser", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(size.pages[0])))
			p := NewParser(names)
			n := 0
			for b.Loop() {
				if _, err := p.Parse(size.pages[n%variants]); err != nil {
					b.Fatal(err)
				}
				n++
			}
			if p.FullParses != 1 {
				b.Fatalf("%d full parses, want 1", p.FullParses)
			}
		})
	}
}
