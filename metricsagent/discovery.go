package metricsagent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Target is one model-server pod to scrape.
type Target struct {
	// Namespace is empty for static targets.
	Namespace string
	Name      string
	Address   netip.Addr
	Port      uint16
	// URL is the metrics URL, http://addr:port/path.
	URL string
}

// TargetKey identifies a target across cycles. A pod that comes back with
// a new IP is a new target: its old values say nothing about the new
// process. It is a comparable value, not a string, so the agent's maps are
// looked up several times per pod and cycle without building one.
type TargetKey struct {
	Namespace, Name string
	Addr            netip.AddrPort
}

func (k TargetKey) String() string { return k.Namespace + "/" + k.Name + "@" + k.Addr.String() }

// Key returns the target's key.
func (t Target) Key() TargetKey {
	return TargetKey{Namespace: t.Namespace, Name: t.Name, Addr: netip.AddrPortFrom(t.Address, t.Port)}
}

// ID is the namespace/name label used in logs and metrics.
func (t Target) ID() string {
	if t.Namespace == "" {
		return t.Name
	}
	return t.Namespace + "/" + t.Name
}

func newTarget(ns, name string, addr netip.Addr, port uint16, path string) Target {
	addr = addr.Unmap()
	return Target{Namespace: ns, Name: name, Address: addr, Port: port,
		URL: "http://" + netip.AddrPortFrom(addr, port).String() + path}
}

// Discoverer lists the pods to scrape now. Targets is called once per cycle
// and must be cheap; the result is sorted by ID.
type Discoverer interface {
	Targets() []Target
}

// Resolver is the part of net.Resolver the agent uses; tests inject one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// StaticDiscovery is a fixed list, for local runs and tests.
type StaticDiscovery struct{ list []Target }

// NewStaticDiscovery parses "host:port,host:port". A host name is resolved
// once, here, to its first address. The target's name is the entry as
// written, its namespace empty.
func NewStaticDiscovery(ctx context.Context, spec, path string, r Resolver) (*StaticDiscovery, error) {
	d := &StaticDiscovery{}
	seen := map[string]bool{}
	for entry := range strings.SplitSeq(spec, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		host, portStr, err := net.SplitHostPort(entry)
		if err != nil {
			return nil, fmt.Errorf("target %q: %w", entry, err)
		}
		port, err := parsePort(portStr)
		if err != nil {
			return nil, fmt.Errorf("target %q: %w", entry, err)
		}
		addr, err := netip.ParseAddr(host)
		if err != nil {
			addrs, lerr := r.LookupNetIP(ctx, "ip", host)
			if lerr != nil || len(addrs) == 0 {
				return nil, fmt.Errorf("target %q: cannot resolve %q: %v", entry, host, lerr)
			}
			addr = addrs[0]
		}
		if seen[entry] {
			return nil, fmt.Errorf("target %q listed twice", entry)
		}
		seen[entry] = true
		d.list = append(d.list, newTarget("", entry, addr, port, path))
	}
	if len(d.list) == 0 {
		return nil, fmt.Errorf("no targets in %q", spec)
	}
	slices.SortFunc(d.list, func(a, b Target) int { return strings.Compare(a.ID(), b.ID()) })
	return d, nil
}

// Targets returns the fixed list.
func (d *StaticDiscovery) Targets() []Target { return d.list }

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("port %q is not in 1..65535", s)
	}
	return uint16(n), nil
}

// KubeConfig selects the pods KubeDiscovery reports.
type KubeConfig struct {
	// Namespace to watch; empty watches all (needs a ClusterRole).
	Namespace string
	// NodeName is this node (spec.nodeName from the downward API).
	NodeName string
	// Selector is a label selector, e.g. "app=vllm"; required.
	Selector string
	// Port is a port number, or the name of a container port.
	Port string
	// Path is the metrics path, e.g. /metrics.
	Path string
	// Pool, when set, replaces Selector and Port: the pods are those its
	// InferencePool's selector matches (in Namespace, the pool's), and each
	// of its target ports is an endpoint of its own, scraped on that port.
	Pool PoolSource
}

// PoolSource supplies the InferencePool discovery follows (ConfigSync);
// nil while there is no valid pool.
type PoolSource interface {
	Pool() *InferencePool
}

// KubeDiscovery watches the pods of this node through a client-go informer
// (list and watch with a spec.nodeName field selector: RBAC get/list/watch
// pods, and the API server only sends this node's pods).
type KubeDiscovery struct {
	cfg      KubeConfig
	selector labels.Selector
	port     uint16 // 0 when cfg.Port names a container port
	informer cache.SharedIndexInformer
	log      *slog.Logger
}

// NewKubeDiscovery validates cfg and builds the informer; call Run to start it.
func NewKubeDiscovery(client corev1client.PodsGetter, cfg KubeConfig, log *slog.Logger) (*KubeDiscovery, error) {
	if cfg.NodeName == "" {
		return nil, fmt.Errorf("node name is required to discover pods (set --node-name or NODE_NAME from the downward API)")
	}
	sel := labels.Everything() // with a pool, its selector is applied to the node's pods
	var err error
	if cfg.Pool == nil {
		if strings.TrimSpace(cfg.Selector) == "" {
			return nil, fmt.Errorf("a pod label selector is required (--pod-selector), or every pod of the node would be scraped")
		}
		if sel, err = labels.Parse(cfg.Selector); err != nil {
			return nil, fmt.Errorf("pod selector %q: %w", cfg.Selector, err)
		}
	} else if cfg.Namespace == "" {
		return nil, fmt.Errorf("an InferencePool selects pods of its own namespace: the namespace is required")
	}
	k := &KubeDiscovery{cfg: cfg, selector: sel, log: log}
	if cfg.Pool == nil {
		if cfg.Port == "" {
			return nil, fmt.Errorf("metrics port is required")
		}
		if cfg.Port[0] >= '0' && cfg.Port[0] <= '9' {
			if k.port, err = parsePort(cfg.Port); err != nil {
				return nil, fmt.Errorf("metrics port: %w", err)
			}
		}
	}
	fieldSel := fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	tweak := func(o *metav1.ListOptions) {
		o.FieldSelector = fieldSel
		o.LabelSelector = sel.String()
	}
	pods := client.Pods(cfg.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return pods.Watch(ctx, o)
		},
	}
	// The wrapper asks client whether it understands watch-list streaming
	// (client-go's fake clientset says no, so the reflector lists instead).
	k.informer = cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Pod{}, 0, cache.Indexers{})
	return k, nil
}

// Start runs the informer until ctx ends and waits up to syncTimeout for
// its first full list.
func (k *KubeDiscovery) Start(ctx context.Context, syncTimeout time.Duration) error {
	go k.informer.RunWithContext(ctx)
	syncCtx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), k.informer.HasSynced) {
		return fmt.Errorf("pod informer did not sync within %v: %w", syncTimeout, syncCtx.Err())
	}
	return nil
}

// Targets lists ready pods of this node that match the selector and have an
// IP and the metrics port. The informer's selectors already narrow the
// list; they are checked again so a misbehaving source cannot widen it.
func (k *KubeDiscovery) Targets() []Target {
	if k.cfg.Pool != nil {
		return k.poolTargets()
	}
	var out []Target
	for _, obj := range k.informer.GetStore().List() {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !k.eligible(pod, k.selector) {
			continue
		}
		addr, err := netip.ParseAddr(pod.Status.PodIP)
		if err != nil {
			continue
		}
		port := k.port
		if port == 0 {
			if port = namedPort(pod, k.cfg.Port); port == 0 {
				k.log.Debug("pod has no container port of that name; skipped", "pod", pod.Namespace+"/"+pod.Name, "port", k.cfg.Port)
				continue
			}
		}
		out = append(out, newTarget(pod.Namespace, pod.Name, addr, port, k.cfg.Path))
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.ID(), b.ID()) })
	return out
}

// poolTargets lists, for every ready pod of this node that the pool's
// selector matches, one target per target port the pod serves, named
// <pod>-rank-<index of the port> (as llm-d's router names data-parallel
// ranks). A pod's llm-d.ai/active-ports annotation (formerly
// inference.networking.k8s.io/active-ports), when present, names the
// ports it serves.
func (k *KubeDiscovery) poolTargets() []Target {
	pool := k.cfg.Pool.Pool()
	if pool == nil {
		return nil
	}
	sel := labels.SelectorFromSet(pool.Spec.Selector.MatchLabels)
	ports := pool.Ports()
	var out []Target
	for _, obj := range k.informer.GetStore().List() {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Namespace != pool.Namespace || !k.eligible(pod, sel) {
			continue
		}
		addr, err := netip.ParseAddr(pod.Status.PodIP)
		if err != nil {
			continue
		}
		active := activePorts(pod, ports)
		for i, port := range ports {
			if active[port] {
				out = append(out, newTarget(pod.Namespace, pod.Name+"-rank-"+strconv.Itoa(i), addr, port, k.cfg.Path))
			}
		}
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.ID(), b.ID()) })
	return out
}

// Annotations naming the target ports a pod serves (llm-d's router reads
// the same two).
const (
	activePortsAnnotation       = "llm-d.ai/active-ports"
	legacyActivePortsAnnotation = "inference.networking.k8s.io/active-ports"
)

// activePorts returns which of ports the pod serves: all of them, unless
// its annotation lists some (numbers not among ports are ignored).
func activePorts(pod *corev1.Pod, ports []uint16) map[uint16]bool {
	out := make(map[uint16]bool, len(ports))
	list, ok := pod.Annotations[activePortsAnnotation]
	if !ok {
		list, ok = pod.Annotations[legacyActivePortsAnnotation]
	}
	for _, p := range ports {
		out[p] = !ok
	}
	if ok {
		for item := range strings.SplitSeq(list, ",") {
			if n, err := parsePort(strings.TrimSpace(item)); err == nil {
				if _, listed := out[n]; listed {
					out[n] = true
				}
			}
		}
	}
	return out
}

func (k *KubeDiscovery) eligible(pod *corev1.Pod, sel labels.Selector) bool {
	if pod.Spec.NodeName != k.cfg.NodeName || pod.DeletionTimestamp != nil ||
		pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" ||
		(k.cfg.Namespace != "" && pod.Namespace != k.cfg.Namespace) ||
		!sel.Matches(labels.Set(pod.Labels)) {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func namedPort(pod *corev1.Pod, name string) uint16 {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name && p.ContainerPort > 0 && p.ContainerPort <= 65535 {
				return uint16(p.ContainerPort)
			}
		}
	}
	return 0
}
