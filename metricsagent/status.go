package metricsagent

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// ConditionAccepted is the condition type the agent writes on
// InferenceObjectives and InferenceModelRewrites (the one their CRDs name).
const ConditionAccepted = "Accepted"

// fieldManager names the agent in the objects' managed fields.
const fieldManager = "wasm-epp-metricsagent"

// StatusWriter writes each verdict as the object's Accepted condition
// (status True or False, the reason, the message, the generation judged).
//
// Every agent of the DaemonSet reaches the same verdicts, so a write is made
// only when the object's condition differs, after a random delay of up to
// Jitter: by then another agent has usually written it, the watch has
// brought the written object, and nothing is left to do. Writes carry the
// resourceVersion read, so two agents writing at once cannot both succeed;
// the loser's conflict is expected and only counted. Without the RBAC
// permission (update on the status subresources) the writer says so once
// and stops; the log and the metrics still report every verdict.
type StatusWriter struct {
	Dyn dynamic.Interface
	// Object returns the stored JSON of an object (KubeObjectSource.object).
	Object  func(kind, namespace, name string) ([]byte, bool)
	Log     *slog.Logger
	Metrics *Metrics
	Jitter  time.Duration
	Now     func() time.Time

	pending  chan []Verdict
	disabled atomic.Bool
	// wrote remembers the last condition written per object and the
	// resourceVersion it was written on, so the verdicts of a rebuild that
	// runs before the watch has brought the written object back are not
	// written twice; once the object moved on, it is judged afresh.
	wrote map[string]written
}

type written struct {
	v  Verdict
	rv string
}

// NewStatusWriter returns a writer; call Run to start it.
func NewStatusWriter(dyn dynamic.Interface, object func(kind, namespace, name string) ([]byte, bool), log *slog.Logger, m *Metrics, jitter time.Duration) *StatusWriter {
	return &StatusWriter{Dyn: dyn, Object: object, Log: log, Metrics: m, Jitter: jitter, Now: time.Now, pending: make(chan []Verdict, 1),
		wrote: map[string]written{}}
}

// Submit hands over the latest verdicts, replacing any not yet written.
func (w *StatusWriter) Submit(vs []Verdict) {
	if w.disabled.Load() {
		return
	}
	for {
		select {
		case w.pending <- vs:
			return
		default:
		}
		select {
		case <-w.pending:
		default:
		}
	}
}

// Run writes submitted verdicts until ctx ends.
func (w *StatusWriter) Run(ctx context.Context) {
	for {
		var vs []Verdict
		select {
		case <-ctx.Done():
			return
		case vs = <-w.pending:
		}
		if w.Jitter > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(rand.N(w.Jitter)):
			}
			select { // newer verdicts arrived meanwhile
			case vs = <-w.pending:
			default:
			}
		}
		for _, v := range vs {
			if w.disabled.Load() || ctx.Err() != nil {
				return
			}
			w.write(ctx, v)
		}
	}
}

func gvrOf(kind string) (schema.GroupVersionResource, bool) {
	switch kind {
	case KindInferenceObjective:
		return InferenceObjectiveGVR, true
	case KindInferenceModelRewrite:
		return InferenceModelRewriteGVR, true
	}
	return schema.GroupVersionResource{}, false
}

// maxConditionMessage is metav1.Condition's bound on a message.
const maxConditionMessage = 32768

// write sets v's condition on the stored object if it differs.
func (w *StatusWriter) write(ctx context.Context, v Verdict) {
	gvr, ok := gvrOf(v.Kind)
	if !ok {
		return
	}
	js, ok := w.Object(v.Kind, v.Namespace, v.Name)
	if !ok {
		return
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(js); err != nil || u.GetGeneration() != v.Generation {
		return // changed since it was judged: a newer verdict follows
	}
	if last, ok := w.wrote[v.ID()]; ok && last.rv == u.GetResourceVersion() && sameCondition(&last.v, &v) {
		return // written on this very version: the watch has not brought it back yet
	}
	status, reason, msg := metav1.ConditionTrue, v.Reason, v.Message
	if !v.Accepted {
		status = metav1.ConditionFalse
	}
	if len(msg) > maxConditionMessage {
		msg = msg[:maxConditionMessage]
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	idx := -1
	transition := w.Now().UTC().Format(time.RFC3339)
	for i, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["type"] != ConditionAccepted {
			continue
		}
		idx = i
		gen, _, _ := unstructured.NestedInt64(m, "observedGeneration")
		if m["status"] == string(status) && m["reason"] == reason && m["message"] == msg && gen == v.Generation {
			return // already says so
		}
		if m["status"] == string(status) {
			if t, ok := m["lastTransitionTime"].(string); ok && t != "" {
				transition = t
			}
		}
	}
	cond := map[string]any{"type": ConditionAccepted, "status": string(status), "reason": reason, "message": msg,
		"observedGeneration": v.Generation, "lastTransitionTime": transition}
	if idx >= 0 {
		conds[idx] = cond
	} else {
		conds = append(conds, cond)
	}
	if err := unstructured.SetNestedSlice(u.Object, conds, "status", "conditions"); err != nil {
		w.Log.Error("cannot set the condition", "kind", v.Kind, "namespace", v.Namespace, "name", v.Name, "err", err)
		return
	}
	_, err := w.Dyn.Resource(gvr).Namespace(v.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{FieldManager: fieldManager})
	switch {
	case err == nil:
		w.wrote[v.ID()] = written{v: v, rv: u.GetResourceVersion()}
		w.Metrics.StatusWrites.WithLabelValues("written").Inc()
		w.Log.Debug("condition written", "kind", v.Kind, "namespace", v.Namespace, "name", v.Name, "status", status, "reason", reason)
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		// Another agent wrote first, or the object changed or went: the
		// watch brings what happened and the next verdict is judged on it.
		w.Metrics.StatusWrites.WithLabelValues("conflict").Inc()
	case apierrors.IsForbidden(err):
		w.Metrics.StatusWrites.WithLabelValues("forbidden").Inc()
		if !w.disabled.Swap(true) {
			w.Log.Warn("no permission to write status conditions: verdicts are only logged and in the metrics from now on (grant update on inferenceobjectives/status and inferencemodelrewrites/status, or set --write-status=false)",
				"err", err)
		}
	default:
		w.Metrics.StatusWrites.WithLabelValues("error").Inc()
		w.Log.Warn("cannot write a status condition; retried within a minute", "kind", v.Kind, "namespace", v.Namespace, "name", v.Name, "err", err)
	}
}

func sameCondition(a, b *Verdict) bool {
	return a.Generation == b.Generation && a.Accepted == b.Accepted && a.Reason == b.Reason && a.Message == b.Message
}
