package config

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/flowcontrol"
)

func TestDecodeDefaults(t *testing.T) {
	for _, doc := range []string{"", "  ", "{}"} {
		cfg, err := Decode([]byte(doc))
		require.NoError(t, err, "doc %q", doc)
		assert.Equal(t, RoleRouter, cfg.Role)
		assert.Equal(t, UnknownModelReject, cfg.UnknownModels)
		assert.Equal(t, DefaultMaxBodyBytes, cfg.MaxBodyBytes)
		assert.Equal(t, DefaultMaxModelNameLength, cfg.MaxModelNameLength)
		assert.Equal(t, DefaultStaleAfter, time.Duration(cfg.StaleAfter))
		assert.Equal(t, NoFreshFailOpen, cfg.WhenNoFreshEndpoint)
		assert.Equal(t, DefaultDestinationHeader, cfg.DestinationHeader)
		assert.Equal(t, DefaultSharedDataKeyPrefix, cfg.SharedDataKeyPrefix)
		assert.Equal(t, DefaultReceiverPath, cfg.Receiver.Path)
		assert.Equal(t, DefaultReceiverTokenEnv, cfg.Receiver.TokenEnv)
		assert.Empty(t, cfg.ServedByHeader)
	}
}

func TestDecodeFull(t *testing.T) {
	cfg, err := Decode([]byte(`{
	  "role": "router",
	  "models": [
	    {"name": "base", "criticality": "Critical"},
	    {"name": "sql", "targets": [{"name": "sql-v1", "weight": 80}, {"name": "sql-v2", "weight": 20}]}
	  ],
	  "unknownModels": "passthrough",
	  "scheduler": {"profile": "scoring"},
	  "maxBodyBytes": 2048,
	  "staleAfter": "500ms",
	  "whenNoFreshEndpoint": "reject",
	  "targetPort": 8000,
	  "servedByHeader": "x-wasm-epp-endpoint",
	  "receiver": {"path": "/push", "tokenEnv": "TOKEN"}
	}`))
	require.NoError(t, err)
	assert.Equal(t, UnknownModelPassthrough, cfg.UnknownModels)
	assert.Equal(t, 500*time.Millisecond, time.Duration(cfg.StaleAfter))
	assert.Equal(t, NoFreshReject, cfg.WhenNoFreshEndpoint)
	assert.Equal(t, CriticalityStandard, cfg.Models[1].Criticality, "criticality defaults to Standard")
	assert.Equal(t, []Target{{"sql-v1", 80}, {"sql-v2", 20}}, cfg.Models[1].Targets)
	assert.JSONEq(t, `{"profile": "scoring"}`, string(cfg.Scheduler))
	assert.Equal(t, 8000, cfg.TargetPort)
	assert.Equal(t, "/push", cfg.Receiver.Path)
}

func TestDecodeFlowControl(t *testing.T) {
	for _, doc := range []string{`{}`, `{"flowControl": null}`} {
		cfg, err := Decode([]byte(doc))
		require.NoError(t, err)
		assert.Nil(t, cfg.FlowControlConfig, "%s: flow control is off unless configured", doc)
	}
	cfg, err := Decode([]byte(`{"flowControl": {}}`))
	require.NoError(t, err)
	require.NotNil(t, cfg.FlowControlConfig)
	assert.Equal(t, flowcontrol.Config{}.WithDefaults(), *cfg.FlowControlConfig)
	cfg, err = Decode([]byte(`{"sharedDataKeyPrefix": "p.", "flowControl": {"maxRequests": 7, "ttl": "3s", "flowHeader": "x-tenant"}}`))
	require.NoError(t, err)
	assert.Equal(t, 7, cfg.FlowControlConfig.MaxRequests)
	assert.Equal(t, 3*time.Second, cfg.FlowControlConfig.TTL)
	assert.Equal(t, "x-tenant", cfg.FlowControlConfig.FlowHeader)
	assert.Equal(t, "p.v2.admit", cfg.AdmissionKey())
}

func TestDecodeSchedulerAndSeed(t *testing.T) {
	cfg, err := Decode([]byte(`{"scheduler": {"profile": "least-request"}, "seed": 42}`))
	require.NoError(t, err)
	assert.Equal(t, "least-request", cfg.SchedulerConfig.Profile, "the scheduler section is decoded once, by Decode")
	require.NotNil(t, cfg.Seed)
	assert.Equal(t, uint64(42), *cfg.Seed)

	cfg, err = Decode(nil)
	require.NoError(t, err)
	assert.Nil(t, cfg.Seed, "no seed unless configured")
	assert.Empty(t, cfg.SchedulerConfig.Profile, "zero scheduler config means the default profile")
	assert.Equal(t, scheduler.DefaultCountRoutedSinceSnapshot, cfg.SchedulerConfig.CountsRoutedSinceSnapshot())

	for _, on := range []bool{true, false} {
		cfg, err = Decode(fmt.Appendf(nil, `{"scheduler": {"countRoutedSinceSnapshot": %t}}`, on))
		require.NoError(t, err)
		assert.Equal(t, on, cfg.SchedulerConfig.CountsRoutedSinceSnapshot())
	}
}

func TestValidModelName(t *testing.T) {
	cases := []struct {
		name string
		in   string
		max  int
		want error
	}{
		{"plain", "llama-3.1-8b/sql-lora", 64, nil},
		{"unicode", "modèle-日本", 64, nil},
		{"empty", "", 64, ErrNameEmpty},
		{"too long", "abcde", 4, ErrNameTooLong},
		{"NUL", "a\x00", 64, ErrNameControl},
		{"newline", "a\nb", 64, ErrNameControl},
		{"DEL", "a\x7f", 64, ErrNameControl},
		{"C1", "a\u0085", 64, ErrNameControl},
		{"invalid UTF-8", "a\xffb", 64, ErrNameControl},
		{"replacement char", "a\uFFFDb", 64, ErrNameControl},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidModelName(tc.in, tc.max)
			if tc.want == nil {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, tc.want)
			assert.NotContains(t, err.Error(), "\n", "the name is quoted, never raw")
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		name, doc, want string
	}{
		{"not json", `hello`, "plugin configuration: invalid JSON"},
		{"trailing", `{} {}`, "plugin configuration: invalid JSON at byte 4: data after the JSON value"},
		{"unknown field", `{"modles": []}`, `unknown field "modles"`},
		{"wrong type", `{"maxBodyBytes": "big"}`, "plugin configuration: maxBodyBytes: expected an integer, got JSON string"},
		{"role", `{"role": "both"}`, `role: unknown role "both"`},
		{"unknown models", `{"unknownModels": "allow"}`, "unknownModels: unknown policy"},
		{"no fresh", `{"whenNoFreshEndpoint": "panic"}`, "whenNoFreshEndpoint: unknown policy"},
		{"stale", `{"staleAfter": "soon"}`, `plugin configuration: staleAfter: expected a duration such as "2s", got "soon"`},
		{"stale number", `{"staleAfter": 2}`, `plugin configuration: staleAfter: expected a duration such as "2s", got 2`},
		{"negative stale", `{"staleAfter": "-1s"}`, "staleAfter: must be positive"},
		{"refresh not a duration", `{"snapshotRefreshInterval": 20}`, `snapshotRefreshInterval: expected a duration such as "2s", got 20`},
		{"refresh negative", `{"snapshotRefreshInterval": "-20ms"}`, `snapshotRefreshInterval: -20ms is outside [1ms, 1s] ("0s": every request re-reads the snapshot)`},
		{"refresh too short", `{"snapshotRefreshInterval": "500us"}`, `snapshotRefreshInterval: 500µs is outside [1ms, 1s]`},
		{"refresh too long", `{"snapshotRefreshInterval": "2s", "staleAfter": "10s"}`, `snapshotRefreshInterval: 2s is outside [1ms, 1s]`},
		{"refresh not whole ms", `{"snapshotRefreshInterval": "1500us"}`, "snapshotRefreshInterval: 1.5ms is not a whole number of milliseconds"},
		{"refresh over staleAfter", `{"snapshotRefreshInterval": "200ms", "staleAfter": "500ms"}`, "snapshotRefreshInterval: 200ms is more than a quarter of staleAfter (500ms)"},
		{"body limit", `{"maxBodyBytes": -1}`, "maxBodyBytes: must be in"},
		{"port", `{"targetPort": 70000}`, "targetPort: must be in"},
		{"header", `{"destinationHeader": "X-Dest"}`, "destinationHeader: \"X-Dest\" is not a lower-case"},
		{"pseudo header", `{"servedByHeader": ":path"}`, "servedByHeader"},
		{"empty model", `{"models": [{"name": ""}]}`, "models[0].name: must not be empty"},
		{"control char", `{"models": [{"name": "a\u0001b"}]}`, "models[0].name: \"a\\x01b\" contains a control character"},
		{"long name", `{"maxModelNameLength": 3, "models": [{"name": "abcd"}]}`, "models[0].name: longer than"},
		{"dup model", `{"models": [{"name": "a"}, {"name": "a"}]}`, `models[1].name: "a" is already defined at models[0]`},
		{"criticality", `{"models": [{"name": "a", "criticality": "urgent"}]}`, "models[0].criticality: unknown criticality"},
		{"weight", `{"models": [{"name": "a", "targets": [{"name": "b", "weight": -1}]}]}`, "models[0].targets[0].weight"},
		{"zero weights", `{"models": [{"name": "a", "targets": [{"name": "b", "weight": 0}]}]}`, "models[0].targets: weights add up to 0"},
		{"dup target", `{"models": [{"name": "a", "targets": [{"name": "b", "weight": 1}, {"name": "b", "weight": 1}]}]}`, "targets[1].name: target \"b\" listed twice"},
		{"receiver path", `{"receiver": {"path": "push"}}`, "receiver.path: must start with /"},
		{"C1 control char", `{"models": [{"name": "a\u0085b"}]}`, "models[0].name: \"a\\u0085b\" contains a control character"},
		{"replacement char", `{"models": [{"name": "a\ud800b"}]}`, "contains a control character or invalid UTF-8"},
		{"scheduler field", `{"scheduler": {"profle": "x"}}`, `scheduler: unknown field "profle"`},
		{"scheduler profile", `{"scheduler": {"profile": "nope"}}`, "scheduler.profile"},
		{"scheduler plugin type", `{"scheduler": {"plugins": [{"type": "no-such-plugin"}]}}`, "scheduler.plugins[0]"},
		{"count routed type", `{"scheduler": {"countRoutedSinceSnapshot": "yes"}}`, "scheduler.countRoutedSinceSnapshot: expected a boolean"},
		{"count routed at top level", `{"countRoutedSinceSnapshot": true}`, `unknown field "countRoutedSinceSnapshot"`},
		{"seed", `{"seed": -1}`, "plugin configuration: seed: expected a non-negative integer, got JSON number -1"},
		{"flow field", `{"flowControl": {"maxRequest": 5}}`, `flowControl: unknown field "maxRequest"`},
		{"flow bound", `{"flowControl": {"maxRequests": 0.5}}`, "flowControl.maxRequests"},
		{"flow ttl", `{"flowControl": {"ttl": "2h"}}`, "flowControl.ttl: must be in (0, 1h0m0s]"},
		{"flow header", `{"flowControl": {"flowHeader": "X-Tenant"}}`, "flowControl.flowHeader"},
		{"flow header is destination", `{"flowControl": {"flowHeader": "x-gateway-destination-endpoint"}}`, "flowControl.flowHeader: \"x-gateway-destination-endpoint\" is the destination header"},
		{"flow not object", `{"flowControl": true}`, "flowControl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.doc))
			require.Error(t, err)
			var cfgErr *Error
			require.True(t, errors.As(err, &cfgErr), "error type %T", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// The configuration is read as strictly as the scheduler section: names
// match exactly, no key is given twice, and the message names the path.
func TestDecodeStrictNames(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"MAXBODYBYTES": 5}`, `plugin configuration: unknown field "MAXBODYBYTES" (names are case-sensitive: did you mean "maxBodyBytes"?)`},
		{`{"role": "router", "role": "receiver"}`, `plugin configuration: duplicate key "role"`},
		{`{"receiver": {"Path": "/p"}}`, `plugin configuration: receiver: unknown field "Path" (names are case-sensitive: did you mean "path"?)`},
		{`{"models": [{"name": "a"}, {"name": "b", "targets": [{"name": "c", "weight": 1, "weight": 2}]}]}`,
			`plugin configuration: models[1].targets[0]: duplicate key "weight"`},
		{`{"models": [{"name": "a", "critcality": "Critical"}]}`, `plugin configuration: models[0]: unknown field "critcality"`},
		{`{"scheduler": {"profile": "scoring", "profile": "random"}}`, `plugin configuration: scheduler: duplicate key "profile"`},
		{`{"scheduler": {"plugins": [{"type": "low-queue-filter", "parameters": {"Threshold": 1}}]}}`,
			`plugin configuration: scheduler.plugins[0].parameters: unknown field "Threshold" (names are case-sensitive: did you mean "threshold"?)`},
		{`{"SchedulerConfig": {}}`, `plugin configuration: unknown field "SchedulerConfig"`},
	} {
		_, err := Decode([]byte(tc.doc))
		var cfgErr *Error
		require.ErrorAs(t, err, &cfgErr, tc.doc)
		assert.Equal(t, tc.want, err.Error(), tc.doc)
	}
}

func TestSnapshotRefreshInterval(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want time.Duration
	}{
		{`{}`, DefaultSnapshotRefresh},
		{`{"snapshotRefreshInterval": "0s"}`, 0},
		{`{"snapshotRefreshInterval": "5ms"}`, 5 * time.Millisecond},
		{`{"snapshotRefreshInterval": "500ms"}`, 500 * time.Millisecond},
		{`{"staleAfter": "60ms"}`, 15 * time.Millisecond},
		{`{"staleAfter": "6ms"}`, time.Millisecond},
		{`{"staleAfter": "3ms"}`, 0},
	} {
		c, err := Decode([]byte(tc.doc))
		require.NoError(t, err, tc.doc)
		assert.Equal(t, tc.want, c.SnapshotRefresh(), tc.doc)
	}
}
