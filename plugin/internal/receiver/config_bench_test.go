package receiver

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// BenchmarkConfigResend: what one agent's resend of the stored table costs
// the receiver (a table of 50 rewritten models with 3 targets each and 20
// objectives, from 500 agents in turn). "head" is the receiver as it is:
// the head and table hash compared while the directory names the stored
// record; "decode" forgets what it knows before each resend, so every one
// is decoded and judged against the decoded stored record, as every
// resend was before.
func BenchmarkConfigResend(b *testing.B) {
	tb := wire.ModelTable{}
	for i := range 50 {
		rw := wire.ModelRewrite{Model: fmt.Sprintf("model-%02d", i)}
		for j := range 3 {
			rw.Targets = append(rw.Targets, wire.WeightedTarget{Model: fmt.Sprintf("model-%02d-v%d", i, j), Weight: uint32(10 + j)})
		}
		tb.Rewrites = append(tb.Rewrites, rw)
	}
	for i := range 20 {
		tb.Objectives = append(tb.Objectives, wire.Objective{Name: fmt.Sprintf("objective-%02d", i), Priority: int32(i - 10)})
	}
	records := make([][]byte, 500)
	for i := range records {
		rec, err := wire.EncodeConfig(&wire.ConfigRecord{AgentID: "node-" + strconv.Itoa(i), PoolNamespace: "llm", PoolName: "pool",
			Revision: wire.ConfigRevision{Pools: 7, Objectives: 7, Rewrites: 7}, Table: tb}, wire.ConfigLimits{})
		require.NoError(b, err)
		records[i] = rec
	}
	for _, mode := range []string{"head", "decode"} {
		b.Run(mode, func(b *testing.B) {
			_, r := newHostReceiver(b, `{"role":"receiver"}`)
			status, _, msg := r.applyConfig(records[0])
			require.Equal(b, 204, status, msg)
			b.SetBytes(int64(len(records[0])))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if mode == "decode" {
					r.config.known = knownConfig{}
				}
				i = (i + 1) % len(records)
				if status, _, msg := r.applyConfig(records[i]); status != 204 {
					b.Fatal(status, msg)
				}
			}
		})
	}
}
