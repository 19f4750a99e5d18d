package metricsagent

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// FailoverTargets is where an agent pushes when aggregators are configured:
// to the aggregators while one of them accepts pushes, and also straight to
// every Envoy once pushes to them have failed, none accepted, for
// FallbackAfter (an agent that pushes only when its values move, or on its
// heartbeat, is not failing between two pushes), so routing
// never goes without metrics because the aggregation tier is down. Pushes
// keep going to the aggregators meanwhile; once one accepts them again (and
// at least RecoverAfter after the fallback began, so a flapping aggregator
// does not flap the Envoys' load) the agent stops pushing to the Envoys.
//
// Observe must see every push outcome (Pusher.Sent).
type FailoverTargets struct {
	Aggregators   EnvoyTargets
	Envoys        EnvoyTargets
	FallbackAfter time.Duration
	RecoverAfter  time.Duration
	Now           func() time.Time
	Log           *slog.Logger
	// Direct, when set, is called with the mode whenever it changes.
	Direct func(bool)

	mu      sync.Mutex
	started bool
	aggs    []string
	lastOK  time.Time
	// failingSince is the first failed push to an aggregator since one
	// last accepted a push (zero: none failed since).
	failingSince time.Time
	accepted     bool // some aggregator accepted a push since the start
	direct       bool
	directSince  time.Time
}

// Targets returns this cycle's targets.
func (f *FailoverTargets) Targets(ctx context.Context) []string {
	aggs := f.Aggregators.Targets(ctx)
	f.mu.Lock()
	now := f.Now()
	if !f.started {
		f.started, f.lastOK = true, now // a grace period at start
	}
	f.aggs = aggs
	// Healthy: an aggregator accepted the latest pushes, or they have been
	// failing for less than FallbackAfter; and at start, until one has
	// accepted a push, for FallbackAfter.
	healthy := f.failingSince.IsZero() || now.Sub(f.failingSince) <= f.FallbackAfter
	if f.lastOK.IsZero() || !f.accepted {
		healthy = now.Sub(f.lastOK) <= f.FallbackAfter
	}
	switch {
	case !f.direct && !healthy:
		f.direct, f.directSince = true, now
		f.Log.Warn("no aggregator accepted a push: pushing to every Envoy directly until one does",
			"for", now.Sub(f.lastOK).Round(time.Millisecond), "aggregators", aggs)
		f.notify(true)
	case f.direct && healthy && now.Sub(f.directSince) >= f.RecoverAfter:
		f.direct = false
		f.Log.Info("an aggregator accepts pushes again: no longer pushing to the Envoys directly", "aggregators", aggs)
		f.notify(false)
	}
	direct := f.direct
	f.mu.Unlock()
	if !direct {
		return aggs
	}
	out := slices.Clone(aggs)
	for _, e := range f.Envoys.Targets(ctx) {
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

func (f *FailoverTargets) notify(direct bool) {
	if f.Direct != nil {
		f.Direct(direct)
	}
}

// Observe records one push outcome.
func (f *FailoverTargets) Observe(target string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(f.aggs, target) {
		return
	}
	now := f.Now()
	switch {
	case err == nil:
		f.lastOK, f.failingSince, f.accepted = now, time.Time{}, true
	case f.failingSince.IsZero():
		f.failingSince = now
	}
}

// IsDirect reports whether the agent pushes to the Envoys itself now.
func (f *FailoverTargets) IsDirect() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.direct
}
