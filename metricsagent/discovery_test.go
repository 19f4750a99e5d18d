package metricsagent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// fakePods is the fake clientset's pods client, plus the clientset's answer
// to whether it supports watch-list streaming (it does not).
type fakePods struct {
	corev1client.PodsGetter
	cs *fake.Clientset
}

func (f fakePods) IsWatchListSemanticsUnSupported() bool {
	return f.cs.IsWatchListSemanticsUnSupported()
}

func podsOf(cs *fake.Clientset) fakePods { return fakePods{cs.CoreV1(), cs} }

type fakeResolver map[string][]netip.Addr

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func TestStaticDiscovery(t *testing.T) {
	r := fakeResolver{"vllm.local": {netip.MustParseAddr("10.1.2.3")}}
	d, err := NewStaticDiscovery(context.Background(), "127.0.0.1:8001, vllm.local:8000,[::1]:9000", "/metrics", r)
	require.NoError(t, err)
	got := d.Targets()
	require.Len(t, got, 3)
	assert.Equal(t, Target{Name: "127.0.0.1:8001", Address: netip.MustParseAddr("127.0.0.1"), Port: 8001, URL: "http://127.0.0.1:8001/metrics"}, got[0])
	assert.Equal(t, "http://[::1]:9000/metrics", got[1].URL)
	assert.Equal(t, "http://10.1.2.3:8000/metrics", got[2].URL)
	assert.Equal(t, "vllm.local:8000", got[2].ID())

	for _, bad := range []string{"", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "nowhere:80", "1.2.3.4:80,1.2.3.4:80"} {
		_, err := NewStaticDiscovery(context.Background(), bad, "/metrics", r)
		assert.Error(t, err, bad)
	}
}

func pod(name, node, ip string, ready bool, mut ...func(*corev1.Pod)) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{"app": "vllm"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}, {Name: "metrics", ContainerPort: 8080}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
	for _, m := range mut {
		m(p)
	}
	return p
}

func names(ts []Target) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.ID()+" "+t.URL)
	}
	return out
}

func TestKubeDiscoveryWithFakeClientset(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(
		pod("a", "node-1", "10.0.0.1", true),
		pod("b", "node-1", "10.0.0.2", false),                                                 // not ready
		pod("c", "node-2", "10.0.0.3", true),                                                  // other node
		pod("d", "node-1", "", true),                                                          // no IP yet
		pod("e", "node-1", "10.0.0.5", true, func(p *corev1.Pod) { p.Labels["app"] = "web" }), // selector
		pod("f", "node-1", "10.0.0.6", true, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
		pod("g", "node-1", "10.0.0.7", true, func(p *corev1.Pod) { p.Namespace = "other" }),
		pod("h", "node-1", "fd00::8", true),
	)
	d, err := NewKubeDiscovery(podsOf(client), KubeConfig{Namespace: "llm", NodeName: "node-1", Selector: "app=vllm", Port: "8000", Path: "/metrics"}, quietLog)
	require.NoError(t, err)
	require.NoError(t, d.Start(ctx, 10*time.Second))
	assert.Equal(t, []string{"llm/a http://10.0.0.1:8000/metrics", "llm/h http://[fd00::8]:8000/metrics"}, names(d.Targets()))

	// b becomes ready, a is being deleted: the informer's watch delivers both.
	b := pod("b", "node-1", "10.0.0.2", true)
	_, err = client.CoreV1().Pods("llm").Update(ctx, b, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, client.CoreV1().Pods("llm").Delete(ctx, "a", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		got := names(d.Targets())
		return len(got) == 2 && got[0] == "llm/b http://10.0.0.2:8000/metrics"
	}, 5*time.Second, 10*time.Millisecond)
}

func TestKubeDiscoveryNamedPort(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(
		pod("a", "node-1", "10.0.0.1", true),
		pod("b", "node-1", "10.0.0.2", true, func(p *corev1.Pod) { p.Spec.Containers[0].Ports = nil }),
	)
	d, err := NewKubeDiscovery(podsOf(client), KubeConfig{NodeName: "node-1", Selector: "app=vllm", Port: "metrics", Path: "/m"}, quietLog)
	require.NoError(t, err)
	require.NoError(t, d.Start(ctx, 10*time.Second))
	assert.Equal(t, []string{"llm/a http://10.0.0.1:8080/m"}, names(d.Targets()))
}

func TestKubeDiscoveryConfigErrors(t *testing.T) {
	client := fake.NewClientset()
	for _, cfg := range []KubeConfig{
		{Selector: "app=vllm", Port: "8000"},                     // no node
		{NodeName: "n", Port: "8000"},                            // no selector
		{NodeName: "n", Selector: "app in (", Port: "8000"},      // bad selector
		{NodeName: "n", Selector: "app=vllm", Port: "0"},         // bad port
		{NodeName: "n", Selector: "app=vllm", Port: ""},          // no port
		{NodeName: "n", Selector: "app=vllm", Port: "123456789"}, // bad port
	} {
		_, err := NewKubeDiscovery(podsOf(client), cfg, quietLog)
		assert.Error(t, err, "%+v", cfg)
	}
}
