package wire

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// relayFleet is n endpoints over n/perNode agents and relay pushes of every
// agent's state at successive rounds (values change, strings do not).
func relayFleet(tb testing.TB, n, perNode, rounds int) [][]byte {
	var d PushDecoder
	out := make([][]byte, rounds)
	for r := 0; r < rounds; r++ {
		agents := n / perNode
		ids := make([]string, agents)
		for a := range ids {
			ids[a] = fmt.Sprintf("node-%05d", a)
		}
		buf := AppendPushV2Header(nil, KindRelay, "agg-0", at(time.Duration(r)*50*time.Millisecond), agents)
		for _, id := range ids { // already sorted
			p := agentPush(tb, id, uint64(r+1), at(time.Duration(r)*50*time.Millisecond), agentState(id, perNode, uint32(3*(r+1)), at(time.Duration(r)*50*time.Millisecond)))
			v, err := d.Decode(p, Limits{})
			if err != nil {
				tb.Fatal(err)
			}
			buf = AppendRelayBlock(buf, v.Blocks[0], 10*time.Millisecond)
		}
		out[r] = buf
	}
	return out
}

// BenchmarkRelayApply is the receiver's work for one relay push holding
// every agent (all changed), and BenchmarkCacheRefresh a router's work to
// follow it.
func BenchmarkRelayApply(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		pushes := relayFleet(b, n, 2, 2)
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			st := &MemStore{}
			w := NewWriter(testKeys, Limits{}, time.Hour)
			if err := w.Init(st); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				p := pushes[i%2]
				setRelaySeq(p, uint64(i+1)) // every agent newer each time
				if _, err := w.Apply(st, p, at(0)); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/endpoint")
		})
	}
}

// setRelaySeq gives every block of a relay push sequence number seq.
func setRelaySeq(p []byte, seq uint64) {
	off := 5 + int(p[4]) + pushV2Fixed
	for off < len(p) {
		binary.LittleEndian.PutUint64(p[off+bhSeq:], seq)
		off += int(le32(p, off+bhLen))
	}
}

func BenchmarkCacheRefresh(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		pushes := relayFleet(b, n, 2, 2)
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			benchAlternatingRefresh(b, n, [2][][]byte{pushes[:1], pushes[:2]})
		})
	}
}

// BenchmarkCacheRefreshAdapters is BenchmarkCacheRefresh with adapter
// lists changing as well, as at the knee of bin/scalebench (a fifth of
// the endpoints change adapters each scrape there): in every relay one
// agent in five reports a shorter list on an endpoint (its block changes
// size and the blocks after it in the segment move) and one in five the
// same number of other adapters, the strings the same (same identities).
func BenchmarkCacheRefreshAdapters(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		agents := n / 2
		encs := make([]BlockEncoder, agents)
		var d PushDecoder
		var pushes [][]byte
		for r := range 2 {
			send := at(time.Duration(r) * 50 * time.Millisecond)
			buf := AppendPushV2Header(nil, KindRelay, "agg-0", send, agents)
			for a := range agents {
				id := fmt.Sprintf("node-%05d", a)
				eps := agentState(id, 2, uint32(3*(r+1)), send)
				switch {
				case r == 1 && a%5 == 0:
					eps[0].ActiveAdapters = []string{"tenant-0"}
				case r == 1 && a%5 == 1:
					eps[0].ActiveAdapters = []string{"summary", "tenant-0"}
				}
				p, err := encs[a].AppendAgentPush(nil, &Push{AgentID: id, Seq: uint64(r + 1), SendTime: send, Endpoints: eps}, Limits{})
				if err != nil {
					b.Fatal(err)
				}
				v, err := d.Decode(p, Limits{})
				if err != nil {
					b.Fatal(err)
				}
				buf = AppendRelayBlock(buf, v.Blocks[0], 10*time.Millisecond)
			}
			pushes = append(pushes, buf)
		}
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			benchAlternatingRefresh(b, n, [2][][]byte{pushes[:1], pushes[:2]})
		})
	}
}

// benchAlternatingRefresh measures a cache alternating between two stores,
// each holding states[j] applied in turn 50 ms apart.
func benchAlternatingRefresh(b *testing.B, n int, states [2][][]byte) {
	var st [2]*MemStore
	for j := range st {
		st[j] = &MemStore{}
		w := NewWriter(testKeys, Limits{}, time.Hour)
		if err := w.Init(st[j]); err != nil {
			b.Fatal(err)
		}
		for k, p := range states[j] {
			if _, err := w.Apply(st[j], p, at(time.Duration(k)*50*time.Millisecond)); err != nil {
				b.Fatal(err)
			}
		}
	}
	c := NewCache(testKeys, Limits{})
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := c.Refresh(st[i%2]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/endpoint")
}

// BenchmarkCacheRefreshPartial is a router's work to follow a relay that
// carries every tenth agent (the rest unchanged): the segments those
// agents are in are read again, and only their endpoints rewritten.
func BenchmarkCacheRefreshPartial(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		full := relayFleet(b, n, 2, 1)[0]
		var d PushDecoder
		agents := n / 2
		part := AppendPushV2Header(nil, KindRelay, "agg-0", at(50*time.Millisecond), (agents+9)/10)
		for a := 0; a < agents; a += 10 {
			id := fmt.Sprintf("node-%05d", a)
			p := agentPush(b, id, 2, at(50*time.Millisecond), agentState(id, 2, 9, at(50*time.Millisecond)))
			v, err := d.Decode(p, Limits{})
			if err != nil {
				b.Fatal(err)
			}
			part = AppendRelayBlock(part, v.Blocks[0], 10*time.Millisecond)
		}
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			benchAlternatingRefresh(b, n, [2][][]byte{{full}, {full, part}})
		})
	}
}

// storedRelay is a store holding a relay of every agent of n endpoints
// (two per agent), the writer that stored it and that relay, with the
// collector's cycle finished (in the guest nothing else would end it).
func storedRelay(b *testing.B, n int) (*MemStore, *Writer, []byte) {
	full := relayFleet(b, n, 2, 1)[0]
	st := &MemStore{}
	w := NewWriter(testKeys, Limits{}, time.Hour)
	if err := w.Init(st); err != nil {
		b.Fatal(err)
	}
	if _, err := w.Apply(st, full, at(0)); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	return st, w, full
}

// BenchmarkRelayApplyHeartbeats is the receiver's work for an idle relay
// at 1,000 endpoints: the agents of 6 of the 64 segments beat (new
// sequence, the same values), as agents heartbeating every 500 ms on
// slots offset by their segment do in each of ten 50 ms relays; and
// BenchmarkRelayApplyNotNewer for a relay of every agent's block that the
// receiver holds already (a full relay when nothing moved).
func BenchmarkRelayApplyHeartbeats(b *testing.B) {
	st, w, full := storedRelay(b, 1000)
	var d PushDecoder
	v, err := d.Decode(full, Limits{})
	if err != nil {
		b.Fatal(err)
	}
	var beat []byte
	n := 0
	for _, blk := range v.Blocks {
		if SegmentOf(blk.AgentID()) < 6 {
			n++
		}
	}
	beat = AppendPushV2Header(beat, KindRelay, "agg-0", at(0), n)
	for _, blk := range v.Blocks {
		if SegmentOf(blk.AgentID()) < 6 {
			beat = AppendRelayBlock(beat, blk, 0)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		setRelaySeq(beat, uint64(i+2))
		if s, err := w.Apply(st, beat, at(0)); err != nil || s.Accepted != n {
			b.Fatal(s, err)
		}
		i++
	}
	b.ReportMetric(float64(n), "blocks/op")
}

func BenchmarkRelayApplyNotNewer(b *testing.B) {
	st, w, full := storedRelay(b, 1000)
	b.ReportAllocs()
	for b.Loop() {
		if s, err := w.Apply(st, full, at(0)); err != nil || s.Accepted != 0 || s.Segments != 0 {
			b.Fatal(s, err)
		}
	}
}

// BenchmarkRelayApplyValues is the receiver's work for a relay at the
// knee at 1,000 endpoints: every agent's block again with new values
// (queue lengths), the same strings, endpoints and adapters.
func BenchmarkRelayApplyValues(b *testing.B) {
	st, w, full := storedRelay(b, 1000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		setRelaySeq(full, uint64(i+2))
		setRelayWaiting(full, uint32(i%40))
		if s, err := w.Apply(st, full, at(0)); err != nil || s.Accepted != 500 {
			b.Fatal(s, err)
		}
		i++
	}
}

// setRelayWaiting sets every endpoint's waiting count in a relay push.
func setRelayWaiting(p []byte, waiting uint32) {
	off := 5 + int(p[4]) + pushV2Fixed
	for off < len(p) {
		blk := Block(p[off:])
		for r := 0; r < blk.Len(); r++ {
			binary.LittleEndian.PutUint32(p[off+blockHeaderBytes+r*recordBytes+erWaiting:], waiting)
		}
		off += int(le32(p, off+bhLen))
	}
}
