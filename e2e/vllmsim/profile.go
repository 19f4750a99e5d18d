package vllmsim

import (
	"fmt"
	"strings"
	"time"
)

// Profile is the cost model of one base model on one GPU: the coefficients of
// the engine step time and the KV-cache size. All figures are published
// ones (cited per profile below), not tuned.
type Profile struct {
	// Name is the --model-profile spelling, e.g. "llama-2-7b".
	Name string
	// Step time in microseconds = StepBaseMicros + PrefillMicrosPerToken·P +
	// DecodeMicrosPerSeq·D + ContextMicrosPerToken·ΣL, where P is prefill
	// tokens in the step, D decoding sequences and ΣL their context tokens.
	StepBaseMicros        float64
	PrefillMicrosPerToken float64
	DecodeMicrosPerSeq    float64
	ContextMicrosPerToken float64
	// KVCapacityTokens is the KV cache a replica holds by default.
	KVCapacityTokens int
	// MaxModelLen is the longest prompt+output the model accepts.
	MaxModelLen int
}

// Llama2_7B is Llama-2-7B on an H100 80GB, vLLM V1, TP 1. Step coefficients
// are BLIS's fitted defaults (defaults.yaml) with the ΣL term derived from KV
// bytes/token and HBM bandwidth; KV capacity ≈105–115k tokens at 0.5 MiB per
// token; max_model_len 4096 is the model's context window.
var Llama2_7B = Profile{
	Name:                  "llama-2-7b",
	StepBaseMicros:        5750,
	PrefillMicrosPerToken: 17.25,
	DecodeMicrosPerSeq:    6,
	ContextMicrosPerToken: 0.30,
	KVCapacityTokens:      110_000,
	MaxModelLen:           4096,
}

// Llama31_8B is Llama-3.1-8B on an H100 80GB: same BLIS step fit, a GQA KV
// cache four times smaller per token (ΣL coefficient 0.075 µs, ≈467k tokens of
// KV). MaxModelLen is the model's 128k context.
var Llama31_8B = Profile{
	Name:                  "llama-3.1-8b",
	StepBaseMicros:        5750,
	PrefillMicrosPerToken: 17.25,
	DecodeMicrosPerSeq:    6,
	ContextMicrosPerToken: 0.075,
	KVCapacityTokens:      467_000,
	MaxModelLen:           131_072,
}

// Profiles lists the built-in profiles by name.
var Profiles = []Profile{Llama2_7B, Llama31_8B}

// ProfileByName returns the built-in profile with that name.
func ProfileByName(name string) (Profile, error) {
	for _, p := range Profiles {
		if p.Name == name {
			return p, nil
		}
	}
	names := make([]string, len(Profiles))
	for i, p := range Profiles {
		names[i] = p.Name
	}
	return Profile{}, fmt.Errorf("vllmsim: unknown model profile %q (known: %s)", name, strings.Join(names, ", "))
}

// StepTime is the duration of one engine step of this profile before the LoRA
// slowdown and adapter loads: prefill tokens p, decoding sequences d, and
// their summed context length sumL.
func (p Profile) StepTime(prefillTokens, decodeSeqs, sumContext int) time.Duration {
	return micros(p.stepMicros(prefillTokens, decodeSeqs, sumContext))
}

func (p Profile) stepMicros(prefillTokens, decodeSeqs, sumContext int) float64 {
	return p.StepBaseMicros +
		p.PrefillMicrosPerToken*float64(prefillTokens) +
		p.DecodeMicrosPerSeq*float64(decodeSeqs) +
		p.ContextMicrosPerToken*float64(sumContext)
}

func (p Profile) validate() error {
	if p.StepBaseMicros <= 0 || p.PrefillMicrosPerToken < 0 || p.DecodeMicrosPerSeq < 0 || p.ContextMicrosPerToken < 0 {
		return fmt.Errorf("vllmsim: profile %q: step coefficients must be non-negative and the base positive", p.Name)
	}
	return nil
}

// micros converts microseconds to a Duration, rounded to the nanosecond.
func micros(us float64) time.Duration { return time.Duration(us*1000 + 0.5) }
