package filter

import (
	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// The model table from Kubernetes objects. The agents push it as a
// configuration record (scheduler/wire ConfigRecord, built from llm-d's
// InferenceObjective and InferenceModelRewrite objects), the receiver keeps
// it in shared data, and the router applies it on the next request: the
// metrics directory it reads on every request names the record's
// generation (config_gen), and the record is read only when that moved.
//
// While a record with a non-empty table is stored, it replaces the
// bootstrap's models entirely and follows llm-d's semantics: a model a
// rewrite names goes to the rewrite's targets by weight, any other model to
// the default rule's targets if there is one, else unchanged (every model is
// served; unknownModels does not apply); the request's criticality comes
// from the objective its x-llm-d-inference-objective header (formerly
// x-gateway-inference-objective) names: priority < 0 is Sheddable, any
// other priority, an unknown objective and no header are Critical (llm-d
// sheds only negative priorities). Without a record, or with an empty
// table, the bootstrap's models apply.

// Objective headers, in the order they are read.
const (
	objectiveHeader       = "x-llm-d-inference-objective"
	legacyObjectiveHeader = "x-gateway-inference-objective"
)

// maxStoredConfigBytes bounds the record a router reads: the receiver has
// judged it against its own bound already (at most this).
const maxStoredConfigBytes = 16 << 20

// crdTable is the router's copy of the stored record, decoded.
type crdTable struct {
	key    string
	limits wire.ConfigLimits
	// gen is the generation the active table came from (0: no record).
	gen    uint64
	active *activeTable // nil: the bootstrap models apply

	applied, decodeErrors proxywasm.MetricCounter
}

// activeTable is a decoded non-empty table. Each model exists once per
// criticality a request may get, so resolving allocates nothing.
type activeTable struct {
	models     map[string]*[2]model
	def        *[2]model // the default rule, or nil
	unchanged  [2]model  // models no rule names, without a default rule
	objectives map[string]scheduler.Criticality
}

// The two criticalities a table gives, as indices into [2]model.
const (
	critIdx = 0
	shedIdx = 1
)

func newCRDTable(cfg *config.Config) crdTable {
	lim := cfg.ConfigLimits()
	lim.MaxBytes = maxStoredConfigBytes
	return crdTable{key: cfg.ConfigKey(), limits: lim,
		applied:      proxywasm.DefineCounterMetric("wasm_epp.config.applied"),
		decodeErrors: proxywasm.DefineCounterMetric("wasm_epp.config.decode_errors")}
}

// CriticalityOfPriority maps an InferenceObjective's priority onto the
// scheduler's criticalities as llm-d sheds: negative priorities are
// sheddable, every other is not.
func CriticalityOfPriority(p int32) scheduler.Criticality {
	if p < 0 {
		return scheduler.Sheddable
	}
	return scheduler.Critical
}

// refresh makes t follow the stored record whose generation the
// directory names (gen 0: none; known false: the directory could not be
// read, keep what is applied). Nothing is read while gen stays.
func (t *crdTable) refresh(gen uint64, known bool) {
	switch {
	case !known || gen == t.gen:
		return
	case gen == 0:
		t.gen, t.active = 0, nil
		return
	}
	data, _, err := proxywasm.GetSharedData(t.key)
	if err != nil {
		logSharedDataError(t.key, err)
		return
	}
	t.gen = gen
	rec, err := wire.DecodeConfig(data, t.limits)
	if err != nil {
		t.decodeErrors.Increment(1)
		logConfigError(err)
		return // the previous table stays
	}
	t.active = buildActiveTable(&rec.Table)
	t.applied.Increment(1)
	logConfigApplied(rec)
}

func logConfigError(err error) {
	proxywasm.LogErrorf("wasm-epp: stored model table unreadable, keeping the previous one: %v", err)
}

func logConfigApplied(rec *wire.DecodedConfig) {
	proxywasm.LogInfof("wasm-epp: model table of pool %s/%s applied: %d rewritten models, default rule %t, %d objectives (revisions %s, from agent %q)",
		rec.PoolNamespace, rec.PoolName, len(rec.Table.Rewrites), len(rec.Table.Default) > 0, len(rec.Table.Objectives),
		rec.Revision.String(), rec.AgentID)
}

// buildActiveTable turns a decoded table into the router's models; nil for
// an empty table (the bootstrap models apply).
func buildActiveTable(tb *wire.ModelTable) *activeTable {
	if tb.Empty() {
		return nil
	}
	a := &activeTable{models: make(map[string]*[2]model, len(tb.Rewrites)),
		objectives: make(map[string]scheduler.Criticality, len(tb.Objectives))}
	for _, rw := range tb.Rewrites {
		a.models[rw.Model] = pair(rw.Model, rw.Targets)
	}
	if len(tb.Default) > 0 {
		a.def = pair("", tb.Default)
	}
	a.unchanged = *pair("", nil)
	for _, o := range tb.Objectives {
		a.objectives[o.Name] = CriticalityOfPriority(o.Priority)
	}
	return a
}

// pair builds the Critical and the Sheddable model of one entry.
func pair(name string, ts []wire.WeightedTarget) *[2]model {
	m := model{name: name}
	for _, t := range ts {
		if t.Weight == 0 {
			continue // in the table but sent nothing
		}
		m.total += int(t.Weight)
		m.targets = append(m.targets, target{name: t.Model, cum: m.total})
	}
	p := &[2]model{m, m}
	p[critIdx].crit, p[shedIdx].crit = scheduler.Critical, scheduler.Sheddable
	return p
}
