package scheduler

import (
	"testing"
)

// FuzzDecodeConfig: any input either fails with a *ConfigError or yields a
// Scheduler whose decisions are well formed. Nothing panics.
//
//	go test -run '^$' -fuzz FuzzDecodeConfig -fuzztime 60s ./scheduler/
func FuzzDecodeConfig(f *testing.F) {
	for _, seed := range []string{
		``, `null`, `{}`, `{"profile": "scoring"}`,
		`{"profile": "round-robin", "byCriticality": {"sheddable": "scoring", "critical": "decision-tree"}}`,
		`{"profile": "t", "plugins": [{"type": "decision-tree-filter", "name": "tree", "parameters": {"kvCacheThreshold": 0.7}}],
		  "profiles": {"t": {"filters": ["tree"], "picker": "random-picker"}}}`,
		`{"profile": "lb", "plugins": [{"type": "shed-filter"}, {"type": "queue-scorer", "name": "q"}],
		  "profiles": {"lb": {"filters": ["shed-filter"], "scorers": [{"scorer": "q", "weight": 3}], "picker": "weighted-random-picker"}}}`,
		`{"profile": "p", "plugins": [{"type": "decision-tree-filter", "name": "tree", "parameters": {
		  "steps": [{"name": "a", "filter": "low-queue-filter", "onSuccess": "b", "onFailure": "drop"},
		            {"name": "b", "filter": "least-kv-cache-filter", "onSuccess": "done", "onFailure": "done"}],
		  "entries": {"critical": "b", "standard": "a", "sheddable": "a"}}}],
		  "profiles": {"p": {"filters": ["tree"], "picker": "max-score-picker"}}}`,
		`{"plugins": [{"type": "lora-affinity-filter", "parameters": {"threshold": 1.5}}]}`,
		`{"a": 1, "a": 2}`,
	} {
		f.Add([]byte(seed))
	}
	snap := randomSnapshot(newRand(1), 12)
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := DecodeConfig(data)
		if err != nil {
			if _, ok := err.(*ConfigError); !ok {
				t.Fatalf("DecodeConfig error is %T, not *ConfigError: %v", err, err)
			}
			return
		}
		s, err := New(cfg, nil, seeded(1))
		if err != nil {
			return
		}
		paths := map[string]bool{}
		for _, p := range s.Paths() {
			paths[p] = true
		}
		for c := Critical; c <= Sheddable; c++ {
			res := s.Schedule(&Request{Model: adapterName(int(c)), Criticality: c}, snap)
			if !paths[res.Path] {
				t.Fatalf("path %q not in Paths()", res.Path)
			}
			if (res.Outcome == Routed) != (res.Endpoint != nil) {
				t.Fatalf("outcome %v with endpoint %v", res.Outcome, res.Endpoint)
			}
			if res.Outcome == Dropped && c == Critical {
				// Only a configured tree or filter can drop a critical
				// request; the built-ins never do.
				if s.ProfileFor(c).Name == ProfileDecisionTree || s.ProfileFor(c).Name == ProfileScoring {
					t.Fatalf("built-in profile dropped a critical request")
				}
			}
		}
	})
}
