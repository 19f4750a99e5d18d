package metricsagent

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

func unstructuredDocs(t testing.TB, file string) []runtime.Object {
	t.Helper()
	var out []runtime.Object
	for _, js := range k8sDocs(t, file) {
		u := &unstructured.Unstructured{}
		require.NoError(t, u.UnmarshalJSON(js))
		out = append(out, u)
	}
	return out
}

var listKinds = map[schema.GroupVersionResource]string{
	InferencePoolGVR:         "InferencePoolList",
	InferenceObjectiveGVR:    "InferenceObjectiveList",
	InferenceModelRewriteGVR: "InferenceModelRewriteList",
}

func allServed(schema.GroupVersionResource) (bool, error) { return true, nil }

type kubeFixture struct {
	dyn     *dynamicfake.FakeDynamicClient
	src     *KubeObjectSource
	sync    *ConfigSync
	status  *StatusWriter
	metrics *Metrics
	logs    *lockedWriter
}

func newKubeFixture(t *testing.T, served func(schema.GroupVersionResource) (bool, error), objects ...runtime.Object) *kubeFixture {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &kubeFixture{logs: &lockedWriter{w: &bytes.Buffer{}}, metrics: NewMetrics(prometheus.NewRegistry())}
	log := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds, objects...)
	f.src = NewKubeObjectSource(f.dyn, "llm", served, log)
	require.NoError(t, f.src.Start(ctx, 10*time.Second))
	f.status = NewStatusWriter(f.dyn, f.src.object, log, f.metrics, 0)
	go f.status.Run(ctx)
	f.sync = NewConfigSync(ConfigSyncOptions{Source: f.src, PoolNamespace: "llm", PoolName: "vllm-llama", AgentID: "node-1",
		Log: log, Metrics: f.metrics, Status: f.status})
	go f.sync.Run(ctx)
	return f
}

func testObjects(t testing.TB) []runtime.Object {
	var objs []runtime.Object
	for _, f := range []string{"pools.yaml", "objectives.yaml", "rewrites.yaml"} {
		objs = append(objs, unstructuredDocs(t, f)...)
	}
	return objs
}

func (f *kubeFixture) record(t *testing.T) *wire.DecodedConfig {
	t.Helper()
	rec, err := wire.DecodeConfig(f.sync.Payload(), wire.ConfigLimits{})
	require.NoError(t, err)
	return rec
}

func (f *kubeFixture) condition(t *testing.T, gvr schema.GroupVersionResource, name string) map[string]any {
	t.Helper()
	u, err := f.dyn.Resource(gvr).Namespace("llm").Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m := c.(map[string]any); m["type"] == ConditionAccepted {
			return m
		}
	}
	return nil
}

// TestKubeObjectSourceBuildsTheTable: the testdata objects through the
// fake dynamic client give the table BuildTable gives, with the highest
// resourceVersion seen per resource, and every verdict as an Accepted
// condition on its object.
func TestKubeObjectSourceBuildsTheTable(t *testing.T) {
	f := newKubeFixture(t, allServed, testObjects(t)...)
	rec := f.record(t)
	want := BuildTable(testTableInput(t), wire.ConfigLimits{})
	assert.Equal(t, want.Table, rec.Table)
	assert.Equal(t, wire.ConfigRevision{Pools: 101, Objectives: 205, Rewrites: 306}, rec.Revision)
	assert.Equal(t, "llm", rec.PoolNamespace)
	assert.Equal(t, "vllm-llama", rec.PoolName)
	require.NotNil(t, f.sync.Pool())
	assert.Equal(t, []uint16{8000, 8001}, f.sync.Pool().Ports())

	for _, v := range want.Verdicts {
		gvr, _ := gvrOf(v.Kind)
		require.Eventually(t, func() bool { return f.condition(t, gvr, v.Name) != nil }, 10*time.Second, 10*time.Millisecond, v.ID())
		c := f.condition(t, gvr, v.Name)
		wantStatus := "True"
		if !v.Accepted {
			wantStatus = "False"
		}
		assert.Equal(t, wantStatus, c["status"], v.ID())
		assert.Equal(t, v.Reason, c["reason"], v.ID())
		assert.Equal(t, v.Message, c["message"], v.ID())
		assert.EqualValues(t, v.Generation, c["observedGeneration"], v.ID())
	}
	assert.Nil(t, f.condition(t, InferenceObjectiveGVR, "other"), "another pool's object is left alone")
	written := testutil.ToFloat64(f.metrics.StatusWrites.WithLabelValues("written"))
	assert.Equal(t, float64(len(want.Verdicts)), written)
	assert.Equal(t, 1.0, testutil.ToFloat64(f.metrics.ConfigRejected.WithLabelValues(KindInferenceModelRewrite, "llm", "llama-experiment", ReasonModelConflict)))
	assert.Equal(t, 3.0, testutil.ToFloat64(f.metrics.ConfigObjects.WithLabelValues(KindInferenceObjective, "accepted")))
	assert.Contains(t, f.logs.String(), `msg="object rejected" kind=InferenceModelRewrite namespace=llm name=llama-experiment reason=ModelConflict`)

	// A rebuild with nothing changed writes nothing: every condition says so already.
	f.sync.Rebuild()
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, written, testutil.ToFloat64(f.metrics.StatusWrites.WithLabelValues("written")))

	// kubectl edits the canary's weights from 90/10 to 0/100.
	canary := unstructuredDocs(t, "rewrites.yaml")[0].(*unstructured.Unstructured)
	rules, _, _ := unstructured.NestedSlice(canary.Object, "spec", "rules")
	targets := rules[0].(map[string]any)["targets"].([]any)
	targets[0].(map[string]any)["weight"] = int64(0)
	targets[1].(map[string]any)["weight"] = int64(100)
	require.NoError(t, unstructured.SetNestedSlice(canary.Object, rules, "spec", "rules")) // NestedSlice returned a copy
	canary.SetResourceVersion("400")
	canary.SetGeneration(5)
	_, err := f.dyn.Resource(InferenceModelRewriteGVR).Namespace("llm").Update(context.Background(), canary, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.record(t).Revision.Rewrites == 400 }, 10*time.Second, 10*time.Millisecond)
	rec = f.record(t)
	assert.Equal(t, []wire.WeightedTarget{wt("llama-3.1-8b", 0), wt("llama-3.2-8b", 100)}, rec.Table.Rewrites[0].Targets)
	require.Eventually(t, func() bool {
		c := f.condition(t, InferenceModelRewriteGVR, "llama-canary")
		return c != nil && c["observedGeneration"] == int64(5)
	}, 10*time.Second, 10*time.Millisecond, "the condition follows the new generation")

	// The canary is deleted: the younger rewrite that wanted "llama" wins it now.
	canary.SetResourceVersion("401")
	require.NoError(t, f.dyn.Resource(InferenceModelRewriteGVR).Namespace("llm").Delete(context.Background(), "llama-canary", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		rec := f.record(t)
		return len(rec.Table.Rewrites) > 0 && rec.Table.Rewrites[0].Model == "llama" && rec.Table.Rewrites[0].Targets[0].Model == "llama-3.3-70b"
	}, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		c := f.condition(t, InferenceModelRewriteGVR, "llama-experiment")
		return c != nil && c["status"] == "True"
	}, 10*time.Second, 10*time.Millisecond)
}

func TestStatusWriterConflictsAndPermissions(t *testing.T) {
	f := newKubeFixture(t, allServed) // no objects: nothing written yet
	var attempts int
	var mu sync.Mutex
	f.dyn.PrependReactor("update", "inferenceobjectives", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if attempts == 1 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "llm-d.ai", Resource: "inferenceobjectives"}, "x", nil)
		}
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "llm-d.ai", Resource: "inferenceobjectives"}, "x", nil)
	})
	for _, o := range testObjects(t) {
		u := o.(*unstructured.Unstructured)
		gvr := map[string]schema.GroupVersionResource{KindInferencePool: InferencePoolGVR, KindInferenceObjective: InferenceObjectiveGVR,
			KindInferenceModelRewrite: InferenceModelRewriteGVR}[u.GetKind()]
		if u.GetKind() == KindInferenceModelRewrite {
			continue
		}
		_, err := f.dyn.Resource(gvr).Namespace("llm").Create(context.Background(), u, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return testutil.ToFloat64(f.metrics.StatusWrites.WithLabelValues("forbidden")) == 1 },
		10*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1.0, testutil.ToFloat64(f.metrics.StatusWrites.WithLabelValues("conflict")))
	assert.Contains(t, f.logs.String(), "no permission to write status conditions")
	f.sync.Rebuild()
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	assert.Equal(t, 2, attempts, "after a Forbidden the writer stops trying")
	mu.Unlock()
	assert.NotEmpty(t, f.record(t).Table.Objectives, "the table does not depend on status writes")
}

// TestKubeObjectSourceWithoutLlmdCRDs: a cluster with GAIE's CRDs only
// gets an empty table (routers keep their bootstrap models), not errors;
// one without InferencePool cannot start.
func TestKubeObjectSourceWithoutLlmdCRDs(t *testing.T) {
	onlyPools := func(gvr schema.GroupVersionResource) (bool, error) { return gvr == InferencePoolGVR, nil }
	f := newKubeFixture(t, onlyPools, unstructuredDocs(t, "pools.yaml")...)
	rec := f.record(t)
	assert.True(t, rec.Table.Empty())
	assert.Contains(t, f.logs.String(), "the API server does not serve this resource")

	src := NewKubeObjectSource(dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds), "llm",
		func(schema.GroupVersionResource) (bool, error) { return false, nil }, quietLog)
	err := src.Start(context.Background(), time.Second)
	assert.ErrorContains(t, err, "does not serve inference.networking.k8s.io/v1 InferencePool")
}

// TestPoolDiscovery: the pods of the node that the pool's selector matches,
// one endpoint per target port; a pool edited into something invalid keeps
// the previous spec; a deleted pool discovers nothing.
func TestPoolDiscovery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newKubeFixture(t, allServed, unstructuredDocs(t, "pools.yaml")...)
	poolPod := func(name, node, ip string, mut ...func(*corev1.Pod)) *corev1.Pod {
		return pod(name, node, ip, true, append([]func(*corev1.Pod){func(p *corev1.Pod) { p.Labels = map[string]string{"app": "vllm-llama"} }}, mut...)...)
	}
	client := fake.NewClientset(
		poolPod("a", "node-1", "10.0.0.1"),
		poolPod("b", "node-1", "10.0.0.2", func(p *corev1.Pod) { p.Annotations = map[string]string{"llm-d.ai/active-ports": "8001, 9999"} }),
		poolPod("c", "node-2", "10.0.0.3"), // other node
		poolPod("d", "node-1", "10.0.0.4", func(p *corev1.Pod) { p.Labels["app"] = "other" }),
		poolPod("e", "node-1", "10.0.0.5", func(p *corev1.Pod) { p.Namespace = "elsewhere" }),
		pod("f", "node-1", "10.0.0.6", false, func(p *corev1.Pod) { p.Labels = map[string]string{"app": "vllm-llama"} }), // not ready
	)
	d, err := NewKubeDiscovery(podsOf(client), KubeConfig{Namespace: "llm", NodeName: "node-1", Path: "/metrics", Pool: f.sync}, quietLog)
	require.NoError(t, err)
	require.NoError(t, d.Start(ctx, 10*time.Second))
	assert.Equal(t, []string{
		"llm/a-rank-0 http://10.0.0.1:8000/metrics",
		"llm/a-rank-1 http://10.0.0.1:8001/metrics",
		"llm/b-rank-1 http://10.0.0.2:8001/metrics",
	}, names(d.Targets()))

	pools := unstructuredDocs(t, "pools.yaml")
	bad := pools[0].(*unstructured.Unstructured)
	require.NoError(t, unstructured.SetNestedSlice(bad.Object, []any{map[string]any{"number": int64(0)}}, "spec", "targetPorts"))
	bad.SetResourceVersion("500")
	_, err = f.dyn.Resource(InferencePoolGVR).Namespace("llm").Update(ctx, bad, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(f.metrics.ConfigRejected.WithLabelValues(KindInferencePool, "llm", "vllm-llama", ReasonInvalidSpec)) == 1
	}, 10*time.Second, 10*time.Millisecond)
	assert.Len(t, d.Targets(), 3, "the previous valid spec stays in use")
	assert.Contains(t, f.logs.String(), "spec.targetPorts[0].number 0 is out of range 1..65535")

	require.NoError(t, f.dyn.Resource(InferencePoolGVR).Namespace("llm").Delete(ctx, "vllm-llama", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return len(d.Targets()) == 0 }, 10*time.Second, 10*time.Millisecond)
}

// TestWatchBookmarksAdvanceTheRevision: a record's revisions say what the
// agent has seen of each resource, and a watch bookmark says it has seen
// everything up to the bookmark's resourceVersion, though no object
// changed. Without bookmarks, an agent that has run for long carries the
// resourceVersions of its last events, far below those of an agent that
// listed later (etcd revisions grow with every write in the cluster); once
// that agent has stored a record and gone away (its node removed), every
// later change got 409 from every receiver, for good.
func TestWatchBookmarksAdvanceTheRevision(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds, testObjects(t)...)
	watchers := map[schema.GroupVersionResource]*watch.FakeWatcher{}
	for gvr := range listKinds {
		fw := watch.NewFakeWithChanSize(8, false)
		watchers[gvr] = fw
		dyn.PrependWatchReactor(gvr.Resource, func(k8stesting.Action) (bool, watch.Interface, error) { return true, fw, nil })
	}
	src := NewKubeObjectSource(dyn, "llm", allServed, quietLog)
	require.NoError(t, src.Start(ctx, 10*time.Second))
	metrics := NewMetrics(prometheus.NewRegistry())
	cs := NewConfigSync(ConfigSyncOptions{Source: src, PoolNamespace: "llm", PoolName: "vllm-llama", AgentID: "node-1",
		Log: quietLog, Metrics: metrics})
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan struct{})
	go func() { defer close(runDone); cs.Run(runCtx) }()
	record := func() *wire.DecodedConfig {
		rec, err := wire.DecodeConfig(cs.Payload(), wire.ConfigLimits{})
		require.NoError(t, err)
		return rec
	}
	before := record()
	require.Equal(t, wire.ConfigRevision{Pools: 101, Objectives: 205, Rewrites: 306}, before.Revision)

	// An agent that started later listed everything at 5000 and stored
	// the same table; then its node went away.
	stored, err := wire.EncodeConfig(&wire.ConfigRecord{AgentID: "node-2", PoolNamespace: "llm", PoolName: "vllm-llama",
		Revision: wire.ConfigRevision{Pools: 5000, Objectives: 5000, Rewrites: 5000}, Table: before.Table}, wire.ConfigLimits{})
	require.NoError(t, err)

	// kubectl edits the canary's weights. This agent has seen events up to
	// 306 and 6100 only: the stored record (5000) may reflect changes it
	// has not seen yet, so the receiver keeps it for now.
	canary := unstructuredDocs(t, "rewrites.yaml")[0].(*unstructured.Unstructured)
	rules, _, _ := unstructured.NestedSlice(canary.Object, "spec", "rules")
	targets := rules[0].(map[string]any)["targets"].([]any)
	targets[0].(map[string]any)["weight"] = int64(1)
	targets[1].(map[string]any)["weight"] = int64(99)
	require.NoError(t, unstructured.SetNestedSlice(canary.Object, rules, "spec", "rules"))
	canary.SetResourceVersion("6100")
	watchers[InferenceModelRewriteGVR].Modify(canary)
	require.Eventually(t, func() bool { return record().Revision.Rewrites == 6100 }, 10*time.Second, 10*time.Millisecond)
	_, err = wire.DecideConfig(stored, record(), wire.ConfigLimits{})
	require.ErrorIs(t, err, wire.ErrConfigNotNewer)

	// The API server's bookmarks reach this agent's watches: it has seen
	// everything up to 6200, and its record says so at once.
	for _, fw := range watchers {
		bm := &unstructured.Unstructured{}
		bm.SetResourceVersion("6200")
		fw.Action(watch.Bookmark, bm)
	}
	want := wire.ConfigRevision{Pools: 6200, Objectives: 6200, Rewrites: 6200}
	require.Eventually(t, func() bool { return record().Revision == want }, 10*time.Second, 10*time.Millisecond,
		"revisions after the bookmarks: %v", record().Revision)
	rec := record()
	assert.Equal(t, []wire.WeightedTarget{wt("llama-3.1-8b", 1), wt("llama-3.2-8b", 99)}, rec.Table.Rewrites[0].Targets)
	decision, err := wire.DecideConfig(stored, rec, wire.ConfigLimits{})
	require.NoError(t, err, "the change must reach the Envoys that hold the departed agent's record")
	assert.Equal(t, wire.ConfigStore, decision)

	// A bookmark that does not move the revision rebuilds nothing: it does
	// not signal a change. The sync is stopped and a signal still pending
	// from the bookmarks above drained first (one that moved a revision may
	// be taken by a rebuild that already saw the next), then the pool's
	// store takes bookmarks as its reflector hands them over.
	stopRun()
	<-runDone
	select {
	case <-src.Changed():
	default:
	}
	require.NoError(t, src.pools.Bookmark("6200"))
	assert.Empty(t, src.Changed(), "a bookmark at the revision already seen signalled a change")
	require.NoError(t, src.pools.Bookmark("6300"))
	assert.Len(t, src.Changed(), 1, "a bookmark that moves the revision signals a change")
}
