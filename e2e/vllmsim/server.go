package vllmsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ReplicaHeader names the replica on every HTTP response.
const ReplicaHeader = "x-vllm-sim-replica"

// maxBodyBytes bounds a request body.
const maxBodyBytes = 16 << 20

// Faults are injected failures. Rates are probabilities per request, drawn
// from the server's seeded random stream.
type Faults struct {
	// ErrorRate answers that fraction of generation requests with a 500
	// before they reach the engine.
	ErrorRate float64
	// LatencySpikeRate delays that fraction of generation requests by
	// LatencySpike of virtual time (divided by the time scale in wall time)
	// before they reach the engine, like a stalled tokenizer or network.
	LatencySpikeRate float64
	LatencySpike     time.Duration
	// MetricsDown makes /metrics answer 503.
	MetricsDown bool
}

func (f Faults) validate() error {
	if f.ErrorRate < 0 || f.ErrorRate > 1 || f.LatencySpikeRate < 0 || f.LatencySpikeRate > 1 {
		return errors.New("vllmsim: fault rates must be within 0..1")
	}
	if f.LatencySpike < 0 {
		return errors.New("vllmsim: latency spike must not be negative")
	}
	if f.LatencySpikeRate > 0 && f.LatencySpike == 0 {
		return errors.New("vllmsim: latency spike rate set without a latency spike duration")
	}
	return nil
}

// ServerConfig configures the HTTP simulator of one replica.
type ServerConfig struct {
	// Name identifies the replica in ReplicaHeader and logs.
	Name string
	// Model is the served base model name; Adapters the LoRA adapters that
	// may be requested by name (they need Replica.MaxLoRAs > 0).
	Model    string
	Adapters []string
	Replica  ReplicaConfig
	// TimeScale is virtual seconds per wall second (10 = ten times faster).
	TimeScale    float64
	MetricsNames MetricsNames
	Faults       Faults
	// Seed seeds fault injection.
	Seed uint64
	// DefaultMaxTokens is the output length of requests without max_tokens.
	DefaultMaxTokens int
	// PromptTokensDetails adds usage.prompt_tokens_details.cached_tokens to
	// responses (non-streaming, and the usage chunk of a stream), as vLLM's
	// --enable-prompt-tokens-details does (off by default in vLLM).
	PromptTokensDetails bool
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// WallClock is the wall clock; nil means time.Now.
	WallClock func() time.Time
}

// Server serves the OpenAI and vLLM endpoints of one simulated replica. A
// goroutine started by Start drives the replica's virtual clock from wall
// time × TimeScale.
type Server struct {
	cfg      ServerConfig
	log      *slog.Logger
	now      func() time.Time
	adapters map[string]bool

	mu       sync.Mutex
	replica  *Replica
	start    time.Time
	inflight map[*Request]*call
	lora     *loraSeries
	faults   Faults
	rng      *rand.Rand
	nextID   uint64
	injected map[string]int64
	started  bool
	closed   bool

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

// call is one HTTP request waiting on the engine. The driver publishes
// progress through the atomics and signals notify.
type call struct {
	generated atomic.Int64
	cached    atomic.Int64 // the request's CachedTokens, set before finished
	finished  atomic.Bool
	failed    atomic.Bool // the server closed before completion
	notify    chan struct{}
}

func (c *call) signal() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// NewServer validates cfg and builds an idle server; call Start to run the
// clock and Close to stop it.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Name == "" || cfg.Model == "" {
		return nil, errors.New("vllmsim: server needs a replica name and a model name")
	}
	if !(cfg.TimeScale > 0) || math.IsInf(cfg.TimeScale, 0) {
		return nil, fmt.Errorf("vllmsim: time scale %v must be positive and finite", cfg.TimeScale)
	}
	if _, err := ParseMetricsNames(string(cfg.MetricsNames)); err != nil {
		return nil, err
	}
	if cfg.DefaultMaxTokens < 1 {
		return nil, errors.New("vllmsim: DefaultMaxTokens must be at least 1")
	}
	if err := cfg.Faults.validate(); err != nil {
		return nil, err
	}
	if len(cfg.Adapters) > 0 && cfg.Replica.MaxLoRAs == 0 {
		return nil, errors.New("vllmsim: adapters given but max_loras is 0")
	}
	adapters := map[string]bool{}
	for _, a := range cfg.Adapters {
		if a == "" || a == cfg.Model || adapters[a] {
			return nil, fmt.Errorf("vllmsim: adapter name %q is empty, repeated or the base model's", a)
		}
		adapters[a] = true
	}
	r, err := NewReplica(cfg.Replica)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := cfg.WallClock
	if now == nil {
		now = time.Now
	}
	s := &Server{
		cfg:      cfg,
		log:      log.With("replica", cfg.Name),
		now:      now,
		adapters: adapters,
		replica:  r,
		inflight: map[*Request]*call{},
		faults:   cfg.Faults,
		rng:      rand.New(rand.NewPCG(cfg.Seed, 0xfa17)),
		injected: map[string]int64{},
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if cfg.Replica.MaxLoRAs > 0 {
		// vLLM shows no series before its first engine step; one empty
		// series at startup lets a scraper learn max_lora before traffic.
		s.lora = newLoRASeries(cfg.Replica.MaxLoRAs)
		s.lora.set(nil, nil, now())
	}
	return s, nil
}

// Start sets virtual time zero to now and starts the clock goroutine.
func (s *Server) Start() {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return
	}
	s.started = true
	s.start = s.now()
	s.mu.Unlock()
	go s.run()
}

// Close stops the clock goroutine; requests still waiting fail with 503.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	started := s.started
	for _, c := range s.inflight {
		c.failed.Store(true)
		c.signal()
	}
	s.inflight = map[*Request]*call{}
	s.mu.Unlock()
	close(s.stop)
	if started {
		<-s.done
	}
}

// SetFaults replaces the injected faults at run time.
func (s *Server) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	s.mu.Lock()
	s.faults = f
	s.mu.Unlock()
	return nil
}

// Metrics returns the replica metrics now.
func (s *Server) Metrics() Metrics {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked()
	return s.replica.Metrics()
}

// virtualNowLocked maps wall time to virtual time, never behind the replica.
func (s *Server) virtualNowLocked() time.Duration {
	v := time.Duration(float64(s.now().Sub(s.start)) * s.cfg.TimeScale)
	return max(v, s.replica.Now())
}

func (s *Server) run() {
	defer close(s.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		s.advanceLocked()
		wait := time.Hour
		if next, ok := s.replica.NextEventTime(); ok {
			wait = max(0, time.Duration(float64(next-s.replica.Now())/s.cfg.TimeScale))
		}
		s.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-s.wake:
		case <-timer.C:
		case <-s.stop:
			return
		}
	}
}

func (s *Server) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// advanceLocked runs the replica up to virtual now one step at a time,
// publishing progress after each step as vLLM streams after each step.
func (s *Server) advanceLocked() {
	if !s.started {
		return
	}
	vnow := s.virtualNowLocked()
	for {
		t, ok := s.replica.NextEventTime()
		if !ok || t > vnow {
			break
		}
		s.publishLocked(s.replica.Advance(t))
		if s.lora != nil {
			m := s.replica.Metrics()
			s.lora.set(m.RunningAdapters, m.WaitingAdapters, s.now())
		}
	}
	s.publishLocked(s.replica.Advance(vnow))
}

func (s *Server) publishLocked(completed []*Request) {
	for req, c := range s.inflight {
		if g := int64(req.Generated); g != c.generated.Load() {
			c.generated.Store(g)
			c.signal()
		}
	}
	for _, req := range completed {
		if c, ok := s.inflight[req]; ok {
			c.generated.Store(int64(req.Generated))
			c.cached.Store(int64(req.CachedTokens))
			c.finished.Store(true)
			c.signal()
			delete(s.inflight, req)
		}
	}
}

// Handler returns the HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.serveGeneration(w, r, apiCompletions) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.serveGeneration(w, r, apiChat) })
	mux.HandleFunc("GET /v1/models", s.serveModels)
	mux.HandleFunc("GET /metrics", s.serveMetrics)
	mux.HandleFunc("GET /health", s.serveHealth)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(ReplicaHeader, s.cfg.Name)
		mux.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers with vLLM's error body.
func writeError(w http.ResponseWriter, status int, typ, msg string, param string) {
	e := errorBody{Error: errorInfo{Message: msg, Type: typ, Code: status}}
	if param != "" {
		e.Error.Param = &param
	}
	writeJSON(w, status, e)
}

func (s *Server) serveHealth(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) serveModels(w http.ResponseWriter, _ *http.Request) {
	created := s.now().Unix()
	maxLen := s.cfg.Replica.MaxModelLen
	base := s.cfg.Model
	list := modelList{Object: "list", Data: []modelCard{{
		ID: base, Object: "model", Created: created, OwnedBy: "vllm", Root: base, MaxModelLen: &maxLen,
	}}}
	for _, a := range s.cfg.Adapters {
		list.Data = append(list.Data, modelCard{
			ID: a, Object: "model", Created: created, OwnedBy: "vllm", Root: "/adapters/" + a, Parent: &base,
		})
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	if s.faults.MetricsDown {
		s.injected["metrics_down"]++
		s.mu.Unlock()
		http.Error(w, "metrics endpoint down (injected fault)", http.StatusServiceUnavailable)
		return
	}
	s.advanceLocked()
	v := metricsView{
		names:    s.cfg.MetricsNames,
		model:    s.cfg.Model,
		replica:  s.replica.Metrics(),
		maxLoRA:  s.cfg.Replica.MaxLoRAs,
		injected: map[string]int64{},
	}
	if s.lora != nil {
		v.lora = s.lora.snapshot()
	}
	for k, n := range s.injected {
		v.injected[k] = n
	}
	s.mu.Unlock()
	prefixCaching := "False"
	if v.replica.PrefixCaching {
		prefixCaching = "True"
	}
	// Label values are CacheConfig fields as Python prints them
	// (vllm/config/cache.py, metrics_info). The hash algorithm is vLLM's
	// default; the simulator's own hash never leaves the replica.
	v.cacheInfo = [][2]string{
		{"block_size", strconv.Itoa(v.replica.BlockSize)},
		{"cache_dtype", "auto"},
		{"enable_prefix_caching", prefixCaching},
		{"gpu_memory_utilization", "0.9"},
		{"num_cpu_blocks", "0"},
		{"num_gpu_blocks", strconv.Itoa(v.replica.KVBlocksTotal)},
		{"prefix_caching_hash_algo", "sha256"},
	}
	if v.names != MetricsV0 {
		v.cacheInfo = append(v.cacheInfo, [2]string{"engine", "0"})
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	if err := writeMetrics(w, v); err != nil {
		s.log.Debug("metrics write failed", "err", err)
	}
}

// drawFaults decides this request's injected faults.
func (s *Server) drawFaults() (fail bool, spike time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.faults
	if f.ErrorRate > 0 && s.rng.Float64() < f.ErrorRate {
		s.injected["error"]++
		return true, 0
	}
	if f.LatencySpikeRate > 0 && s.rng.Float64() < f.LatencySpikeRate {
		s.injected["latency_spike"]++
		return false, f.LatencySpike
	}
	return false, 0
}

func (s *Server) serveGeneration(w http.ResponseWriter, r *http.Request, kind apiKind) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "BadRequestError", "request body too large", "")
			return
		}
		writeError(w, http.StatusBadRequest, "BadRequestError", "cannot read body: "+err.Error(), "")
		return
	}
	g, err := parseGenerationRequest(kind, body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error(), "")
		return
	}
	adapter := ""
	if g.Model != s.cfg.Model {
		if !s.adapters[g.Model] {
			writeError(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", g.Model), "model")
			return
		}
		adapter = g.Model
	}
	if g.MaxTokens == 0 {
		g.MaxTokens = s.cfg.DefaultMaxTokens
	}
	if limit := s.cfg.Replica.MaxModelLen; g.PromptTokens+g.MaxTokens > limit {
		writeError(w, http.StatusBadRequest, "BadRequestError",
			fmt.Sprintf("maximum context length is %d tokens, but %d were requested (%d prompt + %d output); shorten the prompt or max_tokens",
				limit, g.PromptTokens+g.MaxTokens, g.PromptTokens, g.MaxTokens), "")
		return
	}
	fail, spike := s.drawFaults()
	if fail {
		s.log.Info("injected error", "model", g.Model)
		writeError(w, http.StatusInternalServerError, "InternalServerError", "simulated engine failure (injected fault)", "")
		return
	}
	if spike > 0 {
		t := time.NewTimer(time.Duration(float64(spike) / s.cfg.TimeScale))
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}

	req := &Request{Adapter: adapter, PromptTokens: g.PromptTokens, Prompt: g.Prompt, OutputTokens: g.MaxTokens}
	c := &call{notify: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.closed || !s.started {
		s.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "the engine is not running", "")
		return
	}
	s.advanceLocked()
	if err := s.replica.Submit(req, s.replica.Now()); err != nil {
		s.mu.Unlock()
		writeError(w, http.StatusBadRequest, "BadRequestError", err.Error(), "")
		return
	}
	s.nextID++
	id := fmt.Sprintf("%s-%d", s.cfg.Name, s.nextID)
	s.inflight[req] = c
	s.mu.Unlock()
	s.kick()

	meta := responseMeta{kind: kind, id: id, created: s.now().Unix(), model: g.Model, promptTokens: g.PromptTokens, details: s.cfg.PromptTokensDetails}
	if g.Stream {
		s.writeStream(w, r.Context(), req, c, meta, g.IncludeUsage)
	} else {
		s.writeWhole(w, r.Context(), req, c, meta)
	}
}

type responseMeta struct {
	kind         apiKind
	id           string
	created      int64
	model        string
	promptTokens int
	details      bool // PromptTokensDetails
}

// usage is the response's usage block once the call finished. With prompt
// token details on, cached_tokens is sent even when it is 0, as current
// vLLM does (it tests num_cached_tokens for None), so a client can tell a
// miss from a server that reports nothing.
func (m responseMeta) usage(c *call, completion int) *usageInfo {
	u := &usageInfo{PromptTokens: m.promptTokens, CompletionTokens: completion, TotalTokens: m.promptTokens + completion}
	if m.details {
		u.PromptTokensDetails = &promptTokensDetails{CachedTokens: int(c.cached.Load())}
	}
	return u
}

func (m responseMeta) prefixedID() string {
	if m.kind == apiChat {
		return "chatcmpl-" + m.id
	}
	return "cmpl-" + m.id
}

// abort removes a request whose client went away, as vLLM aborts it.
func (s *Server) abort(req *Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inflight, req)
	if s.closed {
		return
	}
	s.advanceLocked()
	if _, err := s.replica.Abort(req, s.replica.Now()); err != nil {
		s.log.Warn("abort failed", "err", err)
	}
}

// wait blocks until the call has news; false means give up (client gone or
// server closed, already answered).
func (s *Server) wait(ctx context.Context, req *Request, c *call) bool {
	select {
	case <-c.notify:
		return !c.failed.Load()
	case <-ctx.Done():
		s.abort(req)
		return false
	}
}

func (s *Server) writeWhole(w http.ResponseWriter, ctx context.Context, req *Request, c *call, m responseMeta) {
	for !c.finished.Load() {
		if !s.wait(ctx, req, c) {
			if c.failed.Load() {
				writeError(w, http.StatusServiceUnavailable, "ServiceUnavailableError", "the engine stopped", "")
			}
			return
		}
	}
	n := int(c.generated.Load())
	reason := "length"
	body := responseBody{ID: m.prefixedID(), Created: m.created, Model: m.model, Usage: m.usage(c, n)}
	if m.kind == apiChat {
		body.Object = "chat.completion"
		body.Choices = []chatChoice{{Message: &chatMessage{Role: "assistant", Content: GeneratedText(n)}, FinishReason: &reason}}
	} else {
		body.Object = "text_completion"
		body.Choices = []completionChoice{{Text: GeneratedText(n), FinishReason: &reason}}
	}
	writeJSON(w, http.StatusOK, body)
}

// writeStream sends one SSE chunk per token, the finish reason on the last
// token, a usage chunk, and "data: [DONE]". vLLM sends the usage chunk only
// when stream_options.include_usage is true; the simulator sends it unless
// the request sets include_usage to false, so plain streams carry usage too.
func (s *Server) writeStream(w http.ResponseWriter, ctx context.Context, req *Request, c *call, m responseMeta, includeUsage bool) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	object := "text_completion"
	if m.kind == apiChat {
		object = "chat.completion.chunk"
	}
	chunk := func(choices any, usage *usageInfo) error {
		if _, err := io.WriteString(w, "data: "); err != nil {
			return err
		}
		// Encode appends "\n"; one more ends the event.
		if err := enc.Encode(responseBody{ID: m.prefixedID(), Object: object, Created: m.created, Model: m.model, Choices: choices, Usage: usage}); err != nil {
			return err
		}
		_, err := io.WriteString(w, "\n")
		return err
	}
	if m.kind == apiChat {
		if chunk([]chatChoice{{Delta: &chatMessage{Role: "assistant", Content: ""}}}, nil) != nil {
			s.abort(req)
			return
		}
		_ = rc.Flush()
	}
	sent := 0
	for {
		if !s.wait(ctx, req, c) {
			return // client gone (aborted) or server closed: end the stream
		}
		finished := c.finished.Load()
		n := int(c.generated.Load())
		for ; sent < n; sent++ {
			var reason *string
			if sent == req.OutputTokens-1 { // generation always runs to max_tokens
				l := "length"
				reason = &l
			}
			var choices any
			if m.kind == apiChat {
				choices = []chatChoice{{Delta: &chatMessage{Content: TokenText(sent)}, FinishReason: reason}}
			} else {
				choices = []completionChoice{{Text: TokenText(sent), FinishReason: reason}}
			}
			if chunk(choices, nil) != nil {
				s.abort(req)
				return
			}
		}
		_ = rc.Flush()
		if finished {
			break
		}
	}
	if includeUsage {
		_ = chunk([]struct{}{}, m.usage(c, sent))
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}
