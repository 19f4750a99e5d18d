package wire

import (
	"slices"
	"strings"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// SnapshotOptions says how stored endpoints become scheduler endpoints.
type SnapshotOptions struct {
	// ExcludeUnhealthy drops endpoints whose latest scrape failed.
	//
	// By default they are kept, with their last good values and
	// Metrics.UpdateTime set to the last good scrape time, so the plugin's
	// staleness rule removes them once that is older than its staleAfter:
	// a pod whose scrapes fail ages towards stale. One slow scrape of a
	// busy pod then does not pull it out of rotation.
	ExcludeUnhealthy bool
}

// DecodeSnapshot turns an encoded Stored value straight into the
// scheduler's view, without building a Stored first. This is what the
// filter runs once per change of shared data.
//
// Endpoints are sorted by namespace and name. An endpoint reported by
// several agents appears once, with the newest scrape. Snapshot.Time is the
// latest Received time of any agent (zero when there is none).
// Metrics.UpdateTime is the endpoint's scrape time. The result does not
// alias b, and its slices share backing arrays: treat it as read-only, as
// scheduler.Snapshot requires.
func DecodeSnapshot(b []byte, lim Limits, opts SnapshotOptions) (*scheduler.Snapshot, error) {
	sb := snapshotBuilder{opts: opts}
	if err := decodeStored(b, lim, &sb); err != nil {
		return nil, err
	}
	return sb.finish(), nil
}

// Snapshot converts s the same way DecodeSnapshot converts its encoding.
func (s *Stored) Snapshot(opts SnapshotOptions) *scheduler.Snapshot {
	sb := snapshotBuilder{opts: opts}
	sb.begin(len(s.Agents), s.TotalEndpoints())
	for i := range s.Agents {
		a := s.Agents[i]
		sb.agentDone(&a, a.Endpoints)
	}
	return sb.finish()
}

type snapshotBuilder struct {
	opts    SnapshotOptions
	agents  int
	snap    scheduler.Snapshot
	scratch []EndpointState
	// Addresses are rendered into one buffer and turned into one string at
	// the end; addrEnd[i] is where endpoint i's text ends.
	addrBuf []byte
	addrEnd []int
}

func (sb *snapshotBuilder) begin(agents, endpoints int) {
	sb.agents = agents
	sb.snap.Endpoints = make([]scheduler.Endpoint, 0, endpoints)
	sb.addrBuf = make([]byte, 0, endpoints*16)
	sb.addrEnd = make([]int, 0, endpoints)
}

func (sb *snapshotBuilder) agent(_ *AgentState, n int) []EndpointState {
	if cap(sb.scratch) < n {
		sb.scratch = make([]EndpointState, n)
	}
	return sb.scratch[:n]
}

func (sb *snapshotBuilder) agentDone(a *AgentState, eps []EndpointState) {
	if a.Received.After(sb.snap.Time) {
		sb.snap.Time = a.Received
	}
	for i := range eps {
		e := &eps[i]
		if sb.opts.ExcludeUnhealthy && !e.Healthy() {
			continue
		}
		sb.addrBuf = e.Address.AppendTo(sb.addrBuf)
		sb.addrEnd = append(sb.addrEnd, len(sb.addrBuf))
		sb.snap.Endpoints = append(sb.snap.Endpoints, scheduler.Endpoint{
			ID:   scheduler.EndpointID{Namespace: e.Namespace, Name: e.Name},
			Port: int(e.Port),
			Metrics: scheduler.Metrics{
				WaitingQueueSize: int(e.Waiting),
				RunningQueueSize: int(e.Running),
				KVCacheUsage:     e.KVCacheUsage,
				ActiveModels:     e.ActiveAdapters,
				WaitingModels:    e.WaitingAdapters,
				MaxActiveModels:  int(e.MaxAdapters),
				UpdateTime:       e.ScrapeTime,
			},
		})
	}
}

func (sb *snapshotBuilder) finish() *scheduler.Snapshot {
	addrs := string(sb.addrBuf)
	start := 0
	for i, end := range sb.addrEnd {
		sb.snap.Endpoints[i].Address = addrs[start:end]
		start = end
	}
	eps := sb.snap.Endpoints
	if sb.agents > 1 {
		// Each agent's list is sorted; only several agents need a sort, and
		// only they can report the same endpoint twice.
		slices.SortFunc(eps, compareForDedup)
		eps = slices.CompactFunc(eps, func(a, b scheduler.Endpoint) bool { return a.ID == b.ID })
	}
	if len(eps) == 0 {
		eps = nil
	}
	sb.snap.Endpoints = eps
	return &sb.snap
}

// compareForDedup orders by ID, then newest scrape first, so compacting
// keeps the newest report of each endpoint; address and port break the
// remaining ties so the order is the same on every Envoy replica.
func compareForDedup(a, b scheduler.Endpoint) int {
	if c := strings.Compare(a.ID.Namespace, b.ID.Namespace); c != 0 {
		return c
	}
	if c := strings.Compare(a.ID.Name, b.ID.Name); c != 0 {
		return c
	}
	if c := b.Metrics.UpdateTime.Compare(a.Metrics.UpdateTime); c != 0 {
		return c
	}
	if c := strings.Compare(a.Address, b.Address); c != 0 {
		return c
	}
	return a.Port - b.Port
}
