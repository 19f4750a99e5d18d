package vllmsim

import (
	"errors"
	"fmt"
	"sort"
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
	// MaxModelLen bounds prompt+output of one request.
	MaxModelLen int
	// MaxLoRAs is the number of adapters one batch may use (vLLM max_loras).
	// Zero disables LoRA: Submit rejects requests naming an adapter.
	MaxLoRAs int
	// LoRASlowdownPerAdapter: a step with A distinct adapters takes
	// ×(1 + LoRASlowdownPerAdapter·A) (BLIS defaults, from arXiv 2508.08343).
	LoRASlowdownPerAdapter float64
	AdapterLoad            AdapterLoadConfig
}

// AdapterLoadConfig prices bringing an adapter into one of the MaxLoRAs GPU
// slots (SIM-PARAMS.md: ≈1.5 ms + size/2 MB per µs from CPU memory, 0.1–1 s
// from disk). The load runs inside the step that first needs the adapter, as
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

// DefaultReplicaConfig returns the SIM-PARAMS.md defaults for a profile:
// max_num_seqs 256, 2048 tokens per step, block size 16, the profile's KV
// capacity and max_model_len, no LoRA (set MaxLoRAs to enable it), slowdown
// 0.02 per adapter, and a 32 MiB adapter (rank 16 on q,k,v,o of a 7B model)
// loaded from CPU memory in 1.5 ms + size / 2 MB per µs.
func DefaultReplicaConfig(p Profile) ReplicaConfig {
	return ReplicaConfig{
		Profile:                p,
		MaxNumSeqs:             256,
		MaxNumBatchedTokens:    2048,
		KVCapacityTokens:       p.KVCapacityTokens,
		BlockSize:              16,
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
	// ID is for the caller; the replica does not read it.
	ID uint64
	// Adapter names the LoRA adapter, "" for the base model.
	Adapter      string
	PromptTokens int
	// OutputTokens is how many tokens the request generates (the simulated
	// generation always runs to this length, like ignore_eos).
	OutputTokens int

	// Arrival is the Submit time.
	Arrival time.Duration
	// FirstTokenAt and LastTokenAt are the ends of the steps that sampled the
	// first and the latest token; Generated counts sampled tokens.
	FirstTokenAt time.Duration
	LastTokenAt  time.Duration
	Generated    int
	// CompletedAt is set when Generated reaches OutputTokens (then it equals
	// LastTokenAt).
	CompletedAt time.Duration
	// Preemptions counts how often the request lost its KV cache.
	Preemptions int

	adapterID int
	numTokens int // prompt + generated: the tokens whose KV must exist
	computed  int // tokens whose KV is computed
	blocks    int // KV blocks held
	sched     int // tokens scheduled in the step in progress
	order     int64
	state     requestState
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
	Counters
}

type adapterState struct {
	name string
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
// batching with chunked prefill, paged KV cache, recompute preemption, and
// LoRA slots. It has no goroutines and no clock of its own: time moves only
// through Submit and Advance. It is not safe for concurrent use.
//
// The scheduling follows vllm/v1/core/sched/scheduler.py (schedule()):
// running requests first, in order, each taking min(remaining, budget)
// tokens; when a running request cannot get KV blocks the most recently
// admitted running request is preempted (its KV freed, recomputed later from
// the front of the waiting queue); waiting requests are admitted FCFS only
// when nothing was preempted in the step, while fewer than MaxNumSeqs run,
// budget is left and KV blocks are free; a request for an adapter outside the
// batch's adapter set when MaxLoRAs adapters are already in it is skipped
// without blocking the requests behind it (vLLM #15422).
//
// Deviation: the adapter set checked at admission is that of all running
// requests, where vLLM uses the running requests scheduled in this step; the
// two differ only when the step budget ran out before the running list did,
// and then vLLM admits nothing either.
type Replica struct {
	cfg         ReplicaConfig
	totalBlocks int
	freeBlocks  int

	running      []*Request
	adapters     []adapterState // index = adapter id; 0 is the base model
	adapterIDs   map[string]int
	waitingCount int
	// runningAdapters counts adapters (not the base model) with running > 0.
	runningAdapters int
	residentCount   int
	cpuCount        int

	nextOrder   int64 // FCFS order of arrivals, increasing from 1
	preemptSeq  int64 // preempted requests go first: order -1, -2, ...
	clock       time.Duration
	busy        bool
	stepEnd     time.Duration
	stepIndex   int64
	batchIDs    []int
	pending     []*Request
	out         []*Request
	stats       Counters
	blockTokens int
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
		freeBlocks:  blocks,
		adapterIDs:  map[string]int{"": 0},
		adapters:    []adapterState{{name: ""}},
		running:     make([]*Request, 0, cfg.MaxNumSeqs),
		blockTokens: cfg.BlockSize,
	}
	return r, nil
}

// Config returns the configuration the replica was built with.
func (r *Replica) Config() ReplicaConfig { return r.cfg }

// Now is the replica clock: the latest time passed to Submit or Advance.
func (r *Replica) Now() time.Duration { return r.clock }

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
	if req.PromptTokens < 1 || req.OutputTokens < 1 {
		return fmt.Errorf("%w: prompt %d and output %d tokens must both be at least 1", ErrInvalidRequest, req.PromptTokens, req.OutputTokens)
	}
	if req.PromptTokens+req.OutputTokens > r.cfg.MaxModelLen {
		return fmt.Errorf("%w: %d prompt + %d output tokens > %d", ErrTooLong, req.PromptTokens, req.OutputTokens, r.cfg.MaxModelLen)
	}
	if req.Adapter != "" && r.cfg.MaxLoRAs == 0 {
		return fmt.Errorf("%w: adapter %q", ErrLoRADisabled, req.Adapter)
	}
	r.advance(now)
	id, ok := r.adapterIDs[req.Adapter]
	if !ok {
		id = len(r.adapters)
		r.adapterIDs[req.Adapter] = id
		r.adapters = append(r.adapters, adapterState{name: req.Adapter, lastUsed: -1})
	}
	req.adapterID = id
	req.Arrival = now
	req.numTokens = req.PromptTokens
	req.computed, req.blocks, req.sched, req.Generated = 0, 0, 0, 0
	r.nextOrder++
	req.order = r.nextOrder
	req.state = stateWaiting
	r.adapters[id].queue.pushBack(req)
	r.waitingCount++
	if !r.busy {
		r.startStep(now)
	}
	return nil
}

// NextEventTime is the end of the step in progress, when the next tokens and
// completions happen; ok is false when the replica is idle.
func (r *Replica) NextEventTime() (t time.Duration, ok bool) {
	return r.stepEnd, r.busy
}

// Advance runs every step that ends at or before to and moves the clock to
// to. It returns the requests that completed since the previous Advance (in
// completion order, including those completed during Submit calls). The
// slice is reused: it is valid until the next call to Advance.
func (r *Replica) Advance(to time.Duration) []*Request {
	if to > r.clock {
		r.advance(to)
	}
	r.out, r.pending = r.pending, r.out[:0]
	return r.out
}

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
	r.stats.Aborted++
	return true, nil
}

// Metrics returns the current gauges and counters.
func (r *Replica) Metrics() Metrics {
	m := Metrics{
		Waiting:       r.waitingCount,
		Running:       len(r.running),
		KVCacheUsage:  float64(r.totalBlocks-r.freeBlocks) / float64(r.totalBlocks),
		MaxLoRAs:      r.cfg.MaxLoRAs,
		BlockSize:     r.cfg.BlockSize,
		KVBlocksTotal: r.totalBlocks,
		KVBlocksUsed:  r.totalBlocks - r.freeBlocks,
		Counters:      r.stats,
	}
	for i := 1; i < len(r.adapters); i++ {
		a := &r.adapters[i]
		if a.running > 0 {
			m.RunningAdapters = append(m.RunningAdapters, a.name)
		}
		if a.queue.len() > 0 {
			m.WaitingAdapters = append(m.WaitingAdapters, a.name)
		}
	}
	sort.Strings(m.RunningAdapters)
	sort.Strings(m.WaitingAdapters)
	return m
}

// ResidentAdapters lists the adapters loaded in GPU slots, sorted.
func (r *Replica) ResidentAdapters() []string {
	var names []string
	for i := 1; i < len(r.adapters); i++ {
		if r.adapters[i].resident {
			names = append(names, r.adapters[i].name)
		}
	}
	sort.Strings(names)
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
		s := r.running[i]
		n := min(s.numTokens-s.computed, budget)
		need := r.blocksFor(s.computed+n) - s.blocks
		for need > r.freeBlocks {
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
		r.freeBlocks -= need
		s.blocks += need
		s.sched = n
		budget -= n
		if s.Generated > 0 && n == 1 && s.computed+1 == s.numTokens {
			decodeSeqs++
			sumContext += s.numTokens
		} else {
			prefill += n
		}
		r.markBatchAdapter(s.adapterID)
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
			n := min(s.numTokens-s.computed, budget)
			need := r.blocksFor(s.computed+n) - s.blocks
			if need > r.freeBlocks {
				break // FCFS: no KV for the head request, admit nothing more
			}
			a.queue.popFront()
			r.waitingCount--
			s.state = stateRunning
			if a.running == 0 && id != 0 {
				r.runningAdapters++
			}
			a.running++
			r.running = append(r.running, s)
			r.freeBlocks -= need
			s.blocks += need
			s.sched = n
			budget -= n
			prefill += n
			r.markBatchAdapter(id)
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

// nextAdmissible returns the adapter id whose queue head is the earliest
// waiting request that the LoRA limit lets into the batch, or -1. With the
// adapter set full only the base model and adapters already running qualify;
// the others stay queued without blocking them.
func (r *Replica) nextAdmissible() int {
	full := r.runningAdapters >= r.cfg.MaxLoRAs
	best := -1
	var bestOrder int64
	for id := range r.adapters {
		a := &r.adapters[id]
		if a.queue.len() == 0 {
			continue
		}
		if id != 0 && full && a.running == 0 {
			continue
		}
		if o := a.queue.front().order; best < 0 || o < bestOrder {
			best, bestOrder = id, o
		}
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
	r.adapters[s.adapterID].queue.pushFront(s)
	r.waitingCount++
}

// releaseRunning frees the KV of a request leaving the running list.
func (r *Replica) releaseRunning(s *Request) {
	r.freeBlocks += s.blocks
	s.blocks = 0
	a := &r.adapters[s.adapterID]
	a.running--
	if a.running == 0 && s.adapterID != 0 {
		r.runningAdapters--
	}
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
	for _, s := range r.running {
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
				}
				s.LastTokenAt = end
				if s.Generated >= s.OutputTokens {
					s.CompletedAt = end
					s.state = stateDone
					r.releaseRunning(s)
					r.stats.Completed++
					r.pending = append(r.pending, s)
					continue
				}
			}
		}
		kept = append(kept, s)
	}
	for i := len(kept); i < len(r.running); i++ {
		r.running[i] = nil
	}
	r.running = kept
}
