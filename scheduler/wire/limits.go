package wire

import (
	"math"
	"time"
)

// Limits bounds everything a payload may contain, so a hostile or buggy
// agent cannot make the plugin allocate without bound, and shared data keeps
// a bounded number of agents and endpoints. A zero field means the default
// shown in DefaultLimits; a negative field is treated as zero elements
// allowed (everything beyond is rejected).
type Limits struct {
	// MaxPushBytes bounds an encoded Push (default 4 MiB).
	MaxPushBytes int
	// MaxStoredBytes bounds what shared data keeps: all segments together
	// (default 64 MiB).
	MaxStoredBytes int
	// MaxEndpoints bounds the endpoints of one push (default 1024).
	MaxEndpoints int
	// MaxAdapters bounds each adapter list of one endpoint (default 64).
	MaxAdapters int
	// MaxNameLen bounds every string: agent id, namespace, name, adapter
	// (default 253, the longest Kubernetes object name).
	MaxNameLen int
	// MaxCount bounds waiting, running and max_adapters (default 1<<20):
	// larger numbers are a bug upstream, not load.
	MaxCount int
	// MaxAgents bounds the agents kept in shared data, and the blocks of
	// one relayed push (default 4096).
	MaxAgents int
	// MaxTotalEndpoints bounds the endpoints of all agents together
	// (default 16384).
	MaxTotalEndpoints int
	// AgentTTL: an aggregator stops relaying an agent not heard from for
	// this long (default 5 min; the receiver's Writer drops stored agents
	// after its own expiry, the plugin's staleAfter).
	AgentTTL time.Duration
	// MaxClockSkew: a push whose send time is more than this ahead of the
	// receiver's clock is refused (default 1 s). Freshness is judged on
	// the receiver's clock whatever this is (see the package doc).
	MaxClockSkew time.Duration
}

// DefaultLimits returns the limits used when a field is left zero.
func DefaultLimits() Limits {
	return Limits{
		MaxPushBytes:      4 << 20,
		MaxStoredBytes:    64 << 20,
		MaxEndpoints:      1024,
		MaxAdapters:       64,
		MaxNameLen:        253,
		MaxCount:          1 << 20,
		MaxAgents:         4096,
		MaxTotalEndpoints: 16384,
		AgentTTL:          5 * time.Minute,
		MaxClockSkew:      time.Second,
	}
}

// Resolved returns l with zero fields set to their defaults.
func (l Limits) Resolved() Limits { return l.resolved() }

// resolved fills zero fields with defaults.
func (l Limits) resolved() Limits {
	d := DefaultLimits()
	pick := func(v, def int) int {
		if v == 0 {
			return def
		}
		if v < 0 {
			return 0
		}
		return v
	}
	l.MaxPushBytes = pick(l.MaxPushBytes, d.MaxPushBytes)
	l.MaxStoredBytes = pick(l.MaxStoredBytes, d.MaxStoredBytes)
	l.MaxEndpoints = pick(l.MaxEndpoints, d.MaxEndpoints)
	l.MaxAdapters = pick(l.MaxAdapters, d.MaxAdapters)
	l.MaxNameLen = pick(l.MaxNameLen, d.MaxNameLen)
	l.MaxCount = min(pick(l.MaxCount, d.MaxCount), math.MaxUint32) // counts travel as uint32
	l.MaxAgents = pick(l.MaxAgents, d.MaxAgents)
	l.MaxTotalEndpoints = pick(l.MaxTotalEndpoints, d.MaxTotalEndpoints)
	if l.AgentTTL == 0 {
		l.AgentTTL = d.AgentTTL
	}
	if l.MaxClockSkew == 0 {
		l.MaxClockSkew = d.MaxClockSkew
	}
	return l
}
