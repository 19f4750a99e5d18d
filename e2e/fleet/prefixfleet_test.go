package fleet

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/wasm-epp/wasm-epp/e2e/vllmsim"
	"github.com/wasm-epp/wasm-epp/scheduler"
)

// gatewayVMs builds gateways × vms instances of spec, each gateway with its
// own shared state, as the fleet's run does.
func gatewayVMs(t *testing.T, spec PolicySpec, gateways, vms int, clock func() time.Time) []Policy {
	t.Helper()
	run := &GatewayShared{}
	var out []Policy
	for g := range gateways {
		shared := &GatewayShared{}
		for k := range vms {
			p, err := spec.New(uint64(g*vms+k+1), clock)
			if err != nil {
				t.Fatal(err)
			}
			if pl, ok := p.(Placed); ok {
				pl.Place(Placement{Gateway: g, VM: k, Gateways: gateways, VMs: vms, Shared: shared, Run: run})
			}
			out = append(out, p)
		}
	}
	return out
}

// groupPrompt is group g's 1,500-token context and a question.
func groupPrompt(g, q int) []uint32 {
	toks := make([]uint32, 0, 1600)
	for i := range 1500 {
		toks = append(toks, uint32(g*100000+i))
	}
	for i := range 100 {
		toks = append(toks, uint32(1<<30+q*1000+i))
	}
	return toks
}

// stickiness routes 50 groups × 10 questions over 2 gateways × 4 VMs at
// random and returns the mean number of distinct replicas a group used.
func stickiness(t *testing.T, spec PolicySpec) float64 { return stickinessOver(t, spec, 2, 4) }

// stickinessOver is stickiness over gateways × vmsPer VMs.
func stickinessOver(t *testing.T, spec PolicySpec, gateways, vmsPer int) float64 {
	now := Epoch
	clock := func() time.Time { return now }
	vms := gatewayVMs(t, spec, gateways, vmsPer, clock)
	snap := &scheduler.Snapshot{Time: now}
	for i := range 8 {
		snap.Endpoints = append(snap.Endpoints, scheduler.Endpoint{ID: scheduler.EndpointID{Namespace: "fleet", Name: fmt.Sprint("vllm-", i)},
			Address: fmt.Sprintf("10.0.0.%d", i+1), Port: 8000, Metrics: scheduler.Metrics{UpdateTime: now}})
	}
	r := rand.New(rand.NewPCG(1, 2))
	used := map[int]map[int]bool{}
	id := uint64(0)
	for q := range 10 {
		for g := range 50 {
			vm := vms[r.IntN(len(vms))]
			req := scheduler.Request{Model: "m", Criticality: scheduler.Critical}
			vr := vllmsim.Request{ID: id, Prompt: groupPrompt(g, q)}
			i, o := vm.Route(&req, &View{Snapshot: snap, InFlight: make([]int, 8), Request: &vr})
			id++
			if o != scheduler.Routed {
				t.Fatalf("outcome %v", o)
			}
			if used[g] == nil {
				used[g] = map[int]bool{}
			}
			used[g][i] = true
		}
		now = now.Add(200 * time.Millisecond)
		for _, vm := range vms {
			if tp, ok := vm.(Ticker); ok {
				tp.Tick(now.Sub(Epoch))
			}
		}
	}
	sum := 0
	for _, m := range used {
		sum += len(m)
	}
	return float64(sum) / float64(len(used))
}

func TestPrefixPoliciesKeepGroupsTogether(t *testing.T) {
	for _, spec := range PrefixPolicies() {
		s := stickiness(t, spec)
		t.Logf("%s: %.2f replicas per group", spec.Name, s)
		if spec.Name != PolicyLLMDApproximate && s > 1.01 {
			t.Errorf("%s: a group used %.2f replicas on idle endpoints, want 1", spec.Name, s)
		}
	}
}
