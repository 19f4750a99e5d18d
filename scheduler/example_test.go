package scheduler_test

import (
	"fmt"
	"math/rand/v2"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// A gateway decodes its "scheduler" section, builds one Scheduler per
// (single-threaded) VM and schedules each request on the current snapshot.
func Example() {
	cfg, err := scheduler.DecodeConfig([]byte(`{"byCriticality": {"sheddable": "scoring"}}`))
	if err != nil {
		panic(scheduler.PrefixError("scheduler", err))
	}
	s, err := scheduler.New(cfg, scheduler.NewRegistry(), scheduler.Options{Rand: rand.NewPCG(1, 2)})
	if err != nil {
		panic(err)
	}
	snap := &scheduler.Snapshot{Endpoints: []scheduler.Endpoint{
		{ID: scheduler.EndpointID{Namespace: "llm", Name: "vllm-0"}, Address: "10.0.0.7", Port: 8000,
			Metrics: scheduler.Metrics{WaitingQueueSize: 2, KVCacheUsage: 0.3, ActiveModels: []string{"sql-lora"}, MaxActiveModels: 4}},
		{ID: scheduler.EndpointID{Namespace: "llm", Name: "vllm-1"}, Address: "10.0.0.8", Port: 8000,
			Metrics: scheduler.Metrics{WaitingQueueSize: 9, KVCacheUsage: 0.9, MaxActiveModels: 4}},
	}}
	for _, req := range []scheduler.Request{
		{Model: "sql-lora", Criticality: scheduler.Critical},
		{Model: "sql-lora", Criticality: scheduler.Sheddable},
	} {
		res := s.Schedule(&req, snap)
		fmt.Printf("%v %v %s:%d %s\n", req.Criticality, res.Outcome, res.Endpoint.Address, res.Endpoint.Port, res.Path)
	}
	// Output:
	// Critical routed 10.0.0.7:8000 critical/low-queue/lora-affinity/least-queue/least-kv
	// Sheddable routed 10.0.0.7:8000 scoring
}
