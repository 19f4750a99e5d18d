package wire

import (
	"fmt"
	"testing"
	"time"
)

// storedOf spreads n endpoints over agents agents.
func storedOf(n, agents int) *Stored {
	s := &Stored{}
	per := n / agents
	for a := 0; a < agents; a++ {
		id := fmt.Sprintf("node-%02d", a)
		s.Agents = append(s.Agents, AgentState{AgentID: id, LastSeq: 1, Received: t0, Endpoints: renamed(id, per)})
	}
	return s
}

func BenchmarkDecodePush(b *testing.B) {
	for _, n := range []int{64, 512} {
		buf, err := EncodePush(push("node-a", 1, n), Limits{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				if _, err := DecodePush(buf, Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncodePush(b *testing.B) {
	for _, n := range []int{64, 512} {
		p := push("node-a", 1, n)
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var dst []byte
			for b.Loop() {
				var err error
				if dst, err = AppendPush(dst[:0], p, Limits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecodeSnapshot(b *testing.B) {
	for _, c := range []struct{ n, agents int }{{64, 1}, {64, 8}, {512, 1}, {512, 8}} {
		buf, err := EncodeStored(storedOf(c.n, c.agents), Limits{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("endpoints=%d/agents=%d", c.n, c.agents), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				if _, err := DecodeSnapshot(buf, Limits{}, SnapshotOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMergeBytes is the receiver's write step: one agent's 64
// endpoints into a stored value of 8 agents (512 endpoints).
func BenchmarkMergeBytes(b *testing.B) {
	stored, err := EncodeStored(storedOf(512, 8), Limits{})
	if err != nil {
		b.Fatal(err)
	}
	p := &Push{AgentID: "node-03", Seq: 2, SendTime: t0, Endpoints: renamed("node-03", 64)}
	pb, err := EncodePush(p, Limits{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := MergeBytes(stored, pb, t0.Add(time.Second), Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}
