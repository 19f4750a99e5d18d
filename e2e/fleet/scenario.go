package fleet

import (
	"fmt"
	"math"
	"strconv"
	"strings"

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
	// by weight.
	Adapters      []vllmsim.AdapterShare
	Input, Output vllmsim.LengthDist
	Criticality   CriticalityMix
}

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
	return nil
}

// SeedScenario is scenario (a), the seed's benchmark: 8 Llama-2-7B H100
// replicas with max-lora 4, 10 adapters sharing the traffic equally,
// ShareGPT lengths, every request Critical.
func SeedScenario() Scenario {
	cfg := vllmsim.DefaultReplicaConfig(vllmsim.Llama2_7B)
	cfg.MaxLoRAs = 4
	return Scenario{
		Name:        "a",
		Title:       "seed: 8 replicas, max-lora 4, 10 adapters at equal traffic",
		Replicas:    8,
		Replica:     cfg,
		Adapters:    vllmsim.EqualShares(vllmsim.AdapterNames("lora", 10)...),
		Input:       vllmsim.ShareGPTInput,
		Output:      vllmsim.ShareGPTOutput,
		Criticality: AllCritical,
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
		Name:        "b",
		Title:       "regression: 10 replicas, max-lora 3, 15 adapters at 5×12%/5×6%/5×2%",
		Replicas:    10,
		Replica:     cfg,
		Adapters:    shares,
		Input:       vllmsim.ShareGPTInput,
		Output:      vllmsim.ShareGPTOutput,
		Criticality: AllCritical,
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
		Name:        "c",
		Title:       "base model: 8 replicas, no adapters",
		Replicas:    8,
		Replica:     cfg,
		Input:       vllmsim.ShareGPTInput,
		Output:      vllmsim.ShareGPTOutput,
		Criticality: AllCritical,
	}
}

// Scenarios lists the built-in scenarios by name.
func Scenarios() []Scenario {
	return []Scenario{SeedScenario(), RegressionScenario(), BaseModelScenario()}
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
