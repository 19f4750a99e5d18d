package metricsagent

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// kubeObjects holds the objects of one resource as a client-go Reflector
// lists and watches them, as JSON, with the highest resourceVersion seen.
//
// It is a Reflector's store rather than an informer's handler so that the
// objects and the revision always go together: a Reflector hands its store
// each list with the list's resourceVersion, and each watch event with the
// object at that event's resourceVersion (a deleted object carries the
// deletion's). A table built from a snapshot has therefore seen exactly the
// changes up to its revision, which is what lets the receiver order the
// tables of agents that briefly disagree (wire.DecideConfig).
type kubeObjects struct {
	gvr    schema.GroupVersionResource
	notify func()
	badRV  func(rv string) // a resourceVersion that is not a number

	mu     sync.Mutex
	objs   map[string][]byte // namespace/name -> JSON
	rev    uint64
	synced bool // a first list arrived (or the resource is not served)
}

func newKubeObjects(gvr schema.GroupVersionResource, notify func(), badRV func(string)) *kubeObjects {
	return &kubeObjects{gvr: gvr, notify: notify, badRV: badRV, objs: map[string][]byte{}}
}

var (
	_ cache.ReflectorStore         = (*kubeObjects)(nil)
	_ cache.ReflectorBookmarkStore = (*kubeObjects)(nil)
)

// revision reads a resourceVersion. kube-apiserver's are etcd revisions,
// which grow across every resource; another server's may be opaque, and
// then the agent cannot order its tables (reported once).
func (s *kubeObjects) revision(rv string) uint64 {
	if rv == "" {
		return 0
	}
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		s.badRV(rv)
		return 0
	}
	return n
}

func (s *kubeObjects) put(obj any) (string, []byte, uint64, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return "", nil, 0, fmt.Errorf("%s: unexpected object %T", s.gvr.Resource, obj)
	}
	js, err := u.MarshalJSON()
	if err != nil {
		return "", nil, 0, err
	}
	return u.GetNamespace() + "/" + u.GetName(), js, s.revision(u.GetResourceVersion()), nil
}

// Add and Update store an object seen in a watch event.
func (s *kubeObjects) Add(obj any) error { return s.Update(obj) }

// Update stores an object seen in a watch event.
func (s *kubeObjects) Update(obj any) error {
	key, js, rv, err := s.put(obj)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.objs[key] = js
	s.rev = max(s.rev, rv)
	s.mu.Unlock()
	s.notify()
	return nil
}

// Delete drops an object; its resourceVersion is the deletion's.
func (s *kubeObjects) Delete(obj any) error {
	key, _, rv, err := s.put(obj)
	if err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.objs, key)
	s.rev = max(s.rev, rv)
	s.mu.Unlock()
	s.notify()
	return nil
}

// Replace takes a whole list at resourceVersion rv.
func (s *kubeObjects) Replace(list []any, rv string) error {
	objs := make(map[string][]byte, len(list))
	rev := s.revision(rv)
	for _, obj := range list {
		key, js, orv, err := s.put(obj)
		if err != nil {
			return err
		}
		objs[key] = js
		rev = max(rev, orv)
	}
	s.mu.Lock()
	s.objs, s.rev, s.synced = objs, max(s.rev, rev), true
	s.mu.Unlock()
	s.notify()
	return nil
}

// Bookmark takes a watch bookmark: every change of the resource up to rv
// has been seen, though no object changed. Without it an agent carries the
// resourceVersions of its last events, which stay below the list
// resourceVersion of an agent that started later; a record that agent
// stored would then hold off every other agent's later tables (409) after
// it went away. kube-apiserver sends a bookmark to each watch about once
// a minute; one that moves the revision rebuilds the record, so a table
// the receivers refused as not newer goes out again at once.
func (s *kubeObjects) Bookmark(rv string) error {
	n := s.revision(rv)
	s.mu.Lock()
	moved := n > s.rev
	s.rev = max(s.rev, n)
	s.mu.Unlock()
	if moved {
		s.notify()
	}
	return nil
}

// Resync is a no-op: nothing is resynced.
func (s *kubeObjects) Resync() error { return nil }

// markUnserved records that the API server does not serve the resource:
// no objects, and nothing to wait for.
func (s *kubeObjects) markUnserved() {
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	s.notify()
}

// snapshot returns the objects in key order, the revision and whether a
// first list has arrived.
func (s *kubeObjects) snapshot() ([][]byte, uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.objs))
	for k := range s.objs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = s.objs[k]
	}
	return out, s.rev, s.synced
}

func (s *kubeObjects) get(namespace, name string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	js, ok := s.objs[namespace+"/"+name]
	return js, ok
}

// ObjectSource is where the pool, objective and rewrite objects come from:
// the API server (KubeObjectSource) or a file (FileObjectSource, tests).
type ObjectSource interface {
	// Snapshot returns the objects now, the revisions they reflect, and
	// whether every resource has been listed once.
	Snapshot() (pools, objectives, rewrites [][]byte, rev wire.ConfigRevision, synced bool)
	// Changed is signalled (never closed) after the objects change.
	Changed() <-chan struct{}
}

// KubeObjectSource watches the InferencePools, InferenceObjectives and
// InferenceModelRewrites of one namespace through the dynamic client.
type KubeObjectSource struct {
	dyn       dynamic.Interface
	namespace string
	served    func(schema.GroupVersionResource) (bool, error)
	log       *slog.Logger
	changed   chan struct{}

	pools, objectives, rewrites *kubeObjects
	badRVOnce                   sync.Once
}

// NewKubeObjectSource builds the source; served tells whether the API server
// serves a resource (discovery), so a cluster without llm-d's CRDs gets a
// table without objectives or rewrites instead of errors.
func NewKubeObjectSource(dyn dynamic.Interface, namespace string, served func(schema.GroupVersionResource) (bool, error), log *slog.Logger) *KubeObjectSource {
	s := &KubeObjectSource{dyn: dyn, namespace: namespace, served: served, log: log, changed: make(chan struct{}, 1)}
	notify := func() {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
	badRV := func(rv string) {
		s.badRVOnce.Do(func() {
			log.Warn("a resourceVersion is not a number: this API server's revisions cannot be compared, so agents that disagree about the model table may not converge until the next change",
				"resourceVersion", rv)
		})
	}
	s.pools = newKubeObjects(InferencePoolGVR, notify, badRV)
	s.objectives = newKubeObjects(InferenceObjectiveGVR, notify, badRV)
	s.rewrites = newKubeObjects(InferenceModelRewriteGVR, notify, badRV)
	return s
}

// unservedRecheck is how often a resource the API server did not serve is
// looked up again (a CRD installed after the agent started).
const unservedRecheck = time.Minute

// discoveryRetry is how soon a failed discovery look-up is retried.
const discoveryRetry = 5 * time.Second

// Start checks that InferencePool is served (without it there is no pool
// to read: an error), then lists and watches every served resource until
// ctx ends, and waits up to syncTimeout for the first lists.
func (s *KubeObjectSource) Start(ctx context.Context, syncTimeout time.Duration) error {
	ok, err := s.served(InferencePoolGVR)
	if err != nil {
		return fmt.Errorf("looking up %s on the API server: %w", InferencePoolGVR.GroupVersion(), err)
	}
	if !ok {
		return fmt.Errorf("the API server does not serve %s %s: install the Gateway API Inference Extension's CRDs, or discover pods with --pod-selector",
			InferencePoolGVR.GroupVersion(), KindInferencePool)
	}
	go s.reflect(ctx, s.pools)
	for _, st := range []*kubeObjects{s.objectives, s.rewrites} {
		go s.whenServed(ctx, st)
	}
	deadline := time.NewTimer(syncTimeout)
	defer deadline.Stop()
	for {
		if _, _, _, _, synced := s.Snapshot(); synced {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("the InferencePool, InferenceObjective and InferenceModelRewrite lists did not arrive within %v", syncTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// whenServed runs st's reflector once its resource is served, looking again
// every unservedRecheck until then.
func (s *KubeObjectSource) whenServed(ctx context.Context, st *kubeObjects) {
	for logged := false; ; {
		ok, err := s.served(st.gvr)
		wait := unservedRecheck
		switch {
		case err != nil:
			// Not known either way: nothing is built until it is.
			s.log.Warn("cannot look up a resource on the API server; retrying", "resource", st.gvr.String(), "err", err)
			wait = discoveryRetry
		case ok:
			s.reflect(ctx, st)
			return
		default:
			if !logged {
				logged = true
				s.log.Info("the API server does not serve this resource: the model table has none of it (looked up again every minute)",
					"resource", st.gvr.GroupResource().String(), "version", st.gvr.Version)
			}
			st.markUnserved()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// reflect lists and watches st's resource in the namespace until ctx ends.
func (s *KubeObjectSource) reflect(ctx context.Context, st *kubeObjects) {
	res := s.dyn.Resource(st.gvr).Namespace(s.namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return res.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return res.Watch(ctx, o)
		},
	}
	r := cache.NewReflectorWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, s.dyn), &unstructured.Unstructured{}, st,
		cache.ReflectorOptions{Name: "wasm-epp " + st.gvr.Resource})
	r.RunWithContext(ctx)
}

// Snapshot implements ObjectSource.
func (s *KubeObjectSource) Snapshot() (pools, objectives, rewrites [][]byte, rev wire.ConfigRevision, synced bool) {
	var ps, os, rs bool
	pools, rev.Pools, ps = s.pools.snapshot()
	objectives, rev.Objectives, os = s.objectives.snapshot()
	rewrites, rev.Rewrites, rs = s.rewrites.snapshot()
	return pools, objectives, rewrites, rev, ps && os && rs
}

// Changed implements ObjectSource.
func (s *KubeObjectSource) Changed() <-chan struct{} { return s.changed }

// object returns the stored JSON of one object (status writes start from it).
func (s *KubeObjectSource) object(kind, namespace, name string) ([]byte, bool) {
	switch kind {
	case KindInferenceObjective:
		return s.objectives.get(namespace, name)
	case KindInferenceModelRewrite:
		return s.rewrites.get(namespace, name)
	}
	return s.pools.get(namespace, name)
}

// Served returns a served func for NewKubeObjectSource that asks the API
// server's discovery endpoint.
func Served(disco interface {
	ServerResourcesForGroupVersion(string) (*metav1.APIResourceList, error)
}) func(schema.GroupVersionResource) (bool, error) {
	return func(gvr schema.GroupVersionResource) (bool, error) {
		list, err := disco.ServerResourcesForGroupVersion(gvr.GroupVersion().String())
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		for _, r := range list.APIResources {
			if r.Name == gvr.Resource {
				return true, nil
			}
		}
		return false, nil
	}
}
