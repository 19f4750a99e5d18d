package vllmsim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Knot is one point of a length distribution's quantile function: a
// fraction Q of requests have at most Tokens tokens.
type Knot struct {
	Q      float64
	Tokens float64
}

// LengthDist is a token-length distribution given by its quantile function,
// interpolated log-linearly between knots (a lognormal-like shape that
// reproduces published quantiles exactly). The first knot must have Q 0 and
// the last Q 1.
type LengthDist struct {
	Knots []Knot
}

// ShareGPTInput matches the prompt lengths of ShareGPT as the LPG tool uses
// it (GAIE site-src/performance/benchmark/sample.json):
// median 109, p90 714, max 1024. The p75 knot (475, derived) makes the mean
// 252 as published; the minimum 4 follows vLLM's benchmark sampler, which
// drops ShareGPT prompts shorter than 4 tokens.
var ShareGPTInput = LengthDist{Knots: []Knot{{0, 4}, {0.5, 109}, {0.75, 475}, {0.9, 714}, {1, 1024}}}

// ShareGPTOutput matches ShareGPT output lengths (same sources): median 144,
// p90 564, max 1025; the p75 knot (367, derived) gives the mean 225.
var ShareGPTOutput = LengthDist{Knots: []Knot{{0, 4}, {0.5, 144}, {0.75, 367}, {0.9, 564}, {1, 1025}}}

// Validate checks the knots: Q from 0 to 1, both Q and Tokens increasing,
// Tokens at least 1.
func (d LengthDist) Validate() error {
	k := d.Knots
	if len(k) < 2 || k[0].Q != 0 || k[len(k)-1].Q != 1 {
		return errors.New("vllmsim: a length distribution needs knots from Q 0 to Q 1")
	}
	for i, kn := range k {
		if kn.Tokens < 1 {
			return fmt.Errorf("vllmsim: knot %d has %v tokens, want at least 1", i, kn.Tokens)
		}
		if i > 0 && (kn.Q <= k[i-1].Q || kn.Tokens < k[i-1].Tokens) {
			return fmt.Errorf("vllmsim: knot %d does not increase", i)
		}
	}
	return nil
}

// Quantile returns the length at fraction q (0..1), before rounding.
func (d LengthDist) Quantile(q float64) float64 {
	k := d.Knots
	i := 1
	for i < len(k)-1 && q > k[i].Q {
		i++
	}
	a, b := k[i-1], k[i]
	f := (q - a.Q) / (b.Q - a.Q)
	return a.Tokens * math.Pow(b.Tokens/a.Tokens, f)
}

// Mean is the exact mean of the continuous distribution (the sampled integer
// lengths differ by rounding only).
func (d LengthDist) Mean() float64 {
	m := 0.0
	for i := 1; i < len(d.Knots); i++ {
		a, b := d.Knots[i-1], d.Knots[i]
		w := b.Q - a.Q
		if a.Tokens == b.Tokens {
			m += w * a.Tokens
		} else {
			m += w * (b.Tokens - a.Tokens) / math.Log(b.Tokens/a.Tokens)
		}
	}
	return m
}

// Sample draws one length.
func (d LengthDist) Sample(rng *rand.Rand) int {
	return int(math.Round(d.Quantile(rng.Float64())))
}

// AdapterShare is one adapter's fraction of the traffic.
type AdapterShare struct {
	Name   string
	Weight float64
}

// EqualShares gives every named adapter the same share.
func EqualShares(names ...string) []AdapterShare {
	s := make([]AdapterShare, len(names))
	for i, n := range names {
		s[i] = AdapterShare{Name: n, Weight: 1}
	}
	return s
}

// AdapterNames returns n names prefix-00, prefix-01, ...
func AdapterNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%02d", prefix, i)
	}
	return names
}

// WorkloadConfig describes an open-loop request stream.
type WorkloadConfig struct {
	// Rate is the mean arrival rate in requests per second (Poisson).
	Rate          float64
	Input, Output LengthDist
	// Adapters picks each request's adapter by weight; empty means every
	// request is for the base model.
	Adapters []AdapterShare
	Seed     uint64
}

// ShareGPTWorkload is Poisson arrivals at rate with ShareGPT lengths for
// the base model.
func ShareGPTWorkload(rate float64, seed uint64) WorkloadConfig {
	return WorkloadConfig{Rate: rate, Input: ShareGPTInput, Output: ShareGPTOutput, Seed: seed}
}

// Arrival is one generated request.
type Arrival struct {
	// Seq numbers arrivals from 0.
	Seq          int
	At           time.Duration
	PromptTokens int
	OutputTokens int
	Adapter      string
}

// Workload generates a deterministic request stream. Arrival gaps, input
// lengths, output lengths and adapters come from separate random streams of
// the seed, so the same seed yields the same requests at any rate (only the
// gaps scale) and with any adapter mix.
type Workload struct {
	cfg                           WorkloadConfig
	gaps, inputs, outputs, picker *rand.Rand
	cumWeights                    []float64
	now                           time.Duration
	seq                           int
}

// NewWorkload validates cfg and returns its generator.
func NewWorkload(cfg WorkloadConfig) (*Workload, error) {
	if !(cfg.Rate > 0) || math.IsInf(cfg.Rate, 0) {
		return nil, fmt.Errorf("vllmsim: workload rate %v must be positive and finite", cfg.Rate)
	}
	if err := cfg.Input.Validate(); err != nil {
		return nil, fmt.Errorf("input lengths: %w", err)
	}
	if err := cfg.Output.Validate(); err != nil {
		return nil, fmt.Errorf("output lengths: %w", err)
	}
	w := &Workload{
		cfg:     cfg,
		gaps:    rand.New(rand.NewPCG(cfg.Seed, 0x9a95)),
		inputs:  rand.New(rand.NewPCG(cfg.Seed, 0x1297)),
		outputs: rand.New(rand.NewPCG(cfg.Seed, 0x0e7)),
		picker:  rand.New(rand.NewPCG(cfg.Seed, 0xada9)),
	}
	total := 0.0
	for _, a := range cfg.Adapters {
		if !(a.Weight > 0) || a.Name == "" {
			return nil, fmt.Errorf("vllmsim: adapter share %+v needs a name and a positive weight", a)
		}
		total += a.Weight
		w.cumWeights = append(w.cumWeights, total)
	}
	return w, nil
}

// Next returns the next arrival.
func (w *Workload) Next() Arrival {
	gap := w.gaps.ExpFloat64() / w.cfg.Rate
	w.now += time.Duration(gap * float64(time.Second))
	a := Arrival{
		Seq:          w.seq,
		At:           w.now,
		PromptTokens: w.cfg.Input.Sample(w.inputs),
		OutputTokens: w.cfg.Output.Sample(w.outputs),
	}
	w.seq++
	if n := len(w.cumWeights); n > 0 {
		x := w.picker.Float64() * w.cumWeights[n-1]
		i := 0
		for i < n-1 && x >= w.cumWeights[i] {
			i++
		}
		a.Adapter = w.cfg.Adapters[i].Name
	}
	return a
}
