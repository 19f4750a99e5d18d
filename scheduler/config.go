package scheduler

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/wasm-epp/wasm-epp/internal/strictjson"
)

// Config selects and assembles scheduling profiles. Its JSON form is
// decoded strictly by DecodeConfig; the Proxy-Wasm plugin embeds it under
// its own "scheduler" key. Every field is optional; the zero Config means
// the seed's decision tree for every request.
//
//	{
//	  "profile": "tuned",                          // serves every criticality; default "decision-tree"
//	  "byCriticality": {"sheddable": "scoring"},   // per-criticality override (critical, standard, sheddable)
//	  "plugins": [                                 // plugin instances, built in this order
//	    {"type": "decision-tree-filter", "name": "tree", "parameters": {"kvCacheThreshold": 0.7}}
//	  ],
//	  "profiles": {                                // user profiles; built-in names are reserved
//	    "tuned": {"filters": ["tree"], "scorers": [], "picker": "random-picker"},
//	    "lb":    {"filters": ["shed-filter"],
//	              "scorers": [{"scorer": "queue-scorer", "weight": 2}, {"scorer": "kv-cache-scorer", "weight": 1}],
//	              "picker": "max-score-picker"}
//	  },
//	  "countRoutedSinceSnapshot": true             // see Scheduler.Observe; default DefaultCountRoutedSinceSnapshot
//	}
//
// A profile references plugins by name: a plugin declared in "plugins", or
// a registered type name, which stands for an instance of that type with
// default parameters. A declared plugin's name defaults to its type.
//
// Built-in profiles (BuiltinProfiles) always exist and use default
// parameters; to tune one, declare the plugin with parameters and a
// profile of your own, as "tuned" above does for the decision tree.
type Config struct {
	Profile       string                 `json:"profile,omitempty"`
	ByCriticality ProfileSelection       `json:"byCriticality,omitzero"`
	Plugins       []PluginSpec           `json:"plugins,omitempty"`
	Profiles      map[string]ProfileSpec `json:"profiles,omitempty"`
	// CountRoutedSinceSnapshot turns on Scheduler.Observe: requests routed
	// since the snapshot's metrics were taken count as waiting at their
	// endpoint. Nil means DefaultCountRoutedSinceSnapshot.
	CountRoutedSinceSnapshot *bool `json:"countRoutedSinceSnapshot,omitempty"`
}

// DefaultCountRoutedSinceSnapshot is CountRoutedSinceSnapshot when the
// configuration leaves it out: off, since it pays for pools serving base
// models without adapters and not for LoRA pools (measured in
// e2e/results/TUNING.md).
const DefaultCountRoutedSinceSnapshot = false

// CountsRoutedSinceSnapshot is CountRoutedSinceSnapshot with its default
// applied.
func (cfg *Config) CountsRoutedSinceSnapshot() bool {
	if cfg.CountRoutedSinceSnapshot == nil {
		return DefaultCountRoutedSinceSnapshot
	}
	return *cfg.CountRoutedSinceSnapshot
}

// ProfileSelection overrides Config.Profile per criticality; empty fields
// fall back to Config.Profile.
type ProfileSelection struct {
	Critical  string `json:"critical,omitempty"`
	Standard  string `json:"standard,omitempty"`
	Sheddable string `json:"sheddable,omitempty"`
}

// PluginSpec declares one plugin instance.
type PluginSpec struct {
	Type       string          `json:"type"`
	Name       string          `json:"name,omitempty"`
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// ProfileSpec lists a profile's plugins by name.
type ProfileSpec struct {
	Filters []string    `json:"filters,omitempty"`
	Scorers []ScorerRef `json:"scorers,omitempty"`
	Picker  string      `json:"picker"`
}

// ScorerRef is one weighted scorer of a profile; Weight must be > 0 and
// finite. A profile's scores are the weighted mean, so only ratios matter.
type ScorerRef struct {
	Scorer string  `json:"scorer"`
	Weight float64 `json:"weight"`
}

// Built-in profile names.
const (
	ProfileDecisionTree = "decision-tree"
	ProfileScoring      = "scoring"
	ProfileRandom       = "random"
	ProfileRoundRobin   = "round-robin"
	ProfileLeastRequest = "least-request"
	ProfilePrefixAware  = "prefix-aware"
)

// BuiltinProfiles returns the built-in profiles, written in the same
// language as user profiles (references are type names, so default
// parameters).
//
//   - decision-tree: the seed's algorithm (SeedTree), random among the
//     survivors. The default.
//   - scoring: the seed's signals as weighted scores instead of a tree.
//     shed-filter keeps the seed's shedding (Standard/Sheddable dropped
//     when no endpoint has capacity). Weights: lora-affinity 10, queue 1,
//     kv-cache 2, running-requests 1; max-score picker (random among
//     ties). Why these: the gap between "adapter active" (1.0) and "free
//     slot" (0.8) is 0.2×10 = 2, as much as queue and running-requests
//     together can swing (each min-max normalised), so a request joins an
//     endpoint that already runs its adapter unless that endpoint is the
//     most loaded on queue and batch and also fuller on KV; and the "free
//     slot" to "cannot load" gap (0.8×10 = 8) exceeds every other score
//     combined, so a request never goes where its adapter must wait for a
//     slot while a free slot exists. e2e/results/TUNING.md has what was
//     measured and the weights that were tried and rejected.
//   - prefix-aware: shedding, prefix affinity with a load guard, then the
//     scoring profile's scorers with a prefix-cache scorer.
//   - random, round-robin, least-request: classic balancers without
//     shedding, baselines for the fleet simulation.
func BuiltinProfiles() map[string]ProfileSpec {
	return map[string]ProfileSpec{
		ProfileDecisionTree: {Filters: []string{TypeDecisionTreeFilter}, Picker: TypeRandomPicker},
		ProfileScoring: {
			Filters: []string{TypeShedFilter},
			Scorers: []ScorerRef{
				{Scorer: TypeLoRAAffinityScorer, Weight: 10},
				{Scorer: TypeQueueScorer, Weight: 1},
				{Scorer: TypeKVCacheScorer, Weight: 2},
				{Scorer: TypeRunningRequestsScorer, Weight: 1},
			},
			Picker: TypeMaxScorePicker,
		},
		ProfileRandom:       {Picker: TypeRandomPicker},
		ProfileRoundRobin:   {Picker: TypeRoundRobinPicker},
		ProfileLeastRequest: {Filters: []string{TypeLeastRequestFilter}, Picker: TypeRandomPicker},
		ProfilePrefixAware: {
			Filters: []string{TypeShedFilter, TypePrefixAffinityFilter},
			Scorers: []ScorerRef{
				{Scorer: TypePrefixCacheScorer, Weight: 3},
				{Scorer: TypeLoRAAffinityScorer, Weight: 10},
				{Scorer: TypeQueueScorer, Weight: 1},
				{Scorer: TypeKVCacheScorer, Weight: 2},
				{Scorer: TypeRunningRequestsScorer, Weight: 1},
			},
			Picker: TypeMaxScorePicker,
		},
	}
}

// ConfigError is a configuration mistake at a JSON path relative to the
// decoded document ("plugins[2].parameters.threshold"); an empty Path means
// the document itself. Callers that embed the document prefix the path
// with PrefixError. It is the strict decoder's error type, so decoding and
// validation mistakes read alike.
type ConfigError = strictjson.Error

func fieldErr(path, msg string) error { return &ConfigError{Path: path, Msg: msg} }

// PrefixError puts prefix in front of a ConfigError's path ("scheduler" +
// "plugins[2]" → "scheduler.plugins[2]"); other errors get "prefix: ".
func PrefixError(prefix string, err error) error { return prefixErr(prefix, err) }

func prefixErr(prefix string, err error) error {
	if err == nil || prefix == "" {
		return err
	}
	var ce *ConfigError
	if !errors.As(err, &ce) {
		return &ConfigError{Path: prefix, Msg: err.Error()}
	}
	return &ConfigError{Path: strictjson.JoinPath(prefix, ce.Path), Msg: ce.Msg}
}

// DecodeParameters strictly decodes a plugin's raw parameters into v (a
// pointer to a struct pre-filled with defaults). Absent or null parameters
// leave v unchanged. Unknown, duplicated and case-mismatched fields, wrong
// types and trailing data are *ConfigError values with paths relative to
// the parameters object.
func DecodeParameters(params json.RawMessage, v any) error {
	if isAbsent(params) {
		return nil
	}
	return decodeStrict(params, v)
}

func isAbsent(data []byte) bool {
	d := bytes.TrimSpace(data)
	return len(d) == 0 || string(d) == "null"
}

// decodeStrict decodes exactly one JSON value into v with the repository's
// strict decoder (internal/strictjson: unknown, case-mismatched and
// duplicated keys are errors); its errors are ConfigErrors.
func decodeStrict(data []byte, v any) error { return strictjson.Decode(data, v) }

// DecodeConfig strictly decodes a Config. Empty input or null is the zero
// Config (the defaults). It checks everything that needs no registry:
// unknown, duplicated and case-mismatched fields, types, required fields,
// duplicate plugin names, weights, reserved and unknown profile names. New
// checks plugin types, parameters and references. Errors are *ConfigError
// with paths relative to data.
func DecodeConfig(data []byte) (Config, error) {
	var cfg Config
	if isAbsent(data) {
		return cfg, nil
	}
	if err := decodeStrict(data, &cfg); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Validate checks what DecodeConfig checks after decoding; New calls it
// too, so a Config built in Go gets the same errors.
func (cfg *Config) Validate() error {
	names := map[string]int{}
	for i, p := range cfg.Plugins {
		path := fmt.Sprintf("plugins[%d]", i)
		if p.Type == "" {
			return fieldErr(path+".type", "required")
		}
		name := p.instanceName()
		if j, dup := names[name]; dup {
			return fieldErr(path+".name", fmt.Sprintf("duplicate plugin name %q (also plugins[%d])", name, j))
		}
		names[name] = i
	}
	builtin := BuiltinProfiles()
	for _, name := range sortedKeys(cfg.Profiles) {
		path := "profiles." + name
		if name == "" {
			return fieldErr("profiles", "profile name must not be empty")
		}
		if _, reserved := builtin[name]; reserved {
			return fieldErr(path, fmt.Sprintf("%q is a built-in profile; choose another name", name))
		}
		spec := cfg.Profiles[name]
		for j, f := range spec.Filters {
			if f == "" {
				return fieldErr(fmt.Sprintf("%s.filters[%d]", path, j), "must not be empty")
			}
		}
		for j, s := range spec.Scorers {
			sp := fmt.Sprintf("%s.scorers[%d]", path, j)
			if s.Scorer == "" {
				return fieldErr(sp+".scorer", "required")
			}
			if !(s.Weight > 0) || math.IsInf(s.Weight, 1) {
				return fieldErr(sp+".weight", "must be > 0 and finite")
			}
		}
		if spec.Picker == "" {
			return fieldErr(path+".picker", "required")
		}
	}
	for _, sel := range []struct{ path, name string }{
		{"profile", cfg.Profile},
		{"byCriticality.critical", cfg.ByCriticality.Critical},
		{"byCriticality.standard", cfg.ByCriticality.Standard},
		{"byCriticality.sheddable", cfg.ByCriticality.Sheddable},
	} {
		if sel.name == "" {
			continue
		}
		_, user := cfg.Profiles[sel.name]
		_, built := builtin[sel.name]
		if !user && !built {
			return fieldErr(sel.path, fmt.Sprintf("unknown profile %q (built-in: %s)", sel.name, strings.Join(sortedKeys(builtin), ", ")))
		}
	}
	return nil
}

func (p PluginSpec) instanceName() string {
	if p.Name != "" {
		return p.Name
	}
	return p.Type
}

// profileFor returns the configured profile name for a criticality.
func (cfg *Config) profileFor(c Criticality) string {
	var name string
	switch c {
	case Critical:
		name = cfg.ByCriticality.Critical
	case Standard:
		name = cfg.ByCriticality.Standard
	case Sheddable:
		name = cfg.ByCriticality.Sheddable
	}
	if name == "" {
		name = cfg.Profile
	}
	if name == "" {
		name = ProfileDecisionTree
	}
	return name
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
