package metricsagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/wasm-epp/wasm-epp/internal/strictjson"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// The Kubernetes objects the agent reads, as the current installs serve
// them: GAIE's InferencePool (inference.networking.k8s.io/v1) and llm-d's
// InferenceObjective and InferenceModelRewrite (llm-d.ai/v1alpha2). No Go
// module of either API is available, so these are the agent's own types for
// the fields it reads; spec sections are decoded strictly (an unknown field
// rejects the object: a field the agent does not know may change what the
// object means). metadata and status are read leniently: the API server and
// other controllers own them.
var (
	InferencePoolGVR         = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
	InferenceObjectiveGVR    = schema.GroupVersionResource{Group: "llm-d.ai", Version: "v1alpha2", Resource: "inferenceobjectives"}
	InferenceModelRewriteGVR = schema.GroupVersionResource{Group: "llm-d.ai", Version: "v1alpha2", Resource: "inferencemodelrewrites"}
)

// Kinds of the objects, as in their apiVersion/kind.
const (
	KindInferencePool         = "InferencePool"
	KindInferenceObjective    = "InferenceObjective"
	KindInferenceModelRewrite = "InferenceModelRewrite"
)

// poolRefDefaultGroup and poolRefDefaultKind are what an objective's or
// rewrite's poolRef means when it leaves them out (their CRDs' defaults).
const (
	poolRefDefaultGroup = "inference.networking.k8s.io"
	poolRefDefaultKind  = KindInferencePool
)

// InferencePool is the part of an InferencePool the agent reads.
type InferencePool struct {
	metav1.ObjectMeta
	Spec InferencePoolSpec
}

// InferencePoolSpec: which pods serve the pool, on which ports.
type InferencePoolSpec struct {
	Selector    PoolSelector `json:"selector"`
	TargetPorts []PoolPort   `json:"targetPorts"`
	// AppProtocol is the model servers' protocol towards Envoy; metrics
	// are scraped with HTTP/1.1 whatever it says.
	AppProtocol string `json:"appProtocol,omitempty"`
	// EndpointPickerRef names the pool's external endpoint picker (llm-d's
	// EPP). wasm-epp picks inside Envoy and ignores it.
	EndpointPickerRef *EndpointPickerRef `json:"endpointPickerRef,omitempty"`
}

// PoolSelector selects the pool's pods in its namespace, by labels only.
type PoolSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

// PoolPort is one target port: each is an endpoint of its own.
type PoolPort struct {
	Number int32 `json:"number"`
}

// EndpointPickerRef is read (so the spec decodes strictly) and ignored.
type EndpointPickerRef struct {
	Group       *string   `json:"group,omitempty"`
	Kind        string    `json:"kind,omitempty"`
	Name        string    `json:"name"`
	Port        *PoolPort `json:"port,omitempty"`
	FailureMode string    `json:"failureMode,omitempty"`
}

// InferenceObjective names a workload's priority.
type InferenceObjective struct {
	metav1.ObjectMeta
	Spec InferenceObjectiveSpec
}

// InferenceObjectiveSpec: higher priority is more important; unset is 0.
type InferenceObjectiveSpec struct {
	Priority *int32  `json:"priority,omitempty"`
	PoolRef  PoolRef `json:"poolRef"`
}

// PoolRef names an InferencePool in the referrer's namespace.
type PoolRef struct {
	Group string `json:"group,omitempty"`
	Kind  string `json:"kind,omitempty"`
	Name  string `json:"name"`
}

// InferenceModelRewrite maps requested model names to weighted targets.
type InferenceModelRewrite struct {
	metav1.ObjectMeta
	Spec InferenceModelRewriteSpec
}

// InferenceModelRewriteSpec: rules in order; the first that matches wins
// within one object.
type InferenceModelRewriteSpec struct {
	PoolRef *PoolRef      `json:"poolRef"`
	Rules   []RewriteRule `json:"rules"`
}

// RewriteRule matches any of its model names (none: every model) and sends
// the request to its targets by weight.
type RewriteRule struct {
	Matches []RewriteMatch  `json:"matches,omitempty"`
	Targets []RewriteTarget `json:"targets,omitempty"`
}

// RewriteMatch matches the request body's model.
type RewriteMatch struct {
	Model *ModelMatch `json:"model,omitempty"`
}

// ModelMatch: Type is "Exact" (the default and only value).
type ModelMatch struct {
	Type  *string `json:"type,omitempty"`
	Value string  `json:"value"`
}

// RewriteTarget is a model name with its weight; weights are set on every
// target of a rule or on none (then the targets share equally).
type RewriteTarget struct {
	Weight       *int32 `json:"weight,omitempty"`
	ModelRewrite string `json:"modelRewrite"`
}

// ObjectError rejects one object: Reason is the condition reason written on
// it (CamelCase, as Kubernetes reasons are), Msg says what to fix.
type ObjectError struct {
	Reason string
	Msg    string
}

func (e *ObjectError) Error() string { return e.Reason + ": " + e.Msg }

// Reasons an object is rejected for.
const (
	ReasonAccepted      = "Accepted"
	ReasonInvalidSpec   = "InvalidSpec"
	ReasonPoolNotFound  = "PoolNotFound"
	ReasonModelConflict = "ModelConflict"
	ReasonTooLarge      = "TooLarge"
)

func invalid(format string, args ...any) *ObjectError {
	return &ObjectError{Reason: ReasonInvalidSpec, Msg: fmt.Sprintf(format, args...)}
}

// envelope is the top level of an object: its spec is kept raw for the
// strict decoder, metadata and status are not judged.
type envelope struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   json.RawMessage `json:"metadata"`
	Spec       json.RawMessage `json:"spec"`
	Status     json.RawMessage `json:"status,omitempty"`
}

// decodeObject reads one object of kind, as JSON, into meta and spec.
func decodeObject(data []byte, gvr schema.GroupVersionResource, kind string, meta *metav1.ObjectMeta, spec any) *ObjectError {
	var env envelope
	if err := strictjson.Decode(data, &env); err != nil {
		return invalid("%v", err)
	}
	if want := gvr.GroupVersion().String(); env.APIVersion != want || env.Kind != kind {
		return invalid("apiVersion %q kind %q: want %s %s", env.APIVersion, env.Kind, want, kind)
	}
	if err := json.Unmarshal(env.Metadata, meta); err != nil {
		return invalid("metadata: %v", err)
	}
	// The API server never sends an object without a valid name; a file
	// (--test-objects-file) may. An objective's name goes into the table.
	if err := wire.CheckName(meta.Name, wire.MaxObjectNameLen); err != nil {
		return invalid("metadata.name %q: %v", meta.Name, err)
	}
	if len(env.Spec) == 0 || string(env.Spec) == "null" {
		return invalid("spec is missing")
	}
	if err := strictjson.Decode(env.Spec, spec); err != nil {
		var se *strictjson.Error
		if errors.As(err, &se) {
			return invalid("%s", strictjson.JoinPath("spec", se.Path)+": "+se.Msg)
		}
		return invalid("spec: %v", err)
	}
	return nil
}

// DecodeInferencePool decodes and validates an InferencePool (JSON).
func DecodeInferencePool(data []byte) (*InferencePool, error) {
	p := &InferencePool{}
	if err := decodeObject(data, InferencePoolGVR, KindInferencePool, &p.ObjectMeta, &p.Spec); err != nil {
		return nil, err
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// maxTargetPorts is InferencePool's schema bound.
const maxTargetPorts = 8

func (p *InferencePool) validate() *ObjectError {
	s := &p.Spec
	if len(s.TargetPorts) == 0 {
		return invalid("spec.targetPorts is empty: a pool needs at least one target port")
	}
	if len(s.TargetPorts) > maxTargetPorts {
		return invalid("spec.targetPorts has %d ports, at most %d", len(s.TargetPorts), maxTargetPorts)
	}
	seen := map[int32]bool{}
	for i, port := range s.TargetPorts {
		if port.Number < 1 || port.Number > 65535 {
			return invalid("spec.targetPorts[%d].number %d is out of range 1..65535", i, port.Number)
		}
		if seen[port.Number] {
			return invalid("spec.targetPorts[%d].number %d is listed twice", i, port.Number)
		}
		seen[port.Number] = true
	}
	if len(s.Selector.MatchLabels) == 0 {
		return invalid("spec.selector.matchLabels is empty: it would select every pod of the namespace")
	}
	for k, v := range s.Selector.MatchLabels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return invalid("spec.selector.matchLabels: key %q: %s", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return invalid("spec.selector.matchLabels[%q]: value %q: %s", k, v, strings.Join(errs, "; "))
		}
	}
	switch s.AppProtocol {
	case "", "http", "kubernetes.io/h2c":
	default:
		return invalid("spec.appProtocol %q: want http or kubernetes.io/h2c", s.AppProtocol)
	}
	return nil
}

// Ports returns the target port numbers in the pool's order.
func (p *InferencePool) Ports() []uint16 {
	out := make([]uint16, len(p.Spec.TargetPorts))
	for i, port := range p.Spec.TargetPorts {
		out[i] = uint16(port.Number)
	}
	return out
}

// DecodeInferenceObjective decodes and validates an InferenceObjective.
func DecodeInferenceObjective(data []byte) (*InferenceObjective, error) {
	o := &InferenceObjective{}
	if err := decodeObject(data, InferenceObjectiveGVR, KindInferenceObjective, &o.ObjectMeta, &o.Spec); err != nil {
		return nil, err
	}
	if err := o.Spec.PoolRef.validate("spec.poolRef"); err != nil {
		return nil, err
	}
	return o, nil
}

// Priority is the objective's priority, 0 when unset (as llm-d reads it).
func (o *InferenceObjective) Priority() int32 {
	if o.Spec.Priority == nil {
		return 0
	}
	return *o.Spec.Priority
}

func (r *PoolRef) validate(path string) *ObjectError {
	if r.Name == "" {
		return invalid("%s.name is required", path)
	}
	return nil
}

// ours reports whether r refers to an InferencePool of the group the agent
// reads (rather than some other kind of pool, which is not its business).
func (r *PoolRef) ours() bool {
	return (r.Group == "" || r.Group == poolRefDefaultGroup) && (r.Kind == "" || r.Kind == poolRefDefaultKind)
}

// DecodeInferenceModelRewrite decodes and validates an InferenceModelRewrite.
func DecodeInferenceModelRewrite(data []byte) (*InferenceModelRewrite, error) {
	rw := &InferenceModelRewrite{}
	if err := decodeObject(data, InferenceModelRewriteGVR, KindInferenceModelRewrite, &rw.ObjectMeta, &rw.Spec); err != nil {
		return nil, err
	}
	if err := rw.validate(); err != nil {
		return nil, err
	}
	return rw, nil
}

func (rw *InferenceModelRewrite) validate() *ObjectError {
	s := &rw.Spec
	if s.PoolRef == nil {
		return invalid("spec.poolRef is required")
	}
	if err := s.PoolRef.validate("spec.poolRef"); err != nil {
		return err
	}
	if len(s.Rules) == 0 {
		return invalid("spec.rules is empty")
	}
	for i, rule := range s.Rules {
		path := "spec.rules[" + strconv.Itoa(i) + "]"
		for j, m := range rule.Matches {
			mp := path + ".matches[" + strconv.Itoa(j) + "].model"
			if m.Model == nil {
				return invalid("%s is required", mp)
			}
			if m.Model.Type != nil && *m.Model.Type != "Exact" {
				return invalid("%s.type %q: only Exact is supported", mp, *m.Model.Type)
			}
			if m.Model.Value == "" {
				return invalid("%s.value is empty", mp)
			}
		}
		if len(rule.Targets) == 0 {
			return invalid("%s.targets is empty: a matching request would have no model to go to", path)
		}
		weighted, sum := 0, int64(0)
		seen := map[string]bool{}
		for j, t := range rule.Targets {
			tp := path + ".targets[" + strconv.Itoa(j) + "]"
			if t.ModelRewrite == "" {
				return invalid("%s.modelRewrite is empty", tp)
			}
			if seen[t.ModelRewrite] {
				return invalid("%s.modelRewrite %q is listed twice in this rule", tp, t.ModelRewrite)
			}
			seen[t.ModelRewrite] = true
			if t.Weight != nil {
				weighted++
				if *t.Weight < 0 {
					return invalid("%s.weight %d is negative", tp, *t.Weight)
				}
				if *t.Weight > wire.MaxWeight {
					return invalid("%s.weight %d is over %d", tp, *t.Weight, wire.MaxWeight)
				}
				sum += int64(*t.Weight)
			}
		}
		if weighted != 0 && weighted != len(rule.Targets) {
			return invalid("%s.targets: %d of %d targets have a weight; set it on all of them or on none", path, weighted, len(rule.Targets))
		}
		if weighted > 0 && sum == 0 {
			return invalid("%s.targets: the weights add up to 0, so no target could be chosen", path)
		}
	}
	return nil
}
