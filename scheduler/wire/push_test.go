package wire

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPushRoundTrip(t *testing.T) {
	maxed := endpoint(1)
	maxed.Namespace = strings.Repeat("n", 253)
	maxed.Name = strings.Repeat("m", 253)
	maxed.Waiting, maxed.Running, maxed.MaxAdapters = 1<<20, 1<<20, 1<<20
	maxed.KVCacheUsage = 1
	maxed.Port = 65535
	for i := 0; i < 64; i++ {
		maxed.ActiveAdapters = append(maxed.ActiveAdapters, fmt.Sprintf("%s%02d", strings.Repeat("a", 251), i))
	}
	unicodeName := endpoint(2)
	unicodeName.ActiveAdapters = []string{"modèle-ünïcode", "日本語"}
	tests := []struct {
		name string
		p    *Push
	}{
		{"no endpoints", push("node-a", 1, 0)},
		{"one endpoint", push("node-a", 2, 1)},
		{"64 endpoints, v4 and v6, unhealthy ones", push("node-a", 1<<62, 64)},
		{"limits reached", &Push{AgentID: strings.Repeat("x", 253), Seq: math.MaxUint64, SendTime: t0, Endpoints: []EndpointState{maxed}}},
		{"unicode adapters", &Push{AgentID: "node-ü", Seq: 9, SendTime: t0, Endpoints: []EndpointState{unicodeName}}},
		{"empty namespace (static target)", &Push{AgentID: "a", Seq: 1, SendTime: t0, Endpoints: []EndpointState{func() EndpointState {
			e := endpoint(3)
			e.Namespace = ""
			e.Name = "127.0.0.1:8000"
			return e
		}()}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := EncodePush(tc.p, Limits{})
			require.NoError(t, err)
			got, err := DecodePush(b, Limits{})
			require.NoError(t, err)
			assert.Equal(t, tc.p, got)
			again, err := EncodePush(got, Limits{})
			require.NoError(t, err)
			assert.Equal(t, b, again, "one encoding per message")
		})
	}
}

func TestDecodePushDoesNotAliasInput(t *testing.T) {
	b, err := EncodePush(push("node-a", 1, 2), Limits{})
	require.NoError(t, err)
	p, err := DecodePush(b, Limits{})
	require.NoError(t, err)
	for i := range b {
		b[i] = 'Z'
	}
	assert.Equal(t, "node-a", p.AgentID)
	assert.Equal(t, "vllm-0000", p.Endpoints[0].Name)
}

func TestNormalizeSortsAndDedups(t *testing.T) {
	eps := []EndpointState{endpoint(2), endpoint(1)}
	eps[0].ActiveAdapters = []string{"b", "a", "b"}
	Normalize(eps)
	assert.Equal(t, "vllm-0001", eps[0].Name)
	assert.Equal(t, []string{"a", "b"}, eps[1].ActiveAdapters)
}

// mutate returns a valid push with one endpoint changed by f.
func mutate(f func(*EndpointState)) *Push {
	p := push("node-a", 7, 3)
	f(&p.Endpoints[1])
	return p
}

func TestDecodePushRejects(t *testing.T) {
	valid := rawPush(push("node-a", 7, 3))
	small := Limits{MaxEndpoints: 2, MaxAdapters: 1, MaxNameLen: 12, MaxCount: 100, MaxPushBytes: 64}
	tests := []struct {
		name  string
		in    []byte
		lim   Limits
		kind  error
		where string // substring of the message
	}{
		{"empty", nil, Limits{}, ErrTruncated, "magic"},
		{"one byte", []byte("W"), Limits{}, ErrTruncated, "magic"},
		{"no version", []byte("WP"), Limits{}, ErrTruncated, "version"},
		{"not a push", []byte("GET / HTTP/1.1\r\n"), Limits{}, ErrFormat, "magic"},
		{"segment given as push", appendSegmentHeader(nil, 0, 1, 0), Limits{}, ErrFormat, "magic"},
		{"unknown version", append([]byte("WP\x02"), valid[3:]...), Limits{}, ErrVersion, "version 2"},
		{"version 0", append([]byte("WP\x00"), valid[3:]...), Limits{}, ErrVersion, "version 0"},
		{"trailing byte", append(append([]byte{}, valid...), 0), Limits{}, ErrTrailing, "1 bytes"},
		{"over size limit", valid, small, ErrLimit, "bytes, limit 64"},
		{"too many endpoints", valid, Limits{MaxEndpoints: 2}, ErrLimit, "push.endpoints: 3 entries, limit 2"},
		{"too many adapters", valid, Limits{MaxAdapters: 1}, ErrLimit, "active_adapters"},
		{"name too long", valid, Limits{MaxNameLen: 5}, ErrLimit, "agent_id"},
		{"count over limit", rawPush(mutate(func(e *EndpointState) { e.Waiting = 101 })), Limits{MaxCount: 100}, ErrLimit, "waiting"},
		{"claims more endpoints than bytes", append(rawPush(push("a", 1, 0))[:len(rawPush(push("a", 1, 0)))-1], 0xe8, 0x07), Limits{}, ErrTruncated, "1000 entries cannot fit"},
		{"empty agent id", rawPush(push("", 7, 1)), Limits{}, ErrInvalidField, "agent_id"},
		{"control char in agent id", rawPush(push("a\nb", 7, 1)), Limits{}, ErrInvalidField, "control character"},
		{"seq zero", rawPush(push("a", 0, 1)), Limits{}, ErrInvalidField, "seq"},
		{"send time zero", rawPush(&Push{AgentID: "a", Seq: 1, SendTime: time.Unix(0, 0)}), Limits{}, ErrInvalidField, "send_time"},
		{"send time negative", rawPush(&Push{AgentID: "a", Seq: 1, SendTime: time.Unix(-5, 0)}), Limits{}, ErrInvalidField, "send_time"},
		{"kv NaN", rawPush(mutate(func(e *EndpointState) { e.KVCacheUsage = math.NaN() })), Limits{}, ErrInvalidField, "kv_cache_usage: NaN"},
		{"kv +Inf", rawPush(mutate(func(e *EndpointState) { e.KVCacheUsage = math.Inf(1) })), Limits{}, ErrInvalidField, "kv_cache_usage"},
		{"kv -Inf", rawPush(mutate(func(e *EndpointState) { e.KVCacheUsage = math.Inf(-1) })), Limits{}, ErrInvalidField, "kv_cache_usage"},
		{"kv negative", rawPush(mutate(func(e *EndpointState) { e.KVCacheUsage = -0.25 })), Limits{}, ErrInvalidField, "kv_cache_usage"},
		{"kv negative zero", rawPush(mutate(func(e *EndpointState) { e.KVCacheUsage = math.Copysign(0, -1) })), Limits{}, ErrInvalidField, "kv_cache_usage"},
		{"kv above 1", rawPush(mutate(func(e *EndpointState) { e.KVCacheUsage = 1.0000001 })), Limits{}, ErrInvalidField, "kv_cache_usage"},
		{"port 0", rawPush(mutate(func(e *EndpointState) { e.Port = 0 })), Limits{}, ErrInvalidField, "port"},
		{"unspecified v4", rawPush(mutate(func(e *EndpointState) { e.Address = netip.IPv4Unspecified() })), Limits{}, ErrInvalidField, "address"},
		{"unspecified v6", rawPush(mutate(func(e *EndpointState) { e.Address = netip.IPv6Unspecified() })), Limits{}, ErrInvalidField, "address"},
		{"multicast", rawPush(mutate(func(e *EndpointState) { e.Address = netip.MustParseAddr("224.0.0.1") })), Limits{}, ErrInvalidField, "address"},
		{"broadcast", rawPush(mutate(func(e *EndpointState) { e.Address = netip.MustParseAddr("255.255.255.255") })), Limits{}, ErrInvalidField, "broadcast"},
		{"v4-mapped v6", rawPush(mutate(func(e *EndpointState) { e.Address = netip.MustParseAddr("::ffff:10.0.0.1") })), Limits{}, ErrInvalidField, "IPv4-mapped"},
		{"empty name", rawPush(mutate(func(e *EndpointState) { e.Name = "" })), Limits{}, ErrInvalidField, "name: empty"},
		{"invalid utf-8", rawPush(mutate(func(e *EndpointState) { e.Namespace = "llm\xff" })), Limits{}, ErrInvalidField, "invalid UTF-8"},
		{"C1 control", rawPush(mutate(func(e *EndpointState) { e.ActiveAdapters = []string{"a\u0085b"} })), Limits{}, ErrInvalidField, "control character"},
		{"DEL", rawPush(mutate(func(e *EndpointState) { e.WaitingAdapters = []string{"a\x7f"} })), Limits{}, ErrInvalidField, "control character"},
		{"empty adapter", rawPush(mutate(func(e *EndpointState) { e.WaitingAdapters = []string{""} })), Limits{}, ErrInvalidField, "waiting_adapters[0]"},
		{"unsorted adapters", rawPush(mutate(func(e *EndpointState) { e.ActiveAdapters = []string{"b", "a"} })), Limits{}, ErrInvalidField, "not sorted"},
		{"duplicate adapters", rawPush(mutate(func(e *EndpointState) { e.ActiveAdapters = []string{"a", "a"} })), Limits{}, ErrInvalidField, "not sorted"},
		{"scrape time zero", rawPush(mutate(func(e *EndpointState) { e.ScrapeTime = time.Unix(0, 0) })), Limits{}, ErrInvalidField, "scrape_time"},
		{"unknown scrape status", rawPush(mutate(func(e *EndpointState) { e.LastError = 200 })), Limits{}, ErrInvalidField, "last_error"},
		{"unsorted endpoints", rawPush(&Push{AgentID: "a", Seq: 1, SendTime: t0, Endpoints: []EndpointState{endpoint(2), endpoint(1)}}), Limits{}, ErrInvalidField, "not sorted"},
		{"duplicate endpoints", rawPush(&Push{AgentID: "a", Seq: 1, SendTime: t0, Endpoints: []EndpointState{endpoint(1), endpoint(1)}}), Limits{}, ErrInvalidField, "endpoints[1]"},
		{"address length 5", func() []byte {
			b := rawPush(push("a", 1, 1))
			i := len(rawPush(push("a", 1, 0))) + 1 + len("llm") + 1 + len("vllm-0000")
			require.Equal(t, byte(4), b[i])
			b[i] = 5
			return b
		}(), Limits{}, ErrInvalidField, "address length 5"},
		{"varint not shortest", func() []byte {
			// agent id length 1 written as 0x81 0x00
			return append([]byte("WP\x01\x81\x00a"), rawPush(push("a", 1, 0))[5:]...)
		}(), Limits{}, ErrInvalidField, "shortest form"},
		{"varint overflow", append([]byte("WP\x01"), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f), Limits{}, ErrInvalidField, "overflows"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := DecodePush(tc.in, tc.lim)
			require.Error(t, err)
			assert.Nil(t, p)
			assert.ErrorIs(t, err, tc.kind)
			assert.Contains(t, err.Error(), tc.where)
			var we *Error
			require.True(t, errors.As(err, &we))
			assert.True(t, strings.HasPrefix(we.Where, "push"), we.Where)
		})
	}
}

func TestDecodePushEveryPrefixIsTruncated(t *testing.T) {
	b, err := EncodePush(push("node-a", 3, 4), Limits{})
	require.NoError(t, err)
	for n := 0; n < len(b); n++ {
		_, err := DecodePush(b[:n], Limits{})
		require.ErrorIs(t, err, ErrTruncated, "prefix of %d bytes", n)
	}
}

func TestEncodePushValidates(t *testing.T) {
	tests := []struct {
		name string
		p    *Push
		kind error
	}{
		{"kv NaN", mutate(func(e *EndpointState) { e.KVCacheUsage = math.NaN() }), ErrInvalidField},
		{"unsorted", &Push{AgentID: "a", Seq: 1, SendTime: t0, Endpoints: []EndpointState{endpoint(2), endpoint(1)}}, ErrInvalidField},
		{"zero send time", &Push{AgentID: "a", Seq: 1}, ErrInvalidField},
		{"invalid address", mutate(func(e *EndpointState) { e.Address = netip.Addr{} }), ErrInvalidField},
		{"zoned address", mutate(func(e *EndpointState) { e.Address = netip.MustParseAddr("fe80::1%eth0") }), ErrInvalidField},
		{"too many endpoints", push("a", 1, 4), ErrLimit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := AppendPush([]byte("keep"), tc.p, Limits{MaxEndpoints: 3})
			assert.ErrorIs(t, err, tc.kind)
			assert.Equal(t, []byte("keep"), b, "dst unchanged on error")
			assert.ErrorIs(t, tc.p.Validate(Limits{MaxEndpoints: 3}), tc.kind)
		})
	}
}

func TestScrapeStatusString(t *testing.T) {
	assert.Equal(t, "ok", ScrapeOK.String())
	assert.Equal(t, "missing_metric", ScrapeMissingMetric.String())
	assert.Equal(t, "unknown(99)", ScrapeStatus(99).String())
	e := endpoint(0)
	assert.True(t, e.Healthy())
	e.LastError = ScrapeHTTPStatus
	assert.False(t, e.Healthy())
}

func TestLimitsDefaults(t *testing.T) {
	assert.Equal(t, DefaultLimits(), Limits{}.resolved())
	l := Limits{MaxEndpoints: -1}.resolved()
	assert.Equal(t, 0, l.MaxEndpoints)
	_, err := EncodePush(push("a", 1, 1), Limits{MaxEndpoints: -1})
	assert.ErrorIs(t, err, ErrLimit)
}
