package metricsagent

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// parseBoth reads body with p and with ParseMetrics and requires the same
// answer, error text included.
func parseBoth(t testing.TB, p *Parser, body []byte) (PodMetrics, error) {
	t.Helper()
	got, gerr := p.Parse(body)
	want, werr := ParseMetrics(body, p.names)
	require.Equal(t, want, got)
	if werr == nil {
		require.NoError(t, gerr)
	} else {
		require.EqualError(t, gerr, werr.Error())
		require.Equal(t, StatusOf(werr), StatusOf(gerr))
	}
	return got, gerr
}

func requireParses(t *testing.T, p *Parser, full, valuesOnly uint64) {
	t.Helper()
	require.Equal(t, full, p.FullParses, "full parses")
	require.Equal(t, valuesOnly, p.ValueParses, "values-only parses")
}

func TestParserReadsNewValuesWithoutExpfmt(t *testing.T) {
	live := livePage(golden(t, "vllm-v1.txt"))
	names := DefaultMetricNames()
	asked := append([]string{names.Waiting, names.Running, names.LoRAInfo}, names.KVUsage...)
	for _, tc := range []struct {
		name string
		page func(n int64) []byte
	}{
		{"whole page", live},
		{"families asked for by name", func(n int64) []byte { return restrict(live(n), asked) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewParser(names)
			for n := range int64(40) {
				m, err := parseBoth(t, p, tc.page(n))
				require.NoError(t, err)
				assert.Equal(t, uint32(n%13), m.Waiting)
				assert.Equal(t, uint32(n%50), m.Running)
				assert.InDelta(t, float64(n%1000)/1000, m.KVCacheUsage, 1e-12)
				assert.Equal(t, []string{"fin-lora", "sql-lora"}, m.ActiveAdapters)
			}
			requireParses(t, p, 1, 39)
		})
	}
}

func TestParserFallsBackToExpfmtWhenThePageChanges(t *testing.T) {
	const (
		typeW   = "# TYPE vllm:num_requests_waiting gauge"
		typeR   = "# TYPE vllm:num_requests_running gauge"
		typeKV  = "# TYPE vllm:kv_cache_usage_perc gauge"
		typeL   = "# TYPE vllm:lora_requests_info gauge"
		running = `vllm:num_requests_running{model_name="m"} 4`
		kv      = `vllm:kv_cache_usage_perc{model_name="m"} 0.5`
	)
	lora := func(running string, at string) string {
		return `vllm:lora_requests_info{max_lora="2",running_lora_adapters="` + running + `",waiting_lora_adapters=""} ` + at
	}
	p := NewParser(DefaultMetricNames())
	steps := []struct {
		name       string
		body       []byte
		wantStatus wire.ScrapeStatus
		full, vals uint64
	}{
		{"first page", page(typeW, `vllm:num_requests_waiting{model_name="m"} 1`, typeR, running, typeKV, kv, typeL, lora("a", "100")), wire.ScrapeOK, 1, 0},
		{"new values", page(typeW, `vllm:num_requests_waiting{model_name="m"} 12`, typeR, running, typeKV, kv, typeL, lora("a", "101.5")), wire.ScrapeOK, 1, 1},
		{"an adapter label changed", page(typeW, `vllm:num_requests_waiting{model_name="m"} 12`, typeR, running, typeKV, kv, typeL, lora("a,b", "102")), wire.ScrapeOK, 2, 1},
		{"a series added", page(typeW, `vllm:num_requests_waiting{model_name="m"} 12`, typeR, running, typeKV, kv, typeL, lora("a,b", "102"), lora("b", "103")), wire.ScrapeOK, 3, 1},
		{"NaN value: same error, template kept", page(typeW, `vllm:num_requests_waiting{model_name="m"} NaN`, typeR, running, typeKV, kv, typeL, lora("a,b", "102"), lora("b", "103")), wire.ScrapeInvalidValue, 3, 2},
		{"values again", page(typeW, `vllm:num_requests_waiting{model_name="m"} 3`, typeR, running, typeKV, kv, typeL, lora("a,b", "104"), lora("b", "103")), wire.ScrapeOK, 3, 3},
		{"hex float (expfmt refuses it)", page(typeW, `vllm:num_requests_waiting{model_name="m"} 0x1p3`, typeR, running, typeKV, kv, typeL, lora("a,b", "104"), lora("b", "103")), wire.ScrapeParseError, 4, 3},
		{"after an expfmt error, expfmt again", page(typeW, `vllm:num_requests_waiting{model_name="m"} 3`, typeR, running, typeKV, kv, typeL, lora("a,b", "104"), lora("b", "103")), wire.ScrapeOK, 5, 3},
		{"a timestamp", page(typeW, `vllm:num_requests_waiting{model_name="m"} 3 1700000000000`, typeR, running, typeKV, kv, typeL, lora("a,b", "104"), lora("b", "103")), wire.ScrapeOK, 6, 3},
		{"no template with timestamps", page(typeW, `vllm:num_requests_waiting{model_name="m"} 4 1700000000001`, typeR, running, typeKV, kv, typeL, lora("a,b", "104"), lora("b", "103")), wire.ScrapeOK, 7, 3},
		{"trailing blank (expfmt refuses it)", page(typeW, `vllm:num_requests_waiting{model_name="m"} 4 `, typeR, running, typeKV, kv), wire.ScrapeParseError, 8, 3},
		{"a family gone", page(typeW, `vllm:num_requests_waiting{model_name="m"} 4`, typeR, running), wire.ScrapeMissingMetric, 9, 3},
		{"missing again, values only", page(typeW, `vllm:num_requests_waiting{model_name="m"} 5`, typeR, running), wire.ScrapeMissingMetric, 9, 4},
	}
	for _, s := range steps {
		_, err := parseBoth(t, p, s.body)
		require.Equal(t, s.wantStatus, StatusOf(err), "%s: %v", s.name, err)
		require.Equal(t, s.full, p.FullParses, "%s: full parses", s.name)
		require.Equal(t, s.vals, p.ValueParses, "%s: values-only parses", s.name)
	}
}

// A page cut short is refused on either path, and the template survives it.
func TestParserRefusesTruncatedPages(t *testing.T) {
	const typeW = "# TYPE vllm:num_requests_waiting gauge"
	whole := func(waiting string) string {
		return string(page(running5, kvV1, typeW, `vllm:num_requests_waiting{model_name="m"} `+waiting, "# TYPE vllm:e2e_request_latency_seconds histogram",
			`vllm:e2e_request_latency_seconds_bucket{le="0.5"} 4`))
	}
	p := NewParser(DefaultMetricNames())
	m, err := parseBoth(t, p, []byte(whole("12")))
	require.NoError(t, err)
	require.Equal(t, uint32(12), m.Waiting)
	m, err = parseBoth(t, p, []byte(whole("17.0")))
	require.NoError(t, err)
	require.Equal(t, uint32(17), m.Waiting)
	requireParses(t, p, 1, 1)

	// Cut in a line the filter drops: the filtered text is the template's
	// shape with new values, yet the page is incomplete.
	cutOther := strings.TrimSuffix(whole("3"), "4\n")
	_, err = parseBoth(t, p, []byte(cutOther))
	require.Equal(t, wire.ScrapeParseError, StatusOf(err), "%v", err)
	assert.ErrorContains(t, err, "truncated")
	// Cut in the last wanted sample's value: "17.0" became "1".
	cutValue := string(page(running5, kvV1, typeW)) + `vllm:num_requests_waiting{model_name="m"} 1`
	_, err = parseBoth(t, p, []byte(cutValue))
	require.Equal(t, wire.ScrapeParseError, StatusOf(err), "%v", err)

	m, err = parseBoth(t, p, []byte(whole("5")))
	require.NoError(t, err)
	assert.Equal(t, uint32(5), m.Waiting)
}

// A duplicated unlabelled series is refused on the values-only path too.
func TestParserRefusesDuplicateSeriesOnEveryPath(t *testing.T) {
	const typeW = "# TYPE vllm:num_requests_waiting gauge"
	dup := func(a, b string) []byte {
		return page(typeW, "vllm:num_requests_waiting "+a, "vllm:num_requests_waiting "+b, running5, kvV1)
	}
	p := NewParser(DefaultMetricNames())
	for _, vals := range [][2]string{{"3", "99"}, {"4", "98"}} {
		_, err := parseBoth(t, p, dup(vals[0], vals[1]))
		require.Equal(t, wire.ScrapeParseError, StatusOf(err), "%v", err)
		assert.ErrorContains(t, err, "vllm:num_requests_waiting: series {} appears twice")
	}
	requireParses(t, p, 1, 1)
}

func TestParserSampleValueRules(t *testing.T) {
	for _, tc := range []struct {
		token string
		ok    bool
	}{
		{"1", true}, {"-0.5", true}, {"1e3", true}, {"+Inf", true}, {"NaN", true}, {"0x10", false},
		{"0x1p3", false}, {"1_000", false}, {"", false}, {"one", false},
	} {
		_, err := parseSampleValue([]byte(tc.token))
		assert.Equal(t, tc.ok, err == nil, "%q: %v", tc.token, err)
		body := page("# TYPE g gauge", "g "+tc.token)
		_, perr := parseFamilies(body)
		assert.Equal(t, tc.ok, perr == nil, "expfmt on %q: %v", tc.token, perr)
	}
}

// FuzzParserTemplate: a parser that read page a gives for page b exactly
// what a fresh parse of b gives, whichever path it takes.
func FuzzParserTemplate(f *testing.F) {
	v1 := golden(f, "vllm-v1.txt")
	live := livePage(v1)
	f.Add(live(1), live(2))
	f.Add(v1, golden(f, "vllm-v0.6.txt"))
	base := page("# TYPE vllm:num_requests_waiting gauge", `vllm:num_requests_waiting 1`,
		"# TYPE vllm:num_requests_running gauge", `vllm:num_requests_running{a="x y"} 2`,
		"# TYPE vllm:kv_cache_usage_perc gauge", `vllm:kv_cache_usage_perc 0.25`)
	f.Add(base, []byte(strings.Replace(string(base), "0.25", "0.5", 1)))
	f.Add(base, []byte(strings.Replace(string(base), " 1\n", " 1 17\n", 1)))
	f.Add(base, []byte(strings.Replace(string(base), " 2\n", " \t2\n", 1)))
	f.Add(base, []byte(strings.TrimSuffix(string(base), "5\n")))
	f.Add(base, []byte(string(base)+"vllm:num_requests_waiting 2\n"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		p := NewParser(DefaultMetricNames())
		parseBoth(t, p, a)
		parseBoth(t, p, b)
		parseBoth(t, p, a)
	})
}

// FuzzParserNewValues aims at the values-only path: page b is page a with
// the last token of every line that has one replaced by token (so b keeps
// a's shape), and the parser that read a must read b as a fresh parse does.
func FuzzParserNewValues(f *testing.F) {
	f.Add(golden(f, "vllm-v1.txt"), "3")
	f.Add(page(waiting2, running5, kvV1), "0.75")
	f.Add(page(waiting2, running5, kvV1), "1e400")
	f.Add(page(waiting2, running5, kvV1), "-Inf")
	f.Add(page(waiting2, running5, kvV1, "# TYPE vllm:lora_requests_info gauge", `vllm:lora_requests_info{max_lora="3",running_lora_adapters="b,a",waiting_lora_adapters="c"} 1.8e9`), "1_0")
	f.Fuzz(func(t *testing.T, a []byte, token string) {
		var b []byte
		for line := range strings.SplitAfterSeq(string(a), "\n") {
			body, nl := strings.CutSuffix(line, "\n")
			if i := strings.LastIndexAny(body, " \t"); i >= 0 && !strings.HasPrefix(strings.TrimLeft(body, " \t"), "#") {
				body = body[:i+1] + token
			}
			b = append(b, body...)
			if nl {
				b = append(b, '\n')
			}
		}
		p := NewParser(DefaultMetricNames())
		parseBoth(t, p, a)
		parseBoth(t, p, b)
	})
}
