package filtertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/envoyhost"
)

// Flow control in the real .wasm inside the host: held requests are
// released from the router's tick, or from the first request callback that
// sees a new snapshot, with their destination set at release, across
// worker VMs that agree on admissions through shared data.

const flowRouterConfig = `{
  "seed": 5,
  "models": [
    {"name": "base", "criticality": "Critical"},
    {"name": "chat", "criticality": "Standard"},
    {"name": "batch", "criticality": "Sheddable"},
    {"name": "split", "criticality": "Sheddable", "targets": [{"name": "split-v2", "weight": 1}]}
  ],
  "flowControl": {"releaseInterval": "5ms"}
}`

func workers(n int) stackOpt { return func(c *envoyhost.Config) { c.Workers = n } }

// Pod states with and without room for non-critical requests (flow
// control's default room: nothing waiting, KV <= 0.9; one request per pod
// and snapshot).
var (
	busyPod = podState{waiting: 50, kv: 0.95}
	freePod = podState{kv: 0.1}
)

// async sends a request in the background; the reply arrives on the
// returned channel (status -1 and the error text if it failed).
func (s *stack) async(ctx context.Context, path, body string, headers ...string) <-chan reply {
	ch := make(chan reply, 1)
	req, err := http.NewRequestWithContext(ctx, "POST", s.router+path, strings.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	go func() {
		resp, err := s.client.Do(req)
		if err != nil {
			ch <- reply{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		ch <- reply{status: resp.StatusCode, header: resp.Header, body: b, pod: resp.Header.Get("X-Pod")}
	}()
	return ch
}

// waitStat waits until the plugin metric reaches want.
func (s *stack) waitStat(name string, want uint64) {
	s.t.Helper()
	require.Eventually(s.t, func() bool {
		v, _ := s.host.StatValue("wasmcustom." + name)
		return v == want
	}, 20*time.Second, 2*time.Millisecond, "%s never reached %d", name, want)
}

// worker is the VM of the router's only worker thread (stackOpt
// workers(1)): the one serving every request.
func (s *stack) worker() envoyhost.VMInfo {
	s.t.Helper()
	for _, vm := range s.host.VMInfo("router") {
		if vm.Thread != "main" {
			return vm
		}
	}
	s.t.Fatal("no worker VM")
	return envoyhost.VMInfo{}
}

// releaseAll pushes fresh snapshots with room until want requests were
// released: each snapshot's slots are filled once.
func (s *stack) releaseAll(want uint64) {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if v, _ := s.host.StatValue("wasmcustom.wasm_epp.flow.released"); v >= want {
			return
		}
		require.True(s.t, time.Now().Before(deadline), "released fewer than %d", want)
		s.setPods(freePod)
		time.Sleep(2 * time.Millisecond)
	}
}

func (s *stack) received() int {
	n := 0
	for _, p := range s.pods {
		n += len(p.requests())
	}
	return n
}

func TestFlowHeldRequestIsReleasedWithItsDestination(t *testing.T) {
	s := startStack(t, flowRouterConfig, 2, workers(1))
	s.setPods(busyPod, busyPod)
	plain := s.async(t.Context(), "/v1/chat/completions", chat("batch"))
	split := s.async(t.Context(), "/v1/completions", `{"model":"split","prompt":"hi"}`)
	s.waitStat("wasm_epp.flow.queued.sheddable", 2)
	time.Sleep(50 * time.Millisecond) // ten ticks: still no capacity
	assert.Zero(t, s.received(), "nothing reaches a pod while every pod is at capacity")
	assert.Empty(t, plain)

	// One room on pod-0 per snapshot: a fresh one until both went.
	require.Eventually(t, func() bool {
		s.setPods(freePod, busyPod)
		return s.stat("wasm_epp.flow.released") >= 2
	}, 20*time.Second, 2*time.Millisecond, "the two held requests were not released")
	for _, ch := range []<-chan reply{plain, split} {
		r := <-ch
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		assert.Equal(t, "pod-0", r.pod, "the pod with room")
	}
	reqs := s.pods[0].requests()
	require.Len(t, reqs, 2)
	for _, rq := range reqs {
		assert.Equal(t, s.pods[0].addr(), rq.Header.Get(destHeader), "destination set at release")
	}
	bodies := []string{string(reqs[0].Body), string(reqs[1].Body)}
	assert.Contains(t, bodies, `{"model":"split-v2","prompt":"hi"}`, "rewritten at release")
	assert.Contains(t, bodies, chat("batch"))
	assert.Equal(t, uint64(2), s.stat("wasm_epp.flow.released"))
	assert.Equal(t, uint64(2), s.stat("wasm_epp.requests.routed"))
	assert.Zero(t, s.stat("wasm_epp.flow.queued.sheddable"))
}

func TestFlowExpiryAndBoundInHost(t *testing.T) {
	s := startStack(t, `{"models": [{"name": "batch", "criticality": "Sheddable"}], "flowControl": {"maxRequests": 2, "releaseInterval": "5ms"}}`, 1, workers(1))
	s.setPods(busyPod)
	short := s.async(t.Context(), "/v1/chat/completions", chat("batch"), "x-wasm-epp-queue-ttl-ms", "30")
	held := s.async(t.Context(), "/v1/chat/completions", chat("batch"))
	s.waitStat("wasm_epp.flow.queued.sheddable", 2)
	full := s.post("/v1/chat/completions", chat("batch"))
	assert.Equal(t, http.StatusTooManyRequests, full.status, "the queue holds 2")
	msg, _, _ := full.errorJSON(t)
	assert.Contains(t, msg, "queue is full")

	r := <-short
	require.Equal(t, http.StatusTooManyRequests, r.status)
	msg, typ, code := r.errorJSON(t)
	assert.Equal(t, "rate_limit_error", typ)
	assert.Equal(t, "capacity_exhausted", code)
	assert.Regexp(t, `waited \d+ms \(its limit\)`, msg)
	var details []string
	require.Eventually(t, func() bool {
		details = details[:0]
		for _, e := range s.routerAccess() {
			details = append(details, e.Details)
		}
		return len(details) == 2
	}, 10*time.Second, 5*time.Millisecond)
	assert.ElementsMatch(t, []string{"wasm_epp_dropped", "wasm_epp_queue_expired"}, details)
	assert.Equal(t, uint64(1), s.stat("wasm_epp.requests.expired"))
	assert.Empty(t, held, "the other one waits on (TTL 10 s)")
	s.setPods(freePod)
	assert.Equal(t, http.StatusOK, (<-held).status)
}

// Four worker VMs, each with its own queue, share one pod with room for
// three: together they release three per snapshot, not three each.
func TestFlowFourWorkersShareCapacity(t *testing.T) {
	s := startStack(t, `{"seed": 5, "models": [{"name": "batch", "criticality": "Sheddable"}],
	  "flowControl": {"releaseInterval": "5ms", "admit": {"maxWaiting": 5}}}`, 1, workers(4))
	s.setPods(busyPod)
	const n = 16
	replies := make([]<-chan reply, n)
	for i := range replies {
		replies[i] = s.async(t.Context(), "/v1/chat/completions", chat("batch"))
	}
	s.waitStat("wasm_epp.flow.queued.sheddable", n)
	perWorker := map[string]int{}
	for _, vm := range s.host.VMInfo("router") {
		perWorker[vm.Thread] = vm.Streams
	}
	t.Logf("held streams per VM: %v", perWorker)

	room := podState{waiting: 3, kv: 0.1} // 3, 4, 5 waiting: three slots
	for round := 1; round*3 <= n; round++ {
		s.setPods(room)
		require.Eventually(t, func() bool { return s.received() >= 3*round }, 20*time.Second, 2*time.Millisecond)
		time.Sleep(40 * time.Millisecond) // eight ticks of every worker on the same snapshot
		assert.Equal(t, 3*round, s.received(), "round %d: one snapshot's three slots are filled once across the four workers", round)
	}
	assert.Positive(t, s.stat("wasm_epp.flow.admission_contention")+s.stat("wasm_epp.flow.released"))
	assert.Zero(t, s.stat("wasm_epp.flow.admission_errors"))
	s.setPods(freePod)
	for _, ch := range replies {
		assert.Equal(t, http.StatusOK, (<-ch).status)
	}
}

// Thousands of clients that give up while held leave no stream context,
// queue entry or guest memory behind.
func TestFlowAbandonedRequestsLeakNothing(t *testing.T) {
	s := startStack(t, flowRouterConfig, 1, workers(1))
	s.setPods(busyPod)
	before := s.worker()
	const batches, batch = 20, 100
	for b := range batches {
		ctx, cancel := context.WithCancel(t.Context())
		var chans []<-chan reply
		for range batch {
			chans = append(chans, s.async(ctx, "/v1/chat/completions", chat("batch")))
		}
		s.waitStat("wasm_epp.flow.queued.sheddable", batch)
		cancel()
		for _, ch := range chans {
			r := <-ch
			require.Equal(t, -1, r.status, "batch %d: a cancelled request got an answer: %s", b, r.body)
		}
		s.waitStat("wasm_epp.flow.queued.sheddable", 0)
	}
	s.waitStat("wasm_epp.flow.abandoned", batches*batch)
	assert.Equal(t, uint64(batches*batch), s.stat("wasm_epp.requests.abandoned"))
	require.Eventually(t, func() bool { return s.worker().Streams == 0 },
		10*time.Second, 5*time.Millisecond, "stream contexts left: %+v", s.host.VMInfo("router"))
	after := s.worker()
	t.Logf("guest memory %d -> %d bytes after %d abandoned requests; stream contexts %d -> %d", before.MemoryBytes, after.MemoryBytes, batches*batch, before.Streams, after.Streams)
	assert.Less(t, after.MemoryBytes-before.MemoryBytes, uint64(16<<20))
	assert.Zero(t, s.received(), "an abandoned request never reaches a pod")
	// The VM is healthy and the queue works: a live request is released.
	live := s.async(t.Context(), "/v1/chat/completions", chat("batch"))
	s.waitStat("wasm_epp.flow.queued.sheddable", 1)
	s.setPods(freePod)
	assert.Equal(t, http.StatusOK, (<-live).status)
}

// A VM holding 1,000 requests of 4 KiB uses under 16 MiB more guest memory
// than before (the bodies stay in the proxy's buffers).
func TestFlowThousandHeldRequestsMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 connections")
	}
	s := startStack(t, flowRouterConfig, 1, workers(1))
	s.setPods(busyPod)
	// Warm the VM up (buffers, the snapshot) with a few held and released.
	body := `{"model":"batch","prompt":"` + strings.Repeat("x", 4096-len(`{"model":"batch","prompt":""}`)) + `"}`
	require.Len(t, body, 4096)
	warm := s.async(t.Context(), "/v1/completions", body)
	s.waitStat("wasm_epp.flow.queued.sheddable", 1)
	s.setPods(freePod)
	require.Equal(t, http.StatusOK, (<-warm).status)
	s.setPods(busyPod)
	base := s.worker()

	const n = 1000
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: n}}
	t.Cleanup(client.CloseIdleConnections)
	s.client = client
	var wg sync.WaitGroup
	statuses := make(chan int, n)
	for range n {
		ch := s.async(t.Context(), "/v1/completions", body)
		wg.Go(func() { statuses <- (<-ch).status })
	}
	s.waitStat("wasm_epp.flow.queued.sheddable", n)
	held := s.worker()
	grew := held.MemoryBytes - base.MemoryBytes
	t.Logf("guest memory %d -> %d bytes with %d requests of 4 KiB held (+%.2f MiB); %d stream contexts",
		base.MemoryBytes, held.MemoryBytes, n, float64(grew)/(1<<20), held.Streams)
	assert.Less(t, grew, uint64(16<<20))
	assert.Equal(t, n, held.Streams)
	assert.Equal(t, uint64(n*4096), s.stat("wasm_epp.flow.queued_bytes"))
	s.releaseAll(n + 1)
	wg.Wait()
	close(statuses)
	ok := 0
	for st := range statuses {
		if st == http.StatusOK {
			ok++
		}
	}
	assert.Equal(t, n, ok)
	assert.Equal(t, n+1, s.received(), "each request reached a pod once")
}

// Bad input cannot grow the queue: malformed TTL headers are ignored,
// missing or over-long flow keys share the anonymous flow, and the bound
// holds whatever the headers say.
func TestFlowBadHeadersStayBounded(t *testing.T) {
	s := startStack(t, `{"models": [{"name": "batch", "criticality": "Sheddable"}],
	  "flowControl": {"maxRequests": 3, "flowHeader": "x-tenant", "maxFlowKeyBytes": 8, "releaseInterval": "5ms"}}`, 1, workers(1))
	s.setPods(busyPod)
	var held []<-chan reply
	refused := 0
	for i := range 10 {
		headers := []string{"x-wasm-epp-queue-ttl-ms", []string{"soon", "-5", "1e3", "7 ms", "9s"}[i%5]}
		if i%3 != 0 {
			headers = append(headers, "x-tenant", strings.Repeat("t", 8+i)+"-unique") // each over the bound
		}
		ch := s.async(t.Context(), "/v1/chat/completions", chat("batch"), headers...)
		if i < 3 {
			held = append(held, ch)
			s.waitStat("wasm_epp.flow.queued.sheddable", uint64(i+1))
			continue
		}
		r := <-ch
		require.Equal(t, http.StatusTooManyRequests, r.status, "request %d: the queue holds 3", i)
		refused++
	}
	assert.Equal(t, 7, refused)
	assert.Equal(t, uint64(3), s.stat("wasm_epp.flow.queued.sheddable"))
	assert.Equal(t, uint64(10), s.stat("wasm_epp.flow.bad_ttl_header"), "every malformed TTL is counted and ignored")
	assert.Equal(t, uint64(6), s.stat("wasm_epp.flow.long_flow_key"))
	assert.Equal(t, uint64(7), s.stat("wasm_epp.flow.rejected_full"))
	assert.NotEmpty(t, s.logs.Find("malformed x-wasm-epp-queue-ttl-ms"))
	s.releaseAll(3)
	for _, ch := range held {
		assert.Equal(t, http.StatusOK, (<-ch).status, "held with the default TTL despite the malformed header")
	}
}

// Release order in the real .wasm: Standard before Sheddable, tenants in
// turn, first in first out inside a tenant. One free slot per snapshot
// releases one request at a time; the pod sees them in release order.
func TestFlowReleaseOrderInHost(t *testing.T) {
	s := startStack(t, `{"models": [{"name": "chat", "criticality": "Standard"}, {"name": "batch", "criticality": "Sheddable"}],
	  "flowControl": {"flowHeader": "x-tenant", "releaseInterval": "5ms"}}`, 1, workers(1))
	s.setPods(busyPod)
	arrivals := []struct{ model, tenant string }{
		{"batch", "a"}, {"chat", "a"}, {"chat", "a"}, {"chat", "b"}, {"batch", "b"}, {"chat", "a"}, {"chat", "c"},
	}
	var replies []<-chan reply
	for i, a := range arrivals {
		body := fmt.Sprintf(`{"model":%q,"prompt":"%s/%s#%d"}`, a.model, a.model, a.tenant, i)
		replies = append(replies, s.async(t.Context(), "/v1/completions", body, "x-tenant", a.tenant))
		s.waitStat("wasm_epp.flow.enqueued", uint64(i+1)) // arrival order is queue order
	}
	oneSlot := podState{kv: 0.1}
	for round := 1; round <= len(arrivals); round++ {
		s.setPods(oneSlot)
		require.Eventually(t, func() bool { return s.received() >= round }, 20*time.Second, 2*time.Millisecond)
	}
	var order []string
	for _, rq := range s.pods[0].requests() {
		var v struct {
			Prompt string `json:"prompt"`
		}
		require.NoError(t, json.Unmarshal(rq.Body, &v))
		order = append(order, v.Prompt)
	}
	assert.Equal(t, []string{
		"chat/a#1", "chat/b#3", "chat/c#6", "chat/a#2", "chat/a#5", // Standard: a, b, c in turn; FIFO inside a
		"batch/a#0", "batch/b#4", // then Sheddable
	}, order)
	for _, ch := range replies {
		assert.Equal(t, http.StatusOK, (<-ch).status)
	}
}

// An HTTP/2 request with trailers is held in on_request_trailers (its last
// body callback had no end of stream) and released from the tick like any
// other: the destination set and the model rewritten at release, the
// buffered body intact.
func TestFlowHoldsFromTheTrailersCallback(t *testing.T) {
	s := startStack(t, flowRouterConfig, 1, workers(1))
	s.setPods(busyPod)
	trailers := http.Header{"X-Checksum": {"abc"}}
	done := make(chan reply, 1)
	go func() {
		done <- s.h2Post("/v1/completions", trailers, `{"model": "split", `, `"prompt": "held in trailers"}`)
	}()
	s.waitStat("wasm_epp.flow.queued.sheddable", 1)
	time.Sleep(30 * time.Millisecond) // six ticks without room
	assert.Zero(t, s.received())
	s.setPods(freePod)
	r := <-done
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	got := s.pods[0].requests()
	require.Len(t, got, 1)
	assert.Equal(t, `{"model": "split-v2", "prompt": "held in trailers"}`, string(got[0].Body))
	assert.Equal(t, s.pods[0].addr(), got[0].Header.Get(destHeader))
	assert.Equal(t, uint64(1), s.stat("wasm_epp.flow.released"))
	assert.Equal(t, uint64(1), s.stat("wasm_epp.requests.routed"))
}

// A new snapshot releases held requests in the first request callback that
// sees it, before any tick: with flow control's tick at 10 s and requests
// re-reading shared data themselves (no refresh tick), a critical request
// arriving after the snapshot lets the held one go, and both reach pods
// with their own destinations.
func TestFlowReleasesOnASnapshotSeenInARequestCallback(t *testing.T) {
	s := startStack(t, `{"seed": 5, "models": [{"name": "base", "criticality": "Critical"}, {"name": "batch", "criticality": "Sheddable"}],
	  "snapshotRefreshInterval": "0s", "flowControl": {"releaseInterval": "10s"}}`, 2, workers(1))
	s.setPods(busyPod, busyPod)
	held := s.async(t.Context(), "/v1/chat/completions", chat("batch"))
	s.waitStat("wasm_epp.flow.queued.sheddable", 1)
	s.setPods(freePod, busyPod)
	crit := s.post("/v1/chat/completions", chat("base"))
	require.Equal(t, http.StatusOK, crit.status, "%s", crit.body)
	r := <-held
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, "pod-0", r.pod, "the pod with room")
	assert.Equal(t, uint64(1), s.stat("wasm_epp.flow.released"))
	for _, p := range s.pods {
		for _, rq := range p.requests() {
			assert.Equal(t, p.addr(), rq.Header.Get(destHeader), "each stream kept its own destination")
		}
	}
	assert.Equal(t, 2, s.received())
}

// A new snapshot the refresh tick reads releases held requests without
// waiting for a request or for flow control's tick: with releaseInterval
// at 10 s and the held request's ttl at 5 s, the held request gets its pod
// only if the refresh tick (20 ms) let it go before it expired.
func TestFlowReleasesOnASnapshotTheRefreshTickRead(t *testing.T) {
	s := startStack(t, `{"seed": 5, "models": [{"name": "batch", "criticality": "Sheddable"}],
	  "flowControl": {"releaseInterval": "10s", "ttl": "5s"}}`, 1, workers(1))
	s.setPods(busyPod)
	held := s.async(t.Context(), "/v1/chat/completions", chat("batch"))
	s.waitStat("wasm_epp.flow.queued.sheddable", 1)
	s.setPods(freePod)
	r := <-held
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, "pod-0", r.pod)
	assert.Equal(t, uint64(1), s.stat("wasm_epp.flow.released"))
	assert.Equal(t, 1, s.received())
}
