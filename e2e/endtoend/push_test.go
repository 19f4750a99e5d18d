package endtoend

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

// fakeReplica is a loopback HTTP server that serves hand-written vLLM
// /metrics and answers completions with its name.
type fakeReplica struct {
	name string
	v0   bool // metric names: v0 gpu_cache_usage_perc, else v1 kv_cache_usage_perc
	srv  *httptest.Server

	mu      sync.Mutex
	waiting int
	running int
	broken  bool // /metrics answers 500
}

func newFakeReplica(t *testing.T, name string, v0 bool) *fakeReplica {
	f := &fakeReplica{name: name, v0: v0}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", f.metrics)
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, stackModel)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"text_completion","model":%q,"choices":[{"text":"%s"}]}`, stackModel, name)
	})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-vllm-sim-replica", name)
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeReplica) addr() string { return f.srv.Listener.Addr().String() }

func (f *fakeReplica) set(waiting, running int, broken bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.waiting, f.running, f.broken = waiting, running, broken
}

func (f *fakeReplica) metrics(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	waiting, running, broken := f.waiting, f.running, f.broken
	f.mu.Unlock()
	if broken {
		http.Error(w, "engine dead", http.StatusInternalServerError)
		return
	}
	kv, labels := "vllm:kv_cache_usage_perc", `model_name="`+stackModel+`",engine="0"`
	if f.v0 {
		kv, labels = "vllm:gpu_cache_usage_perc", `model_name="`+stackModel+`"`
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprintf(w, "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{%s} %d\n", labels, running)
	fmt.Fprintf(w, "# HELP vllm:num_requests_waiting Waiting.\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{%s} %d\n", labels, waiting)
	fmt.Fprintf(w, "# HELP %s KV.\n# TYPE %s gauge\n%s{%s} 0.1\n", kv, kv, kv, labels)
	fmt.Fprintf(w, "# HELP vllm:lora_requests_info LoRA.\n# TYPE vllm:lora_requests_info gauge\n"+
		"vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 1.7e9\n")
}

// TestAgentPushDrivesRouting is the metrics path end to end: real HTTP
// servers serve metrics, the real agent scrapes them and pushes into the
// real plugin's receiver in the gateway, and the plugin's routing follows
// the metrics as they change.
func TestAgentPushDrivesRouting(t *testing.T) {
	a := newFakeReplica(t, "fake-a", true)
	b := newFakeReplica(t, "fake-b", false)
	a.set(0, 1, false)
	b.set(40, 4, false)
	s := startStack(t, stack.Config{ExtraTargets: []string{a.addr(), b.addr()}})

	// Critical requests go to the shortest queue.
	all := func(want *fakeReplica, n int) {
		t.Helper()
		for i := range n {
			r := complete(t, s, stackModel, 1)
			require.Equal(t, http.StatusOK, r.Status, r.String())
			require.Equal(t, want.addr(), r.served(s), "request %d", i)
			require.Equal(t, want.name, r.Header.Get("x-vllm-sim-replica"))
		}
	}
	follows := func(want *fakeReplica) {
		t.Helper()
		poll(t, func() bool { return complete(t, s, stackModel, 1).served(s) == want.addr() },
			"routing never moved to %s", want.name)
		// One VM deciding on the push does not mean every VM does: each
		// re-reads on its own tick.
		awaitRouters()
		all(want, 20)
	}
	follows(a)

	// The queues swap: routing follows the pushed metrics.
	a.set(40, 4, false)
	b.set(0, 1, false)
	follows(b)

	// b's metrics endpoint breaks while it looks idle: its last values age
	// out and the busy but healthy a takes the traffic.
	b.set(0, 0, true)
	follows(a)

	// b recovers.
	b.set(0, 0, false)
	follows(b)
}
