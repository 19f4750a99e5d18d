package wire

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestErrorMessage(t *testing.T) {
	_, err := DecodePush(rawPush(mutate(func(e *EndpointState) { e.KVCacheUsage = 1.5 })), Limits{})
	require.Error(t, err)
	msg := err.Error()
	assert.True(t, strings.HasPrefix(msg, `wire: push.endpoints[1].kv_cache_usage: 1.5 outside 0..1 (invalid field at byte `), msg)
}

func TestNames(t *testing.T) {
	k := NewKeys(DefaultKeyPrefix)
	assert.Equal(t, "wasm-epp.v2.dir", k.Dir)
	assert.Equal(t, "wasm-epp.v2.seg.00", k.Segments[0])
	assert.Equal(t, "wasm-epp.v2.seg.63", k.Segments[NumSegments-1])
	assert.Equal(t, "/wasm-epp/v1/push", PushPath)
}
