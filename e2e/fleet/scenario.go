package fleet

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
	"github.com/wasm-epp/wasm-epp/scheduler"
)

// Scenario is a fleet and the traffic it serves; the arrival rate is set per
// run (RunConfig.Rate), so one scenario is swept over loads.
type Scenario struct {
	// Name is the short key used on the command line and in file names.
	Name string
	// Title describes the scenario in reports.
	Title    string
	Replicas int
	// Replica configures every replica (identical replicas, as a
	// Deployment); Replica.MaxLoRAs is vLLM's --max-loras.
	Replica vllmsim.ReplicaConfig
	// Adapters is the traffic mix: every request names one adapter, drawn
	// by weight. With Traffic nil, requests have ShareGPT-like Input and
	// Output lengths and share no prefix.
	Adapters      []vllmsim.AdapterShare
	Input, Output vllmsim.LengthDist
	// Traffic, when set, generates the requests instead (token ids with
	// shared prefixes: SharedContexts, MultiTurn, SystemPrompts).
	Traffic     Traffic
	Criticality CriticalityMix
	// UniquePrompts, with Traffic nil, gives every request token ids that
	// no other request shares (uniquePromptTokens), so that prefix-aware
	// policies run their real path on a prompt nobody holds: hashing, an
	// index miss, the consistent choice, the load guard. The replicas
	// serve such a prompt exactly as one without ids (vllmsim: it shares
	// no block with any other), so no other policy's figures change.
	UniquePrompts bool
	// MinWarmup is the least warmup a run of the scenario gets, whatever
	// RunConfig.Warmup says: conversations take minutes to reach their
	// steady mix of turns.
	MinWarmup time.Duration
}

// traffic is the scenario's Traffic, ShareGPT traffic when unset.
func (s Scenario) traffic() Traffic {
	if s.Traffic != nil {
		return s.Traffic
	}
	return shareGPT{input: s.Input, output: s.Output, adapters: s.Adapters, unique: s.UniquePrompts}
}

// SharesPrefixes reports whether the scenario's prompts share prefixes
// (unique prompts share none).
func (s Scenario) SharesPrefixes() bool { return s.Traffic != nil }

// Validate reports the first unusable field.
func (s Scenario) Validate() error {
	switch {
	case s.Name == "":
		return fmt.Errorf("fleet: scenario needs a name")
	case s.Replicas <= 0:
		return fmt.Errorf("fleet: scenario %q: Replicas must be positive", s.Name)
	case len(s.Adapters) > 0 && s.Replica.MaxLoRAs == 0:
		return fmt.Errorf("fleet: scenario %q has adapters but MaxLoRAs 0", s.Name)
	}
	if err := s.Replica.Validate(); err != nil {
		return fmt.Errorf("fleet: scenario %q: %w", s.Name, err)
	}
	if err := s.Criticality.Validate(); err != nil {
		return fmt.Errorf("fleet: scenario %q: %w", s.Name, err)
	}
	if err := s.traffic().validate(); err != nil {
		return fmt.Errorf("fleet: scenario %q: %w", s.Name, err)
	}
	return nil
}

// SeedScenario is scenario (a), the seed's benchmark: 8 Llama-2-7B H100
// replicas with max-lora 4, 10 adapters sharing the traffic equally,
// ShareGPT lengths, every request Critical.
func SeedScenario() Scenario {
	cfg := vllmsim.DefaultReplicaConfig(vllmsim.Llama2_7B)
	cfg.MaxLoRAs = 4
	return Scenario{
		Name:          "a",
		Title:         "seed: 8 replicas, max-lora 4, 10 adapters at equal traffic",
		Replicas:      8,
		Replica:       cfg,
		Adapters:      vllmsim.EqualShares(vllmsim.AdapterNames("lora", 10)...),
		Input:         vllmsim.ShareGPTInput,
		Output:        vllmsim.ShareGPTOutput,
		Criticality:   AllCritical,
		UniquePrompts: true,
	}
}

// RegressionScenario is scenario (b), upstream's LoRA regression mix: 10
// replicas with max-lora 3, 15 adapters at 5×12% / 5×6% / 5×2% of the
// traffic, ShareGPT lengths, every request Critical.
func RegressionScenario() Scenario {
	cfg := vllmsim.DefaultReplicaConfig(vllmsim.Llama2_7B)
	cfg.MaxLoRAs = 3
	names := vllmsim.AdapterNames("lora", 15)
	shares := make([]vllmsim.AdapterShare, len(names))
	for i, n := range names {
		w := []float64{12, 6, 2}[i/5]
		shares[i] = vllmsim.AdapterShare{Name: n, Weight: w}
	}
	return Scenario{
		Name:          "b",
		Title:         "regression: 10 replicas, max-lora 3, 15 adapters at 5×12%/5×6%/5×2%",
		Replicas:      10,
		Replica:       cfg,
		Adapters:      shares,
		Input:         vllmsim.ShareGPTInput,
		Output:        vllmsim.ShareGPTOutput,
		Criticality:   AllCritical,
		UniquePrompts: true,
	}
}

// BaseModelScenario is scenario (c): the fleet of (a) serving the base
// model only (no adapters, LoRA disabled), so routing is about load alone:
// what a fleet without adapters sees, where herding onto the replica that
// looked least loaded has no LoRA placement to hide behind. Not part of the
// default sweep.
func BaseModelScenario() Scenario {
	cfg := vllmsim.DefaultReplicaConfig(vllmsim.Llama2_7B)
	cfg.MaxLoRAs = 0
	return Scenario{
		Name:          "c",
		Title:         "base model: 8 replicas, no adapters",
		Replicas:      8,
		Replica:       cfg,
		Input:         vllmsim.ShareGPTInput,
		Output:        vllmsim.ShareGPTOutput,
		Criticality:   AllCritical,
		UniquePrompts: true,
	}
}

// Fixed is a length distribution that always gives n tokens.
func Fixed(n float64) vllmsim.LengthDist {
	return vllmsim.LengthDist{Knots: []vllmsim.Knot{{Q: 0, Tokens: n}, {Q: 1, Tokens: n}}}
}

// SharedContextScenario is scenario (d), the shape of llm-d's published
// prefix benchmark: 150 groups, each with its
// own 6,000-token context, every request its group's context plus a new
// 1,200-token question, 1,000 output tokens, on 8 replicas. The contexts
// need a long-context model: Llama-3.1-8B (467k tokens of KV per replica;
// the 150 contexts take 900k, about a quarter of the fleet's).
func SharedContextScenario() Scenario {
	return Scenario{
		Name:        "d",
		Title:       "shared long contexts: 8 replicas (Llama-3.1-8B), 150 groups × 6,000-token context + a new 1,200-token question, 1,000 output tokens",
		Replicas:    8,
		Replica:     vllmsim.DefaultReplicaConfig(vllmsim.Llama31_8B),
		Traffic:     SharedContexts{Groups: 150, ContextTokens: 6000, Question: Fixed(1200), Output: Fixed(1000)},
		Criticality: AllCritical,
	}
}

// MultiTurnScenario is scenario (e): conversations of 3 to 10 turns, each
// turn resending the whole history (user messages and the responses as
// generated) plus a ShareGPT-length user message, a ShareGPT-length
// response, and an exponential think time of mean 10 s between a response
// and the next turn; 8 Llama-3.1-8B replicas (histories outgrow Llama-2's
// 4,096-token context).
func MultiTurnScenario() Scenario {
	return Scenario{
		Name:        "e",
		Title:       "multi-turn chat: 8 replicas (Llama-3.1-8B), conversations of 3–10 turns, ShareGPT-length messages, 10 s mean think time",
		Replicas:    8,
		Replica:     vllmsim.DefaultReplicaConfig(vllmsim.Llama31_8B),
		Traffic:     MultiTurn{MinTurns: 3, MaxTurns: 10, User: vllmsim.ShareGPTInput, Output: vllmsim.ShareGPTOutput, Think: 10 * time.Second},
		Criticality: AllCritical,
		MinWarmup:   3 * time.Minute,
	}
}

// SystemPromptScenario is scenario (f): scenario (a)'s fleet and adapters
// (8 Llama-2-7B replicas, max-lora 4, 10 adapters at equal traffic), every
// request starting with its adapter's own 1,000-token system prompt,
// followed by ShareGPT-length user text.
func SystemPromptScenario() Scenario {
	sc := SeedScenario()
	sc.Name = "f"
	sc.Title = "adapters with system prompts: (a)'s fleet, each of the 10 adapters with its own 1,000-token system prompt"
	sc.Traffic = SystemPrompts{Adapters: sc.Adapters, SystemTokens: 1000, Input: sc.Input, Output: sc.Output}
	return sc
}

// Scenarios lists the built-in scenarios by name.
func Scenarios() []Scenario {
	return []Scenario{SeedScenario(), RegressionScenario(), BaseModelScenario(),
		SharedContextScenario(), MultiTurnScenario(), SystemPromptScenario()}
}

// ScenarioByName returns a built-in scenario.
func ScenarioByName(name string) (Scenario, error) {
	var names []string
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, nil
		}
		names = append(names, s.Name)
	}
	return Scenario{}, fmt.Errorf("fleet: unknown scenario %q (have %s)", name, strings.Join(names, ", "))
}

// CriticalityMix gives the fractions of requests per criticality; they are
// weights, so only ratios matter.
type CriticalityMix struct {
	Critical, Standard, Sheddable float64
}

// AllCritical serves every request as Critical: nothing is ever shed, so
// policies are compared on latency alone. Upstream's benchmark
// InferenceModels were Critical too.
var AllCritical = CriticalityMix{Critical: 1}

// Validate checks that weights are finite, non-negative and not all zero.
func (m CriticalityMix) Validate() error {
	for _, w := range []float64{m.Critical, m.Standard, m.Sheddable} {
		if !(w >= 0) || math.IsInf(w, 1) {
			return fmt.Errorf("fleet: criticality mix %s needs finite non-negative weights", m)
		}
	}
	if !(m.Critical+m.Standard+m.Sheddable > 0) || math.IsInf(m.Critical+m.Standard+m.Sheddable, 1) {
		return fmt.Errorf("fleet: criticality mix %s needs a positive, finite total weight", m)
	}
	return nil
}

// pick maps u in [0,1) to a criticality.
func (m CriticalityMix) pick(u float64) scheduler.Criticality {
	x := u * (m.Critical + m.Standard + m.Sheddable)
	switch {
	case x < m.Critical:
		return scheduler.Critical
	case x < m.Critical+m.Standard:
		return scheduler.Standard
	}
	return scheduler.Sheddable
}

func (m CriticalityMix) String() string {
	return fmt.Sprintf("critical=%g,standard=%g,sheddable=%g", m.Critical, m.Standard, m.Sheddable)
}

// ParseCriticalityMix reads "critical=0.6,standard=0.2,sheddable=0.2";
// omitted classes get weight 0.
func ParseCriticalityMix(s string) (CriticalityMix, error) {
	var m CriticalityMix
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return m, fmt.Errorf("fleet: criticality mix %q: %q is not class=weight", s, part)
		}
		w, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return m, fmt.Errorf("fleet: criticality mix %q: weight of %s: %w", s, k, err)
		}
		switch strings.ToLower(k) {
		case "critical":
			m.Critical = w
		case "standard":
			m.Standard = w
		case "sheddable":
			m.Sheddable = w
		default:
			return m, fmt.Errorf("fleet: criticality mix %q: unknown class %q (critical, standard, sheddable)", s, k)
		}
	}
	return m, m.Validate()
}
