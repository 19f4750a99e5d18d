package scheduler

import (
	"encoding/json"
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// build decodes and assembles, as the Proxy-Wasm plugin does.
func build(configJSON string) (*Scheduler, error) {
	cfg, err := DecodeConfig([]byte(configJSON))
	if err != nil {
		return nil, err
	}
	return New(cfg, nil, seeded(1))
}

func TestConfigValid(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		profile [3]string // serving Critical, Standard, Sheddable
	}{
		{"absent", ``, [3]string{"decision-tree", "decision-tree", "decision-tree"}},
		{"null", ` null `, [3]string{"decision-tree", "decision-tree", "decision-tree"}},
		{"empty object", `{}`, [3]string{"decision-tree", "decision-tree", "decision-tree"}},
		{"built-in scoring", `{"profile": "scoring"}`, [3]string{"scoring", "scoring", "scoring"}},
		{"per criticality", `{"profile": "round-robin", "byCriticality": {"sheddable": "scoring", "critical": "decision-tree"}}`,
			[3]string{"decision-tree", "round-robin", "scoring"}},
		{"tuned decision tree", `{
			"profile": "tuned",
			"plugins": [{"type": "decision-tree-filter", "name": "tree",
			             "parameters": {"loraAffinityThreshold": 1, "queueingThresholdLoRA": 64, "queueThresholdCritical": 2, "kvCacheThreshold": 0.7}}],
			"profiles": {"tuned": {"filters": ["tree"], "picker": "random-picker"}}}`,
			[3]string{"tuned", "tuned", "tuned"}},
		{"scoring profile with declared plugins and type references", `{
			"profile": "lb",
			"plugins": [
				{"type": "shed-filter", "parameters": {"queueThreshold": 10}},
				{"type": "queue-scorer", "name": "q"},
				{"type": "weighted-random-picker", "name": "pick", "parameters": null}
			],
			"profiles": {"lb": {"filters": ["shed-filter", "least-queue-filter"],
			                    "scorers": [{"scorer": "q", "weight": 3}, {"scorer": "kv-cache-scorer", "weight": 0.5}],
			                    "picker": "pick"}}}`,
			[3]string{"lb", "lb", "lb"}},
		{"custom decision tree table", `{
			"profile": "two-step",
			"plugins": [
				{"type": "low-queue-filter", "name": "short", "parameters": {"threshold": 3}},
				{"type": "decision-tree-filter", "name": "tree", "parameters": {
					"steps": [
						{"name": "short-queue", "filter": "short", "onSuccess": "affinity", "onFailure": "least"},
						{"name": "affinity", "filter": "lora-affinity-filter", "onSuccess": "done", "onFailure": "done"},
						{"name": "least", "filter": "least-request-filter", "onSuccess": "done", "onFailure": "drop"}
					],
					"entries": {"critical": "short-queue", "standard": "short-queue", "sheddable": "short-queue"}}}
			],
			"profiles": {"two-step": {"filters": ["tree"], "picker": "random-picker"}}}`,
			[3]string{"two-step", "two-step", "two-step"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := build(tc.json)
			require.NoError(t, err)
			for c := Critical; c <= Sheddable; c++ {
				assert.Equal(t, tc.profile[c], s.ProfileFor(c).Name, c.String())
			}
		})
	}
}

func TestConfigInvalid(t *testing.T) {
	tests := []struct {
		name string
		json string
		err  string // exact error text
	}{
		{"syntax", `{"profile": }`, "invalid JSON at byte 13: invalid character '}' looking for beginning of value"},
		{"truncated", `{"profile": "x"`, "invalid JSON at byte 15: unexpected end of JSON input"},
		{"trailing data", `{} {}`, "invalid JSON at byte 4: data after the JSON value"},
		{"field names are case-sensitive", `{"Profile": "scoring"}`, `unknown field "Profile" (names are case-sensitive: did you mean "profile"?)`},
		{"parameter names are case-sensitive", `{"plugins": [{"type": "low-queue-filter", "parameters": {"Threshold": 3}}]}`,
			`plugins[0].parameters: unknown field "Threshold" (names are case-sensitive: did you mean "threshold"?)`},
		{"nested unknown field has a path", `{"plugins": [{"type": "decision-tree-filter", "parameters": {
			"steps": [{"name": "a", "filter": "least-queue-filter", "onSuccess": "done", "onFailure": "done"}],
			"entries": {"critical": "a", "standard": "a", "Sheddable": "a"}}}]}`,
			`plugins[0].parameters.entries: unknown field "Sheddable" (names are case-sensitive: did you mean "sheddable"?)`},
		{"unknown field in a tree step", `{"plugins": [{"type": "decision-tree-filter", "parameters": {
			"steps": [{"name": "a", "filter": "least-queue-filter", "onSuccess": "done", "onFail": "done"}]}}]}`,
			`plugins[0].parameters.steps[0]: unknown field "onFail"`},
		{"duplicate top-level key", `{"profile": "scoring", "plugins": [], "profile": "random"}`, `duplicate key "profile"`},
		{"duplicate nested key", `{"plugins": [{"type": "x"}, {"type": "low-queue-filter", "parameters": {"threshold": 1, "threshold": 2}}]}`,
			`plugins[1].parameters: duplicate key "threshold"`},
		{"duplicate profile", `{"profiles": {"p": {"picker": "random-picker"}, "q": {"picker": "random-picker", "filters": ["a"]}, "p": {"picker": "x"}}}`,
			`profiles: duplicate key "p"`},
		{"unknown top-level field", `{"profil": "scoring"}`, `unknown field "profil"`},
		{"wrong type at top", `{"plugins": {}}`, "plugins: expected an array, got JSON object"},
		{"unknown field in byCriticality", `{"byCriticality": {"batch": "random"}}`, `byCriticality: unknown field "batch"`},
		{"unknown profile selected", `{"profile": "fastest"}`,
			`profile: unknown profile "fastest" (built-in: decision-tree, least-request, prefix-aware, random, round-robin, scoring)`},
		{"unknown profile per criticality", `{"byCriticality": {"standard": "nope"}}`, `byCriticality.standard: unknown profile "nope" (built-in: decision-tree, least-request, prefix-aware, random, round-robin, scoring)`},
		{"unknown field in plugin", `{"plugins": [{"type": "queue-scorer", "weight": 2}]}`, `plugins[0]: unknown field "weight"`},
		{"plugin without type", `{"plugins": [{"name": "x"}]}`, "plugins[0].type: required"},
		{"duplicate plugin names", `{"plugins": [{"type": "queue-scorer", "name": "q"}, {"type": "kv-cache-scorer", "name": "q"}]}`,
			`plugins[1].name: duplicate plugin name "q" (also plugins[0])`},
		{"duplicate by defaulted name", `{"plugins": [{"type": "queue-scorer"}, {"type": "queue-scorer"}]}`,
			`plugins[1].name: duplicate plugin name "queue-scorer" (also plugins[0])`},
		{"unknown plugin type", `{"plugins": [{"type": "magic"}]}`, `plugins[0].type: unknown plugin type "magic"`},
		{"name shadows another type", `{"plugins": [{"type": "queue-scorer", "name": "kv-cache-scorer"}]}`,
			`plugins[0].name: "kv-cache-scorer" is the name of plugin type "kv-cache-scorer"; choose another name`},
		{"out of range lora threshold", `{"plugins": [{"type": "queue-scorer"}, {"type": "random-picker"}, {"type": "lora-affinity-filter", "parameters": {"threshold": 1.5}}]}`,
			"plugins[2].parameters.threshold: must be in [0,1]"},
		{"negative queue threshold", `{"plugins": [{"type": "low-queue-filter", "parameters": {"threshold": -1}}]}`,
			"plugins[0].parameters.threshold: must be >= 0"},
		{"kv threshold out of range", `{"plugins": [{"type": "has-capacity-filter", "parameters": {"kvCacheThreshold": 80}}]}`,
			"plugins[0].parameters.kvCacheThreshold: must be in [0,1]"},
		{"tree threshold out of range", `{"plugins": [{"type": "decision-tree-filter", "parameters": {"loraAffinityThreshold": -0.1}}]}`,
			"plugins[0].parameters.loraAffinityThreshold: must be in [0,1]"},
		{"unknown parameter", `{"plugins": [{"type": "low-queue-filter", "parameters": {"treshold": 3}}]}`,
			`plugins[0].parameters: unknown field "treshold"`},
		{"parameter of wrong type", `{"plugins": [{"type": "low-queue-filter", "parameters": {"threshold": "3"}}]}`,
			"plugins[0].parameters.threshold: expected an integer, got JSON string"},
		{"fractional integer parameter", `{"plugins": [{"type": "low-queue-filter", "parameters": {"threshold": 2.5}}]}`,
			"plugins[0].parameters.threshold: expected an integer, got JSON number 2.5"},
		{"parameters on a plugin without any", `{"plugins": [{"type": "random-picker", "parameters": {"seed": 1}}]}`,
			`plugins[0].parameters: unknown field "seed"`},
		{"parameters not an object", `{"plugins": [{"type": "random-picker", "parameters": [1]}]}`,
			"plugins[0].parameters: expected an object, got JSON array"},
		{"tree thresholds with steps", `{"plugins": [{"type": "decision-tree-filter", "parameters": {"kvCacheThreshold": 0.5,
			"steps": [{"name": "a", "filter": "least-queue-filter", "onSuccess": "done", "onFailure": "done"}],
			"entries": {"critical": "a", "standard": "a", "sheddable": "a"}}}]}`,
			"plugins[0].parameters.steps: thresholds configure the built-in table only; with steps, set them on the referenced filters"},
		{"tree step references a scorer", `{"plugins": [{"type": "decision-tree-filter", "parameters": {
			"steps": [{"name": "a", "filter": "queue-scorer", "onSuccess": "done", "onFailure": "done"}],
			"entries": {"critical": "a", "standard": "a", "sheddable": "a"}}}]}`,
			`plugins[0].parameters.steps[0].filter: "queue-scorer" is not a filter`},
		{"tree step with unknown target", `{"plugins": [{"type": "decision-tree-filter", "parameters": {
			"steps": [{"name": "a", "filter": "least-queue-filter", "onSuccess": "b", "onFailure": "done"}],
			"entries": {"critical": "a", "standard": "a", "sheddable": "a"}}}]}`,
			`plugins[0].parameters.steps[0].onSuccess: unknown step "b" (want a step name, "done" or "drop")`},
		{"tree step references a later plugin", `{"plugins": [{"type": "decision-tree-filter", "parameters": {
			"steps": [{"name": "a", "filter": "later", "onSuccess": "done", "onFailure": "done"}],
			"entries": {"critical": "a", "standard": "a", "sheddable": "a"}}}, {"type": "least-queue-filter", "name": "later"}]}`,
			`plugins[0].parameters.steps[0].filter: unknown plugin "later" (neither declared in plugins nor a registered type)`},
		{"tree entries without steps", `{"plugins": [{"type": "decision-tree-filter", "parameters": {"entries": {"critical": "a"}}}]}`,
			"plugins[0].parameters.entries: only valid together with steps"},
		{"built-in profile name reserved", `{"profiles": {"scoring": {"picker": "random-picker"}}}`,
			`profiles.scoring: "scoring" is a built-in profile; choose another name`},
		{"profile without picker", `{"profiles": {"p": {"filters": ["least-queue-filter"]}}}`, "profiles.p.picker: required"},
		{"unknown field in profile", `{"profiles": {"p": {"picker": "random-picker", "scorer": []}}}`, `profiles.p: unknown field "scorer"`},
		{"unknown field in scorer ref", `{"profiles": {"p": {"picker": "random-picker", "scorers": [{"scorer": "queue-scorer", "weight": 1, "w": 2}]}}}`,
			`profiles.p.scorers[0]: unknown field "w"`},
		{"zero weight", `{"profiles": {"p": {"picker": "random-picker", "scorers": [{"scorer": "queue-scorer", "weight": 0}]}}}`,
			"profiles.p.scorers[0].weight: must be > 0 and finite"},
		{"missing weight", `{"profiles": {"p": {"picker": "random-picker", "scorers": [{"scorer": "queue-scorer"}]}}}`,
			"profiles.p.scorers[0].weight: must be > 0 and finite"},
		{"unknown plugin reference", `{"profiles": {"p": {"filters": ["nope"], "picker": "random-picker"}}}`,
			`profiles.p.filters[0]: unknown plugin "nope" (neither declared in plugins nor a registered type)`},
		{"scorer used as filter", `{"profiles": {"p": {"filters": ["queue-scorer"], "picker": "random-picker"}}}`,
			`profiles.p.filters[0]: "queue-scorer" is not a filter`},
		{"filter used as picker", `{"profiles": {"p": {"picker": "least-queue-filter"}}}`,
			`profiles.p.picker: "least-queue-filter" is not a picker`},
		{"filter used as scorer", `{"profiles": {"p": {"picker": "random-picker", "scorers": [{"scorer": "shed-filter", "weight": 1}]}}}`,
			`profiles.p.scorers[0].scorer: "shed-filter" is not a scorer`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := build(tc.json)
			require.Error(t, err)
			assert.Equal(t, tc.err, err.Error())
			var ce *ConfigError
			assert.True(t, errors.As(err, &ce), "want a *ConfigError, got %T", err)
		})
	}
}

// TestConfigEmbedded decodes the scheduler section of a larger document, as
// the Proxy-Wasm plugin does, and prefixes errors with its key.
func TestConfigEmbedded(t *testing.T) {
	var outer struct {
		Scheduler json.RawMessage `json:"scheduler"`
	}
	doc := `{"scheduler": {"plugins": [{"type": "queue-scorer"}, {"type": "random-picker"}, {"type": "lora-affinity-filter", "parameters": {"threshold": 2}}]}}`
	require.NoError(t, json.Unmarshal([]byte(doc), &outer))
	_, err := build(string(outer.Scheduler))
	require.Error(t, err)
	assert.Equal(t, "scheduler.plugins[2].parameters.threshold: must be in [0,1]", PrefixError("scheduler", err).Error())

	_, err = build(`{"bogus": 1}`)
	assert.Equal(t, `scheduler: unknown field "bogus"`, PrefixError("scheduler", err).Error())
	assert.Equal(t, "scheduler: plain", PrefixError("scheduler", errors.New("plain")).Error())
	assert.NoError(t, PrefixError("scheduler", nil))
}

// TestConfigGoValuesValidated checks that a Config built in Go (the fleet
// simulation does) gets the same checks as decoded JSON.
func TestConfigGoValuesValidated(t *testing.T) {
	_, err := New(Config{Profiles: map[string]ProfileSpec{"p": {Picker: "random-picker", Scorers: []ScorerRef{{Scorer: "queue-scorer", Weight: -1}}}}}, nil, seeded(1))
	assert.EqualError(t, err, "profiles.p.scorers[0].weight: must be > 0 and finite")
	_, err = New(Config{Profiles: map[string]ProfileSpec{"p": {Picker: "random-picker", Scorers: []ScorerRef{{Scorer: "queue-scorer", Weight: math.Inf(1)}}}}}, nil, seeded(1))
	assert.EqualError(t, err, "profiles.p.scorers[0].weight: must be > 0 and finite")
	_, err = New(Config{Profile: "nope"}, nil, seeded(1))
	assert.ErrorContains(t, err, `profile: unknown profile "nope"`)
	s, err := New(Config{Profile: ProfileLeastRequest}, nil, seeded(1))
	require.NoError(t, err)
	assert.Equal(t, ProfileLeastRequest, s.ProfileFor(Critical).Name)
}

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	var got []string
	for _, typ := range r.Types() {
		got = append(got, typ.Kind.String()+":"+typ.Type)
		assert.NotEmpty(t, typ.Doc)
	}
	assert.Equal(t, []string{
		"filter:decision-tree-filter", "filter:has-capacity-filter", "scorer:kv-cache-scorer",
		"filter:least-kv-cache-filter", "filter:least-queue-filter", "filter:least-request-filter",
		"filter:lora-affinity-filter", "scorer:lora-affinity-scorer", "filter:low-queue-filter",
		"picker:max-score-picker", "filter:prefix-affinity-filter", "scorer:prefix-cache-scorer",
		"scorer:queue-scorer", "picker:random-picker", "picker:round-robin-picker",
		"scorer:running-requests-scorer", "filter:shed-filter", "picker:weighted-random-picker",
	}, got)

	err := r.Register(PluginType{Type: "queue-scorer", Kind: KindScorer, New: noParams(func(n string) Plugin { return &QueueScorer{PluginName: n} })})
	assert.EqualError(t, err, `scheduler: plugin type "queue-scorer" already registered`)
	assert.Error(t, r.Register(PluginType{Type: "no-factory"}))

	// A fork adds its own type and uses it by name.
	require.NoError(t, r.Register(PluginType{Type: "first-picker", Kind: KindPicker, Doc: "always the first",
		New: noParams(func(n string) Plugin { return firstPicker(n) })}))
	cfg, err := DecodeConfig([]byte(`{"profile": "p", "profiles": {"p": {"picker": "first-picker"}}}`))
	require.NoError(t, err)
	s, err := New(cfg, r, seeded(1))
	require.NoError(t, err)
	snap := snapshot(ep("a", 9, 0, nil, nil, 0), ep("b", 0, 0, nil, nil, 0))
	assert.Equal(t, "a", s.Schedule(&Request{}, snap).Endpoint.ID.Name)

	// A factory returning the wrong kind is caught.
	require.NoError(t, r.Register(PluginType{Type: "liar", Kind: KindScorer, Doc: "claims to score",
		New: noParams(func(n string) Plugin { return firstPicker(n) })}))
	_, err = New(Config{Plugins: []PluginSpec{{Type: "liar"}}}, r, seeded(1))
	assert.EqualError(t, err, `plugins[0].type: plugin "liar" does not implement scorer`)
}

type firstPicker string

func (p firstPicker) Name() string                          { return string(p) }
func (firstPicker) Pick(*Cycle, []*Endpoint, []float64) int { return 0 }

// TestConfigRoundTrip: a Config built in Go (the fleet simulation) and
// marshalled reads back identically.
func TestConfigRoundTrip(t *testing.T) {
	cfg := Config{
		Profile:       "lb",
		ByCriticality: ProfileSelection{Sheddable: ProfileDecisionTree},
		Plugins:       []PluginSpec{{Type: TypeQueueScorer, Name: "q"}, {Type: TypeLowQueueFilter, Parameters: json.RawMessage(`{"threshold":7}`)}},
		Profiles: map[string]ProfileSpec{"lb": {
			Filters: []string{TypeLowQueueFilter},
			Scorers: []ScorerRef{{Scorer: "q", Weight: 2}, {Scorer: TypeKVCacheScorer, Weight: 1}},
			Picker:  TypeMaxScorePicker,
		}},
	}
	data, err := json.Marshal(cfg)
	require.NoError(t, err)
	back, err := DecodeConfig(data)
	require.NoError(t, err)
	assert.Equal(t, cfg, back)
	_, err = New(back, nil, seeded(1))
	require.NoError(t, err)

	data, err = json.Marshal(Config{})
	require.NoError(t, err)
	assert.JSONEq(t, `{}`, string(data))
}
