package endtoend

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/stack"
)

// TestFlowControlHoldsSheddableUntilCapacityReturns runs the real processes
// (simulated replicas, agent, gateway with the real .wasm) with flow
// control on: critical load saturates the replicas, sheddable requests sent
// meanwhile wait instead of getting 429, and every one of them is answered
// once, 200, after capacity returns. The replicas count what they served:
// nothing is lost and nothing is sent twice.
func TestFlowControlHoldsSheddableUntilCapacityReturns(t *testing.T) {
	s := startStack(t, stack.Config{
		Replicas:    2,
		Adapters:    []string{"sql-lora-0", "sql-lora-9"},
		MaxLoRAs:    2,
		TimeScale:   8,
		ReplicaArgs: []string{"--max-num-seqs", "2"},
		RouterPatch: map[string]any{"flowControl": map[string]any{"ttl": "30s", "releaseInterval": "20ms"}},
	})
	served := func() int {
		n := 0
		for _, addr := range replicaAddrs(s) {
			n += completedRequests(t, addr)
		}
		return n
	}
	before := served()

	// Critical load: 2 replicas × 2 sequences, the rest waits in vLLM's
	// queue, far over flow control's room (nothing waiting). A
	// pump keeps flood requests in flight until told to stop, so the
	// replicas stay saturated however slowly this machine runs; new ones
	// start a scrape apart, as in the overload test (herding).
	const flood = 24
	var wg sync.WaitGroup
	var mu sync.Mutex
	var crit []reply
	stop := make(chan struct{})
	pumped := make(chan int, 1)
	go func() {
		sem := make(chan struct{}, flood)
		n := 0
		defer func() { pumped <- n }()
		for {
			select {
			case <-stop:
				return
			case sem <- struct{}{}:
			}
			n++
			wg.Go(func() {
				defer func() { <-sem }()
				r, err := trySend(context.Background(), http.MethodPost, s.ClientURL()+"/v1/completions", completion(stackModel, 200), nil)
				if err != nil {
					r = reply{Status: -1, Body: []byte(err.Error())}
				}
				mu.Lock()
				crit = append(crit, r)
				mu.Unlock()
			})
			if n%6 == 0 {
				time.Sleep(testInterval + 10*time.Millisecond)
			}
		}
	}()
	// Wait until the gateway sees no capacity: a sheddable request would
	// now get 429 without flow control.
	poll(t, func() bool {
		for _, addr := range replicaAddrs(s) {
			if replicaState(t, addr).Waiting <= 5 {
				return false
			}
		}
		return true
	}, "the critical load did not saturate the replicas")
	waitPushes(t, s, 2)

	const shed = 8
	type answer struct {
		r     reply
		after time.Duration
	}
	answers := make(chan answer, shed)
	sentAt := time.Now()
	for range shed {
		wg.Go(func() {
			r, err := trySend(context.Background(), http.MethodPost, s.ClientURL()+"/v1/completions", completion("sql-lora-9", 4), nil)
			if err != nil {
				r = reply{Status: -1, Body: []byte(err.Error())}
			}
			answers <- answer{r, time.Since(sentAt)}
		})
	}
	// They wait: each is queued in the gateway, or (when a starved machine
	// let the pump fall behind and a replica showed room) routed at once;
	// none is refused. The pump runs on meanwhile, so on any machine most
	// arrive while every replica is saturated.
	var queued uint64
	poll(t, func() bool {
		queued = stat(t, s, pluginStat("flow.enqueued"))
		return queued+uint64(len(answers)) >= shed
	}, "sheddable requests were neither queued nor answered")
	t.Logf("%d of %d sheddable requests queued, %d routed at once", queued, shed, len(answers))
	require.Positive(t, queued, "no sheddable request met the saturated replicas")
	assert.Equal(t, uint64(shed), queued+uint64(len(answers)))

	close(stop) // the load drains, capacity returns, the queue is released
	floodSent := <-pumped
	wg.Wait()
	close(answers)
	require.Len(t, crit, floodSent)
	for _, r := range crit {
		assert.Equal(t, http.StatusOK, r.Status, "critical: %s", r)
	}
	n := 0
	var waits []time.Duration
	for a := range answers {
		n++
		waits = append(waits, a.after.Round(time.Millisecond))
		if assert.Equal(t, http.StatusOK, a.r.Status, "sheddable after %s: %s", a.after, a.r) {
			var v struct {
				Choices []struct {
					Text string `json:"text"`
				} `json:"choices"`
			}
			require.NoError(t, json.Unmarshal(a.r.Body, &v))
			assert.Equal(t, simText(4), v.Choices[0].Text)
		}
	}
	t.Logf("sheddable requests answered after %v", waits)
	assert.Equal(t, shed, n)
	assert.Equal(t, queued, stat(t, s, pluginStat("flow.released")), "every queued request was released")
	assert.Zero(t, stat(t, s, pluginStat("flow.expired")))
	assert.Zero(t, stat(t, s, pluginStat("requests.dropped")), "nothing refused")
	// None lost, none sent twice: the replicas served exactly what was sent.
	poll(t, func() bool { return served()-before >= floodSent+shed })
	assert.Equal(t, floodSent+shed, served()-before)
}

// completedRequests is what a replica counts as served
// (vllm:request_success_total, summed over its series).
func completedRequests(t *testing.T, addr string) int {
	t.Helper()
	r := send(t, http.MethodGet, "http://"+addr+"/metrics", nil, nil)
	require.Equal(t, http.StatusOK, r.Status)
	n := 0.0
	for _, line := range strings.Split(string(r.Body), "\n") {
		if !strings.HasPrefix(line, "vllm:request_success_total") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		require.NoError(t, err, line)
		n += v
	}
	return int(n)
}
