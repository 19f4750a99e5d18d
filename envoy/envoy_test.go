package envoy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/envoy/bootstrap"
	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// rulesFor lists every bootstrap in this folder with the rules it must pass:
// a new YAML file fails the test until someone decides how it is deployed.
var rulesFor = map[string]Rules{
	"envoy.yaml": {PushOnLoopback: true, WasmFile: "bin/wasm-epp.wasm"},
}

func TestEveryBootstrapInFolderPasses(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			rules, ok := rulesFor[f]
			require.True(t, ok, "add %s to rulesFor with the rules it must pass", f)
			doc, err := os.ReadFile(f)
			require.NoError(t, err)
			b, err := bootstrap.Load(doc)
			require.NoError(t, err)
			require.NoError(t, Check(b, rules))
		})
	}
}

// TestLocalBootstrapFacts states the facts the issue names, directly on the
// decoded protos, so a reader does not have to trust Check.
func TestLocalBootstrapFacts(t *testing.T) {
	doc, err := os.ReadFile("envoy.yaml")
	require.NoError(t, err)
	b, err := bootstrap.Load(doc)
	require.NoError(t, err)
	plugins, err := Plugins(b)
	require.NoError(t, err)
	require.Len(t, plugins, 2)

	byRole := map[config.Role]Plugin{}
	for _, p := range plugins {
		pc := p.Wasm.GetConfig()
		assert.True(t, pc.GetAllowOnHeadersStopIteration().GetValue(), p.Where())
		assert.Equal(t, wasmv3.FailurePolicy_FAIL_CLOSED, pc.GetFailurePolicy(), p.Where())
		byRole[p.Config.Role] = p
	}
	router, receiver := byRole[config.RoleRouter], byRole[config.RoleReceiver]
	require.NotNil(t, router.Config)
	require.NotNil(t, receiver.Config)

	// Shared data is per vm_id: both roles must be in the same VM identity.
	rvm, pvm := router.Wasm.GetConfig().GetVmConfig(), receiver.Wasm.GetConfig().GetVmConfig()
	assert.Equal(t, "wasm-epp", rvm.GetVmId())
	assert.Equal(t, rvm.GetVmId(), pvm.GetVmId())
	assert.Equal(t, "bin/wasm-epp.wasm", rvm.GetCode().GetLocal().GetFilename())
	assert.Equal(t, rvm.GetCode().GetLocal().GetFilename(), pvm.GetCode().GetLocal().GetFilename())
	assert.Equal(t, []string{"WASM_EPP_PUSH_TOKEN"}, pvm.GetEnvironmentVariables().GetHostEnvKeys())

	// The ORIGINAL_DST cluster reads exactly the header the router writes.
	var odst *clusterv3.Cluster
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetType() == clusterv3.Cluster_ORIGINAL_DST {
			odst = c
		}
	}
	require.NotNil(t, odst)
	assert.Equal(t, router.Config.DestinationHeader, odst.GetOriginalDstLbConfig().GetHttpHeaderName())
	assert.True(t, odst.GetOriginalDstLbConfig().GetUseHttpHeader())

	// The push listener is not reachable from other hosts; clients are.
	assert.Equal(t, "127.0.0.1", receiver.Listener.GetAddress().GetSocketAddress().GetAddress())
	assert.Equal(t, uint32(9002), receiver.Listener.GetAddress().GetSocketAddress().GetPortValue())
	assert.Equal(t, "0.0.0.0", router.Listener.GetAddress().GetSocketAddress().GetAddress())
	assert.Equal(t, uint32(10000), router.Listener.GetAddress().GetSocketAddress().GetPortValue())
	assert.Equal(t, "127.0.0.1", b.GetAdmin().GetAddress().GetSocketAddress().GetAddress())

	// The demo configuration the README describes.
	assert.Equal(t, "x-wasm-epp-endpoint", router.Config.ServedByHeader)
	assert.Equal(t, config.DefaultReceiverPath, receiver.Config.Receiver.Path)
	models := map[string]config.Model{}
	for _, m := range router.Config.Models {
		models[m.Name] = m
	}
	assert.Equal(t, config.CriticalityCritical, models["meta-llama/Llama-2-7b-hf"].Criticality)
	for i := range 10 {
		assert.Contains(t, models, "sql-lora-"+string(rune('0'+i)))
	}
	assert.Len(t, models["sql-assistant"].Targets, 2, "the traffic-split example")
}

// TestCheckRejects mutates the local bootstrap one fact at a time and
// requires bootstrap.Load or Check to name the problem.
func TestCheckRejects(t *testing.T) {
	doc, err := os.ReadFile("envoy.yaml")
	require.NoError(t, err)
	local := rulesFor["envoy.yaml"]

	tests := []struct {
		name, old, new string
		count          int // occurrences to replace; -1 all
		rules          *Rules
		want           string
	}{
		{name: "unknown bootstrap field", old: "node:\n", new: "nodes:\n", count: 1, want: "unknown field"},
		{name: "unknown wasm field", old: "allow_on_headers_stop_iteration: true", new: "allow_on_header_stop_iteration: true", count: 1, want: "unknown field"},
		{name: "duplicate key", old: "  cluster: wasm-epp\n", new: "  cluster: wasm-epp\n  cluster: other\n", count: 1, want: "already set"},
		{name: "proto validation", old: "connect_timeout: 2s", new: "connect_timeout: -2s", count: 1, want: "ConnectTimeout"},
		{name: "typed config validation", old: "stat_prefix: wasm_epp_push", new: "stat_prefix: \"\"", count: 1, want: "StatPrefix"},
		{name: "stop iteration off", old: "allow_on_headers_stop_iteration: true", new: "allow_on_headers_stop_iteration: false", count: 1, want: "allow_on_headers_stop_iteration must be true"},
		{name: "failure policy implicit", old: "failure_policy: FAIL_CLOSED\n", new: "\n", count: 1, want: "set failure_policy explicitly"},
		{name: "failure policy open", old: "failure_policy: FAIL_CLOSED", new: "failure_policy: FAIL_OPEN", count: 1, want: "skips the plugin"},
		{name: "header mismatch", old: "http_header_name: x-gateway-destination-endpoint", new: "http_header_name: x-other", count: 1, want: "must route on http header"},
		{name: "push on all interfaces", old: "address: 127.0.0.1, port_value: 9002", new: "address: 0.0.0.0, port_value: 9002", count: 1, want: "must bind a loopback"},
		{name: "admin exposed", old: "address: 127.0.0.1, port_value: 9901", new: "address: 0.0.0.0, port_value: 9901", count: 1, want: "admin must listen on a loopback"},
		{name: "vm ids differ", old: "vm_id: wasm-epp", new: "vm_id: wasm-epp-2", count: 1, want: "vm_id must be"},
		{name: "code differs", old: "local: {filename: bin/wasm-epp.wasm}", new: "local: {filename: bin/other.wasm}", count: 1, want: "code must be"},
		{name: "token inline", old: "host_env_keys: [WASM_EPP_PUSH_TOKEN]", new: "key_values: {WASM_EPP_PUSH_TOKEN: secret}", count: -1, want: "must come from the host environment"},
		{name: "plugin config unknown field", old: `"role": "router",`, new: `"role": "router", "colour": "red",`, count: 1, want: "unknown field \"colour\""},
		{name: "plugin config as JSON struct", old: "type.googleapis.com/google.protobuf.StringValue", new: "type.googleapis.com/google.protobuf.Value", count: 1, want: "must be a google.protobuf.StringValue"},
		{name: "no catch-all", old: "- match: {prefix: \"/\"}\n                direct_response:\n                  status: 404", new: "- match: {prefix: \"/x\"}\n                direct_response:\n                  status: 404", count: 1, want: "catch-all"},
		{name: "push forwarded", old: "- match: {prefix: \"/\"}\n                direct_response:\n                  status: 404\n                  body:\n                    inline_string: '{\"error\":{\"message\":\"not found: pushes", new: "- match: {prefix: \"/x\"}\n                route: {cluster: wasm_epp_endpoints}\n              - match: {prefix: \"/\"}\n                direct_response:\n                  status: 404\n                  body:\n                    inline_string: '{\"error\":{\"message\":\"not found: pushes", count: 1, want: "must be a direct_response, never forwarded"},
		{name: "route timeout", old: "timeout: 0s\n                  idle_timeout", new: "timeout: 15s\n                  idle_timeout", count: 1, want: "timeout: 0s"},
		{name: "buffer below body limit", old: "per_connection_buffer_limit_bytes: 2097152", new: "per_connection_buffer_limit_bytes: 1024", count: 1, want: "below maxBodyBytes"},
		{name: "wasm file rule", rules: &Rules{WasmFile: "/etc/wasm-epp/plugin.wasm"}, want: "code must be \"/etc/wasm-epp/plugin.wasm\""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mutated := string(doc)
			if tc.old != "" {
				require.Contains(t, mutated, tc.old, "the mutation no longer applies to envoy.yaml")
				mutated = strings.Replace(mutated, tc.old, tc.new, tc.count)
			}
			rules := local
			if tc.rules != nil {
				rules = *tc.rules
			}
			b, err := bootstrap.Load([]byte(mutated))
			if err == nil {
				err = Check(b, rules)
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
