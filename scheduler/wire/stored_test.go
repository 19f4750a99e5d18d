package wire

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// renamed returns n endpoints of agent-specific names, so agents do not overlap.
func renamed(prefix string, n int) []EndpointState {
	eps := endpoints(n)
	for i := range eps {
		eps[i].Name = prefix + "-" + eps[i].Name
	}
	return eps
}

func TestMergeKeepsOtherAgentsAndReplacesOwn(t *testing.T) {
	s, err := Merge(nil, &Push{AgentID: "node-b", Seq: 10, SendTime: t0, Endpoints: renamed("b", 2)}, at(0), Limits{})
	require.NoError(t, err)
	s, err = Merge(s, &Push{AgentID: "node-a", Seq: 5, SendTime: t0, Endpoints: renamed("a", 3)}, at(time.Second), Limits{})
	require.NoError(t, err)
	require.Len(t, s.Agents, 2)
	assert.Equal(t, "node-a", s.Agents[0].AgentID, "agents sorted")
	assert.Equal(t, 5, s.TotalEndpoints())

	// node-b reports one endpoint fewer: replaced, not merged.
	before := s
	s, err = Merge(s, &Push{AgentID: "node-b", Seq: 11, SendTime: t0, Endpoints: renamed("b", 1)}, at(2*time.Second), Limits{})
	require.NoError(t, err)
	assert.Equal(t, 4, s.TotalEndpoints())
	assert.Equal(t, uint64(11), s.Agents[1].LastSeq)
	assert.Equal(t, at(2*time.Second), s.Agents[1].Received)
	// Scrape times are on the receiver's clock: ages counted back from
	// node-a's receipt one second after it sent.
	want := renamed("a", 3)
	for i := range want {
		want[i].ScrapeTime = want[i].ScrapeTime.Add(time.Second)
	}
	assert.Equal(t, want, s.Agents[0].Endpoints, "other agent untouched")
	assert.Len(t, before.Agents[1].Endpoints, 2, "input not modified")
}

func TestMergeJudgesTimesOnTheReceiversClock(t *testing.T) {
	p := push("node-a", 1, 3)
	p.SendTime = at(1500 * time.Millisecond)
	_, err := Merge(nil, p, at(0), Limits{})
	require.ErrorIs(t, err, ErrClockSkew)
	assert.Contains(t, err.Error(), "1.5s ahead of the receiver's clock (limit 1s)")
	_, err = Merge(nil, p, at(0), Limits{MaxClockSkew: 2 * time.Second})
	require.NoError(t, err)

	p = push("node-a", 2, 2)
	p.Endpoints[0].ScrapeTime = at(time.Hour)   // after the send: counts as the receipt
	p.Endpoints[1].ScrapeTime = time.Unix(0, 1) // very old
	p.SendTime = at(-10 * time.Second)          // the agent's clock is behind
	s, err := Merge(nil, p, at(0), Limits{})
	require.NoError(t, err)
	assert.True(t, at(0).Equal(s.Agents[0].Endpoints[0].ScrapeTime))
	assert.True(t, time.Unix(10, 1).Equal(s.Agents[0].Endpoints[1].ScrapeTime))

	// Ahead within the skew, with an age longer than the receiver's epoch
	// time: kept at the oldest time the format carries.
	p = push("node-a", 3, 1)
	p.SendTime = time.Unix(0, 2).Add(500 * time.Millisecond)
	p.Endpoints[0].ScrapeTime = time.Unix(0, 1)
	s, err = Merge(nil, p, time.Unix(0, 2), Limits{})
	require.NoError(t, err)
	assert.True(t, time.Unix(0, 1).Equal(s.Agents[0].Endpoints[0].ScrapeTime))
	_, err = EncodeStored(s, Limits{})
	require.NoError(t, err, "what Merge returns can be stored")
}

func TestMergeRejectsStaleSequence(t *testing.T) {
	s, err := Merge(nil, push("node-a", 10, 1), at(0), Limits{})
	require.NoError(t, err)
	for _, seq := range []uint64{10, 9, 1} {
		_, err := Merge(s, push("node-a", seq, 2), at(time.Second), Limits{})
		assert.ErrorIs(t, err, ErrStaleSequence, "seq %d", seq)
		assert.Contains(t, err.Error(), "last accepted 10")
	}
	_, err = Merge(s, push("node-a", 11, 2), at(time.Second), Limits{})
	assert.NoError(t, err)
}

func TestMergeDropsExpiredAgents(t *testing.T) {
	lim := Limits{AgentTTL: time.Minute}
	s, err := Merge(nil, &Push{AgentID: "old", Seq: 100, SendTime: t0, Endpoints: renamed("o", 1)}, at(0), lim)
	require.NoError(t, err)
	s, err = Merge(s, push("new", 1, 1), at(30*time.Second), lim)
	require.NoError(t, err)
	require.Len(t, s.Agents, 2)

	s, err = Merge(s, push("new", 2, 1), at(61*time.Second), lim)
	require.NoError(t, err)
	require.Len(t, s.Agents, 1, "old agent expired")
	assert.Equal(t, "new", s.Agents[0].AgentID)

	// An expired agent that comes back is accepted whatever its sequence.
	s2, err := Merge(&Stored{Agents: []AgentState{{AgentID: "old", LastSeq: 100, Received: at(0), Endpoints: renamed("o", 1)}}},
		push("old", 3, 1), at(2*time.Minute), lim)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), s2.Agents[0].LastSeq)
}

func TestMergeLimits(t *testing.T) {
	s, err := Merge(nil, push("a", 1, 3), at(0), Limits{})
	require.NoError(t, err)
	_, err = Merge(s, push("b", 1, 1), at(0), Limits{MaxAgents: 1})
	assert.ErrorIs(t, err, ErrLimit)
	assert.Contains(t, err.Error(), "limit 1")
	_, err = Merge(s, &Push{AgentID: "b", Seq: 1, SendTime: t0, Endpoints: renamed("b", 2)}, at(0), Limits{MaxTotalEndpoints: 4})
	assert.ErrorIs(t, err, ErrLimit)
	assert.Contains(t, err.Error(), "5 endpoints in total")
	// The agent's own endpoints are replaced, not added, before counting.
	_, err = Merge(s, push("a", 2, 4), at(0), Limits{MaxTotalEndpoints: 4})
	assert.NoError(t, err)
	_, err = Merge(s, mutate(func(e *EndpointState) { e.Port = 0 }), at(0), Limits{})
	assert.ErrorIs(t, err, ErrInvalidField)
	_, err = Merge(s, push("c", 1, 1), time.Time{}, Limits{})
	assert.ErrorIs(t, err, ErrInvalidField)
}

func TestStoredRoundTrip(t *testing.T) {
	s := &Stored{Agents: []AgentState{
		{AgentID: "node-a", LastSeq: 1, Received: at(0), Endpoints: renamed("a", 5)},
		{AgentID: "node-b", LastSeq: 1 << 63, Received: at(time.Second)},
		{AgentID: "node-c", LastSeq: 7, Received: at(2 * time.Second), Endpoints: renamed("c", 64)},
	}}
	b, err := EncodeStored(s, Limits{})
	require.NoError(t, err)
	got, err := DecodeStored(b, Limits{})
	require.NoError(t, err)
	assert.Equal(t, s, got)
	again, err := EncodeStored(got, Limits{})
	require.NoError(t, err)
	assert.Equal(t, b, again)

	empty, err := EncodeStored(&Stored{}, Limits{})
	require.NoError(t, err)
	got, err = DecodeStored(empty, Limits{})
	require.NoError(t, err)
	assert.Equal(t, &Stored{}, got)
}

func TestDecodeStoredRejects(t *testing.T) {
	two := &Stored{Agents: []AgentState{
		{AgentID: "a", LastSeq: 1, Received: t0, Endpoints: renamed("a", 2)},
		{AgentID: "b", LastSeq: 1, Received: t0, Endpoints: renamed("b", 1)},
	}}
	valid := rawStored(two, 3)
	tests := []struct {
		name  string
		in    []byte
		lim   Limits
		kind  error
		where string
	}{
		{"push given as stored", rawPush(push("a", 1, 1)), Limits{}, ErrFormat, "magic"},
		{"unknown version", append([]byte("WS\x09"), valid[3:]...), Limits{}, ErrVersion, "version 9"},
		{"trailing", append(append([]byte{}, valid...), 1, 2), Limits{}, ErrTrailing, "2 bytes"},
		{"total too small", rawStored(two, 2), Limits{}, ErrInvalidField, "more endpoints than endpoints_total"},
		{"total too large", rawStored(two, 4), Limits{}, ErrInvalidField, "announces 4 endpoints, agents hold 3"},
		{"too many agents", valid, Limits{MaxAgents: 1}, ErrLimit, "stored.agents"},
		{"too many endpoints in total", valid, Limits{MaxTotalEndpoints: 2}, ErrLimit, "endpoints_total"},
		{"too many endpoints for one agent", valid, Limits{MaxEndpoints: 1}, ErrLimit, "stored.agents[0].endpoints"},
		{"over size", valid, Limits{MaxStoredBytes: 10}, ErrLimit, "limit 10"},
		{"unsorted agents", rawStored(&Stored{Agents: []AgentState{two.Agents[1], two.Agents[0]}}, 3), Limits{}, ErrInvalidField, "agents not sorted"},
		{"duplicate agents", rawStored(&Stored{Agents: []AgentState{two.Agents[0], two.Agents[0]}}, 4), Limits{}, ErrInvalidField, "agents not sorted"},
		{"seq zero", rawStored(&Stored{Agents: []AgentState{{AgentID: "a", LastSeq: 0, Received: t0}}}, 0), Limits{}, ErrInvalidField, "last_seq"},
		{"received zero", rawStored(&Stored{Agents: []AgentState{{AgentID: "a", LastSeq: 1, Received: time.Unix(0, 0)}}}, 0), Limits{}, ErrInvalidField, "received"},
		{"empty agent id", rawStored(&Stored{Agents: []AgentState{{AgentID: "", LastSeq: 1, Received: t0}}}, 0), Limits{}, ErrInvalidField, "agent_id"},
		{"bad endpoint", rawStored(&Stored{Agents: []AgentState{{AgentID: "a", LastSeq: 1, Received: t0,
			Endpoints: []EndpointState{func() EndpointState { e := endpoint(1); e.KVCacheUsage = 2; return e }()}}}}, 1),
			Limits{}, ErrInvalidField, "stored.agents[0].endpoints[0].kv_cache_usage"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := DecodeStored(tc.in, tc.lim)
			assert.Nil(t, s)
			assert.ErrorIs(t, err, tc.kind)
			if err != nil {
				assert.Contains(t, err.Error(), tc.where)
			}
			snap, err := DecodeSnapshot(tc.in, tc.lim, SnapshotOptions{})
			assert.Nil(t, snap)
			assert.ErrorIs(t, err, tc.kind, "DecodeSnapshot rejects the same input")
		})
	}
	b, err := EncodeStored(two, Limits{})
	require.NoError(t, err)
	for n := 0; n < len(b); n++ {
		_, err := DecodeStored(b[:n], Limits{})
		require.ErrorIs(t, err, ErrTruncated, "prefix of %d bytes", n)
	}
}

func TestEncodeStoredValidates(t *testing.T) {
	_, err := EncodeStored(&Stored{Agents: []AgentState{{AgentID: "b", LastSeq: 1, Received: t0}, {AgentID: "a", LastSeq: 1, Received: t0}}}, Limits{})
	assert.ErrorIs(t, err, ErrInvalidField)
	_, err = EncodeStored(&Stored{Agents: []AgentState{{AgentID: "a", LastSeq: 1, Received: t0, Endpoints: endpoints(3)}}}, Limits{MaxTotalEndpoints: 2})
	assert.ErrorIs(t, err, ErrLimit)
	_, err = EncodeStored(&Stored{Agents: []AgentState{{AgentID: "a", LastSeq: 1, Received: t0, Endpoints: endpoints(3)}}}, Limits{MaxStoredBytes: 20})
	assert.ErrorIs(t, err, ErrLimit)
}

func TestMergeBytes(t *testing.T) {
	p1, err := EncodePush(&Push{AgentID: "node-a", Seq: 1, SendTime: t0, Endpoints: renamed("a", 2)}, Limits{})
	require.NoError(t, err)
	p2, err := EncodePush(&Push{AgentID: "node-b", Seq: 1, SendTime: t0, Endpoints: renamed("b", 1)}, Limits{})
	require.NoError(t, err)

	s1, err := MergeBytes(nil, p1, at(0), Limits{})
	require.NoError(t, err)
	s2, err := MergeBytes(s1, p2, at(time.Second), Limits{})
	require.NoError(t, err)
	got, err := DecodeStored(s2, Limits{})
	require.NoError(t, err)
	require.Len(t, got.Agents, 2)
	assert.Equal(t, 3, got.TotalEndpoints())

	// Same pushes, same stored bytes: every Envoy replica agrees.
	s1b, _ := MergeBytes(nil, p1, at(0), Limits{})
	s2b, _ := MergeBytes(s1b, p2, at(time.Second), Limits{})
	assert.Equal(t, s2, s2b)

	_, err = MergeBytes(s2, p1, at(2*time.Second), Limits{})
	assert.ErrorIs(t, err, ErrStaleSequence, "replayed push")

	_, err = MergeBytes(s2, []byte("WP\x07"), at(0), Limits{})
	assert.ErrorIs(t, err, ErrVersion)
	assert.NotErrorIs(t, err, ErrStoredCorrupt)

	_, err = MergeBytes([]byte("garbage"), p1, at(0), Limits{})
	assert.ErrorIs(t, err, ErrStoredCorrupt)
	assert.ErrorIs(t, err, ErrFormat)

	_, err = MergeBytes(s2, rawPush(&Push{AgentID: "node-c", Seq: 1, SendTime: t0, Endpoints: renamed("c", 1)}), at(0), Limits{MaxAgents: 2})
	assert.ErrorIs(t, err, ErrLimit)
}

func TestSnapshotConversion(t *testing.T) {
	unhealthy := endpoint(4) // i%9==4: ScrapeTimeout
	require.False(t, unhealthy.Healthy())
	v6 := endpoint(3) // i%11==3: IPv6
	s := &Stored{Agents: []AgentState{
		{AgentID: "node-a", LastSeq: 1, Received: at(time.Second), Endpoints: []EndpointState{endpoint(0), v6, unhealthy}},
		{AgentID: "node-b", LastSeq: 1, Received: at(2 * time.Second), Endpoints: renamed("b", 1)},
	}}
	Normalize(s.Agents[0].Endpoints)
	b, err := EncodeStored(s, Limits{})
	require.NoError(t, err)

	snap, err := DecodeSnapshot(b, Limits{}, SnapshotOptions{})
	require.NoError(t, err)
	assert.Equal(t, s.Snapshot(SnapshotOptions{}), snap, "DecodeSnapshot == DecodeStored + Snapshot")
	assert.Equal(t, at(2*time.Second), snap.Time)
	require.Len(t, snap.Endpoints, 4)
	e0 := endpoint(0)
	assert.Equal(t, scheduler.Endpoint{
		ID:      scheduler.EndpointID{Namespace: "llm", Name: "b-vllm-0000"},
		Address: "10.0.0.0", Port: 8000,
		Metrics: scheduler.Metrics{
			WaitingQueueSize: 0, RunningQueueSize: 0, KVCacheUsage: 0,
			ActiveModels: e0.ActiveAdapters, WaitingModels: e0.WaitingAdapters, MaxActiveModels: 4,
			UpdateTime: e0.ScrapeTime,
		},
	}, snap.Endpoints[0])
	assert.Equal(t, "vllm-0003", snap.Endpoints[2].ID.Name)
	assert.Equal(t, "fd00::4", snap.Endpoints[2].Address)
	assert.Equal(t, 3, snap.Endpoints[2].Metrics.WaitingQueueSize)
	assert.Equal(t, 0.03, snap.Endpoints[2].Metrics.KVCacheUsage)
	assert.Equal(t, "vllm-0004", snap.Endpoints[3].ID.Name, "unhealthy kept by default with last values")
	assert.Equal(t, unhealthy.ScrapeTime, snap.Endpoints[3].Metrics.UpdateTime)

	healthy, err := DecodeSnapshot(b, Limits{}, SnapshotOptions{ExcludeUnhealthy: true})
	require.NoError(t, err)
	require.Len(t, healthy.Endpoints, 3)
	for _, e := range healthy.Endpoints {
		assert.NotEqual(t, "vllm-0004", e.ID.Name)
	}
}

func TestSnapshotDuplicateAcrossAgentsKeepsNewest(t *testing.T) {
	older, newer := endpoint(1), endpoint(1)
	older.ScrapeTime, older.Waiting = at(-time.Second), 9
	newer.ScrapeTime, newer.Waiting = at(0), 2
	newer.Address = netip.MustParseAddr("10.9.9.9")
	other := endpoint(2)
	s := &Stored{Agents: []AgentState{
		{AgentID: "a", LastSeq: 1, Received: t0, Endpoints: []EndpointState{newer, other}},
		{AgentID: "b", LastSeq: 1, Received: t0, Endpoints: []EndpointState{older}},
	}}
	b, err := EncodeStored(s, Limits{})
	require.NoError(t, err)
	snap, err := DecodeSnapshot(b, Limits{}, SnapshotOptions{})
	require.NoError(t, err)
	require.Len(t, snap.Endpoints, 2)
	assert.Equal(t, "10.9.9.9", snap.Endpoints[0].Address)
	assert.Equal(t, 2, snap.Endpoints[0].Metrics.WaitingQueueSize)
	assert.Equal(t, "vllm-0002", snap.Endpoints[1].ID.Name)
}

func TestSnapshotOfNothing(t *testing.T) {
	b, err := EncodeStored(&Stored{}, Limits{})
	require.NoError(t, err)
	snap, err := DecodeSnapshot(b, Limits{}, SnapshotOptions{})
	require.NoError(t, err)
	assert.Empty(t, snap.Endpoints)
	assert.True(t, snap.Time.IsZero())
	_, err = DecodeSnapshot(nil, Limits{}, SnapshotOptions{})
	assert.ErrorIs(t, err, ErrTruncated, "nothing stored is for the caller to handle")
}

func TestErrorMessage(t *testing.T) {
	_, err := DecodePush(rawPush(mutate(func(e *EndpointState) { e.KVCacheUsage = 1.5 })), Limits{})
	require.Error(t, err)
	msg := err.Error()
	assert.True(t, strings.HasPrefix(msg, `wire: push.endpoints[1].kv_cache_usage: 1.5 outside 0..1 (invalid field at byte `), msg)
}

func TestNames(t *testing.T) {
	assert.Equal(t, "wasm-epp.snapshot.v1", SnapshotKey(DefaultKeyPrefix))
	assert.Equal(t, "/wasm-epp/v1/push", PushPath)
}
