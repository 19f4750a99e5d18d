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
	// MaxStoredBytes bounds an encoded Stored snapshot (default 16 MiB).
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
	// MaxAgents bounds the agents kept in a Stored snapshot (default 256).
	MaxAgents int
	// MaxTotalEndpoints bounds the endpoints of all agents together in a
	// Stored snapshot (default 4096).
	MaxTotalEndpoints int
	// AgentTTL: Merge drops an agent not heard from for this long
	// (default 5 min), so agents of deleted nodes do not pile up.
	AgentTTL time.Duration
	// MaxClockSkew: Merge refuses a push whose send time is more than this
	// ahead of the receiver's clock (default 1 s). Freshness is judged on
	// the receiver's clock whatever this is (see Merge).
	MaxClockSkew time.Duration
}

// DefaultLimits returns the limits used when a field is left zero.
func DefaultLimits() Limits {
	return Limits{
		MaxPushBytes:      4 << 20,
		MaxStoredBytes:    16 << 20,
		MaxEndpoints:      1024,
		MaxAdapters:       64,
		MaxNameLen:        253,
		MaxCount:          1 << 20,
		MaxAgents:         256,
		MaxTotalEndpoints: 4096,
		AgentTTL:          5 * time.Minute,
		MaxClockSkew:      time.Second,
	}
}

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
