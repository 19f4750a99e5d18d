package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/internal/filter"
)

// start runs the plugin's VM and plugin start in proxytest with a
// configuration and VM environment.
func start(t *testing.T, cfgJSON string, env map[string]string) (proxytest.HostEmulator, types.OnPluginStartStatus) {
	t.Helper()
	vm := newVMContext(func(k string) string { return env[k] }, filter.Options{})
	host, reset := proxytest.NewHostEmulator(proxytest.NewEmulatorOption().
		WithVMContext(vm).WithPluginConfiguration([]byte(cfgJSON)))
	t.Cleanup(reset)
	require.Equal(t, types.OnVMStartStatusOK, host.StartVM())
	return host, host.StartPlugin()
}

// post sends a POST with a body and returns the local reply, if any.
func post(host proxytest.HostEmulator, path, body string) *proxytest.LocalHttpResponse {
	id := host.InitializeHttpContext()
	hdrs := [][2]string{{":method", "POST"}, {":path", path}, {":authority", "gw"}}
	if host.CallOnRequestHeaders(id, hdrs, false); host.GetSentLocalResponse(id) == nil {
		host.CallOnRequestBody(id, []byte(body), true)
	}
	return host.GetSentLocalResponse(id)
}

func TestPluginStart(t *testing.T) {
	t.Run("invalid configuration names the field", func(t *testing.T) {
		host, status := start(t, `{"models": [{"name": "a", "criticality": "urgent"}]}`, nil)
		assert.Equal(t, types.OnPluginStartStatusFailed, status)
		require.Len(t, host.GetCriticalLogs(), 1)
		assert.Contains(t, host.GetCriticalLogs()[0], "models[0].criticality")
	})
	t.Run("invalid scheduler section", func(t *testing.T) {
		host, status := start(t, `{"scheduler": {"profile": "fastest"}}`, nil)
		assert.Equal(t, types.OnPluginStartStatusFailed, status)
		assert.Contains(t, strings.Join(host.GetCriticalLogs(), "\n"), "scheduler.profile")
	})
	t.Run("case-mismatched field", func(t *testing.T) {
		host, status := start(t, `{"MAXBODYBYTES": 5}`, nil)
		assert.Equal(t, types.OnPluginStartStatusFailed, status)
		assert.Contains(t, strings.Join(host.GetCriticalLogs(), "\n"), `unknown field "MAXBODYBYTES"`)
	})
	t.Run("receiver without token", func(t *testing.T) {
		host, status := start(t, `{"role": "receiver"}`, nil)
		assert.Equal(t, types.OnPluginStartStatusFailed, status)
		assert.Contains(t, strings.Join(host.GetCriticalLogs(), "\n"), "WASM_EPP_PUSH_TOKEN")
	})
	t.Run("the receiver role answers pushes", func(t *testing.T) {
		host, status := start(t, `{"role": "receiver", "receiver": {"tokenEnv": "TOKEN"}}`, map[string]string{"TOKEN": "s3cret"})
		require.Equal(t, types.OnPluginStartStatusOK, status)
		reply := post(host, "/wasm-epp/v1/push", "x")
		require.NotNil(t, reply)
		assert.Equal(t, uint32(401), reply.StatusCode, "no token: the receiver answers, not the router")
	})
	t.Run("the router role routes", func(t *testing.T) {
		host, status := start(t, `{"models": [{"name": "chat"}]}`, nil)
		require.Equal(t, types.OnPluginStartStatusOK, status)
		reply := post(host, "/v1/chat/completions", `{"model": "other"}`)
		require.NotNil(t, reply)
		assert.Equal(t, uint32(404), reply.StatusCode, "the router refuses a model it does not know")
	})
}

// A stream reaching a plugin that failed to start is answered 503, never
// passed through unrouted.
func TestUnconfiguredPluginAnswers503(t *testing.T) {
	host, status := start(t, `{"role": "nobody"}`, nil)
	require.Equal(t, types.OnPluginStartStatusFailed, status)
	reply := post(host, "/v1/completions", `{"model": "m"}`)
	require.NotNil(t, reply)
	assert.Equal(t, uint32(503), reply.StatusCode)
	var body struct {
		Error struct{ Message, Type, Code string }
	}
	require.NoError(t, json.Unmarshal(reply.Data, &body))
	assert.Equal(t, "internal_error", body.Error.Code)
	assert.Equal(t, "server_error", body.Error.Type)
	assert.Contains(t, body.Error.Message, "not configured")
}
