package wire

import (
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/kv"
)

// MemStore is kv.MemStore: shared data in memory, for tests and native
// benchmarks.
type MemStore = kv.MemStore

// Fill stores one agent's endpoints in st as the receiver would store its
// push at now (keys under prefix): for tests and benchmarks that fill
// shared data directly.
func Fill(st Store, prefix, agentID string, seq uint64, eps []EndpointState, now time.Time) error {
	w := NewWriter(NewKeys(prefix), Limits{}, 24*time.Hour)
	if err := w.Init(st); err != nil {
		return err
	}
	var enc BlockEncoder
	b, err := enc.AppendAgentPush(nil, &Push{AgentID: agentID, Seq: seq, SendTime: now, Endpoints: eps}, Limits{})
	if err != nil {
		return err
	}
	_, err = w.Apply(st, b, now)
	return err
}
