package fleet

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
)

// Traffic is the shape of a scenario's requests: how prompts are built and
// share prefixes. A nil Scenario.Traffic is ShareGPT traffic (Scenario.Input,
// Output and Adapters) whose prompts share nothing; SharedContexts,
// MultiTurn and SystemPrompts generate token ids with shared prefixes.
type Traffic interface {
	// Describe is one line for reports.
	Describe() string
	validate() error
	// newSource is the run's request stream at rate requests per second.
	newSource(rate float64, seed uint64) (source, error)
	// share is the traffic one replica of n serves in the best case a
	// router can reach (MeasureCapacity): each replica holds only its
	// share of the shared prefixes and at most maxLoRAs adapters.
	share(n, maxLoRAs int) Traffic
}

// arrival is one request as a source generates it.
type arrival struct {
	seq          int
	at           time.Duration
	adapter      string
	promptTokens int
	outputTokens int
	// prompt is the token ids (nil: a prompt shared with nothing); the
	// source may reuse it after the next take.
	prompt     []uint32
	outputSeed uint64
	// hashes remembers the block hashes of the prompts this one extends
	// (a conversation's), nil for none.
	hashes *vllmsim.PromptHashes
	// turn is set for a conversation turn: the run tells it when the
	// request ends, so that the next turn follows.
	turn *turn
	// opens is true for the first request of a conversation and for every
	// open-loop request: what a burst may add.
	opens bool
}

// source is a run's request stream in time order.
type source interface {
	// peek is the time of the next arrival, never if there is none now
	// (a conversation's next turn appears when its previous one ends).
	peek() time.Duration
	// opensNext reports whether the next arrival opens a conversation (or
	// is open-loop): what a burst may add or leave out.
	opensNext() bool
	// take fills a with the next arrival.
	take(a *arrival)
}

const never = time.Duration(math.MaxInt64)

// newRunSource is the run's stream: the scenario's traffic at cfg.Rate,
// plus the burst stream when cfg.Burst is on.
func newRunSource(cfg RunConfig, sc Scenario) (source, error) {
	if cfg.Policy.IgnoresPrompt {
		// Unique ids are for the policies (the replicas serve such
		// prompts without them, runOnce), and this one never reads
		// them: drawing them cost scenario (a) a fifth of its
		// instructions.
		sc.UniquePrompts = false
	}
	t := sc.traffic()
	base, err := t.newSource(cfg.Rate, cfg.Seed)
	if err != nil || !cfg.Burst.On() {
		return base, err
	}
	extra, err := t.newSource(cfg.Rate*(cfg.Burst.Factor-1), cfg.Seed^0xb0b5)
	if err != nil {
		return nil, err
	}
	return &burstSource{base: base, extra: extra, burst: cfg.Burst}, nil
}

// burstSource adds a second stream of the same traffic (its own seed)
// inside the bursts: exactly a stream of (Factor-1) × rate over them. Of the
// second stream only requests that open a conversation are kept or dropped
// by time; a kept conversation runs to its end.
type burstSource struct {
	base, extra source
	burst       Burst
	seq         int
	skipped     arrival
}

// nextExtra drops the second stream's openers outside the bursts and
// returns the time of its next kept arrival.
func (b *burstSource) nextExtra() time.Duration {
	for {
		t := b.extra.peek()
		if t == never || !b.extra.opensNext() || b.burst.inside(t) {
			return t
		}
		b.extra.take(&b.skipped)
	}
}

func (b *burstSource) peek() time.Duration { return min(b.base.peek(), b.nextExtra()) }

func (b *burstSource) opensNext() bool {
	if b.nextExtra() < b.base.peek() {
		return b.extra.opensNext()
	}
	return b.base.opensNext()
}

func (b *burstSource) take(a *arrival) {
	if b.nextExtra() < b.base.peek() {
		b.extra.take(a)
	} else {
		b.base.take(a)
	}
	a.seq = b.seq
	b.seq++
}

// shareGPT is the traffic of scenarios (a) to (c): Poisson arrivals with
// ShareGPT lengths and an adapter mix (vllmsim.Workload); every prompt
// shares nothing with another: it has no token ids (Request.Prompt nil),
// or with unique, ids no other request shares (uniquePromptTokens).
type shareGPT struct {
	input, output vllmsim.LengthDist
	adapters      []vllmsim.AdapterShare
	unique        bool
}

func (s shareGPT) Describe() string {
	return fmt.Sprintf("ShareGPT lengths, %d adapters, no shared prefixes", len(s.adapters))
}

func (s shareGPT) validate() error { return nil }

func (s shareGPT) share(_, maxLoRAs int) Traffic {
	if n := min(maxLoRAs, len(s.adapters)); n > 0 {
		names := make([]string, n)
		for i := range names {
			names[i] = s.adapters[i].Name
		}
		s.adapters = vllmsim.EqualShares(names...)
	}
	return s
}

func (s shareGPT) newSource(rate float64, seed uint64) (source, error) {
	w, err := vllmsim.NewWorkload(vllmsim.WorkloadConfig{Rate: rate, Input: s.input, Output: s.output, Adapters: s.adapters, Seed: seed})
	if err != nil {
		return nil, err
	}
	src := &workloadSource{w: w, next: w.Next()}
	if s.unique {
		src.ids = newTokenPCG(seed, 0x1d5e)
	}
	return src, nil
}

type workloadSource struct {
	w    *vllmsim.Workload
	next vllmsim.Arrival
	ids  *tokenPCG // unique prompts: their token ids; nil: none
	buf  []uint32
}

func (s *workloadSource) peek() time.Duration { return s.next.At }

func (s *workloadSource) opensNext() bool { return true }

func (s *workloadSource) take(a *arrival) {
	n := s.next
	*a = arrival{seq: n.Seq, at: n.At, adapter: n.Adapter, promptTokens: n.PromptTokens, outputTokens: n.OutputTokens, opens: true}
	if s.ids != nil {
		s.buf = uniquePromptTokens(s.buf[:0], s.ids, n.PromptTokens)
		a.prompt = s.buf
	}
	s.next = s.w.Next()
}

// uniquePromptTokens appends n token ids that no other prompt shares: ids
// below 2^24 drawn from rng, a stream of its own per run seed (so the
// arrivals, lengths and adapters are those of the run without ids). Two
// prompts share a first 16-token block with probability 2^-384: never.
func uniquePromptTokens(dst []uint32, rng *tokenPCG, n int) []uint32 {
	return appendRandomTokens(dst, rng, n)
}

// Token ids of generated text: random ids below 2^24 (a vocabulary), and
// the chat template's markers above it.
const (
	tokTurnStart uint32 = 0xffff_0001 + iota
	tokTurnEnd
	tokRoleUser
	tokRoleAssistant
)

// appendRandomTokens appends n ids drawn from rng, one draw each. It takes
// the generator itself, not a rand.Rand over it, whose calls through the
// Source interface cost scenario (a) a tenth of its run time; the draws
// are the same (rand.Rand.Uint64 is its source's).
func appendRandomTokens(dst []uint32, rng *tokenPCG, n int) []uint32 {
	l := len(dst)
	dst = slices.Grow(dst, n)[:l+n]
	rng.fillTokens(dst[l:])
	return dst
}

// newDraws is a stream of random draws and its generator, for
// appendRandomTokens.
func newDraws(seed, stream uint64) (*rand.Rand, *tokenPCG) {
	g := newTokenPCG(seed, stream)
	return rand.New(g), g
}

// fixedTokens is a prompt part that is the same in every run: n ids drawn
// from key.
func fixedTokens(key uint64, n int) []uint32 {
	return appendRandomTokens(make([]uint32, 0, n), newTokenPCG(key, 0x70c5), n)
}

// poisson draws the gaps of a Poisson stream.
type poisson struct {
	rng  *rand.Rand
	rate float64
	at   time.Duration
}

func (p *poisson) next() time.Duration {
	p.at += time.Duration(p.rng.ExpFloat64() / p.rate * float64(time.Second))
	return p.at
}

func validRate(rate float64) error {
	if !(rate > 0) || math.IsInf(rate, 0) {
		return fmt.Errorf("fleet: rate %v must be positive and finite", rate)
	}
	return nil
}

// SharedContexts is traffic (d), the shape of llm-d's prefix benchmark:
// Groups groups, each with its own context of ContextTokens tokens; a
// request is a uniformly chosen group's context followed by a new question
// (no two questions alike). The contexts are the same in every run.
type SharedContexts struct {
	Groups        int
	ContextTokens int
	Question      vllmsim.LengthDist
	Output        vllmsim.LengthDist
}

// Describe is one line for reports.
func (s SharedContexts) Describe() string {
	return fmt.Sprintf("%d groups × %d-token shared context + a new ~%.0f-token question, ~%.0f output tokens",
		s.Groups, s.ContextTokens, s.Question.Mean(), s.Output.Mean())
}

func (s SharedContexts) validate() error {
	if s.Groups < 1 || s.ContextTokens < 1 {
		return errors.New("fleet: shared contexts need groups and context tokens")
	}
	if err := s.Question.Validate(); err != nil {
		return fmt.Errorf("question lengths: %w", err)
	}
	return s.Output.Validate()
}

func (s SharedContexts) share(n, _ int) Traffic {
	s.Groups = (s.Groups + n - 1) / n
	return s
}

func (s SharedContexts) newSource(rate float64, seed uint64) (source, error) {
	if err := validRate(rate); err != nil {
		return nil, err
	}
	src := &contextSource{cfg: s, contexts: make([][]uint32, s.Groups),
		gaps: poisson{rng: rand.New(rand.NewPCG(seed, 0x9a95)), rate: rate}}
	src.draws, src.tokens = newDraws(seed, 0xd0c5)
	src.nextAt = src.gaps.next()
	return src, nil
}

type contextSource struct {
	cfg      SharedContexts
	contexts [][]uint32
	gaps     poisson
	draws    *rand.Rand
	tokens   *tokenPCG // draws' generator
	nextAt   time.Duration
	seq      int
	buf      []uint32
}

func (s *contextSource) peek() time.Duration { return s.nextAt }

func (s *contextSource) opensNext() bool { return true }

func (s *contextSource) take(a *arrival) {
	g := s.draws.IntN(s.cfg.Groups)
	if s.contexts[g] == nil {
		s.contexts[g] = fixedTokens(uint64(g)+1, s.cfg.ContextTokens)
	}
	q := max(1, s.cfg.Question.Sample(s.draws))
	s.buf = appendRandomTokens(append(s.buf[:0], s.contexts[g]...), s.tokens, q)
	*a = arrival{seq: s.seq, at: s.nextAt, promptTokens: len(s.buf), prompt: s.buf,
		outputTokens: max(1, s.cfg.Output.Sample(s.draws)), outputSeed: s.draws.Uint64(), opens: true}
	s.seq++
	s.nextAt = s.gaps.next()
}

// SystemPrompts is traffic (f): requests for Adapters drawn by weight, each
// adapter's prompts starting with its own system prompt of SystemTokens
// tokens, then a ShareGPT-length user part no other request shares.
type SystemPrompts struct {
	Adapters      []vllmsim.AdapterShare
	SystemTokens  int
	Input, Output vllmsim.LengthDist
}

// Describe is one line for reports.
func (s SystemPrompts) Describe() string {
	return fmt.Sprintf("%d adapters, each with its own %d-token system prompt, + ShareGPT-length user text", len(s.Adapters), s.SystemTokens)
}

func (s SystemPrompts) validate() error {
	if len(s.Adapters) == 0 || s.SystemTokens < 1 {
		return errors.New("fleet: system prompts need adapters and system tokens")
	}
	return nil
}

func (s SystemPrompts) share(_, maxLoRAs int) Traffic {
	s.Adapters = shareGPT{adapters: s.Adapters}.share(0, maxLoRAs).(shareGPT).adapters
	return s
}

func (s SystemPrompts) newSource(rate float64, seed uint64) (source, error) {
	w, err := vllmsim.NewWorkload(vllmsim.WorkloadConfig{Rate: rate, Input: s.Input, Output: s.Output, Adapters: s.Adapters, Seed: seed})
	if err != nil {
		return nil, err
	}
	src := &systemSource{w: w, next: w.Next(), system: map[string][]uint32{}, tokens: s.SystemTokens}
	src.draws, src.gen = newDraws(seed, 0x5959)
	for i, a := range s.Adapters {
		src.system[a.Name] = fixedTokens(0x5e00+uint64(i), s.SystemTokens)
	}
	return src, nil
}

type systemSource struct {
	w      *vllmsim.Workload
	next   vllmsim.Arrival
	system map[string][]uint32
	tokens int
	draws  *rand.Rand
	gen    *tokenPCG // draws' generator
	buf    []uint32
}

func (s *systemSource) peek() time.Duration { return s.next.At }

func (s *systemSource) opensNext() bool { return true }

func (s *systemSource) take(a *arrival) {
	n := s.next
	s.buf = appendRandomTokens(append(s.buf[:0], s.system[n.Adapter]...), s.gen, n.PromptTokens)
	*a = arrival{seq: n.Seq, at: n.At, adapter: n.Adapter, promptTokens: len(s.buf), prompt: s.buf,
		outputTokens: n.OutputTokens, outputSeed: s.draws.Uint64(), opens: true}
	s.next = s.w.Next()
}

// MultiTurn is traffic (e): conversations start as a Poisson stream; each
// has MinTurns to MaxTurns turns (uniform); a turn sends the whole history
// rendered with a fixed chat template (the earlier user messages and the
// responses the replica generated, token for token) plus a new user message
// of User length, and asks for Output tokens; the next turn is sent an
// exponential think time (mean Think) after the response ends. A refused
// turn ends its conversation. The rate of a run counts turns: conversations
// start at rate / mean turns.
type MultiTurn struct {
	MinTurns, MaxTurns int
	User, Output       vllmsim.LengthDist
	Think              time.Duration
}

// Describe is one line for reports.
func (m MultiTurn) Describe() string {
	return fmt.Sprintf("conversations of %d–%d turns, each resending its history + a ShareGPT-length message, think time %v (exponential)",
		m.MinTurns, m.MaxTurns, m.Think)
}

func (m MultiTurn) validate() error {
	if m.MinTurns < 1 || m.MaxTurns < m.MinTurns || m.Think < 0 {
		return errors.New("fleet: multi-turn needs 1 <= MinTurns <= MaxTurns and a non-negative think time")
	}
	if err := m.User.Validate(); err != nil {
		return err
	}
	return m.Output.Validate()
}

func (m MultiTurn) share(int, int) Traffic { return m }

func (m MultiTurn) meanTurns() float64 { return float64(m.MinTurns+m.MaxTurns) / 2 }

func (m MultiTurn) newSource(rate float64, seed uint64) (source, error) {
	if err := validRate(rate); err != nil {
		return nil, err
	}
	s := &chatSource{cfg: m, starts: poisson{rng: rand.New(rand.NewPCG(seed, 0x5e55)), rate: rate / m.meanTurns()},
		turnTokens: int(1.25 * (m.User.Mean() + m.Output.Mean() + 6))}
	s.draws, s.tokens = newDraws(seed, 0x7a1c)
	s.nextStart = s.starts.next()
	return s, nil
}

// turn is one request of a conversation.
type turn struct {
	conv   *conversation
	output int
	seed   uint64
}

type conversation struct {
	src     *chatSource
	history []uint32
	// hashes are the replicas' block hashes of the history: each turn
	// hashes only the blocks it adds (a tenth of (e)'s run time before).
	hashes vllmsim.PromptHashes
	left   int // turns still to send after this one
}

type chatSource struct {
	cfg       MultiTurn
	starts    poisson
	nextStart time.Duration
	draws     *rand.Rand
	tokens    *tokenPCG // draws' generator
	followUps turnHeap
	seq       int
	// turnTokens is a generous mean of the tokens one turn adds to a
	// history: a history gets room for MaxTurns turns at once, where
	// growing it by appending cost (e) about 6% of its run time.
	turnTokens int
	// spare holds the history buffers of ended conversations for the next
	// ones: no request holds a history once its conversation ended (the
	// replicas read a prompt only until Submit returns, a held request
	// holds a copy), and allocating a fresh one zeroed it first: 3 M of
	// (e)'s 42.2 M misses of a 1 MiB L2 (BENCHMARKS.md, "Replica-model
	// speed work, fifth round").
	spare [][]uint32
}

// maxSpareHistories bounds chatSource.spare.
const maxSpareHistories = 4096

// followUp is a conversation's next turn, due at at.
type followUp struct {
	at   time.Duration
	conv *conversation
	prev *turn
}

type turnHeap []followUp

func (h turnHeap) Len() int           { return len(h) }
func (h turnHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h turnHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *turnHeap) Push(x any)        { *h = append(*h, x.(followUp)) }
func (h *turnHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (s *chatSource) peek() time.Duration {
	if s.followUpNext() {
		return s.followUps[0].at
	}
	return s.nextStart
}

func (s *chatSource) followUpNext() bool {
	return len(s.followUps) > 0 && s.followUps[0].at < s.nextStart
}

func (s *chatSource) opensNext() bool { return !s.followUpNext() }

func (s *chatSource) take(a *arrival) {
	var c *conversation
	var at time.Duration
	opens := false
	if s.followUpNext() {
		f := heap.Pop(&s.followUps).(followUp)
		c, at = f.conv, f.at
		// The previous response, token for token as the replica generated
		// it, closes the assistant message the last turn opened.
		n := len(c.history)
		c.history = slices.Grow(c.history, f.prev.output+1)[:n+f.prev.output]
		response := c.history[n:]
		for i := range response {
			response[i] = vllmsim.OutputToken(f.prev.seed, i)
		}
		c.history = append(c.history, tokTurnEnd)
	} else {
		c = &conversation{src: s, left: s.cfg.MinTurns + s.draws.IntN(s.cfg.MaxTurns-s.cfg.MinTurns+1)}
		if l := len(s.spare); l > 0 {
			c.history, s.spare = s.spare[l-1], s.spare[:l-1]
		} else {
			c.history = make([]uint32, 0, s.cfg.MaxTurns*s.turnTokens)
		}
		at, opens = s.nextStart, true
		s.nextStart = s.starts.next()
	}
	c.left--
	c.history = append(c.history, tokTurnStart, tokRoleUser)
	c.history = appendRandomTokens(c.history, s.tokens, max(1, s.cfg.User.Sample(s.draws)))
	c.history = append(c.history, tokTurnEnd, tokTurnStart, tokRoleAssistant)
	t := &turn{conv: c, output: max(1, s.cfg.Output.Sample(s.draws)), seed: s.draws.Uint64()}
	*a = arrival{seq: s.seq, at: at, promptTokens: len(c.history), prompt: c.history, outputTokens: t.output,
		outputSeed: t.seed, turn: t, opens: opens, hashes: &c.hashes}
	s.seq++
}

// ended is told that the turn's request ended at at: completed, or refused
// (which ends the conversation).
func (t *turn) ended(at time.Duration, completed bool) {
	c := t.conv
	s := c.src
	if !completed || c.left == 0 {
		if len(s.spare) < maxSpareHistories {
			s.spare = append(s.spare, c.history[:0])
		}
		c.history, c.hashes = nil, vllmsim.PromptHashes{}
		return
	}
	think := time.Duration(s.draws.ExpFloat64() * float64(s.cfg.Think))
	heap.Push(&s.followUps, followUp{at: at + think, conv: c, prev: t})
}
