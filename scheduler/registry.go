package scheduler

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
)

// Kind says which framework interface a plugin type implements.
type Kind int

const (
	KindFilter Kind = iota
	KindScorer
	KindPicker
)

func (k Kind) String() string {
	switch k {
	case KindFilter:
		return "filter"
	case KindScorer:
		return "scorer"
	case KindPicker:
		return "picker"
	}
	return "unknown"
}

// Handle gives a factory access to plugin instances built before it (in
// configuration order) or to any registered type with default parameters,
// so composite plugins (a configured decision tree) can reference others.
type Handle interface {
	Plugin(ref string) (Plugin, error)
}

// Factory builds one plugin instance. params is the raw "parameters" value
// (nil when absent); decode it with DecodeParameters so unknown fields are
// errors, and return *ConfigError values whose Path is relative to
// "parameters".
type Factory func(name string, params json.RawMessage, h Handle) (Plugin, error)

// PluginType is one registered plugin type.
type PluginType struct {
	Type string
	Kind Kind
	// Doc is a one-line description for listings.
	Doc string
	New Factory
}

// Registry lists the plugin types a configuration may name. It is an
// explicit value (no package-level registration), so a test or a fork can
// add types without touching global state.
type Registry struct {
	types map[string]PluginType
}

// Built-in plugin type names.
const (
	TypeLowQueueFilter        = "low-queue-filter"
	TypeHasCapacityFilter     = "has-capacity-filter"
	TypeLoRAAffinityFilter    = "lora-affinity-filter"
	TypeLeastQueueFilter      = "least-queue-filter"
	TypeLeastKVCacheFilter    = "least-kv-cache-filter"
	TypeLeastRequestFilter    = "least-request-filter"
	TypeShedFilter            = "shed-filter"
	TypeDecisionTreeFilter    = "decision-tree-filter"
	TypeQueueScorer           = "queue-scorer"
	TypeKVCacheScorer         = "kv-cache-scorer"
	TypeLoRAAffinityScorer    = "lora-affinity-scorer"
	TypeRunningRequestsScorer = "running-requests-scorer"
	TypeRandomPicker          = "random-picker"
	TypeMaxScorePicker        = "max-score-picker"
	TypeWeightedRandomPicker  = "weighted-random-picker"
	TypeRoundRobinPicker      = "round-robin-picker"
	TypePrefixCacheScorer     = "prefix-cache-scorer"
	TypePrefixAffinityFilter  = "prefix-affinity-filter"
)

// NewRegistry returns a registry holding every built-in plugin type.
func NewRegistry() *Registry {
	r := &Registry{types: map[string]PluginType{}}
	for _, t := range builtinTypes() {
		if err := r.Register(t); err != nil {
			panic(err) // built-in names are constants; a clash is a programming error
		}
	}
	return r
}

// Register adds a plugin type; registering a type name twice is an error.
func (r *Registry) Register(t PluginType) error {
	if t.Type == "" || t.New == nil {
		return fmt.Errorf("scheduler: plugin type needs a name and a factory")
	}
	if _, dup := r.types[t.Type]; dup {
		return fmt.Errorf("scheduler: plugin type %q already registered", t.Type)
	}
	r.types[t.Type] = t
	return nil
}

// Lookup returns the registered type with that name.
func (r *Registry) Lookup(name string) (PluginType, bool) {
	t, ok := r.types[name]
	return t, ok
}

// Types lists the registered types sorted by name.
func (r *Registry) Types() []PluginType {
	out := make([]PluginType, 0, len(r.types))
	for _, t := range r.types {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Type < out[j].Type })
	return out
}

// noParams is the factory of plugins without parameters: it still rejects
// any field, so a typo is not silently ignored.
func noParams(build func(name string) Plugin) Factory {
	return func(name string, params json.RawMessage, _ Handle) (Plugin, error) {
		var none struct{}
		if err := DecodeParameters(params, &none); err != nil {
			return nil, err
		}
		return build(name), nil
	}
}

func builtinTypes() []PluginType {
	return []PluginType{
		{TypeLowQueueFilter, KindFilter, "keeps endpoints with waiting queue <= threshold (default 128)",
			func(name string, params json.RawMessage, _ Handle) (Plugin, error) {
				p := struct {
					Threshold int `json:"threshold"`
				}{DefaultQueueingThresholdLoRA}
				if err := DecodeParameters(params, &p); err != nil {
					return nil, err
				}
				if p.Threshold < 0 {
					return nil, fieldErr("threshold", "must be >= 0")
				}
				return &LowQueueFilter{PluginName: name, Threshold: p.Threshold}, nil
			}},
		{TypeHasCapacityFilter, KindFilter, "keeps endpoints with waiting <= queueThreshold (5) and KV <= kvCacheThreshold (0.8)",
			func(name string, params json.RawMessage, _ Handle) (Plugin, error) {
				f, err := decodeCapacity(name, params)
				if err != nil {
					return nil, err
				}
				return f, nil
			}},
		{TypeShedFilter, KindFilter, "non-critical requests: has-capacity-filter, dropped (429) when nothing has capacity",
			func(name string, params json.RawMessage, _ Handle) (Plugin, error) {
				f, err := decodeCapacity(name, params)
				if err != nil {
					return nil, err
				}
				return &ShedFilter{HasCapacityFilter: *f}, nil
			}},
		{TypeLoRAAffinityFilter, KindFilter, "LoRA soft affinity: affinity group with probability threshold (0.999), else free-slot group",
			func(name string, params json.RawMessage, _ Handle) (Plugin, error) {
				p := struct {
					Threshold float64 `json:"threshold"`
				}{DefaultLoRAAffinityThreshold}
				if err := DecodeParameters(params, &p); err != nil {
					return nil, err
				}
				if !(p.Threshold >= 0 && p.Threshold <= 1) {
					return nil, fieldErr("threshold", "must be in [0,1]")
				}
				return &LoRAAffinityFilter{PluginName: name, Threshold: p.Threshold}, nil
			}},
		{TypeLeastQueueFilter, KindFilter, "keeps endpoints in the lowest waiting-queue band [min, min+(max-min)/n]",
			noParams(func(name string) Plugin { return &LeastQueueFilter{PluginName: name} })},
		{TypeLeastKVCacheFilter, KindFilter, "keeps endpoints in the lowest KV-cache band [min, min+(max-min)/n]",
			noParams(func(name string) Plugin { return &LeastKVCacheFilter{PluginName: name} })},
		{TypeLeastRequestFilter, KindFilter, "keeps endpoints with the fewest waiting+running requests",
			noParams(func(name string) Plugin { return &LeastRequestFilter{PluginName: name} })},
		{TypeDecisionTreeFilter, KindFilter, "a table of filter steps with success/failure branches; default: the seed's tree",
			newDecisionTreeFromParams},
		{TypeQueueScorer, KindScorer, "waiting queue, min-max normalised (shortest 1)",
			noParams(func(name string) Plugin { return &QueueScorer{PluginName: name} })},
		{TypeKVCacheScorer, KindScorer, "1 - KV-cache usage",
			noParams(func(name string) Plugin { return &KVCacheScorer{PluginName: name} })},
		{TypeLoRAAffinityScorer, KindScorer, "adapter active 1.0, free slot 0.8, waiting 0.6, else 0",
			noParams(func(name string) Plugin { return &LoRAAffinityScorer{PluginName: name} })},
		{TypeRunningRequestsScorer, KindScorer, "running batch size, min-max normalised (smallest 1)",
			noParams(func(name string) Plugin { return &RunningRequestsScorer{PluginName: name} })},
		{TypeRandomPicker, KindPicker, "uniform among candidates",
			noParams(func(name string) Plugin { return &RandomPicker{PluginName: name} })},
		{TypeMaxScorePicker, KindPicker, "highest score, random among ties",
			noParams(func(name string) Plugin { return &MaxScorePicker{PluginName: name} })},
		{TypeWeightedRandomPicker, KindPicker, "probability proportional to score",
			noParams(func(name string) Plugin { return &WeightedRandomPicker{PluginName: name} })},
		{TypeRoundRobinPicker, KindPicker, "rotates through candidates across requests",
			noParams(func(name string) Plugin { return &RoundRobinPicker{PluginName: name} })},
		{TypePrefixCacheScorer, KindScorer, "share of the prompt's blocks the endpoint is believed to cache",
			noParams(func(name string) Plugin { return &PrefixCacheScorer{PluginName: name} })},
		{TypePrefixAffinityFilter, KindFilter, "prefix affinity while the endpoint has capacity, else the consistent choice (rendezvous, bounded loads)",
			newPrefixAffinityFromParams},
	}
}

func decodeCapacity(name string, params json.RawMessage) (*HasCapacityFilter, error) {
	p := struct {
		QueueThreshold   int     `json:"queueThreshold"`
		KVCacheThreshold float64 `json:"kvCacheThreshold"`
	}{DefaultQueueThresholdCritical, DefaultKVCacheThreshold}
	if err := DecodeParameters(params, &p); err != nil {
		return nil, err
	}
	if p.QueueThreshold < 0 {
		return nil, fieldErr("queueThreshold", "must be >= 0")
	}
	if !(p.KVCacheThreshold >= 0 && p.KVCacheThreshold <= 1) {
		return nil, fieldErr("kvCacheThreshold", "must be in [0,1]")
	}
	return &HasCapacityFilter{PluginName: name, QueueThreshold: p.QueueThreshold, KVCacheThreshold: p.KVCacheThreshold}, nil
}

// decisionTreeParams is the decision-tree-filter's "parameters": either
// the seed's thresholds (the built-in table), or a table of its own whose
// steps name filter plugins (declared earlier or by type). Thresholds are
// pointers so that giving one together with steps is detected.
type decisionTreeParams struct {
	LoRAAffinityThreshold  *float64       `json:"loraAffinityThreshold"`
	QueueingThresholdLoRA  *int           `json:"queueingThresholdLoRA"`
	QueueThresholdCritical *int           `json:"queueThresholdCritical"`
	KVCacheThreshold       *float64       `json:"kvCacheThreshold"`
	Steps                  []treeStepSpec `json:"steps"`
	Entries                *TreeEntries   `json:"entries"`
}

type treeStepSpec struct {
	Name      string `json:"name"`
	Filter    string `json:"filter"`
	OnSuccess string `json:"onSuccess"`
	OnFailure string `json:"onFailure"`
}

func newDecisionTreeFromParams(name string, params json.RawMessage, h Handle) (Plugin, error) {
	var p decisionTreeParams
	if err := DecodeParameters(params, &p); err != nil {
		return nil, err
	}
	hasThresholds := p.LoRAAffinityThreshold != nil || p.QueueingThresholdLoRA != nil ||
		p.QueueThresholdCritical != nil || p.KVCacheThreshold != nil
	if p.Steps == nil {
		if p.Entries != nil {
			return nil, fieldErr("entries", "only valid together with steps")
		}
		tp := DefaultTreeParams()
		setIf(&tp.LoRAAffinityThreshold, p.LoRAAffinityThreshold)
		setIf(&tp.QueueingThresholdLoRA, p.QueueingThresholdLoRA)
		setIf(&tp.QueueThresholdCritical, p.QueueThresholdCritical)
		setIf(&tp.KVCacheThreshold, p.KVCacheThreshold)
		if err := tp.validate(); err != nil {
			return nil, err
		}
		steps, entries := SeedTree(tp)
		return NewDecisionTree(name, steps, entries)
	}
	if hasThresholds {
		return nil, fieldErr("steps", "thresholds configure the built-in table only; with steps, set them on the referenced filters")
	}
	if p.Entries == nil {
		return nil, fieldErr("entries", "required with steps")
	}
	steps := make([]TreeStep, len(p.Steps))
	for i, s := range p.Steps {
		field := fmt.Sprintf("steps[%d].filter", i)
		if s.Filter == "" {
			return nil, fieldErr(field, "required")
		}
		pl, err := h.Plugin(s.Filter)
		if err != nil {
			return nil, prefixErr(field, err)
		}
		f, ok := pl.(Filter)
		if !ok {
			return nil, fieldErr(field, fmt.Sprintf("%q is not a filter", s.Filter))
		}
		steps[i] = TreeStep{Name: s.Name, Filter: f, OnSuccess: s.OnSuccess, OnFailure: s.OnFailure}
	}
	return NewDecisionTree(name, steps, *p.Entries)
}

func setIf[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

func newPrefixAffinityFromParams(name string, params json.RawMessage, _ Handle) (Plugin, error) {
	p := struct {
		QueueThreshold    int     `json:"queueThreshold"`
		KVCacheThreshold  float64 `json:"kvCacheThreshold"`
		KeepRatio         float64 `json:"keepRatio"`
		MinMatchBlocks    int     `json:"minMatchBlocks"`
		ConsistentHashing bool    `json:"consistentHashing"`
		BalanceFactor     float64 `json:"balanceFactor"`
		MinCapacity       int     `json:"minCapacity"`
		MinReuse          float64 `json:"minReuse"`
	}{DefaultPrefixQueueThreshold, DefaultPrefixKVCacheThreshold, DefaultPrefixKeepRatio,
		DefaultPrefixMinMatchBlocks, true, DefaultPrefixBalanceFactor, DefaultPrefixMinCapacity, DefaultPrefixMinReuse}
	if err := DecodeParameters(params, &p); err != nil {
		return nil, err
	}
	switch {
	case p.QueueThreshold < 0:
		return nil, fieldErr("queueThreshold", "must be >= 0")
	case !(p.KVCacheThreshold >= 0 && p.KVCacheThreshold <= 1):
		return nil, fieldErr("kvCacheThreshold", "must be in [0,1]")
	case !(p.KeepRatio > 0 && p.KeepRatio <= 1):
		return nil, fieldErr("keepRatio", "must be in (0,1]")
	case p.MinMatchBlocks < 0:
		return nil, fieldErr("minMatchBlocks", "must be >= 0")
	case !(p.BalanceFactor > 1) || math.IsInf(p.BalanceFactor, 0):
		return nil, fieldErr("balanceFactor", "must be a finite number > 1")
	case p.MinCapacity < 0:
		return nil, fieldErr("minCapacity", "must be >= 0")
	case !(p.MinReuse >= 0 && p.MinReuse <= 1):
		return nil, fieldErr("minReuse", "must be in [0,1]")
	}
	return &PrefixAffinityFilter{PluginName: name, QueueThreshold: p.QueueThreshold, KVCacheThreshold: p.KVCacheThreshold,
		KeepRatio: p.KeepRatio, MinMatchBlocks: p.MinMatchBlocks, ConsistentHashing: p.ConsistentHashing,
		BalanceFactor: p.BalanceFactor, MinCapacity: p.MinCapacity, MinReuse: p.MinReuse}, nil
}
