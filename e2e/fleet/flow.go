package fleet

import (
	"fmt"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/flowcontrol"
)

// Flow control in the simulation: each gateway VM runs the plugin's own
// flow control (scheduler/flowcontrol): its queue, its room test, its
// Releaser, with the VMs agreeing on admissions through an in-process
// shared store (flowcontrol.MemStore, shared data's rules). So a simulated
// queue orders, bounds, expires and releases exactly as the plugin's does;
// only the clock is virtual.
//
// What the plugin does per VM and the simulation copies:
//   - an arriving Standard or Sheddable request goes straight to the queue
//     when requests of its band or a higher one already wait there (it must
//     not overtake them); otherwise it is scheduled as admitted
//     (scheduler.Request.Admitted) and goes if the endpoint the profile
//     picks has room (flowcontrol.Room), else it is queued;
//   - a Critical request is routed by the profile as without flow control;
//   - a full queue refuses (429) as without flow control;
//   - every ReleaseInterval the VM expires requests past their TTL (429)
//     and releases what has room;
//   - a new snapshot (scrape) is acted on by the first arrival at the VM
//     after it (Releaser.ReleaseRouted: before the arrival's own decision
//     when requests of its band or a higher one are held, after it
//     otherwise, and not at all when the arrival itself is held), as the
//     plugin does in its request callbacks, and by the next tick;
//   - a released request's latencies count from its arrival, wait
//     included.

// FlowSuffix names the flow-control variant of a policy.
const FlowSuffix = "+flow"

// FlowPolicySpec is base with flow control: requests base drops wait in a
// queue configured by cfg. base must be a scheduler policy.
func FlowPolicySpec(base PolicySpec, cfg flowcontrol.Config) PolicySpec {
	cfg = cfg.WithDefaults()
	s := base
	s.Name = base.Name + FlowSuffix
	s.Flow = &cfg
	return s
}

// LocalAdmissionSuffix names a flow-control variant whose VMs do not share
// admissions (FlowLocalAdmission).
const LocalAdmissionSuffix = "-local"

// FlowLocalAdmission is a flow-control spec whose VMs each count only their
// own releases, as if the shared record did not exist: the baseline that
// shows what the cross-VM agreement is for.
func FlowLocalAdmission(flow PolicySpec) PolicySpec {
	s := flow
	s.Name = flow.Name + LocalAdmissionSuffix
	s.FlowLocal = true
	return s
}

// queueScheduler is implemented by policies whose decisions flow control
// can act on: the scheduler's Schedule without Observe (flow control
// counts what it sends itself).
type queueScheduler interface {
	scheduleQueued(req *scheduler.Request, snap *scheduler.Snapshot) scheduler.Result
}

func (p *schedulerPolicy) scheduleQueued(req *scheduler.Request, snap *scheduler.Snapshot) scheduler.Result {
	return p.s.Schedule(req, snap)
}

// Burst adds arrivals on top of a run's Poisson rate: during Length out of
// every Every, starting Offset into each period, the rate is Factor times
// the base rate. The extra arrivals are a second Poisson stream (its own
// seed) kept only inside the bursts, which is exactly a Poisson stream of
// (Factor-1) × rate over them.
type Burst struct {
	Every, Length, Offset time.Duration
	Factor                float64
}

// On reports whether the burst is configured.
func (b Burst) On() bool { return b.Every > 0 }

func (b Burst) validate() error {
	if !b.On() {
		return nil
	}
	switch {
	case b.Length <= 0 || b.Length > b.Every:
		return fmt.Errorf("fleet: burst length %v must be in (0, %v]", b.Length, b.Every)
	case b.Offset < 0 || b.Offset >= b.Every:
		return fmt.Errorf("fleet: burst offset %v must be in [0, %v)", b.Offset, b.Every)
	case !(b.Factor > 1) || b.Factor > 100:
		return fmt.Errorf("fleet: burst factor %v must be in (1, 100]", b.Factor)
	}
	return nil
}

// inside reports whether t falls in a burst.
func (b Burst) inside(t time.Duration) bool {
	p := t % b.Every
	return p >= b.Offset && p < b.Offset+b.Length
}

// ClassResult is what one criticality's measured requests got.
type ClassResult struct {
	Measured, Completed int
	// Refused counts 429s: dropped at once, queue full, or expired in the
	// queue. NoEndpoint counts 503s.
	Refused, NoEndpoint int
	TTFT                Quantiles
}

// FlowResult is what the queues did over the whole run (warmup included),
// summed over VMs.
type FlowResult struct {
	// Queued requests entered a queue; Released left it routed, Expired
	// left it with 429 after their TTL, Left with 503 (no endpoint at
	// release). Full counts requests refused because the queue was full.
	Queued, Released, Expired, Left, Full int
	// MaxQueued is the largest number of requests one VM held.
	MaxQueued int
	// Wait is the queueing time of released measured requests.
	Wait Quantiles
	// Contention counts release attempts put off because the shared
	// admission record kept changing.
	Contention uint64
	// Admitted counts admissions written to the shared record.
	Admitted uint64
	// OverThreshold counts released requests sent to a replica whose live
	// waiting queue was already above the decision tree's has-capacity
	// limit (scheduler.DefaultQueueThresholdCritical): slots filled more
	// than once, e.g. by several VMs acting on one snapshot.
	OverThreshold int
	// OverRoom counts released requests sent to a replica whose live
	// waiting queue was already over flow control's own room test
	// (Config.Admit.MaxWaiting): they wait at the replica instead of
	// starting, because another release (this VM's or another's) took
	// the room first.
	OverRoom int
}

// ArrivalOutcome is what became of one arrival (Result.Outcomes).
type ArrivalOutcome uint8

// Arrival outcomes.
const (
	OutcomeCompleted ArrivalOutcome = iota
	OutcomeRefused
	OutcomeNoEndpoint
)

// flowGate is one VM's flow control.
type flowGate struct {
	queue    *flowcontrol.Queue[uint64] // flight ids
	releaser flowcontrol.Releaser[uint64]
	qs       queueScheduler
	req      scheduler.Request
	// releasedTag is the scrape this VM last released on.
	releasedTag uint64
}

// flowState is every VM's flow control in one run.
type flowState struct {
	cfg   flowcontrol.Config
	gates []*flowGate
	store *flowcontrol.MemStore
	// tag names the current scrape; every VM's copy is refreshed at once.
	tag      uint64
	nextTick time.Duration
	res      FlowResult
}

// admittedKey is the plugin's shared-data key for admissions (default
// prefix), for the look of it: the simulation's store holds nothing else.
const admittedKey = "wasm-epp.v2.admit"

func newFlowState(cfg flowcontrol.Config, local bool, policies []Policy, store *flights) (*flowState, error) {
	fs := &flowState{cfg: cfg, store: &flowcontrol.MemStore{}, nextTick: cfg.ReleaseInterval}
	for k, p := range policies {
		qs, ok := p.(queueScheduler)
		if !ok {
			return nil, fmt.Errorf("fleet: flow control needs a scheduler policy (VM %d has %T)", k, p)
		}
		q, err := flowcontrol.New[uint64](cfg)
		if err != nil {
			return nil, err
		}
		g := &flowGate{queue: q, qs: qs}
		shared := fs.store
		if local {
			shared = &flowcontrol.MemStore{} // this VM's alone
		}
		g.releaser = flowcontrol.Releaser[uint64]{
			Queue:     q,
			Admission: flowcontrol.NewAdmission(shared, admittedKey),
			Room:      cfg.Admit,
			Schedule: func(id uint64, snap *scheduler.Snapshot) (scheduler.Result, string) {
				f := store.get(id)
				g.req = scheduler.Request{Model: f.req.Adapter, TargetModel: f.req.Adapter, Criticality: f.crit, Admitted: true}
				return qs.scheduleQueued(&g.req, snap), f.req.Adapter
			},
		}
		fs.gates = append(fs.gates, g)
	}
	return fs, nil
}

// queued counts the requests held by every VM.
func (fs *flowState) queued() int {
	n := 0
	for _, g := range fs.gates {
		n += g.queue.Len()
	}
	return n
}

// hold queues flight id on VM vm; false when the queue is full.
func (fs *flowState) hold(vm int, id uint64, f *flight, now time.Duration) bool {
	g := fs.gates[vm]
	b, _ := flowcontrol.BandFor(f.crit)
	// The plugin's flow key is the target model by default; the prompt's
	// bytes stand for the body (about 4 bytes per token).
	_, err := g.queue.PushString(b, f.req.Adapter, int64(4*f.req.PromptTokens), now, fs.cfg.TTL, id)
	if err != nil {
		fs.res.Full++
		return false
	}
	fs.res.Queued++
	fs.res.MaxQueued = max(fs.res.MaxQueued, g.queue.Len())
	return true
}

// route decides a request arriving at VM vm with policy p, as the plugin
// does with flow control on: the replica and scheduler.Routed, or
// Dropped when it is to be held, or the outcome that refuses it.
func (fs *flowState) route(vm int, req *scheduler.Request, p Policy, v *View, now time.Duration) (int, scheduler.Outcome) {
	g := fs.gates[vm]
	b, waits := flowcontrol.BandFor(req.Criticality)
	if !waits {
		i, o := p.Route(req, v)
		fs.onSnapshot(vm, v, now)
		return i, o
	}
	if g.queue.Waiting(b) {
		// Held requests of its band or a higher one go first; it waits
		// behind those that stay.
		fs.onSnapshot(vm, v, now)
		if g.queue.Waiting(b) {
			return -1, scheduler.Dropped
		}
	}
	req.Admitted = true
	res := g.qs.scheduleQueued(req, v.Snapshot)
	req.Admitted = false
	switch {
	case g.releaser.Room.Take(v.Snapshot, res, req.TargetModel):
		fs.onSnapshot(vm, v, now) // only lower bands are held: after it
		return res.Index, scheduler.Routed
	case res.Outcome == scheduler.Routed || res.Outcome == scheduler.Dropped:
		return -1, scheduler.Dropped // no room now: held (not released by its own arrival)
	}
	fs.onSnapshot(vm, v, now)
	return -1, res.Outcome
}

// onSnapshot is the plugin's release from a request callback: the first
// request a VM handles after a scrape releases what has room on it.
func (fs *flowState) onSnapshot(vm int, v *View, now time.Duration) {
	g := fs.gates[vm]
	if g.releasedTag == fs.tag || g.queue.Len() == 0 {
		return
	}
	g.releasedTag = fs.tag
	g.releaser.ReleaseRouted(now, v.Snapshot, fs.tag)
}

// ClassOf is the index of a criticality in Result.Classes.
func ClassOf(c scheduler.Criticality) int {
	if c < scheduler.Critical || c > scheduler.Sheddable {
		return int(scheduler.Sheddable)
	}
	return int(c)
}

// NonCritical sums the Standard and Sheddable classes.
func (r *Result) NonCritical() ClassResult {
	a, b := r.Classes[scheduler.Standard], r.Classes[scheduler.Sheddable]
	return ClassResult{Measured: a.Measured + b.Measured, Completed: a.Completed + b.Completed,
		Refused: a.Refused + b.Refused, NoEndpoint: a.NoEndpoint + b.NoEndpoint}
}

// onRelease sets what every VM does with a request that leaves its queue
// by release (routed, or refused for good with res.Outcome saying why).
func (fs *flowState) onRelease(fn func(id uint64, res scheduler.Result, waited time.Duration)) {
	for _, g := range fs.gates {
		g.releaser.Done = func(e flowcontrol.Entry[uint64], res scheduler.Result, _ error) {
			if res.Outcome == scheduler.Routed || res.Outcome == scheduler.FailedOpen {
				fs.res.Released++
			} else {
				fs.res.Left++
			}
			fn(e.Value, res, e.Waited)
		}
	}
}

// tick is every VM's release tick: expire, then release on its current
// snapshot copy.
func (fs *flowState) tick(now time.Duration, views []*View, expired func(id uint64)) {
	for k, g := range fs.gates {
		g.queue.Expire(now, func(e flowcontrol.Entry[uint64]) {
			fs.res.Expired++
			expired(e.Value)
		})
		if g.queue.Len() > 0 {
			g.releasedTag = fs.tag
			g.releaser.Release(now, views[k].Snapshot, fs.tag)
		}
	}
	fs.nextTick += fs.cfg.ReleaseInterval
}

// result is the run's FlowResult without Wait (pooled by RunSeeds).
func (fs *flowState) result() FlowResult {
	r := fs.res
	for _, g := range fs.gates {
		r.Contention += g.releaser.ContentionBlocked
		r.Admitted += g.releaser.Admission.Stats().Admitted
	}
	return r
}

// pool adds another seed's counts to r (RunSeeds).
func (r *Result) pool(o *Result) {
	for c := range r.Classes {
		a, b := &r.Classes[c], o.Classes[c]
		a.Measured += b.Measured
		a.Completed += b.Completed
		a.Refused += b.Refused
		a.NoEndpoint += b.NoEndpoint
	}
	f, g := &r.Flow, o.Flow
	f.Queued += g.Queued
	f.Released += g.Released
	f.Expired += g.Expired
	f.Left += g.Left
	f.Full += g.Full
	f.MaxQueued = max(f.MaxQueued, g.MaxQueued)
	f.Contention += g.Contention
	f.Admitted += g.Admitted
	f.OverThreshold += g.OverThreshold
	f.OverRoom += g.OverRoom
	r.Outcomes = append(r.Outcomes, o.Outcomes...)
}
