package scale

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Fleet is simulated endpoints, PerNode to a node, one agent per node.
type Fleet struct {
	Agents []*Agent
	// Probe, when set, is the agent whose one endpoint (ProbeName)
	// reports a new running adapter every scrape, named after the scrape's
	// sequence (Agent.ProbeAdapter), keeps the last probeKeep of them, and
	// has no free adapter slot: a request for one of them lands on it only
	// once a router has seen a push carrying it (see Probe).
	Probe *Agent
}

// Agent is one simulated node agent: its id, sequence and endpoints.
type Agent struct {
	ID  string
	Seq uint64
	Eps []wire.EndpointState
	// serves[i] are the adapters endpoint i is configured with (vLLM's
	// --lora-modules): its running adapters are drawn from them.
	serves [][]string
	rng    *rand.Rand
	enc    wire.BlockEncoder
}

// ProbeName is the probe endpoint's name.
const ProbeName = "probe"

// probeKeep is how many scrapes' adapters the probe endpoint keeps
// running: at a 50 ms interval a prober has 1.6 s to see each (Probe
// counts one not seen by then as missed).
const probeKeep = 32

// ProbeAdapter is the newest adapter the probe endpoint reports: the one
// named after its last scrape ("" for an agent that is not the probe).
func (a *Agent) ProbeAdapter() string {
	if len(a.Eps) != 1 || a.Eps[0].Name != ProbeName || len(a.Eps[0].ActiveAdapters) == 0 {
		return ""
	}
	ads := a.Eps[0].ActiveAdapters
	return ads[len(ads)-1]
}

// adapters is the pool the simulated endpoints draw their LoRA adapters from.
var adapters = func() []string {
	out := make([]string, 16)
	for i := range out {
		out[i] = fmt.Sprintf("lora-%02d", i)
	}
	return out
}()

// NewFleet builds endpoints endpoints, perNode per agent, every one at a
// distinct loopback address 127.x.y.z with the given port (so a single
// upstream listening on all interfaces serves them all), plus the probe
// agent when probe is set. Sequences start at seqBase.
func NewFleet(endpoints, perNode int, port uint16, seed uint64, probe bool) *Fleet {
	f := &Fleet{}
	rng := rand.New(rand.NewPCG(seed, 0x5ca1e))
	n := 0
	for node := 0; n < endpoints; node++ {
		a := &Agent{ID: fmt.Sprintf("node-%05d", node), Seq: uint64(time.Now().UnixNano()), rng: rand.New(rand.NewPCG(seed, uint64(node)))}
		for i := 0; i < perNode && n < endpoints; i++ {
			n++
			ip := netip.AddrFrom4([4]byte{127, byte(n >> 16), byte(n >> 8), byte(n)})
			serves := make([]string, 6)
			for j, k := range rng.Perm(len(adapters))[:len(serves)] {
				serves[j] = adapters[k]
			}
			a.serves = append(a.serves, serves)
			a.Eps = append(a.Eps, wire.EndpointState{
				Namespace: "llm", Name: fmt.Sprintf("vllm-%05d-%d", node, i), Address: ip, Port: port,
				Waiting: uint32(rng.IntN(4)), Running: uint32(rng.IntN(32)), KVCacheUsage: rng.Float64() * 0.7,
				MaxAdapters: 4, ActiveAdapters: []string{serves[0]},
			})
		}
		wire.Normalize(a.Eps)
		f.Agents = append(f.Agents, a)
	}
	// Warm the agents' string tables: a real agent has run for a while, so
	// every adapter its pods serve is in its table already (a new one
	// would be a new block identity for every reader).
	now := time.Now()
	for _, a := range f.Agents {
		for i := 0; i < 100; i++ {
			a.Step(now, 1)
			if _, err := a.Push(nil, 2, now); err != nil {
				panic(err)
			}
		}
	}
	if probe {
		f.Probe = &Agent{ID: "probe-agent", Seq: uint64(time.Now().UnixNano()), rng: rand.New(rand.NewPCG(seed, 1<<40)), serves: [][]string{nil},
			Eps: []wire.EndpointState{{Namespace: "llm", Name: ProbeName, Address: netip.AddrFrom4([4]byte{127, 254, 254, 254}), Port: port, MaxAdapters: probeKeep}}}
		for i := 0; i < probeKeep; i++ {
			f.Probe.Step(now, 1) // every adapter slot taken from the start
		}
		f.Agents = append(f.Agents, f.Probe)
	}
	return f
}

// Step advances the agent by one scrape at now: with probability change
// each endpoint's queue, running count and KV-cache use move (a busy fleet
// moves every scrape), and one scrape in five its running adapters (drawn
// from those it serves); the sequence grows.
// The probe adds an adapter named after the new sequence (names sort in
// the order they came, as the wire keeps adapter lists sorted) and drops
// its oldest beyond probeKeep.
func (a *Agent) Step(now time.Time, change float64) {
	a.Seq++
	for i := range a.Eps {
		e := &a.Eps[i]
		e.ScrapeTime = now
		if a.Eps[i].Name == ProbeName {
			if len(e.ActiveAdapters) == probeKeep {
				e.ActiveAdapters = append(e.ActiveAdapters[:0], e.ActiveAdapters[1:]...)
			}
			e.ActiveAdapters = append(e.ActiveAdapters, fmt.Sprintf("probe-%020d", a.Seq))
			continue
		}
		if a.rng.Float64() >= change {
			continue
		}
		e.Waiting = uint32(max(0, min(40, int(e.Waiting)+a.rng.IntN(5)-2)))
		e.Running = uint32(max(0, min(64, int(e.Running)+a.rng.IntN(7)-3)))
		e.KVCacheUsage = max(0, min(0.98, e.KVCacheUsage+(a.rng.Float64()-0.5)*0.04))
		if serves := a.serves[i]; a.rng.IntN(5) == 0 {
			e.ActiveAdapters = append(e.ActiveAdapters[:0], serves[a.rng.IntN(len(serves))])
			if a.rng.IntN(2) == 0 {
				e.ActiveAdapters = append(e.ActiveAdapters, serves[a.rng.IntN(len(serves))])
			}
			slices.Sort(e.ActiveAdapters)
			e.ActiveAdapters = slices.Compact(e.ActiveAdapters)
		}
	}
}

// Push encodes the agent's current state as its push in wire version
// (1 or 2), sent at now.
func (a *Agent) Push(dst []byte, version int, now time.Time) ([]byte, error) {
	p := &wire.Push{AgentID: a.ID, Seq: a.Seq, SendTime: now, Endpoints: a.Eps}
	if version == 1 {
		return wire.AppendPush(dst, p, wire.Limits{})
	}
	return a.enc.AppendAgentPush(dst, p, wire.Limits{})
}
