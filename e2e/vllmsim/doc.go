// Package vllmsim simulates vLLM model servers well enough that routing
// results mean something without GPUs. It has two layers:
//
// The replica model (Replica) is pure, deterministic Go driven by an
// explicit virtual clock. It reproduces vLLM V1's engine loop: continuous
// batching capped at MaxNumSeqs, a per-step token budget with chunked
// prefill, a paged KV cache with admission only while blocks are free and
// recompute preemption when decoding runs out of blocks, automatic prefix
// caching (chained block hashes over token ids and the LoRA adapter,
// reference-counted blocks, LRU eviction from the free queue, kvcache.go),
// an FCFS waiting queue, and LoRA with MaxLoRAs adapters per batch, adapter
// load time and a per-step slowdown with the number of distinct adapters.
// Requests for an adapter that has no slot wait (and are listed as waiting
// adapters) without blocking other requests, as vLLM's scheduler skips
// them. Step times follow published vLLM figures, with cached prompt
// tokens left out of the prefill. The fleet simulation of the routing
// benchmark and the HTTP simulator both use it:
//
//	r, err := vllmsim.NewReplica(cfg)               // cfg from DefaultReplicaConfig
//	err = r.Submit(req, now)                        // req *Request; advances to now first
//	t, busy := r.NextEventTime()                    // end of the step in progress
//	for _, done := range r.Advance(t) { ... }       // completed requests, in order
//	m := r.Metrics()                                // waiting, running, KV usage, adapters
//
// A discrete-event loop takes the earliest of its own events and every
// replica's NextEventTime, calls Advance(t) on the replicas (Advance runs
// every step that ends at or before t), and handles its event. Results are
// on the Request: FirstTokenAt, LastTokenAt, Generated, CompletedAt (TTFT,
// TPOT and Latency are helpers). Nothing in the model reads the wall clock
// or starts goroutines; the same inputs give the same timeline.
//
// Workload generates Poisson arrivals with ShareGPT-like lengths
// (ShareGPTInput, ShareGPTOutput fit to the published quantiles) and an
// adapter mix, from a seed. Saturation measures one replica's saturation
// throughput for the "check against reality".
//
// Token identity (tokens.go): a request's prompt is token ids
// (Request.Prompt); the HTTP layer derives them from text, 4 UTF-8 bytes per
// token (TextTokens), after rendering chat messages with one fixed template
// (RenderChat), so identical text prefixes share tokens and KV blocks.
// Generated tokens are a function of Request.OutputSeed (OutputToken).
//
// The HTTP layer (Server, and the vllm-sim command) wraps one Replica with a
// goroutine that maps wall time × TimeScale to virtual time, and serves the
// OpenAI completions and chat endpoints (plain and SSE, with
// usage.prompt_tokens_details.cached_tokens when PromptTokensDetails is on),
// /v1/models, vLLM's Prometheus /metrics (v0 or v1 names, prefix-cache
// counters, cache_config_info) and /health, with fault injection.
package vllmsim
