package fleet

import (
	"bytes"
	"encoding/csv"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

func TestSummarizeUsesNearestRank(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		in   []time.Duration
		want Quantiles
	}{
		{"empty", nil, Quantiles{}},
		{"one", []time.Duration{5 * ms}, Quantiles{Mean: 5 * ms, P50: 5 * ms, P90: 5 * ms, P99: 5 * ms}},
		{"ten unsorted", []time.Duration{10 * ms, 1 * ms, 9 * ms, 2 * ms, 8 * ms, 3 * ms, 7 * ms, 4 * ms, 6 * ms, 5 * ms},
			Quantiles{Mean: 5500 * time.Microsecond, P50: 5 * ms, P90: 9 * ms, P99: 10 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, summarize(tc.in))
		})
	}
}

func TestParseCriticalityMix(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    CriticalityMix
		wantErr bool
	}{
		{"critical=1", AllCritical, false},
		{"critical=0.5, Standard=0.2,sheddable=0.3", CriticalityMix{0.5, 0.2, 0.3}, false},
		{"sheddable=1", CriticalityMix{Sheddable: 1}, false},
		{"critical=0", CriticalityMix{}, true},
		{"critical=-1,sheddable=2", CriticalityMix{}, true},
		{"urgent=1", CriticalityMix{}, true},
		{"critical", CriticalityMix{}, true},
		{"critical=x", CriticalityMix{}, true},
	} {
		got, err := ParseCriticalityMix(tc.in)
		if tc.wantErr {
			assert.Error(t, err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
	mix := CriticalityMix{Critical: 1, Standard: 1, Sheddable: 2}
	assert.Equal(t, scheduler.Critical, mix.pick(0.1))
	assert.Equal(t, scheduler.Standard, mix.pick(0.3))
	assert.Equal(t, scheduler.Sheddable, mix.pick(0.9))
}

func TestParsePolicy(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	require.NoError(t, os.WriteFile(good, []byte(`{"profile":"mine","profiles":{"mine":{"scorers":[{"scorer":"queue-scorer","weight":1}],"picker":"max-score-picker"}}}`), 0o600))
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"profile":"mine","profiles":{"mine":{"picker":"no-such-picker"}}}`), 0o600))

	for _, name := range []string{"decision-tree", "scoring", "random", "round-robin", "least-request", EnvoyLeastRequest} {
		p, err := ParsePolicy(name)
		require.NoError(t, err, name)
		assert.Equal(t, name, p.Name)
	}
	p, err := ParsePolicy("tuned=" + good)
	require.NoError(t, err)
	assert.Equal(t, "tuned", p.Name)
	_, err = Run(RunConfig{Scenario: smallScenario(), Policy: p, Rate: 10, Seed: 1, Window: 5 * time.Second, ScrapeInterval: DefaultScrapeInterval})
	require.NoError(t, err)

	for _, arg := range []string{"nope", "x=" + bad, "x=" + filepath.Join(dir, "missing.json")} {
		_, err := ParsePolicy(arg)
		assert.Error(t, err, arg)
	}
}

func TestScenariosAreValid(t *testing.T) {
	for _, sc := range Scenarios() {
		require.NoError(t, sc.Validate(), sc.Name)
		got, err := ScenarioByName(sc.Name)
		require.NoError(t, err)
		assert.Equal(t, sc.Title, got.Title)
	}
	b := RegressionScenario()
	total, top := 0.0, 0.0
	for i, a := range b.Adapters {
		total += a.Weight
		if i < 5 {
			top += a.Weight
		}
	}
	assert.InDelta(t, 0.6, top/total, 1e-9, "5 adapters × 12%")
	_, err := ScenarioByName("z")
	assert.Error(t, err)
}

func TestSVGIsWellFormed(t *testing.T) {
	for _, logY := range []bool{false, true} {
		p := Plot{Title: "p90 <TPOT> & co", XLabel: "load", YLabel: "ms", LogY: logY, Series: []Series{
			{Name: "a", X: []float64{20, 60, 100}, Y: []float64{1, 30, 4000}},
			{Name: "b", X: []float64{20, 60, 100}, Y: []float64{2, 0, 10}}, // 0 is skipped on a log axis
		}}
		var buf bytes.Buffer
		require.NoError(t, p.WriteSVG(&buf))
		dec := xml.NewDecoder(&buf)
		polylines := 0
		for {
			tok, err := dec.Token()
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
				polylines++
			}
		}
		assert.Equal(t, 2, polylines)
	}
	err := Plot{Series: []Series{{Name: "x", X: []float64{1}, Y: []float64{1, 2}}}}.WriteSVG(io.Discard)
	assert.Error(t, err)
	err = Plot{LogY: true, Series: []Series{{Name: "x", X: []float64{1}, Y: []float64{0}}}}.WriteSVG(io.Discard)
	assert.Error(t, err)
}

func TestSweepWritesReport(t *testing.T) {
	sc := smallScenario()
	cfg := SweepConfig{
		Scenarios: []Scenario{sc}, Loads: []float64{0.5, 1},
		Policies: []PolicySpec{mustPolicy(t, scheduler.ProfileDecisionTree), mustPolicy(t, scheduler.ProfileRoundRobin), mustPolicy(t, scheduler.ProfileScoring)},
		Seed:     3, Seeds: 1, Warmup: 5 * time.Second, Window: 20 * time.Second, ScrapeInterval: DefaultScrapeInterval, Parallel: 2,
	}
	results, err := Sweep(cfg)
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.Len(t, results[0].Runs, 6)
	assert.Greater(t, results[0].Capacity.FleetRPS, 4*15.0)
	for _, r := range results[0].Runs {
		assert.Equal(t, sc.Name, r.Scenario)
		assert.InDelta(t, r.Load*results[0].Capacity.FleetRPS, r.Rate, 1e-9)
	}

	again, err := Sweep(SweepConfig{Scenarios: cfg.Scenarios, Loads: cfg.Loads, Policies: cfg.Policies, Seed: 3, Seeds: 1,
		Warmup: cfg.Warmup, Window: cfg.Window, ScrapeInterval: cfg.ScrapeInterval, Parallel: 1})
	require.NoError(t, err)
	assert.Equal(t, results, again, "parallelism does not change results")

	dir := t.TempDir()
	rep := &Report{Command: "fleetbench -test", Config: cfg, Results: results, Knee: 1}
	require.NoError(t, rep.WriteFiles(dir))
	md, err := os.ReadFile(filepath.Join(dir, "RESULTS.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "fleetbench -test")
	assert.Contains(t, string(md), "| (small) | p90 TPOT |")
	for _, m := range plotMetrics {
		_, err := os.Stat(filepath.Join(dir, plotFile("small", m.key)))
		if !m.shown(sc) {
			assert.NotContains(t, string(md), plotFile("small", m.key), "no prefix plots without shared prefixes")
			assert.Error(t, err)
			continue
		}
		assert.Contains(t, string(md), plotFile("small", m.key))
		assert.NoError(t, err)
	}
	f, err := os.Open(filepath.Join(dir, "results.csv"))
	require.NoError(t, err)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, 7)
	assert.Equal(t, CSVHeader, rows[0])
	assert.True(t, strings.HasPrefix(strings.Join(rows[1], ","), "small,decision-tree,50.000,"))

	_, err = Sweep(SweepConfig{Scenarios: cfg.Scenarios, Policies: cfg.Policies})
	assert.Error(t, err, "no loads")
	_, err = Sweep(SweepConfig{Scenarios: cfg.Scenarios, Policies: cfg.Policies, Loads: []float64{-1}})
	assert.Error(t, err)
}

func TestReportComparesWithTheOracleAndFIFO(t *testing.T) {
	cfg := SweepConfig{
		Scenarios: []Scenario{smallScenario(), smallContexts()}, Loads: []float64{0.5, 1},
		Policies: []PolicySpec{mustPolicy(t, scheduler.ProfileRandom), mustPolicy(t, scheduler.ProfileDecisionTree), mustPolicy(t, Oracle)},
		Seed:     2, Seeds: 1, Warmup: 5 * time.Second, Window: 20 * time.Second, ScrapeInterval: DefaultScrapeInterval, Parallel: 2,
		LoRAFIFOAt: 0.5,
	}
	results, err := Sweep(cfg)
	require.NoError(t, err)
	require.Len(t, results[0].FIFO, 3, "FIFO runs for the scenario with adapters")
	assert.Empty(t, results[1].FIFO)
	assert.Greater(t, results[1].Capacity.HitRate, 0.8, "one replica with its share of the contexts hits nearly all of them")
	assert.Zero(t, results[0].Capacity.HitRate)
	for _, r := range results[0].FIFO {
		assert.Equal(t, 0.5, r.Load)
	}
	var md bytes.Buffer
	require.NoError(t, (&Report{Command: "x", Config: cfg, Results: results, Knee: 1}).WriteMarkdown(&md))
	out := md.String()
	assert.Contains(t, out, "LoRA admission rule against pure FIFO")
	assert.Contains(t, out, "| decision-tree |")
	assert.Contains(t, out, "Gaps to the oracle")
	assert.Contains(t, out, "**Random over oracle, p90 TTFT:")
	assert.Contains(t, out, "(small-d) oracle: p90 TTFT")
	assert.NotContains(t, out, "| (small-d) | p90 TPOT |", "the routing targets are for the LoRA scenarios")
	assert.Contains(t, out, "prefix-hit-rate")
}
