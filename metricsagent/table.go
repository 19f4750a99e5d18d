package metricsagent

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// TableInput is what a model table is built from: the pool it is for, the
// names of the InferencePools that exist in its namespace, and the
// InferenceObjective and InferenceModelRewrite objects of that namespace as
// the API server sent them (JSON).
type TableInput struct {
	PoolNamespace, PoolName string
	Pools                   []string
	Objectives, Rewrites    [][]byte
}

// TableResult is the table and one verdict per object that names the pool
// (or names a pool that does not exist): objects of other pools are not
// this table's business and get none.
type TableResult struct {
	Table    wire.ModelTable
	Verdicts []Verdict
}

// Verdict is what became of one object, as its Accepted condition says it.
type Verdict struct {
	Kind, Namespace, Name string
	Generation            int64
	Accepted              bool
	Reason, Message       string
	// Conflicts are the precedence decisions that involved this object,
	// each reported (for a rejected object, the one that rejected it).
	Conflicts []string
}

// ID is kind namespace/name, for logs and metrics.
func (v *Verdict) ID() string { return v.Kind + " " + v.Namespace + "/" + v.Name }

// BuildTable maps the objects onto a model table, as llm-d's router
// resolves them:
//
//   - an InferenceModelRewrite's rule sends the models it matches exactly
//     to its targets by weight; a rule without matches serves every model
//     no exact match names (the table's default);
//   - within one object the first rule (in list order) that matches a
//     model wins, and a later one is reported as shadowed;
//   - across objects the oldest (creation time, then namespace/name) wins a
//     model or the default; the younger object is rejected whole, so a
//     table never holds part of an object;
//   - an InferenceObjective gives its name a priority (unset: 0).
//
// An object whose spec does not decode strictly or breaks a rule, that names
// a pool that does not exist, or that would take the table past lim, is
// rejected with the reason; the others are unaffected. The result depends
// only on the input (not its order, nor which agent builds it: the byte
// bound leaves room for the longest agent id), so every agent builds the
// same table.
func BuildTable(in TableInput, lim wire.ConfigLimits) TableResult {
	lim = lim.Resolved()
	b := &tableBuilder{in: in, lim: lim, claimed: map[string]string{},
		size: wire.ConfigBaseSize(longestAgentID, in.PoolNamespace, in.PoolName)}
	objectives := b.ours(in.Objectives, KindInferenceObjective, func(data []byte) (*metav1.ObjectMeta, any, error) {
		o, err := DecodeInferenceObjective(data)
		if err != nil {
			return nil, nil, err
		}
		return &o.ObjectMeta, o, nil
	})
	rewrites := b.ours(in.Rewrites, KindInferenceModelRewrite, func(data []byte) (*metav1.ObjectMeta, any, error) {
		rw, err := DecodeInferenceModelRewrite(data)
		if err != nil {
			return nil, nil, err
		}
		return &rw.ObjectMeta, rw, nil
	})
	for _, o := range objectives {
		b.addObjective(o)
	}
	for _, o := range rewrites {
		b.addRewrite(o)
	}
	b.res.Table.Normalize()
	slices.SortFunc(b.res.Verdicts, func(x, y Verdict) int {
		return strings.Compare(x.Kind+"/"+x.Namespace+"/"+x.Name, y.Kind+"/"+y.Namespace+"/"+y.Name)
	})
	return b.res
}

// longestAgentID stands for any agent's id in the size of a record.
var longestAgentID = strings.Repeat("a", wire.MaxObjectNameLen)

type tableBuilder struct {
	in  TableInput
	lim wire.ConfigLimits
	res TableResult
	// claimed maps each model with a rewrite (and "" for the default) to
	// the object that holds it.
	claimed map[string]string
	size    int
}

// object is one decoded object of the pool, or one that failed to decode.
type object struct {
	kind string
	meta metav1.ObjectMeta
	obj  any // *InferenceObjective or *InferenceModelRewrite
}

// ours decodes the objects of one kind, rejects those that fail or name a
// pool that does not exist, and returns the ones naming the pool, oldest
// first.
func (b *tableBuilder) ours(raw [][]byte, kind string, decode func([]byte) (*metav1.ObjectMeta, any, error)) []object {
	var out []object
	for _, data := range raw {
		meta, obj, err := decode(data)
		if err != nil {
			m, ref := peek(data)
			if !ref.ours() || (ref.Name != "" && ref.Name != b.in.PoolName && slices.Contains(b.in.Pools, ref.Name)) {
				continue // another pool's object: its own picker judges it
			}
			b.reject(kind, &m, err)
			continue
		}
		ref := poolRefOf(obj)
		if !ref.ours() || (ref.Name != b.in.PoolName && slices.Contains(b.in.Pools, ref.Name)) {
			continue
		}
		if !slices.Contains(b.in.Pools, ref.Name) {
			b.reject(kind, meta, &ObjectError{Reason: ReasonPoolNotFound,
				Msg: fmt.Sprintf("spec.poolRef names InferencePool %q, which does not exist in namespace %q", ref.Name, meta.Namespace)})
			continue
		}
		out = append(out, object{kind: kind, meta: *meta, obj: obj})
	}
	slices.SortFunc(out, func(x, y object) int {
		if c := x.meta.CreationTimestamp.Compare(y.meta.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(x.meta.Namespace+"/"+x.meta.Name, y.meta.Namespace+"/"+y.meta.Name)
	})
	return out
}

func poolRefOf(obj any) PoolRef {
	switch o := obj.(type) {
	case *InferenceObjective:
		return o.Spec.PoolRef
	case *InferenceModelRewrite:
		return *o.Spec.PoolRef
	}
	return PoolRef{}
}

// peek reads the metadata and poolRef of an object that did not decode,
// leniently, to tell whether it is the pool's (and report it) or not.
func peek(data []byte) (metav1.ObjectMeta, PoolRef) {
	var v struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
		Spec     struct {
			PoolRef PoolRef `json:"poolRef"`
		} `json:"spec"`
	}
	_ = json.Unmarshal(data, &v)
	return v.Metadata, v.Spec.PoolRef
}

func (b *tableBuilder) reject(kind string, meta *metav1.ObjectMeta, err error) {
	oe, ok := err.(*ObjectError)
	if !ok {
		oe = invalid("%v", err)
	}
	v := Verdict{Kind: kind, Namespace: meta.Namespace, Name: meta.Name, Generation: meta.Generation,
		Reason: oe.Reason, Message: oe.Msg}
	if oe.Reason == ReasonModelConflict {
		v.Conflicts = []string{oe.Msg}
	}
	b.res.Verdicts = append(b.res.Verdicts, v)
}

func (b *tableBuilder) accept(o *object, msg string, conflicts []string) {
	b.res.Verdicts = append(b.res.Verdicts, Verdict{Kind: o.kind, Namespace: o.meta.Namespace, Name: o.meta.Name,
		Generation: o.meta.Generation, Accepted: true, Reason: ReasonAccepted, Message: msg, Conflicts: conflicts})
}

// countGrowth is what one more entry adds to a list count of n entries.
func countGrowth(n int) int { return wire.CountSize(n+1) - wire.CountSize(n) }

func (b *tableBuilder) addObjective(o object) {
	obj := o.obj.(*InferenceObjective)
	entry := wire.Objective{Name: o.meta.Name, Priority: obj.Priority()}
	t := &b.res.Table
	grow := wire.ObjectiveSize(&entry) + countGrowth(len(t.Objectives))
	if len(t.Objectives) >= b.lim.MaxObjectives || b.size+grow > b.lim.MaxBytes {
		b.reject(o.kind, &o.meta, &ObjectError{Reason: ReasonTooLarge,
			Msg: fmt.Sprintf("the table already holds %d objectives (%d bytes): older objects fill its bounds (%d objectives, %d bytes)",
				len(t.Objectives), b.size, b.lim.MaxObjectives, b.lim.MaxBytes)})
		return
	}
	t.Objectives = append(t.Objectives, entry)
	b.size += grow
	b.accept(&o, objectiveMessage(entry), nil)
}

// objectiveMessage says how requests use an accepted objective.
func objectiveMessage(o wire.Objective) string {
	class := "not sheddable"
	if o.Priority < 0 {
		class = "sheddable"
	}
	return fmt.Sprintf("priority %d (%s) for requests with header %s: %s", o.Priority, class, ObjectiveHeader, o.Name)
}

// ObjectiveHeader is the request header naming a request's objective
// (llm-d's; the router also reads its former name, x-gateway-inference-objective).
const ObjectiveHeader = "x-llm-d-inference-objective"

func (b *tableBuilder) addRewrite(o object) {
	rw := o.obj.(*InferenceModelRewrite)
	id := KindInferenceModelRewrite + " " + strconv.Quote(o.meta.Name)
	var (
		entries   []wire.ModelRewrite
		def       []wire.WeightedTarget
		defRule   = -1
		claimedBy = map[string]int{} // model -> rule index within this object
		notes     []string
	)
	for i, rule := range rw.Spec.Rules {
		if err := b.checkRule(i, &rule); err != nil {
			b.reject(o.kind, &o.meta, err)
			return
		}
		targets := weightedTargets(rule.Targets)
		if len(rule.Matches) == 0 {
			if defRule >= 0 {
				notes = append(notes, fmt.Sprintf("rules[%d] matches every model, as rules[%d] does: rules[%d] wins (first rule in list order)", i, defRule, defRule))
				continue
			}
			defRule, def = i, targets
			continue
		}
		for _, m := range rule.Matches {
			model := m.Model.Value
			if j, dup := claimedBy[model]; dup {
				if j != i {
					notes = append(notes, fmt.Sprintf("rules[%d] matches %q, as rules[%d] does: rules[%d] wins (first rule in list order)", i, model, j, j))
				}
				continue
			}
			claimedBy[model] = i
			entries = append(entries, wire.ModelRewrite{Model: model, Targets: slices.Clone(targets)})
		}
	}
	// Older objects hold their models: a younger one that wants any of them
	// is rejected whole.
	for _, e := range entries {
		if owner, taken := b.claimed[e.Model]; taken {
			b.reject(o.kind, &o.meta, &ObjectError{Reason: ReasonModelConflict,
				Msg: fmt.Sprintf("model %q is already rewritten by the older %s (the oldest object wins)", e.Model, owner)})
			return
		}
	}
	if def != nil {
		if owner, taken := b.claimed[""]; taken {
			b.reject(o.kind, &o.meta, &ObjectError{Reason: ReasonModelConflict,
				Msg: fmt.Sprintf("rules[%d] matches every model, as a rule of the older %s does (the oldest object wins)", defRule, owner)})
			return
		}
	}
	part := &wire.ModelTable{Rewrites: entries, Default: def}
	part.Normalize()
	t := &b.res.Table
	grow := 0
	for i := range part.Rewrites {
		grow += wire.RewriteSize(&part.Rewrites[i]) + countGrowth(len(t.Rewrites)+i)
	}
	if def != nil {
		grow += wire.DefaultSize(def)
	}
	if len(t.Rewrites)+len(entries) > b.lim.MaxRewrites || b.size+grow > b.lim.MaxBytes {
		b.reject(o.kind, &o.meta, &ObjectError{Reason: ReasonTooLarge,
			Msg: fmt.Sprintf("its %d models would take the table past its bounds (%d models, %d bytes; older objects hold %d models, %d bytes)",
				len(entries), b.lim.MaxRewrites, b.lim.MaxBytes, len(t.Rewrites), b.size)})
		return
	}
	for _, e := range entries {
		b.claimed[e.Model] = id
	}
	if def != nil {
		b.claimed[""] = id
		t.Default = def
	}
	t.Rewrites = append(t.Rewrites, part.Rewrites...)
	b.size += grow
	msg := fmt.Sprintf("%d models rewritten", len(entries))
	if def != nil {
		msg += ", and every other model by rules[" + strconv.Itoa(defRule) + "]"
	}
	if len(notes) > 0 {
		msg += "; " + strings.Join(notes, "; ")
	}
	b.accept(&o, msg, notes)
}

// weightedTargets turns a rule's targets into wire targets: without weights
// they share equally.
func weightedTargets(ts []RewriteTarget) []wire.WeightedTarget {
	out := make([]wire.WeightedTarget, len(ts))
	for i, t := range ts {
		w := uint32(1)
		if t.Weight != nil {
			w = uint32(*t.Weight)
		}
		out[i] = wire.WeightedTarget{Model: t.ModelRewrite, Weight: w}
	}
	return out
}

// checkRule holds a rule's names and target count to the record's rules,
// which the receiver applies too.
func (b *tableBuilder) checkRule(i int, rule *RewriteRule) *ObjectError {
	path := "spec.rules[" + strconv.Itoa(i) + "]"
	for j, m := range rule.Matches {
		if err := wire.CheckName(m.Model.Value, b.lim.MaxModelNameLen); err != nil {
			return invalid("%s.matches[%d].model.value %q: %v", path, j, m.Model.Value, err)
		}
	}
	if len(rule.Targets) > b.lim.MaxTargets {
		return &ObjectError{Reason: ReasonTooLarge, Msg: fmt.Sprintf("%s has %d targets, at most %d", path, len(rule.Targets), b.lim.MaxTargets)}
	}
	for j, t := range rule.Targets {
		if err := wire.CheckName(t.ModelRewrite, b.lim.MaxModelNameLen); err != nil {
			return invalid("%s.targets[%d].modelRewrite %q: %v", path, j, t.ModelRewrite, err)
		}
	}
	return nil
}
