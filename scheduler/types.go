package scheduler

import "time"

// EndpointID names a model-server pod.
type EndpointID struct {
	Namespace string
	Name      string
}

func (id EndpointID) String() string {
	if id.Namespace == "" {
		return id.Name
	}
	return id.Namespace + "/" + id.Name
}

// Metrics is what the scheduler knows about one endpoint, as last scraped.
//
// ActiveModels and WaitingModels are kept apart (vLLM's running_lora_adapters
// and waiting_lora_adapters): an adapter that is only waiting still has to be
// loaded before it serves.
type Metrics struct {
	// WaitingQueueSize is the scraped waiting queue plus RoutedSinceUpdate.
	WaitingQueueSize int
	RunningQueueSize int
	// KVCacheUsage is the fraction of KV-cache blocks in use, 0..1.
	KVCacheUsage float64
	// ActiveModels are the LoRA adapters loaded in the running batch.
	ActiveModels []string
	// WaitingModels are adapters requested by queued requests.
	WaitingModels []string
	// MaxActiveModels is vLLM's max_loras: adapter slots per batch.
	MaxActiveModels int
	// UpdateTime is when these values were scraped.
	UpdateTime time.Time
	// RoutedSinceUpdate counts the requests Scheduler.Observe recorded on
	// this endpoint since these values were scraped (already included in
	// WaitingQueueSize); always 0 unless Config.CountRoutedSinceSnapshot
	// is on. Fresh metrics start it at 0 again.
	RoutedSinceUpdate int
}

// HasActiveModel reports whether model is among the running adapters.
func (m *Metrics) HasActiveModel(model string) bool { return contains(m.ActiveModels, model) }

// HasWaitingModel reports whether model is among the waiting adapters.
func (m *Metrics) HasWaitingModel(model string) bool { return contains(m.WaitingModels, model) }

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Endpoint is one model server and its latest metrics.
type Endpoint struct {
	ID EndpointID
	// Address is the pod IP (v4 or v6, without brackets).
	Address string
	Port    int
	Metrics Metrics
}

// Snapshot is a view of every known endpoint.
//
// The scheduler never modifies a Snapshot except through Scheduler.Observe,
// which (only when Config.CountRoutedSinceSnapshot is on) may add a routed
// request to the chosen endpoint's WaitingQueueSize and RoutedSinceUpdate;
// it never touches the slices. Callers must not modify a Snapshot while a
// Scheduler call on it runs. A Snapshot that Observe updates belongs to that
// one Scheduler: callers sharing metrics between Schedulers give each its
// own copy of Endpoints (slices such as ActiveModels may stay shared).
//
// Between calls the owner may hand over a new Snapshot, or change this one
// in place and say so: MetricsChanged(i) after rewriting Endpoints[i].Metrics
// (which drops what Observe added), Changed() after anything else
// (endpoints added, removed, reordered or given new identities, or
// Endpoints replaced). A Scheduler keeps a per-snapshot index of large
// snapshots (see Options.IndexMinEndpoints) and updates it from these
// calls at its next decision; a change made in place without them leaves
// the index describing the old values. A new Snapshot needs no call, and
// neither does a Snapshot nobody has scheduled on yet. Do not copy a
// Snapshot by value once it has been scheduled on.
type Snapshot struct {
	Endpoints []Endpoint
	// Time is when the snapshot was assembled.
	Time time.Time

	changes changeLog
}

// Criticality says how important a request is; it decides shedding.
type Criticality int

const (
	// Critical requests are never shed.
	Critical Criticality = iota
	// Standard requests are shed like Sheddable ones, as in the seed.
	Standard
	// Sheddable requests are dropped when no endpoint has capacity.
	Sheddable
)

func (c Criticality) String() string {
	switch c {
	case Critical:
		return "Critical"
	case Standard:
		return "Standard"
	case Sheddable:
		return "Sheddable"
	}
	return "Unknown"
}

// Request is what the scheduler needs to know about one inference request.
type Request struct {
	// Model is the model name the client asked for.
	Model string
	// TargetModel is the resolved base model or LoRA adapter to serve it.
	TargetModel string
	Criticality Criticality
	// Admitted says that flow control (scheduler/flowcontrol) has already
	// decided this Standard or Sheddable request may be served now: the
	// shedding plugins let it through as they let a Critical request
	// through (the decision tree takes its critical entry, shed-filter
	// keeps every candidate), so the profile only decides where it goes.
	// The profile is still the one selected for its criticality, and its
	// decision path says "admitted".
	Admitted bool
	// Prefix is what the routing index knows about the prompt (nil: no
	// prefix information; prefix-aware plugins then stand aside).
	Prefix PrefixInfo
}

// shed reports whether shedding plugins may drop the request: it is
// neither Critical nor admitted by flow control.
func (r *Request) shed() bool { return r.Criticality != Critical && !r.Admitted }
