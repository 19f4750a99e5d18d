package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// mixEntry is one requested model name and its share of the load.
type mixEntry struct {
	Model       string
	Criticality string
	Weight      float64
}

// buildMix derives the request mix from the router configuration: the base
// model and the traffic-split names get 10% each, and the remaining share is
// spread over the other configured names with Zipf-like weights (1/(i+1)^0.6
// in configuration order), so a few adapters are hot and the rest cold, as
// in GAIE's LoRA regression mix.
func buildMix(c *config.Config, base string) []mixEntry {
	var plain, split []config.Model
	hasBase := false
	for _, m := range c.Models {
		switch {
		case m.Name == base:
			hasBase = true
		case len(m.Targets) > 0:
			split = append(split, m)
		default:
			plain = append(plain, m)
		}
	}
	crit := func(m config.Model) string {
		if m.Criticality == "" {
			return config.CriticalityStandard
		}
		return m.Criticality
	}
	var mix []mixEntry
	rest := 1.0
	if hasBase {
		for _, m := range c.Models {
			if m.Name == base {
				mix = append(mix, mixEntry{base, crit(m), 0.10})
			}
		}
		rest -= 0.10
	}
	if len(split) > 0 {
		for _, m := range split {
			mix = append(mix, mixEntry{m.Name, crit(m), 0.10 / float64(len(split))})
		}
		rest -= 0.10
	}
	var sum float64
	for i := range plain {
		sum += 1 / math.Pow(float64(i+1), 0.6)
	}
	for i, m := range plain {
		mix = append(mix, mixEntry{m.Name, crit(m), rest / sum / math.Pow(float64(i+1), 0.6)})
	}
	return mix
}

// job is one request of the demo load.
type job struct {
	Seq         int
	At          time.Duration // offset from the start of the load
	Model       string
	Criticality string
	Chat        bool
	Stream      bool
	PromptToks  int
	MaxTokens   int
}

// loadShape is the arrival process: Poisson arrivals whose rate rises
// linearly from Peak/10 to Peak over the first Ramp of Duration, then holds.
type loadShape struct {
	Duration   time.Duration
	Peak       float64 // requests per second
	Ramp       float64 // fraction of Duration spent ramping up, in [0,1]
	MaxJobs    int     // 0: no cap
	StreamFrac float64
	ChatFrac   float64
	Seed       uint64
}

// cumulative is the expected number of arrivals by time t (seconds).
func (l loadShape) cumulative(t float64) float64 {
	T, r1 := l.Duration.Seconds(), l.Peak
	r0, tr := r1/10, l.Ramp*T
	if t <= tr {
		if tr == 0 {
			return 0
		}
		return r0*t + (r1-r0)*t*t/(2*tr)
	}
	return r0*tr + (r1-r0)*tr/2 + r1*(t-tr)
}

// inverse maps an expected arrival count back to time (seconds).
func (l loadShape) inverse(n float64) float64 {
	T, r1 := l.Duration.Seconds(), l.Peak
	r0, tr := r1/10, l.Ramp*T
	if n <= l.cumulative(tr) && tr > 0 {
		a := (r1 - r0) / (2 * tr)
		if a == 0 {
			return n / r0
		}
		return (-r0 + math.Sqrt(r0*r0+4*a*n)) / (2 * a)
	}
	return tr + (n-l.cumulative(tr))/r1
}

// plan generates the whole job list deterministically from the seed: a unit
// rate Poisson process time-warped through the rate curve.
func plan(shape loadShape, mix []mixEntry) []job {
	rng := rand.New(rand.NewPCG(shape.Seed, 0x5eed))
	var total float64
	for _, m := range mix {
		total += m.Weight
	}
	var jobs []job
	var unit float64
	for seq := 0; shape.MaxJobs == 0 || seq < shape.MaxJobs; seq++ {
		unit += rng.ExpFloat64()
		t := shape.inverse(unit)
		if t >= shape.Duration.Seconds() {
			break
		}
		pick := rng.Float64() * total
		m := mix[len(mix)-1]
		for _, e := range mix {
			if pick < e.Weight {
				m = e
				break
			}
			pick -= e.Weight
		}
		jobs = append(jobs, job{
			Seq: seq, At: time.Duration(t * float64(time.Second)), Model: m.Model, Criticality: m.Criticality,
			Chat: rng.Float64() < shape.ChatFrac, Stream: rng.Float64() < shape.StreamFrac,
			PromptToks: vllmsim.ShareGPTInput.Sample(rng), MaxTokens: vllmsim.ShareGPTOutput.Sample(rng),
		})
	}
	return jobs
}

// sharedContexts is how many long contexts the demo's prompts start with
// (a schema per tenant, as an assistant re-sends it with every question).
const sharedContexts = 12

// body renders the OpenAI request. The prompt is real text of about the
// planned length (the simulator counts 4 bytes per token), so the
// plugin parses bodies of realistic size: one of sharedContexts contexts,
// then the job's own question. Streams ask for the usage chunk.
func (j job) body() []byte {
	const sentence = "SELECT name FROM users; "
	n := j.PromptToks * vllmsim.BytesPerToken
	context := fmt.Sprintf("Tenant %d schema. ", j.Seq%sharedContexts)
	question := fmt.Sprintf(" Question %d: which indexes help?", j.Seq)
	text := context + strings.Repeat(sentence, n/len(sentence)+1)[:max(n-len(context)-len(question), 0)] + question
	req := map[string]any{"model": j.Model, "max_tokens": j.MaxTokens, "stream": j.Stream}
	if j.Stream {
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	if j.Chat {
		req["messages"] = []map[string]string{{"role": "user", "content": text}}
	} else {
		req["prompt"] = text
	}
	b, _ := json.Marshal(req)
	return b
}

func (j job) path() string {
	if j.Chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// hit says whether the serving replica already ran or queued the adapter.
type hit int

const (
	hitUnknown hit = iota // not an adapter request, or no scrape to judge by
	hitYes
	hitNo
)

// result is what happened to one job.
type result struct {
	job
	Sent     time.Time
	Status   int    // 0: no HTTP response
	ErrType  string // OpenAI error type, or the transport error
	Latency  time.Duration
	TTFT     time.Duration // streams: time to the first chunk
	Endpoint string        // the plugin's served-by header (ip:port)
	Replica  string        // the simulator's replica header
	Target   string        // the model the replica served (after traffic split)
	Tokens   int
	Hit      hit
	// PromptTokens and CachedTokens are the response's usage (-1: the
	// server did not report cached tokens).
	PromptTokens, CachedTokens int
}

// usage is an OpenAI usage block.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (r *result) setUsage(u *usage) {
	r.PromptTokens, r.CachedTokens = u.PromptTokens, -1
	if u.PromptTokensDetails != nil {
		r.CachedTokens = u.PromptTokensDetails.CachedTokens
	}
}

// driver sends jobs and collects results.
type driver struct {
	client      *http.Client
	base        string
	servedBy    string
	adapters    map[string]bool
	scraper     *scraper
	maxInflight int64

	inflight atomic.Int64
	sent     atomic.Int64
	ok       atomic.Int64
	dropped  atomic.Int64 // 429
	failed   atomic.Int64 // anything else
	skipped  atomic.Int64 // not sent: too many in flight

	mu      sync.Mutex
	results []result
}

// run sends every job at its time and waits for the answers; when ctx ends
// it stops sending and cancels what is in flight after drain. It returns
// how long it was sending.
func (d *driver) run(ctx context.Context, jobs []job, start time.Time, drain time.Duration) (sending time.Duration) {
	reqCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
send:
	for _, j := range jobs {
		if wait := time.Until(start.Add(j.At)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				break send
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			break send
		}
		if d.inflight.Load() >= d.maxInflight {
			d.skipped.Add(1)
			continue
		}
		d.inflight.Add(1)
		d.sent.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer d.inflight.Add(-1)
			d.record(d.do(reqCtx, j))
		}()
	}
	sending = time.Since(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(drain)
	defer t.Stop()
	select {
	case <-done:
		return sending
	case <-t.C:
	case <-ctx.Done():
		// Interrupted: give in-flight requests no more time.
	}
	cancel()
	<-done
	return sending
}

func (d *driver) record(r result) {
	switch {
	case r.Status == http.StatusOK && r.ErrType == "":
		d.ok.Add(1)
	case r.Status == http.StatusTooManyRequests:
		d.dropped.Add(1)
	default:
		d.failed.Add(1)
	}
	d.mu.Lock()
	d.results = append(d.results, r)
	d.mu.Unlock()
}

func (d *driver) snapshot() []result {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.results)
}

func (d *driver) do(ctx context.Context, j job) result {
	r := result{job: j, Sent: time.Now(), CachedTokens: -1}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.base+j.path(), bytes.NewReader(j.body()))
	if err != nil {
		r.ErrType = err.Error()
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		r.ErrType = transportError(err)
		r.Latency = time.Since(r.Sent)
		return r
	}
	defer resp.Body.Close()
	r.Status = resp.StatusCode
	r.Endpoint = resp.Header.Get(d.servedBy)
	r.Replica = resp.Header.Get(vllmsim.ReplicaHeader)
	if r.Endpoint != "" {
		d.scraper.observe(r.Endpoint)
	}
	switch {
	case resp.StatusCode != http.StatusOK:
		var e struct {
			Error struct {
				Type string `json:"type"`
			} `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) == nil && e.Error.Type != "" {
			r.ErrType = e.Error.Type
		} else {
			r.ErrType = strings.TrimSpace(firstLine(string(b)))
		}
	case j.Stream:
		r.ErrType = readStream(resp.Body, &r)
	default:
		var body struct {
			Model string `json:"model"`
			Usage usage  `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			r.ErrType = "bad response body: " + err.Error()
		}
		r.Target, r.Tokens = body.Model, body.Usage.CompletionTokens
		r.setUsage(&body.Usage)
	}
	r.Latency = time.Since(r.Sent)
	target := r.Target
	if target == "" {
		target = j.Model
	}
	if d.adapters[target] && r.Endpoint != "" {
		r.Hit = d.scraper.had(r.Endpoint, target, r.Sent)
	}
	return r
}

// readStream reads SSE chunks up to "data: [DONE]"; it returns "" when the
// stream is complete, else what was wrong.
func readStream(body io.Reader, r *result) string {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if r.TTFT == 0 {
			r.TTFT = time.Since(r.Sent)
		}
		if data == "[DONE]" {
			return ""
		}
		var chunk struct {
			Model   string            `json:"model"`
			Choices []json.RawMessage `json:"choices"`
			Usage   *usage            `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return "bad stream chunk: " + err.Error()
		}
		r.Target = chunk.Model
		if chunk.Usage != nil {
			r.setUsage(chunk.Usage)
		}
		if len(chunk.Choices) > 0 {
			r.Tokens++
		}
	}
	if err := sc.Err(); err != nil {
		return transportError(err)
	}
	return "stream ended without [DONE]"
}

func transportError(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return msg
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

// hitFor is a convenience for tests and reports.
func (h hit) String() string {
	return [...]string{"unknown", "hit", "miss"}[h]
}
