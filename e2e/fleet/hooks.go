package fleet

import "time"

// ResponseObserver is implemented by policies that learn from responses, as
// the plugin reads the response stream of the requests it routed. The run
// calls it on the VM instance that routed the request, in virtual-time
// order, between routing calls.
type ResponseObserver interface {
	// FirstToken is called when the response's first token leaves the
	// replica (the end of the prefill: the first chunk of a stream).
	FirstToken(r Response)
	// Finished is called when the response ends, with what its usage block
	// reports.
	Finished(r Response)
}

// Response is what the gateway learns from one response.
type Response struct {
	// ID is the request's id, View.Request.ID when it was routed.
	ID uint64
	// Replica is the replica that served it.
	Replica int
	// At is the virtual time of the event.
	At time.Duration
	// PromptTokens is usage.prompt_tokens.
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens: the prompt
	// tokens the replica found in its prefix cache (vLLM's
	// num_cached_tokens). vLLM sends it only in the usage block, at the
	// end of the response, so it is -1 at FirstToken, and at Finished when
	// the server reports none (RunConfig.HideCachedTokens).
	CachedTokens int
	// Generated is the number of tokens generated so far.
	Generated int
}

// Placement tells a policy instance where it runs.
type Placement struct {
	// Gateway is the Envoy replica (0..Gateways-1), VM its worker VM
	// (0..VMs-1).
	Gateway, VM   int
	Gateways, VMs int
	// Shared is the gateway's state shared by its VMs (Envoy shared data's
	// place): the same value for every VM of one gateway, another for
	// each gateway.
	Shared *GatewayShared
	// Run is shared by every VM of every gateway: the place of a picker
	// outside the gateways that sees all their requests (llm-d's EPP).
	Run *GatewayShared
}

// Ticker is implemented by policies with periodic work (the plugin syncs
// its prefix index on the root context's tick); the run calls Tick at
// every metrics scrape.
type Ticker interface {
	Tick(at time.Duration)
}

// PredictionReporter is implemented by policies that predict cached
// tokens; the run sums their reports into Result.Prediction.
type PredictionReporter interface {
	Prediction() Prediction
}

// Prediction compares the cached tokens a policy predicted at routing time
// with those the replicas reported, over the responses it judged (those
// that reported cached tokens, whole run).
type Prediction struct {
	Judged, Mispredicted int
	// PredictedTokens, CachedTokens and PromptTokens sum over the judged.
	PredictedTokens, CachedTokens, PromptTokens int64
	// PredictedHits and ReportedHits count requests with more than half of
	// their prompt predicted, or reported, cached; BothHits those with both.
	PredictedHits, ReportedHits, BothHits int
}

// Add sums o into p.
func (p *Prediction) Add(o Prediction) {
	p.Judged += o.Judged
	p.Mispredicted += o.Mispredicted
	p.PredictedTokens += o.PredictedTokens
	p.CachedTokens += o.CachedTokens
	p.PromptTokens += o.PromptTokens
	p.PredictedHits += o.PredictedHits
	p.ReportedHits += o.ReportedHits
	p.BothHits += o.BothHits
}

// Placed is implemented by policies that want to know their Placement;
// the run calls Place once, after New, before any request.
type Placed interface {
	Place(p Placement)
}

// GatewayShared holds state that the VMs of one gateway share, by key (a
// policy uses a key type of its own). Runs are single-threaded: no locking.
type GatewayShared struct {
	values map[any]any
}

// Value returns the value stored under key, storing init() first if there
// is none.
func (s *GatewayShared) Value(key any, init func() any) any {
	if s.values == nil {
		s.values = map[any]any{}
	}
	v, ok := s.values[key]
	if !ok {
		v = init()
		s.values[key] = v
	}
	return v
}
