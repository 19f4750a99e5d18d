package fleet

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/flowcontrol"
)

// View is what a policy may look at when it routes one request.
type View struct {
	// Snapshot is the last scrape of every replica (Endpoints[i] is replica
	// i); its Metrics.UpdateTime is the scrape time.
	Snapshot *scheduler.Snapshot
	// InFlight[i] counts requests the gateway sent to replica i that have
	// not completed: live, gateway-side state as Envoy keeps it (rq_active).
	InFlight []int
	// Request is the request being routed as the replica will receive it
	// (its ID, token ids in Prompt, adapter, lengths); valid during Route.
	Request *vllmsim.Request
	// Replicas are the true replicas. Only the oracle policy reads them:
	// no real router can.
	Replicas []*vllmsim.Replica
}

// Policy routes requests. It returns the replica index when the outcome is
// scheduler.Routed, and is otherwise ignored. A Policy serves one run and
// is never used concurrently.
type Policy interface {
	Route(req *scheduler.Request, v *View) (replica int, outcome scheduler.Outcome)
}

// PolicySpec names a policy and builds a fresh instance for one run.
type PolicySpec struct {
	Name string
	// New builds the policy. seed makes it reproducible; clock returns the
	// virtual time, for policies that check staleness.
	New func(seed uint64, clock func() time.Time) (Policy, error)
	// CountsRouted: a scheduler policy whose configuration counts requests
	// routed since the last scrape (scheduler.Scheduler.Observe), for
	// reports.
	CountsRouted bool
	// Flow, when set, holds the requests the policy drops in the plugin's
	// flow-control queue (FlowPolicySpec); FlowLocal keeps each VM's
	// admissions to itself (FlowLocalAdmission).
	Flow      *flowcontrol.Config
	FlowLocal bool
	// IgnoresPrompt: the policy never reads View.Request.Prompt, so a run
	// need not draw the unique token ids of Scenario.UniquePrompts for it
	// (the scheduler's profiles without prefix plugins, Envoy's
	// least-request).
	IgnoresPrompt bool
}

// Policy names offered besides the scheduler's built-in profiles.
const (
	// EnvoyLeastRequest is Envoy's LEAST_REQUEST load balancer with default
	// settings: power of two choices on the gateway's live count of active
	// requests per host.
	EnvoyLeastRequest = "envoy-least-request"
)

// DefaultPolicies are the policies a sweep compares: the scheduler's
// baselines and profiles, Envoy's least-request, and the oracle.
//
// "random" and "round-robin" are the scheduler's profiles; over a fleet
// whose endpoints are all fresh they are exactly Envoy's RANDOM and
// ROUND_ROBIN (uniform pick; rotation over a stable host list). The
// scheduler's "least-request" is not Envoy's: it takes the minimum of
// waiting+running over all endpoints from the last scrape, so it is kept as
// its own policy next to EnvoyLeastRequest.
func DefaultPolicies() []PolicySpec {
	names := []string{
		scheduler.ProfileRandom,
		scheduler.ProfileRoundRobin,
		EnvoyLeastRequest,
		scheduler.ProfileLeastRequest,
		scheduler.ProfileDecisionTree,
		scheduler.ProfileScoring,
		Oracle,
	}
	specs := make([]PolicySpec, len(names))
	for i, n := range names {
		s, err := PolicyByName(n)
		if err != nil {
			panic(err) // built-in names; a failure is a bug
		}
		specs[i] = s
	}
	return specs
}

// PolicyByName returns EnvoyLeastRequest or a built-in scheduler profile
// with the scheduler's defaults.
func PolicyByName(name string) (PolicySpec, error) {
	return policyByName(name, PolicyOptions{})
}

// PolicyOptions adjust the scheduler policies ParsePolicyWith builds.
type PolicyOptions struct {
	// CountRoutedSinceSnapshot, when set, is the scheduler configuration's
	// countRoutedSinceSnapshot for every scheduler policy whose
	// configuration leaves it out (built-in profile names always do).
	CountRoutedSinceSnapshot *bool
}

func (o PolicyOptions) apply(cfg scheduler.Config) scheduler.Config {
	if cfg.CountRoutedSinceSnapshot == nil {
		cfg.CountRoutedSinceSnapshot = o.CountRoutedSinceSnapshot
	}
	return cfg
}

func policyByName(name string, opts PolicyOptions) (PolicySpec, error) {
	if name == EnvoyLeastRequest {
		return PolicySpec{Name: name, IgnoresPrompt: true, New: func(seed uint64, _ func() time.Time) (Policy, error) {
			return NewEnvoyLeastRequest(rand.NewPCG(seed, 0xe1e5), 2), nil
		}}, nil
	}
	if name == Oracle {
		return OracleSpec(), nil
	}
	if name == PolicyHigressApprox {
		return HigressPolicySpec(), nil
	}
	for _, spec := range PrefixPolicies() {
		if spec.Name == name {
			return spec, nil
		}
	}
	if _, ok := scheduler.BuiltinProfiles()[name]; !ok {
		return PolicySpec{}, fmt.Errorf("fleet: unknown policy %q (%s, %s, a scheduler profile, or name=config.json)", name, EnvoyLeastRequest, Oracle)
	}
	return SchedulerPolicySpec(name, opts.apply(scheduler.Config{Profile: name})), nil
}

// ParsePolicy reads one command-line policy: a name (PolicyByName), or
// name=path of a JSON scheduler configuration (scheduler.DecodeConfig).
func ParsePolicy(arg string) (PolicySpec, error) {
	return ParsePolicyWith(arg, PolicyOptions{})
}

// ParsePolicyWith is ParsePolicy with opts applied to scheduler policies.
func ParsePolicyWith(arg string, opts PolicyOptions) (PolicySpec, error) {
	name, path, isFile := strings.Cut(arg, "=")
	if !isFile {
		return policyByName(arg, opts)
	}
	raw, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return PolicySpec{}, fmt.Errorf("fleet: policy %q: %w", name, err)
	}
	cfg, err := scheduler.DecodeConfig(raw)
	if err != nil {
		return PolicySpec{}, fmt.Errorf("fleet: policy %q: %s: %w", name, path, err)
	}
	cfg = opts.apply(cfg)
	spec := SchedulerPolicySpec(name, cfg)
	// Build once now so a bad configuration fails before a sweep starts.
	p, err := spec.New(1, time.Now)
	if err == nil && p.(*schedulerPolicy).s.UsesPrefix() {
		// Prefix-aware plugins need the prompt's hashes and an index.
		spec = PrefixPolicySpec(name, cfg, IndexShared)
	}
	if err != nil {
		return PolicySpec{}, fmt.Errorf("fleet: policy %q: %s: %w", name, path, err)
	}
	return spec, nil
}

// DefaultStaleAfter is upstream EPP's staleness limit for metrics.
const DefaultStaleAfter = 2 * time.Second

// SchedulerPolicySpec routes with the scheduler package configured by cfg,
// with the plugin's defaults around it: DefaultStaleAfter and fail-open
// (whenNoFreshEndpoint "fail-open"). Each policy instance calls Observe
// after every routed request, so with countRoutedSinceSnapshot on it
// counts what it routed since the last scrape in its own snapshot, as the
// plugin does per VM.
func SchedulerPolicySpec(name string, cfg scheduler.Config) PolicySpec {
	return schedulerPolicySpec(name, cfg, 0)
}

// schedulerPolicySpec is SchedulerPolicySpec with the scheduler's
// Options.IndexMinEndpoints (0: its default).
func schedulerPolicySpec(name string, cfg scheduler.Config, indexMinEndpoints int) PolicySpec {
	// A scheduler policy reads the scheduler.Request and the snapshot
	// only (prefix plugins come as PrefixPolicySpec, which hashes the
	// prompt).
	return PolicySpec{Name: name, CountsRouted: cfg.CountsRoutedSinceSnapshot(), IgnoresPrompt: true, New: func(seed uint64, clock func() time.Time) (Policy, error) {
		s, err := scheduler.New(cfg, scheduler.NewRegistry(), scheduler.Options{
			Rand:              rand.NewPCG(seed, 0x5c4e),
			Now:               clock,
			StaleAfter:        DefaultStaleAfter,
			FailOpen:          true,
			IndexMinEndpoints: indexMinEndpoints,
		})
		if err != nil {
			return nil, err
		}
		return &schedulerPolicy{s: s}, nil
	}}
}

// schedulerPolicy adapts the scheduler: the decision is the plugin's own,
// Schedule then Observe.
type schedulerPolicy struct {
	s *scheduler.Scheduler
}

func (p *schedulerPolicy) Route(req *scheduler.Request, v *View) (int, scheduler.Outcome) {
	res := p.s.Schedule(req, v.Snapshot)
	switch res.Outcome {
	case scheduler.Routed:
		p.s.Observe(req, res)
	case scheduler.FailedOpen:
		// Every scrape was older than DefaultStaleAfter (only when the
		// scrape interval is configured above it): sent all the same.
	default:
		return -1, res.Outcome
	}
	return res.Index, scheduler.Routed
}

// EnvoyLeastRequestPolicy emulates Envoy's least-request balancer for hosts
// of equal weight (its unweighted host pick): draw Choices hosts uniformly at
// random, independently (the same host may be drawn twice), and keep the one
// with the fewest active requests, the first drawn on ties. Active requests
// are the gateway's own count, so they are never stale.
type EnvoyLeastRequestPolicy struct {
	rand    *rand.Rand
	Choices int
}

// NewEnvoyLeastRequest returns the policy; Envoy's default choice count is 2.
func NewEnvoyLeastRequest(src rand.Source, choices int) *EnvoyLeastRequestPolicy {
	return &EnvoyLeastRequestPolicy{rand: rand.New(src), Choices: max(choices, 1)}
}

func (p *EnvoyLeastRequestPolicy) Route(_ *scheduler.Request, v *View) (int, scheduler.Outcome) {
	n := len(v.InFlight)
	if n == 0 {
		return -1, scheduler.NoEndpoint
	}
	best := p.rand.IntN(n)
	for range p.Choices - 1 {
		if c := p.rand.IntN(n); v.InFlight[c] < v.InFlight[best] {
			best = c
		}
	}
	return best, scheduler.Routed
}
