package vllmsim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// ReplicaConfig sizes one simulated vLLM replica. Every field must be set:
// start from DefaultReplicaConfig and override. NewReplica rejects zero
// values rather than guessing.
type ReplicaConfig struct {
	Profile Profile
	// MaxNumSeqs caps running sequences (vLLM max_num_seqs; 256 is the older
	// default in engine/arg_utils.py, GAIE's benchmarks use 1024).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of one step; prompts longer
	// than what is left are prefilled in chunks (chunked prefill).
	MaxNumBatchedTokens int
	// KVCapacityTokens is the KV cache size; it is paged in blocks of
	// BlockSize tokens and rounded down to whole blocks.
	KVCapacityTokens int
	BlockSize        int
	// EnablePrefixCaching turns on vLLM V1's automatic prefix caching (on
	// by default in V1, --enable-prefix-caching): full KV blocks are kept
	// by hash after their request ends, and a request whose leading blocks
	// are cached skips their prefill.
	EnablePrefixCaching bool
	// MaxModelLen bounds prompt+output of one request.
	MaxModelLen int
	// MaxLoRAs is the number of adapters one batch may use (vLLM max_loras).
	// Zero disables LoRA: Submit rejects requests naming an adapter.
	MaxLoRAs int
	// LoRASlowdownPerAdapter: a step with A distinct adapters takes
	// ×(1 + LoRASlowdownPerAdapter·A) (BLIS defaults, from arXiv 2508.08343).
	LoRASlowdownPerAdapter float64
	AdapterLoad            AdapterLoadConfig
	// LoRAAdmission is how waiting requests meet the MaxLoRAs limit:
	// LoRASkip (vLLM V1's current rule, the default) or LoRAFIFO (its
	// earlier rule, kept to measure what the skip rule costs).
	LoRAAdmission LoRAAdmission
}

// LoRAAdmission selects the rule for a waiting request whose adapter is not
// in the step's batch when MaxLoRAs adapters already are.
type LoRAAdmission uint8

const (
	// LoRASkip is vLLM V1's rule (vllm/v1/core/sched/scheduler.py,
	// schedule(), "Scheduling would exceed max_loras, skip"): the request
	// is set aside for this step and the requests behind it are still
	// considered, so new requests of an adapter in the batch overtake it;
	// it stays at its place in the waiting order for the next step.
	LoRASkip LoRAAdmission = iota
	// LoRAFIFO stops admitting at that request, as V1's scheduler once did:
	// strict arrival order, head-of-line blocking on adapter slots.
	LoRAFIFO
)

func (a LoRAAdmission) String() string {
	switch a {
	case LoRASkip:
		return "skip"
	case LoRAFIFO:
		return "fifo"
	}
	return fmt.Sprintf("LoRAAdmission(%d)", uint8(a))
}

// ParseLoRAAdmission reads "skip" or "fifo".
func ParseLoRAAdmission(s string) (LoRAAdmission, error) {
	switch s {
	case "skip":
		return LoRASkip, nil
	case "fifo":
		return LoRAFIFO, nil
	}
	return 0, fmt.Errorf("vllmsim: LoRA admission %q: want skip or fifo", s)
}

// AdapterLoadConfig prices bringing an adapter into one of the MaxLoRAs GPU
// slots (published figures: ≈1.5 ms + size/2 MB per µs from CPU memory,
// 0.1–1 s from disk). The load runs inside the step that first needs the adapter, as
// vLLM activates adapters before the forward pass.
type AdapterLoadConfig struct {
	// Base is the fixed cost of a load from CPU memory.
	Base time.Duration
	// SizeBytes is the adapter size; BytesPerMicrosecond the copy bandwidth.
	SizeBytes           int64
	BytesPerMicrosecond float64
	// MaxCPUAdapters is how many adapters stay in CPU memory (vLLM
	// max_cpu_loras); 0 means all of them, i.e. every adapter was loaded at
	// startup, as with --lora-modules and a large max_cpu_loras.
	MaxCPUAdapters int
	// DiskLoad is added when the adapter is not in CPU memory. It is paid on
	// first use when non-zero, and again after a CPU-cache eviction.
	DiskLoad time.Duration
}

// DefaultReplicaConfig returns vLLM's defaults for a profile:
// max_num_seqs 256, 2048 tokens per step, block size 16 with prefix caching
// on (vLLM V1's defaults), the profile's KV capacity and max_model_len, no
// LoRA (set MaxLoRAs to enable it; waiting requests skip as in vLLM), slowdown
// 0.02 per adapter, and a 32 MiB adapter (rank 16 on q,k,v,o of a 7B model)
// loaded from CPU memory in 1.5 ms + size / 2 MB per µs.
func DefaultReplicaConfig(p Profile) ReplicaConfig {
	return ReplicaConfig{
		Profile:                p,
		MaxNumSeqs:             256,
		MaxNumBatchedTokens:    2048,
		KVCapacityTokens:       p.KVCapacityTokens,
		BlockSize:              16,
		EnablePrefixCaching:    true,
		MaxModelLen:            p.MaxModelLen,
		MaxLoRAs:               0,
		LoRASlowdownPerAdapter: 0.02,
		AdapterLoad: AdapterLoadConfig{
			Base:                1500 * time.Microsecond,
			SizeBytes:           32 << 20,
			BytesPerMicrosecond: 2e6,
		},
	}
}

// Validate reports the first unusable field.
func (c ReplicaConfig) Validate() error {
	if err := c.Profile.validate(); err != nil {
		return err
	}
	switch {
	case c.MaxNumSeqs <= 0:
		return errors.New("vllmsim: MaxNumSeqs must be positive")
	case c.MaxNumBatchedTokens <= 0:
		return errors.New("vllmsim: MaxNumBatchedTokens must be positive")
	case c.BlockSize <= 0:
		return errors.New("vllmsim: BlockSize must be positive")
	case c.KVCapacityTokens < c.BlockSize:
		return fmt.Errorf("vllmsim: KVCapacityTokens %d is less than one block of %d", c.KVCapacityTokens, c.BlockSize)
	case c.MaxModelLen <= 0:
		return errors.New("vllmsim: MaxModelLen must be positive")
	case c.MaxModelLen > c.KVCapacityTokens/c.BlockSize*c.BlockSize:
		// vLLM refuses to start when one max-length request cannot fit.
		return fmt.Errorf("vllmsim: MaxModelLen %d exceeds the KV cache of %d tokens", c.MaxModelLen, c.KVCapacityTokens/c.BlockSize*c.BlockSize)
	case c.MaxLoRAs < 0:
		return errors.New("vllmsim: MaxLoRAs must not be negative")
	case c.LoRASlowdownPerAdapter < 0:
		return errors.New("vllmsim: LoRASlowdownPerAdapter must not be negative")
	case c.AdapterLoad.Base < 0 || c.AdapterLoad.SizeBytes < 0 || c.AdapterLoad.DiskLoad < 0 || c.AdapterLoad.MaxCPUAdapters < 0:
		return errors.New("vllmsim: AdapterLoad fields must not be negative")
	case c.AdapterLoad.SizeBytes > 0 && c.AdapterLoad.BytesPerMicrosecond <= 0:
		return errors.New("vllmsim: AdapterLoad.BytesPerMicrosecond must be positive when SizeBytes is set")
	case c.MaxLoRAs > 0 && c.AdapterLoad.MaxCPUAdapters > 0 && c.AdapterLoad.MaxCPUAdapters < c.MaxLoRAs:
		return errors.New("vllmsim: AdapterLoad.MaxCPUAdapters must be at least MaxLoRAs (as vLLM requires of max_cpu_loras)")
	case c.LoRAAdmission > LoRAFIFO:
		return fmt.Errorf("vllmsim: unknown %v", c.LoRAAdmission)
	}
	return nil
}

// Errors returned by Submit and Abort.
var (
	ErrInvalidRequest  = errors.New("vllmsim: invalid request")
	ErrTooLong         = errors.New("vllmsim: prompt plus output exceeds max_model_len")
	ErrLoRADisabled    = errors.New("vllmsim: request names an adapter but the replica has MaxLoRAs 0")
	ErrClockBackwards  = errors.New("vllmsim: time earlier than the replica clock")
	ErrAlreadySubmited = errors.New("vllmsim: request was already submitted")
)

// Request is one generation request. The caller fills the input fields; the
// replica fills the result fields. A Request belongs to one replica from
// Submit on and must not be modified by the caller afterwards.
type Request struct {
	// The engine's per-step loops read and write the fields from here to
	// LastTokenAt for every running request on every step; they come
	// first and fit in 64 bytes, so that a step touches one cache line per
	// request when the Request starts on one.
	numTokens int32 // prompt + generated: the tokens whose KV must exist
	computed  int32 // tokens whose KV is computed
	sched     int32 // tokens scheduled in the step in progress
	// tableTokens is len(table) × block size: the tokens the block table
	// has room for.
	tableTokens int32
	// cacheAt is (cachedBlocks+1) × block size: the token count at which
	// the next block of table is full and cached; hashAt is
	// (len(hashes)+1) × block size, when the next block is hashed. Either
	// is noTokens when there is nothing to do (prefix caching off, or a
	// prompt without token ids for hashAt).
	cacheAt, hashAt int32
	adapterID       int32
	state           requestState
	// Generated counts sampled tokens.
	Generated int
	// OutputTokens is how many tokens the request generates (the simulated
	// generation always runs to this length, like ignore_eos).
	OutputTokens int
	// FirstTokenAt and LastTokenAt are the ends of the steps that sampled the
	// first and the latest token.
	LastTokenAt  time.Duration
	FirstTokenAt time.Duration

	// The fields from here to hashBlock are what hashing a block as a
	// decode step fills it, and caching it, read: 128 adjacent bytes,
	// two or three cache lines (appendBlockHash, cacheFullBlocks).
	salt uint64 // nonzero: a prompt without token ids (Prompt nil)
	// hashes[i] is the hash of full block i of the request's tokens (prompt
	// then generated), computed as tokens arrive (request_block_hasher);
	// lastHash is the last of them (noneHash for none).
	hashes   []uint64
	lastHash uint64
	loraKey  uint64
	// OutputSeed fixes the token ids the request generates
	// (OutputToken(OutputSeed, i)); they are cached like prompt tokens once
	// they fill a block.
	OutputSeed   uint64
	PromptTokens int
	cachedBlocks int // leading blocks of table registered in the cache
	// taggedBlocks counts the leading blocks of a running request that it
	// found cached when it was admitted. For a request without token ids
	// they are those it found in its run when it resumed (already counted
	// as cached); the blocks from there to cachedBlocks are counted as they
	// fill, and all of them join its next run when it frees them.
	taggedBlocks int
	table        []int32
	// records is the chunk of the pool's records its new blocks take;
	// hashRun the pool's run of its cached blocks while it runs (noRun for
	// none).
	records recordCursor
	hashRun int32
	// run is, for a request without token ids that freed its blocks, the
	// pool's run of its cached blocks (noRun for none).
	run       int32
	hashBlock int // block size the hashes were computed for, 0 = none
	tail      []uint32

	// ID is for the caller; the replica does not read it.
	ID uint64

	// Arrival is the Submit time.
	Arrival time.Duration
	// CompletedAt is set when Generated reaches OutputTokens (then it equals
	// LastTokenAt).
	CompletedAt time.Duration
	// Preemptions counts how often the request lost its KV cache.
	Preemptions int
	// CachedTokens is vLLM's num_cached_tokens, what the response reports
	// as usage.prompt_tokens_details.cached_tokens: the tokens found in the
	// prefix cache when the request was first scheduled (a multiple of the
	// block size, at most PromptTokens-1).
	CachedTokens int
	scheduled    bool // scheduled at least once (CachedTokens is set)
	// expectHit is what CachedPrefixTokens found on this replica at the
	// Submit time (Load's estimate; 0 if nothing looked).
	expectHit     int
	hitFor        *Replica
	hitStep       int64
	hitBlocksSeen int
	order         int64

	// Adapter names the LoRA adapter, "" for the base model.
	Adapter string
	// Prompt holds the prompt's token ids when the caller knows them
	// (len(Prompt) == PromptTokens): requests whose prompts start with the
	// same full blocks of tokens, for the same adapter, share those KV
	// blocks. Nil means a prompt that shares nothing with any other. The
	// replica reads Prompt only until Submit returns (and in
	// CachedPrefixTokens), so the caller may reuse the buffer afterwards.
	Prompt []uint32
	// Hashes, if set, remembers the block hashes of the earlier prompts and
	// responses this prompt extends (see PromptHashes); the replica reads
	// and extends it at Submit (and CachedPrefixTokens) and when the
	// request completes.
	Hashes *PromptHashes
	// lender is the PromptHashes whose array hashes shares (see
	// PromptHashes), nil when hashes is the request's own.
	lender *PromptHashes
}

// PromptHashes remembers the block hashes of a token sequence that only
// grows, a conversation's history resent with every turn, so that a
// replica hashes only the full blocks a prompt adds to the ones hashed
// before, as vLLM's request_block_hasher would compute them again. The
// caller promises that every prompt it is given to starts with the tokens
// of the earlier ones and, once one of them completed, with all the
// tokens that request generated (the next turn resends the response); the
// hashes are of those tokens. It holds the hashes of one block size and
// adapter at a time, the latest asked for. The zero value is empty.
//
// A request borrows the array of the PromptHashes for its hashes instead
// of copying them (Request.lender, lentTo), and appends the hashes of its
// prompt's new blocks and of its generated blocks there, which are what
// the PromptHashes learns next; the conversation's next turn borrows the
// same array and appends past them. Sharing instead of copying a
// conversation's hashes into every turn's request and back, with the
// fleet's reuse of histories, took (e) from 42.2 M to 36.0 M misses of a
// 1 MiB L2, the histories 3 M of them (BENCHMARKS.md, "Replica-model
// speed work, fifth round").
//
// The block runs view these arrays (hashRun.hashes), and a request keeps
// reading its own, so one rule keeps every view true: a hash array is only
// appended to; the request currently borrowing it (lentTo) appends past
// its own length, and anyone else writes to it only above the longest
// length any borrower reached; a writer that cannot keep to that copies
// first. So the PromptHashes takes a copy of its own before writing while
// a request borrows its array (own); it moves to a copy when a borrower
// lets go having hashed blocks it never learned, an aborted turn
// (unshareHashes); and a prompt shorter than what it knows gets an array
// of its own (Replica.prepareHashes).
type PromptHashes struct {
	blockSize int
	key       uint64
	hashes    []uint64
	lentTo    *Request
}

// own makes the hashes the PromptHashes' own again, copying them if a
// request appends to their array.
func (m *PromptHashes) own() {
	if m.lentTo != nil {
		m.hashes = slices.Clone(m.hashes)
		m.lentTo = nil
	}
}

// unshareHashes lets go of the array req borrowed from a PromptHashes:
// req's hashes start again empty. If req hashed blocks the PromptHashes
// did not learn (it was aborted), the PromptHashes moves to a copy: the
// block runs may view those hashes, so nothing writes over them.
func unshareHashes(req *Request) {
	if m := req.lender; m != nil {
		if m.lentTo == req {
			m.lentTo = nil
			if len(req.hashes) > len(m.hashes) {
				m.hashes = slices.Clone(m.hashes)
			}
		}
		req.lender, req.hashes = nil, nil
	}
}

type requestState uint8

const (
	stateNew requestState = iota
	stateWaiting
	stateRunning
	stateDone
	stateAborted
)

// Done reports whether the request has generated all its tokens.
func (r *Request) Done() bool { return r.state == stateDone }

// TTFT is the time from arrival to the first token.
func (r *Request) TTFT() time.Duration { return r.FirstTokenAt - r.Arrival }

// TPOT is the mean time between output tokens after the first (0 when the
// request generated at most one token).
func (r *Request) TPOT() time.Duration {
	if r.Generated < 2 {
		return 0
	}
	return (r.LastTokenAt - r.FirstTokenAt) / time.Duration(r.Generated-1)
}

// Latency is the end-to-end time of a completed request.
func (r *Request) Latency() time.Duration { return r.CompletedAt - r.Arrival }

// Counters are cumulative totals since the replica was created.
//
// The prefix-cache counters follow vllm/v1/metrics/stats.py
// (PrefixCacheStats.record, called at admission): a request scheduled from
// the waiting queue adds its tokens (prompt plus generated so far) to the
// queries and its cached prefix to the hits; lookups by requests that were
// preempted before go to the Preempted fields instead.
type Counters struct {
	Steps int64
	// BusyTime is the summed duration of all steps.
	BusyTime time.Duration
	// PromptTokens counts prompt tokens of requests whose prefill finished
	// (once per request, as vllm:prompt_tokens_total); PrefillTokens counts
	// every prefill token computed, recomputation after preemption included.
	PromptTokens     int64
	PrefillTokens    int64
	GenerationTokens int64
	Completed        int64
	Aborted          int64
	Preemptions      int64
	AdapterLoads     int64
	// PrefixQueries and PrefixHits are in tokens
	// (vllm:prefix_cache_queries, vllm:prefix_cache_hits).
	PrefixQueries          int64
	PrefixHits             int64
	PreemptedPrefixQueries int64
	PreemptedPrefixHits    int64
}

// Metrics is the replica state as vLLM's /metrics would show it now.
type Metrics struct {
	Waiting int
	Running int
	// KVCacheUsage is the fraction of KV blocks in use, 0..1.
	KVCacheUsage float64
	// RunningAdapters are the distinct adapters of running requests,
	// WaitingAdapters those of waiting requests (sorted; an adapter may be in
	// both, as in newer vLLM).
	RunningAdapters []string
	WaitingAdapters []string
	MaxLoRAs        int
	BlockSize       int
	KVBlocksTotal   int
	KVBlocksUsed    int
	// PrefixCaching says whether automatic prefix caching is on;
	// KVBlocksCached counts blocks that hold a cached full block (in use or
	// free, evictable).
	PrefixCaching  bool
	KVBlocksCached int
	Counters
}

type adapterState struct {
	name string
	key  uint64 // extra key of its block hashes
	// queue holds this adapter's waiting requests in FCFS order.
	queue        requestDeque
	running      int   // running requests using it
	resident     bool  // loaded in a GPU slot
	lastUsed     int64 // step index of the last batch that used it
	batchMark    int64 // step index of the batch being assembled
	inCPU        bool
	cpuLastTouch int64
}

// Replica is the discrete-time model of one vLLM V1 engine: continuous
// batching with chunked prefill, paged KV cache with automatic prefix
// caching, recompute preemption, and LoRA slots. It has no goroutines and no
// clock of its own: time moves only through Submit and Advance. It is not
// safe for concurrent use.
//
// The scheduling follows vllm/v1/core/sched/scheduler.py (schedule()):
// running requests first, in order, each taking min(remaining, budget)
// tokens; when a running request cannot get KV blocks the most recently
// admitted running request is preempted (its KV freed, recomputed later from
// the front of the waiting queue); waiting requests are admitted FCFS only
// when nothing was preempted in the step, while fewer than MaxNumSeqs run,
// budget is left and KV blocks are free. The adapters of the requests
// scheduled so far in the step are the batch's LoRA set (scheduled_loras); a
// waiting request for another adapter when MaxLoRAs are in it is skipped
// under LoRASkip (vLLM's rule) or stops admission under LoRAFIFO.
//
// Prefix caching follows vllm/v1/core/kv_cache_manager.py
// (get_computed_blocks, allocate_slots) and
// vllm/v1/core/single_type_kv_cache_manager.py (find_longest_cache_hit,
// get_num_blocks_to_allocate, free), over the block pool of kvcache.go: a
// request taken from the waiting queue looks up the longest run of its
// leading full blocks in the cache, at most (tokens−1)/BlockSize blocks so
// that the last token is always computed; the hit blocks join its block
// table without prefill and without new blocks (a hit block sitting in the
// free queue still uses up a free block); the step prices only the tokens
// after the hit; once scheduled, every block that the step fills is
// registered in the cache, so later requests, even in the same step, hit
// it. A preempted request frees its blocks and on resuming looks them up
// again, recomputing only what was evicted meanwhile.
type Replica struct {
	cfg         ReplicaConfig
	totalBlocks int
	pool        blockPool

	running    []*Request
	adapters   []adapterState // index = adapter id; 0 is the base model
	adapterIDs map[string]int
	// byName lists the adapter ids but the base model's, sorted by name,
	// so that Metrics lists adapters in order without sorting them (the
	// fleet benchmark reads every replica's Metrics at every scrape).
	byName []int
	// waitingCount counts waiting requests; waitingPrefill estimates their
	// prefill tokens (see Load).
	waitingCount   int
	waitingPrefill int
	residentCount  int
	cpuCount       int

	nextOrder   int64 // FCFS order of arrivals, increasing from 1
	preemptSeq  int64 // preempted requests go first: order -1, -2, ...
	saltSeq     uint64
	clock       time.Duration
	busy        bool
	stepEnd     time.Duration
	stepIndex   int64
	batchIDs    []int
	pending     []*Request
	out         []*Request
	firsts      []*Request
	firstsOut   []*Request
	stats       Counters
	blockTokens int
	hitScratch  []int32
	tokScratch  []uint32
	slices      slicePool
}

// NewReplica returns an idle replica, or the configuration error.
func NewReplica(cfg ReplicaConfig) (*Replica, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	blocks := cfg.KVCapacityTokens / cfg.BlockSize
	r := &Replica{
		cfg:         cfg,
		totalBlocks: blocks,
		pool:        newBlockPool(blocks, cfg.EnablePrefixCaching),
		adapterIDs:  map[string]int{"": 0},
		adapters:    []adapterState{{name: ""}},
		running:     make([]*Request, 0, cfg.MaxNumSeqs),
		blockTokens: cfg.BlockSize,
		tokScratch:  make([]uint32, cfg.BlockSize),
	}
	return r, nil
}

// Config returns the configuration the replica was built with.
func (r *Replica) Config() ReplicaConfig { return r.cfg }

// Now is the replica clock: the latest time passed to Submit or Advance.
func (r *Replica) Now() time.Duration { return r.clock }

func (r *Replica) validate(req *Request) error {
	if req.PromptTokens < 1 || req.OutputTokens < 1 {
		return fmt.Errorf("%w: prompt %d and output %d tokens must both be at least 1", ErrInvalidRequest, req.PromptTokens, req.OutputTokens)
	}
	if req.Prompt != nil && len(req.Prompt) != req.PromptTokens {
		return fmt.Errorf("%w: %d prompt token ids for PromptTokens %d", ErrInvalidRequest, len(req.Prompt), req.PromptTokens)
	}
	if req.PromptTokens+req.OutputTokens > r.cfg.MaxModelLen {
		return fmt.Errorf("%w: %d prompt + %d output tokens > %d", ErrTooLong, req.PromptTokens, req.OutputTokens, r.cfg.MaxModelLen)
	}
	if req.Adapter != "" && r.cfg.MaxLoRAs == 0 {
		return fmt.Errorf("%w: adapter %q", ErrLoRADisabled, req.Adapter)
	}
	return nil
}

// Submit queues req at time now. It first advances the replica to now, so
// completions up to now are buffered and returned by the next Advance. If
// the replica was idle a step starts at now; otherwise req joins the waiting
// queue and is considered when the step in progress ends.
func (r *Replica) Submit(req *Request, now time.Duration) error {
	if now < r.clock {
		return fmt.Errorf("%w: submit at %v, clock at %v", ErrClockBackwards, now, r.clock)
	}
	if req.state != stateNew {
		return ErrAlreadySubmited
	}
	if err := r.validate(req); err != nil {
		return err
	}
	r.advance(now)
	id, ok := r.adapterIDs[req.Adapter]
	if !ok {
		id = len(r.adapters)
		r.adapterIDs[req.Adapter] = id
		r.adapters = append(r.adapters, adapterState{name: req.Adapter, key: adapterKey(req.Adapter), lastUsed: -1})
		at, _ := slices.BinarySearchFunc(r.byName, req.Adapter, func(id int, name string) int { return strings.Compare(r.adapters[id].name, name) })
		r.byName = slices.Insert(r.byName, at, id)
	}
	req.adapterID = int32(id)
	req.Arrival = now
	req.numTokens = int32(req.PromptTokens)
	req.computed, req.sched, req.Generated, req.CachedTokens = 0, 0, 0, 0
	req.table, req.tableTokens, req.scheduled = r.slices.table(r.blocksFor(req.PromptTokens+req.OutputTokens)), 0, false
	r.setCachedBlocks(req, 0)
	req.expectHit = 0
	req.run, req.hashRun = noRun, noRun
	req.hashAt = noTokens
	if r.cfg.EnablePrefixCaching {
		r.prepareHashes(req)
		if req.salt == 0 {
			req.hashAt = int32((len(req.hashes) + 1) * r.blockTokens)
		}
		if req.hitFor == r && req.hitStep == r.stepIndex {
			req.expectHit = req.hitBlocksSeen // CachedPrefixTokens looked since the last step
		}
	}
	r.nextOrder++
	req.order = r.nextOrder
	req.state = stateWaiting
	r.adapters[id].queue.pushBack(req)
	r.waitingCount++
	r.waitingPrefill += int(req.numTokens) - req.expectHit*r.blockTokens
	if !r.busy {
		r.startStep(now)
	}
	return nil
}

// prepareHashes computes the block hashes of req's full prompt blocks (vLLM
// hashes a request's blocks when it is created) and keeps the prompt's last
// partial block for hashing the first generated block. A request without
// token ids gets a unique salt instead (see blockPool.releaseRun).
func (r *Replica) prepareHashes(req *Request) {
	bs := r.blockTokens
	if req.hashBlock == bs && (req.salt != 0 || (req.Prompt != nil && len(req.hashes) == req.PromptTokens/bs)) {
		return // done by CachedPrefixTokens before Submit
	}
	unshareHashes(req)
	req.hashBlock = bs
	if req.Prompt == nil {
		r.saltSeq++
		req.salt = fmix64(r.saltSeq) | 1
		return
	}
	full := req.PromptTokens / bs
	req.salt = 0
	req.loraKey = adapterKey(req.Adapter)
	total := (req.PromptTokens + req.OutputTokens) / bs
	parent := noneHash
	m := req.Hashes
	if m != nil {
		m.own()
		if m.blockSize != bs || m.key != req.loraKey {
			m.blockSize, m.key, m.hashes = bs, req.loraKey, nil // runs may view the old list
		}
	}
	if m != nil && len(m.hashes) <= full {
		if cap(m.hashes) < total {
			m.hashes = append(make([]uint64, 0, max(total, 2*cap(m.hashes))), m.hashes...)
		}
		req.hashes, req.lender, m.lentTo = m.hashes, m, req
		if len(m.hashes) > 0 {
			parent = m.hashes[len(m.hashes)-1]
		}
	} else {
		req.hashes = make([]uint64, 0, total) // never reused: runs view it
		if m != nil {
			req.hashes = append(req.hashes, m.hashes[:full]...)
			if full > 0 {
				parent = m.hashes[full-1]
			}
		}
	}
	for i := len(req.hashes); i < full; i++ {
		parent = hashBlock(parent, req.loraKey, req.Prompt[i*bs:(i+1)*bs])
		req.hashes = append(req.hashes, parent)
	}
	if m != nil && full > len(m.hashes) {
		m.hashes = req.hashes[:full] // the array they share
	}
	req.lastHash = parent
	req.tail = append(req.tail[:0], req.Prompt[full*bs:]...)
}

// rememberHashes adds the hashes of a completed request's generated full
// blocks to its PromptHashes: the prompt that extends this one starts with
// its response too (a conversation's next turn).
func (r *Replica) rememberHashes(s *Request) {
	if m := s.Hashes; m != nil && s.salt == 0 && m.blockSize == r.blockTokens && m.key == s.loraKey && len(m.hashes) <= len(s.hashes) {
		if m.lentTo == s {
			m.hashes = s.hashes // in the array they share
			return
		}
		m.own()
		m.hashes = append(m.hashes, s.hashes[len(m.hashes):]...)
	}
}

// appendBlockHash hashes the request's next full block once its last token
// exists: the prompt's tail followed by generated tokens.
func (r *Replica) appendBlockHash(s *Request) {
	if s.salt != 0 {
		return // its blocks are counted in runs, not hashed
	}
	bs := r.blockTokens
	start := len(s.hashes) * bs
	var h uint64
	if start >= s.PromptTokens {
		h = hashOutputBlock(s.lastHash, s.loraKey, s.OutputSeed, start-s.PromptTokens, bs)
	} else {
		buf := r.tokScratch[:bs]
		tailStart := s.PromptTokens - len(s.tail)
		for k := range buf {
			if p := start + k; p < s.PromptTokens {
				buf[k] = s.tail[p-tailStart]
			} else {
				buf[k] = OutputToken(s.OutputSeed, p-s.PromptTokens)
			}
		}
		h = hashBlock(s.lastHash, s.loraKey, buf)
	}
	s.hashes = append(s.hashes, h)
	s.lastHash = h
}

// longestHit appends to dst the cached blocks of the longest leading run of
// the request's blocks, at most maxBlocks (find_longest_cache_hit for full
// attention: left to right, stopping at the first miss).
func (r *Replica) longestHit(s *Request, maxBlocks int, dst []int32) []int32 {
	if !r.cfg.EnablePrefixCaching {
		return dst
	}
	if s.salt != 0 {
		for range r.pool.runHits(s.run, s.salt, maxBlocks) {
			dst = append(dst, noBlock) // its table only counts blocks
		}
		return dst
	}
	r.pool.lookup(s.hashes, maxBlocks, &dst)
	return dst
}

// hitBlocks is len(longestHit(...)) without collecting the blocks.
func (r *Replica) hitBlocks(s *Request, maxBlocks int) int {
	if !r.cfg.EnablePrefixCaching {
		return 0
	}
	if s.salt != 0 {
		return r.pool.runHits(s.run, s.salt, maxBlocks)
	}
	return r.pool.lookup(s.hashes, maxBlocks, nil)
}

// CachedPrefixTokens is how many of req's prompt tokens the replica's prefix
// cache holds now: what a request not yet submitted would find if it were
// scheduled at once. It reads the true cache, for the fleet benchmark's
// oracle; req must carry Prompt (a prompt without token ids shares nothing).
// It computes req's block hashes once for all replicas of one block size.
func (r *Replica) CachedPrefixTokens(req *Request) int {
	if !r.cfg.EnablePrefixCaching || req.state != stateNew || req.PromptTokens < 1 || len(req.Prompt) != req.PromptTokens {
		return 0
	}
	r.prepareHashes(req)
	n := r.hitBlocks(req, (req.PromptTokens-1)/r.blockTokens)
	req.hitFor, req.hitStep, req.hitBlocksSeen = r, r.stepIndex, n
	return n * r.blockTokens
}

// NextEventTime is the end of the step in progress, when the next tokens and
// completions happen; ok is false when the replica is idle.
func (r *Replica) NextEventTime() (t time.Duration, ok bool) {
	return r.stepEnd, r.busy
}

// Advance runs every step that ends at or before to and moves the clock to
// to. It returns the requests that completed since the previous Advance (in
// completion order, including those completed during Submit calls). The
// slice is reused: it is valid until the next call to Advance. FirstTokens
// then lists the requests that sampled their first token in the same span.
func (r *Replica) Advance(to time.Duration) []*Request {
	if to > r.clock {
		r.advance(to)
	}
	r.out, r.pending = r.pending, r.out[:0]
	r.firstsOut, r.firsts = r.firsts, r.firstsOut[:0]
	return r.out
}

// FirstTokens lists the requests whose first token was sampled in the span
// the last Advance covered (the end of their prefill: when the first
// streamed chunk leaves), in order. Valid until the next Advance.
func (r *Replica) FirstTokens() []*Request { return r.firstsOut }

func (r *Replica) advance(to time.Duration) {
	for r.busy && r.stepEnd <= to {
		end := r.stepEnd
		r.finishStep(end)
		r.startStep(end)
	}
	if to > r.clock {
		r.clock = to
	}
}

// Abort removes a request that has not completed (a client disconnect in
// vLLM), freeing its KV blocks. It reports whether the request was found.
// Tokens of the step in progress that belonged to it are simply discarded.
func (r *Replica) Abort(req *Request, now time.Duration) (bool, error) {
	if now < r.clock {
		return false, fmt.Errorf("%w: abort at %v, clock at %v", ErrClockBackwards, now, r.clock)
	}
	r.advance(now)
	switch req.state {
	case stateWaiting:
		r.adapters[req.adapterID].queue.remove(req)
		r.waitingCount--
		r.waitingPrefill -= int(req.numTokens) - req.expectHit*r.blockTokens
	case stateRunning:
		for i, s := range r.running {
			if s == req {
				copy(r.running[i:], r.running[i+1:])
				r.running[len(r.running)-1] = nil
				r.running = r.running[:len(r.running)-1]
				break
			}
		}
		r.releaseRunning(req)
	default:
		return false, nil
	}
	req.state = stateAborted
	r.dropSlices(req)
	r.stats.Aborted++
	return true, nil
}

// Metrics returns the current gauges and counters.
func (r *Replica) Metrics() Metrics {
	used := r.totalBlocks - r.pool.free
	m := Metrics{
		Waiting:        r.waitingCount,
		Running:        len(r.running),
		KVCacheUsage:   float64(used) / float64(r.totalBlocks),
		MaxLoRAs:       r.cfg.MaxLoRAs,
		BlockSize:      r.cfg.BlockSize,
		KVBlocksTotal:  r.totalBlocks,
		KVBlocksUsed:   used,
		PrefixCaching:  r.cfg.EnablePrefixCaching,
		KVBlocksCached: r.pool.hashed,
		Counters:       r.stats,
	}
	for _, id := range r.byName {
		a := &r.adapters[id]
		if a.running > 0 {
			m.RunningAdapters = append(m.RunningAdapters, a.name)
		}
		if a.queue.len() > 0 {
			m.WaitingAdapters = append(m.WaitingAdapters, a.name)
		}
	}
	return m
}

// Load is a replica's true state as only a router with perfect knowledge
// could read it (the fleet benchmark's oracle); vLLM exposes none of it
// beyond the queue lengths.
type Load struct {
	Waiting, Running int
	// PendingPrefillTokens are prefill tokens not yet computed: the rest of
	// the running requests' prompts, plus the waiting requests' tokens less
	// what the prefix cache held for them when they arrived (when
	// CachedPrefixTokens was asked about them then, as the oracle does).
	PendingPrefillTokens int
	// DecodingSeqs and DecodeContextTokens are D and ΣL of the step-time
	// formula for the running requests past their prefill.
	DecodingSeqs, DecodeContextTokens int
	FreeBlocks, TotalBlocks           int
	// RunningAdapters counts distinct adapters with running requests.
	RunningAdapters int
}

// Load returns the replica's true state now.
func (r *Replica) Load() Load {
	l := Load{Waiting: r.waitingCount, Running: len(r.running), PendingPrefillTokens: r.waitingPrefill,
		FreeBlocks: r.pool.free, TotalBlocks: r.totalBlocks}
	for _, s := range r.running {
		if left := int(s.numTokens - s.computed); left > 1 || s.Generated == 0 {
			l.PendingPrefillTokens += left
		} else {
			l.DecodingSeqs++
			l.DecodeContextTokens += int(s.numTokens)
		}
	}
	for i := 1; i < len(r.adapters); i++ {
		if r.adapters[i].running > 0 {
			l.RunningAdapters++
		}
	}
	return l
}

// AdapterRequests returns how many running and waiting requests use the
// adapter ("" is the base model).
func (r *Replica) AdapterRequests(name string) (running, waiting int) {
	id, ok := r.adapterIDs[name]
	if !ok {
		return 0, 0
	}
	return r.adapters[id].running, r.adapters[id].queue.len()
}

// ResidentAdapters lists the adapters loaded in GPU slots, sorted.
func (r *Replica) ResidentAdapters() []string {
	var names []string
	for _, id := range r.byName {
		if r.adapters[id].resident {
			names = append(names, r.adapters[id].name)
		}
	}
	return names
}

func (r *Replica) blocksFor(tokens int) int {
	return (tokens + r.blockTokens - 1) / r.blockTokens
}

// startStep schedules the next step at time now (vLLM Scheduler.schedule)
// and prices it; with nothing to run the replica goes idle.
func (r *Replica) startStep(now time.Duration) {
	r.stepIndex++
	budget := r.cfg.MaxNumBatchedTokens
	prefill, decodeSeqs, sumContext := 0, 0, 0
	preempted := false
	r.batchIDs = r.batchIDs[:0]

	// Running requests first, in admission order.
	for i := 0; i < len(r.running) && budget > 0; {
		// Decode steps that need no new block and fill none, most of a
		// step's requests every step: what the general case below does
		// for them, without its branches, in a loop over the list as it
		// is (only the general case changes it).
		for running := r.running; i < len(running) && budget > 0; i++ {
			s := running[i]
			if end := s.computed + 1; end != s.numTokens || s.Generated == 0 || end > s.tableTokens || end >= s.cacheAt {
				break
			}
			r.batch(s, 1)
			budget--
			decodeSeqs++
			sumContext += int(s.numTokens)
		}
		if i == len(r.running) || budget == 0 {
			break
		}
		s := r.running[i]
		n := min(int(s.numTokens-s.computed), budget)
		end := int(s.computed) + n
		need := 0
		if end > int(s.tableTokens) {
			need = r.blocksFor(end) - len(s.table)
		}
		for need > r.pool.free {
			// Preempt the most recently admitted request (FCFS policy).
			victim := r.running[len(r.running)-1]
			r.running[len(r.running)-1] = nil
			r.running = r.running[:len(r.running)-1]
			r.preempt(victim)
			preempted = true
			if victim == s {
				break
			}
		}
		if s.state != stateRunning {
			break // s preempted itself: nothing more can run
		}
		if need > 0 {
			r.setTable(s, r.pool.allocate(need, s.table, r.cursorOf(s)))
		}
		if end >= int(s.cacheAt) {
			r.cacheFullBlocks(s, end)
		}
		r.batch(s, n)
		budget -= n
		if s.Generated > 0 && n == 1 && end == int(s.numTokens) {
			decodeSeqs++
			sumContext += int(s.numTokens)
		} else {
			prefill += n
		}
		i++
	}

	// Then waiting requests, unless this step preempted.
	if !preempted {
		for budget > 0 && len(r.running) < r.cfg.MaxNumSeqs && r.waitingCount > 0 {
			id := r.nextAdmissible()
			if id < 0 {
				break // every waiting request needs an adapter without a slot
			}
			a := &r.adapters[id]
			s := a.queue.front()
			hit := r.longestHit(s, int(s.numTokens-1)/r.blockTokens, r.hitScratch[:0])
			r.hitScratch = hit
			computed := len(hit) * r.blockTokens
			n := min(int(s.numTokens)-computed, budget)
			newBlocks := r.blocksFor(computed+n) - len(hit)
			evictable := len(hit) // a run's blocks are all free
			if s.salt == 0 {
				evictable = r.pool.evictable(hit)
			}
			if newBlocks+evictable > r.pool.free {
				break // FCFS: no KV for the head request, admit nothing more
			}
			a.queue.popFront()
			r.waitingCount--
			r.waitingPrefill -= int(s.numTokens) - s.expectHit*r.blockTokens
			s.state = stateRunning
			a.running++
			r.running = append(r.running, s)
			if s.salt != 0 {
				r.pool.takeRun(s.run, len(hit))
				s.run = noRun
			} else {
				r.pool.touch(hit)
			}
			r.setTable(s, r.pool.allocate(newBlocks, append(s.table[:0], hit...), r.cursorOf(s)))
			s.computed = int32(computed)
			s.taggedBlocks = len(hit)
			if r.cfg.EnablePrefixCaching {
				if s.Preemptions > 0 {
					r.stats.PreemptedPrefixQueries += int64(s.numTokens)
					r.stats.PreemptedPrefixHits += int64(computed)
				} else {
					r.stats.PrefixQueries += int64(s.numTokens)
					r.stats.PrefixHits += int64(computed)
				}
			}
			if !s.scheduled {
				s.scheduled, s.CachedTokens = true, computed
			}
			r.cacheFullBlocks(s, computed+n)
			r.batch(s, n)
			budget -= n
			prefill += n
		}
	}

	if prefill == 0 && decodeSeqs == 0 {
		r.busy = false
		return
	}
	us := r.cfg.Profile.stepMicros(prefill, decodeSeqs, sumContext)
	if distinct := len(r.batchIDs); distinct > 0 {
		us *= 1 + r.cfg.LoRASlowdownPerAdapter*float64(distinct)
	}
	d := micros(us) + r.loadBatchAdapters()
	r.stats.Steps++
	r.stats.BusyTime += d
	r.stats.PrefillTokens += int64(prefill)
	r.busy = true
	r.stepEnd = now + d
}

// cacheFullBlocks registers the request's blocks that are full once its
// first tokens are computed (allocate_slots caches them at scheduling).
func (r *Replica) cacheFullBlocks(s *Request, tokens int) {
	if tokens < int(s.cacheAt) {
		return // also when prefix caching is off
	}
	full := tokens / r.blockTokens
	if s.salt != 0 {
		// Only the owner can hit these blocks, and only once it has freed
		// them: they are counted as cached now and enter a run of the
		// free queue when freed (releaseRunning).
		if from := max(s.cachedBlocks, s.taggedBlocks); full > from {
			r.pool.hashed += full - from
		}
	} else {
		// The blocks it found cached at admission keep their hashes.
		full = min(full, len(s.hashes))
		if from := max(s.cachedBlocks, s.taggedBlocks); full > from {
			r.pool.cacheBlocks(s.table[from:full], s.hashes, from, &s.hashRun, r.blocksFor(s.PromptTokens+s.OutputTokens)-from)
		}
	}
	r.setCachedBlocks(s, max(s.cachedBlocks, full))
}

// setCachedBlocks records that the leading n blocks of s.table are in the
// cache.
func (r *Replica) setCachedBlocks(s *Request, n int) {
	s.cachedBlocks = n
	s.cacheAt = noTokens
	if r.cfg.EnablePrefixCaching {
		s.cacheAt = int32((n + 1) * r.blockTokens)
	}
}

// cursorOf is where s takes the records of its new blocks: nil for a
// request without token ids, whose table only counts its blocks.
func (r *Replica) cursorOf(s *Request) *recordCursor {
	if s.salt != 0 {
		return nil
	}
	return &s.records
}

// setTable sets the block table of a request taking blocks.
func (r *Replica) setTable(s *Request, table []int32) {
	s.table = table
	s.tableTokens = int32(len(table) * r.blockTokens)
}

// noTokens is a token count no request reaches.
const noTokens = math.MaxInt32

// batch puts n tokens of s into the step being scheduled: its share of
// the step and its adapter's place in the batch (the step's token counts
// are the caller's).
func (r *Replica) batch(s *Request, n int) {
	s.sched = int32(n)
	if s.adapterID != 0 {
		r.markBatchAdapter(int(s.adapterID))
	}
}

// markBatchAdapter records that the batch being assembled uses adapter id.
func (r *Replica) markBatchAdapter(id int) {
	if id == 0 {
		return
	}
	a := &r.adapters[id]
	if a.batchMark != r.stepIndex {
		a.batchMark = r.stepIndex
		r.batchIDs = append(r.batchIDs, id)
	}
}

// nextAdmissible returns the adapter id whose queue head is the waiting
// request to consider next, or -1. Under LoRASkip that is the earliest
// waiting request the LoRA limit lets into this step's batch: with MaxLoRAs
// adapters scheduled, only the base model and those adapters qualify, and
// the others stay queued without blocking them. Under LoRAFIFO it is the
// earliest waiting request, or none if its adapter does not fit.
func (r *Replica) nextAdmissible() int {
	full := len(r.batchIDs) >= r.cfg.MaxLoRAs
	fifo := r.cfg.LoRAAdmission == LoRAFIFO
	best := -1
	var bestOrder int64
	bestFits := false
	for id := range r.adapters {
		a := &r.adapters[id]
		if a.queue.len() == 0 {
			continue
		}
		fits := id == 0 || !full || a.batchMark == r.stepIndex
		if !fits && !fifo {
			continue
		}
		if o := a.queue.front().order; best < 0 || o < bestOrder {
			best, bestOrder, bestFits = id, o, fits
		}
	}
	if !bestFits {
		return -1
	}
	return best
}

// preempt frees a running request's KV and puts it at the front of the
// waiting queue to be recomputed (vLLM _preempt_request).
func (r *Replica) preempt(s *Request) {
	r.releaseRunning(s)
	s.computed = 0
	s.sched = 0
	s.Preemptions++
	r.stats.Preemptions++
	r.preemptSeq--
	s.order = r.preemptSeq
	s.state = stateWaiting
	s.expectHit = 0
	r.adapters[s.adapterID].queue.pushFront(s)
	r.waitingCount++
	r.waitingPrefill += int(s.numTokens)
}

// dropSlices returns a finished request's block table to the replica's
// slice pool: it is what a long run would otherwise allocate per request.
func (r *Replica) dropSlices(s *Request) {
	r.slices.putTable(s.table)
	unshareHashes(s)
	s.table, s.hashes, s.tail = nil, nil, nil
}

// releaseRunning frees the KV of a request leaving the running list, tail
// block first. A request without token ids keeps the run of its cached
// blocks, to find them when it resumes.
func (r *Replica) releaseRunning(s *Request) {
	if s.salt != 0 {
		s.run = r.pool.releaseRun(s.salt, len(s.table), s.cachedBlocks)
		s.taggedBlocks = 0
	} else {
		r.pool.release(s.table)
		r.pool.dropCursor(&s.records)
		r.pool.closeHashRun(&s.hashRun)
	}
	s.table = s.table[:0]
	s.tableTokens = 0
	r.setCachedBlocks(s, 0)
	r.adapters[s.adapterID].running--
}

// loadBatchAdapters brings the batch's adapters into GPU slots, evicting the
// least recently used adapters the batch does not use, and returns the time
// the loads add to the step.
func (r *Replica) loadBatchAdapters() time.Duration {
	var total time.Duration
	lc := r.cfg.AdapterLoad
	for _, id := range r.batchIDs {
		a := &r.adapters[id]
		a.lastUsed = r.stepIndex
		if a.resident {
			continue
		}
		if r.residentCount >= r.cfg.MaxLoRAs {
			r.evictGPU()
		}
		a.resident = true
		r.residentCount++
		r.stats.AdapterLoads++
		total += lc.Base
		if lc.SizeBytes > 0 {
			total += micros(float64(lc.SizeBytes) / lc.BytesPerMicrosecond)
		}
		if !a.inCPU {
			if lc.MaxCPUAdapters > 0 && r.cpuCount >= lc.MaxCPUAdapters {
				r.evictCPU()
			}
			a.inCPU = true
			r.cpuCount++
			total += lc.DiskLoad
		}
		a.cpuLastTouch = r.stepIndex
	}
	return total
}

func (r *Replica) evictGPU() {
	victim := -1
	for id := 1; id < len(r.adapters); id++ {
		a := &r.adapters[id]
		if a.resident && a.batchMark != r.stepIndex && (victim < 0 || a.lastUsed < r.adapters[victim].lastUsed) {
			victim = id
		}
	}
	if victim < 0 {
		// Unreachable: a batch never has more than MaxLoRAs adapters.
		panic("vllmsim: no GPU adapter slot to evict")
	}
	r.adapters[victim].resident = false
	r.residentCount--
}

func (r *Replica) evictCPU() {
	victim := -1
	for id := 1; id < len(r.adapters); id++ {
		a := &r.adapters[id]
		if a.inCPU && !a.resident && (victim < 0 || a.cpuLastTouch < r.adapters[victim].cpuLastTouch) {
			victim = id
		}
	}
	if victim >= 0 {
		r.adapters[victim].inCPU = false
		r.cpuCount--
	}
}

// finishStep applies the step that ends at end: scheduled tokens become
// computed; a request whose KV caught up with its tokens samples one token;
// a request that reached OutputTokens completes and frees its KV.
func (r *Replica) finishStep(end time.Duration) {
	kept := r.running[:0]
	for i, s := range r.running {
		if s.sched > 0 {
			s.computed += s.sched
			s.sched = 0
			if s.computed == s.numTokens {
				if s.Generated == 0 {
					r.stats.PromptTokens += int64(s.PromptTokens)
				}
				s.Generated++
				s.numTokens++
				r.stats.GenerationTokens++
				if s.Generated == 1 {
					s.FirstTokenAt = end
					r.firsts = append(r.firsts, s)
				}
				s.LastTokenAt = end
				if s.Generated >= s.OutputTokens {
					s.CompletedAt = end
					s.state = stateDone
					r.rememberHashes(s)
					r.releaseRunning(s)
					r.dropSlices(s)
					r.stats.Completed++
					r.pending = append(r.pending, s)
					continue
				}
				if s.numTokens == s.hashAt {
					r.appendBlockHash(s) // the new token filled a block
					s.hashAt += int32(r.blockTokens)
				}
			}
		}
		if len(kept) != i {
			r.running[len(kept)] = s // behind a request that completed
		}
		kept = kept[:len(kept)+1]
	}
	for i := len(kept); i < len(r.running); i++ {
		r.running[i] = nil
	}
	r.running = kept
}
