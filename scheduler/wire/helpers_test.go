package wire

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"
)

// t0 is a fixed instant; tests never read the wall clock.
var t0 = time.Unix(1_750_000_000, 123_456_789)

func at(d time.Duration) time.Time { return time.Unix(0, t0.Add(d).UnixNano()) }

// endpoint builds a plausible endpoint number i.
func endpoint(i int) EndpointState {
	e := EndpointState{
		Namespace:    "llm",
		Name:         fmt.Sprintf("vllm-%04d", i),
		Address:      netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}),
		Port:         8000,
		Waiting:      uint32(i % 7),
		Running:      uint32(i % 13),
		KVCacheUsage: float64(i%100) / 100,
		MaxAdapters:  4,
		ScrapeTime:   at(-time.Duration(i%50) * time.Millisecond),
	}
	if i%2 == 0 {
		e.ActiveAdapters = []string{fmt.Sprintf("adapter-%d", i%10), "sql-lora"}
		e.WaitingAdapters = []string{"tweet-summary"}
	}
	if i%9 == 4 {
		e.LastError = ScrapeTimeout
	}
	if i%11 == 3 {
		e.Address = netip.MustParseAddr(fmt.Sprintf("fd00::%x", i+1))
	}
	return e
}

func endpoints(n int) []EndpointState {
	if n == 0 {
		return nil // what decoding gives back
	}
	eps := make([]EndpointState, n)
	for i := range eps {
		eps[i] = endpoint(i)
	}
	Normalize(eps)
	return eps
}

func push(agent string, seq uint64, n int) *Push {
	return &Push{AgentID: agent, Seq: seq, SendTime: t0, Endpoints: endpoints(n)}
}

// rawPush encodes p with no validation at all, to build invalid inputs.
func rawPush(p *Push) []byte {
	b := append([]byte{}, magicPush[0], magicPush[1], version1)
	b = appendStr(b, p.AgentID)
	b = binary.LittleEndian.AppendUint64(b, p.Seq)
	b = binary.LittleEndian.AppendUint64(b, uint64(p.SendTime.UnixNano()))
	b = binary.AppendUvarint(b, uint64(len(p.Endpoints)))
	for i := range p.Endpoints {
		b = appendEndpoint(b, &p.Endpoints[i])
	}
	return b
}
