// Package prefixroute is the router's prefix-cache tracking inside one
// worker VM: it hashes a request's prompt (scheduler/prefix), looks it up
// in the VM's copy of the shared index before scheduling, records the
// decision, keeps what the response needs to check the prediction, reads
// usage from the response as it passes, and syncs the index with the
// other worker VMs through Envoy shared data on the root context's tick.
// The filter calls it in a few places; the decisions are the scheduler's.
package prefixroute

import (
	"time"

	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/plugin/internal/shareddata"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

// maxKeptBlocks bounds the hashes a request keeps for its response check
// (the predicted part of the prompt; 4096 blocks = 256 KiB of prompt).
const maxKeptBlocks = 4096

// Tracker is one VM's prefix tracking. Not safe for concurrent use (a VM
// is single-threaded).
type Tracker struct {
	cfg     scheduler.PrefixConfig
	hasher  *prefix.Hasher
	tracker *scheduler.PrefixTracker
	index   *prefix.Index
	m       metrics
	last    prefix.Stats
}

// metrics are the tracker's counters. Requests add to plain fields
// (counts); the tick publishes what changed: a host call per counter per
// request would cost more than the hashing of a 4 KiB prompt in the guest.
type metrics struct {
	hashed, hashBytes, hashNanos          proxywasm.MetricCounter
	predicted, reported, promptTokens     proxywasm.MetricCounter
	judged, mispredicted, unreported      proxywasm.MetricCounter
	recorded, forgotten, evicted, dropped proxywasm.MetricCounter
	fetched, casRetries                   proxywasm.MetricCounter
	entries                               proxywasm.MetricGauge

	counts, published counts
}

// counts are the request-path counters not yet published.
type counts struct {
	hashed, hashBytes, hashNanos      uint64
	predicted, reported, promptTokens uint64
	judged, mispredicted, unreported  uint64
}

// New builds the tracker of one VM; keyPrefix starts its shared-data keys.
func New(cfg scheduler.PrefixConfig, keyPrefix string) (*Tracker, error) {
	h, err := prefix.NewHasher(cfg.Hash)
	if err != nil {
		return nil, err
	}
	icfg := cfg.Index
	icfg.KeyPrefix = keyPrefix
	var store prefix.Store
	if cfg.Shared {
		store = shareddata.Store{}
	}
	idx, err := prefix.NewIndex(icfg, store)
	if err != nil {
		return nil, err
	}
	t := &Tracker{cfg: cfg, hasher: h, tracker: scheduler.NewPrefixTracker(idx), index: idx}
	t.defineMetrics()
	return t, nil
}

func (t *Tracker) defineMetrics() {
	c := proxywasm.DefineCounterMetric
	t.m = metrics{
		hashed: c("wasm_epp.prefix.hashed_requests"), hashBytes: c("wasm_epp.prefix.hashed_bytes"),
		hashNanos: c("wasm_epp.prefix.hash_ns"),
		predicted: c("wasm_epp.prefix.predicted_cached_tokens"), reported: c("wasm_epp.prefix.reported_cached_tokens"),
		promptTokens: c("wasm_epp.prefix.reported_prompt_tokens"),
		judged:       c("wasm_epp.prefix.responses.judged"), mispredicted: c("wasm_epp.prefix.responses.mispredicted"),
		unreported: c("wasm_epp.prefix.responses.unreported"),
		recorded:   c("wasm_epp.prefix.index.recorded"), forgotten: c("wasm_epp.prefix.index.forgotten"),
		evicted: c("wasm_epp.prefix.index.evicted"), dropped: c("wasm_epp.prefix.index.dropped_writes"),
		fetched: c("wasm_epp.prefix.index.fetched_buckets"), casRetries: c("wasm_epp.prefix.index.cas_retries"),
		entries: proxywasm.DefineGaugeMetric("wasm_epp.prefix.index.entries"),
	}
}

// Index is the VM's index (tests, metrics).
func (t *Tracker) Index() *prefix.Index { return t.index }

// Prompt is what the request parser found of a request's prompt: raw JSON
// values, nil when absent.
type Prompt struct {
	Prompt, Messages, Tools, CacheSalt []byte
	// NoEscapes: the body holds no backslash (the parser saw no escape).
	NoEscapes bool
}

// Hash hashes a request for target and reports a prompt shape the hasher
// refuses (prefix.ErrPromptShape, prefix.ErrMessageShape): the filter
// answers 400 and nothing is written. elapsed is the time spent, from the
// caller's clock.
func (t *Tracker) Hash(target string, p Prompt) error {
	var err error
	t.hasher.SetNoEscapes(p.NoEscapes)
	switch {
	case p.Messages != nil:
		err = t.hasher.HashMessages(target, p.CacheSalt, p.Tools, p.Messages)
	case p.Prompt != nil:
		err = t.hasher.HashPrompt(target, p.CacheSalt, p.Prompt)
	default:
		t.hasher.Reset(prefix.Seed(target, prefix.ModeText, p.CacheSalt))
	}
	return err
}

// Hashed counts one hashed request and the time it took.
func (t *Tracker) Hashed(elapsed time.Duration) {
	c := &t.m.counts
	c.hashed++
	c.hashBytes += uint64(t.hasher.Bytes())
	c.hashNanos += uint64(max(elapsed, 0))
}

// Blocks is the last hashed prompt's block count.
func (t *Tracker) Blocks() int { return len(t.hasher.Blocks()) }

// Prepare looks the last hashed prompt up and sets req.Prefix.
func (t *Tracker) Prepare(req *scheduler.Request, snap *scheduler.Snapshot) {
	t.tracker.Prepare(req, snap, t.hasher.Blocks(), t.hasher.Key())
}

// Pending is what one routed request keeps for its response: the
// prediction and the hashes it covered. The filter keeps one per HTTP
// context (reused with it).
type Pending struct {
	active    bool
	endpoint  uint32
	blocks    int
	predicted int
	kept      []uint64
	routedAt  time.Time
	scanner   prefix.UsageScanner
}

// Routed records that the last prepared request went to snapshot endpoint
// i and fills p for its response.
func (t *Tracker) Routed(i int, now time.Time, p *Pending) {
	predicted := t.tracker.Routed(i, now)
	blocks := t.hasher.Blocks()
	p.active, p.endpoint, p.blocks, p.predicted, p.routedAt = true, t.tracker.KeyOf(i), len(blocks), predicted, now
	p.kept = append(p.kept[:0], blocks[:min(predicted, maxKeptBlocks)]...)
	p.scanner.Reset()
}

// Reset forgets a request (its context is reused).
func (p *Pending) Reset() { p.active = false; p.kept = p.kept[:0] }

// ResponseBody scans one response chunk for usage; it never holds the
// chunk.
func (p *Pending) ResponseBody(chunk []byte) {
	if p.active {
		p.scanner.Write(chunk)
	}
}

// ResponseDone judges the prediction once the response ended: predicted
// and reported cached tokens are counted, and a predicted hit the server
// reports as a miss removes the mispredicted entries. A response without
// usage details changes nothing.
func (t *Tracker) ResponseDone(p *Pending, now time.Time) {
	if !p.active {
		return
	}
	p.active = false
	p.scanner.Finish()
	prompt, cached, havePrompt, haveCached := p.scanner.Result()
	c := &t.m.counts
	if !havePrompt || !haveCached {
		c.unreported++
		return
	}
	predictedTokens, forget := prefix.Judge(p.blocks, p.predicted, prompt, cached, t.cfg.Index.RecordEvery)
	c.judged++
	c.predicted += uint64(max(predictedTokens, 0))
	c.reported += uint64(max(min(cached, prompt), 0))
	c.promptTokens += uint64(max(prompt, 0))
	if forget >= 0 {
		c.mispredicted++
		t.index.Forget(p.kept, p.endpoint, forget, now)
	}
}

// Tick syncs the index with the other VMs (shared mode) and publishes the
// index counters. The root context calls it every TickPeriod.
func (t *Tracker) Tick() {
	if t.cfg.Shared {
		t.index.Sync()
	}
	s := t.index.Stats()
	add := func(c proxywasm.MetricCounter, now, before int64) {
		if d := now - before; d > 0 {
			c.Increment(uint64(d))
		}
	}
	add(t.m.recorded, s.Recorded, t.last.Recorded)
	add(t.m.forgotten, s.Forgotten, t.last.Forgotten)
	add(t.m.evicted, s.Evicted, t.last.Evicted)
	add(t.m.dropped, s.DroppedWrites, t.last.DroppedWrites)
	add(t.m.fetched, s.Fetched, t.last.Fetched)
	add(t.m.casRetries, s.CASRetries, t.last.CASRetries)
	t.last = s
	c, p := &t.m.counts, &t.m.published
	for _, x := range []struct {
		m         proxywasm.MetricCounter
		now, then uint64
	}{{t.m.hashed, c.hashed, p.hashed}, {t.m.hashBytes, c.hashBytes, p.hashBytes}, {t.m.hashNanos, c.hashNanos, p.hashNanos},
		{t.m.predicted, c.predicted, p.predicted}, {t.m.reported, c.reported, p.reported}, {t.m.promptTokens, c.promptTokens, p.promptTokens},
		{t.m.judged, c.judged, p.judged}, {t.m.mispredicted, c.mispredicted, p.mispredicted}, {t.m.unreported, c.unreported, p.unreported}} {
		if x.now > x.then {
			x.m.Increment(x.now - x.then)
		}
	}
	*p = *c
	// Every VM holds the same shared entries: the last writer's count.
	if d := int64(t.index.Entries()) - t.m.entries.Value(); d != 0 {
		t.m.entries.Add(d)
	}
}

// TickPeriod is the root context's tick period the tracker needs.
func (t *Tracker) TickPeriod() time.Duration { return t.cfg.SyncInterval }
