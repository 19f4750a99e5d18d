package envoyhost

import (
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
)

// Load failures and runtime failures with each failure policy.

func TestMissingImportFailsToLoad(t *testing.T) {
	_, err := startHarness(t, missingImportPkg)
	require.Error(t, err)
	assert.Contains(t, err.Error(),
		"Failed to load Wasm module due to a missing import: wasi_snapshot_preview1.proc_raise")
}

func TestProxyCallFromInitIsRestricted(t *testing.T) {
	_, err := startHarness(t, testPluginPkg, withEnv("TESTPLUGIN_INIT_HOSTCALL", "1"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "restricted_callback")
	assert.Contains(t, err.Error(), "env.proxy_set_shared_data")
}

func TestPanicInInitFailsToLoad(t *testing.T) {
	_, err := startHarness(t, testPluginPkg, withEnv("TESTPLUGIN_INIT_PANIC", "1"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Failed to initialize Wasm code")
}

func TestConfigureFalseRejectsConfig(t *testing.T) {
	_, err := startHarness(t, testPluginPkg, withPluginConfig(`{"fail_configure": true}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "canary rejected the configuration")

	_, err = startHarness(t, testPluginPkg, withPluginConfig(`{"unknown_field": 1}`))
	require.Error(t, err, "the plugin rejects unknown fields")
}

func TestVMStartFalseRejectsConfig(t *testing.T) {
	_, err := startHarness(t, testPluginPkg, func(_ *Config, p *PluginConfig) {
		p.VM.Configuration = []byte("fail-vm-start")
	})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "proxy_on_vm_start returned false")
}

// A trap in a callback fails the VM: that request gets 503 with an empty
// body and details wasm_fail_stream, and the VM is never called again.
func TestPanicInCallbackFailsClosed(t *testing.T) {
	h := newHarness(t, testPluginPkg, withWorkers(1))
	resp, body := h.do("GET", "/x", "", map[string]string{"X-Tp-Panic-In": "request_headers"})
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Empty(t, body)
	assert.Empty(t, resp.Header.Get("X-Tp-Vm-Nonce"), "no response callback on a failed VM")
	require.Eventually(t, func() bool { return len(h.access.all()) == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "wasm_fail_stream", h.access.all()[0].Details)

	// Later requests: 503, and no call into the VM (no log line from on_log).
	before := len(h.logs.Find("testplugin log:"))
	for i := 0; i < 3; i++ {
		resp, body = h.do("GET", "/after", "", nil)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Empty(t, body)
	}
	assert.Len(t, h.logs.Find("testplugin log:"), before)
	assert.Empty(t, h.up.requests())
}

func TestPanicInEveryCallbackKind(t *testing.T) {
	for _, cb := range []string{"request_body", "response_headers", "response_body", "log"} {
		t.Run(cb, func(t *testing.T) {
			h := newHarness(t, testPluginPkg, withWorkers(1))
			req, err := http.NewRequest("POST", h.url+"/x", strings.NewReader("payload"))
			require.NoError(t, err)
			req.Header.Set("X-Tp-Panic-In", cb)
			req.Header.Set(DefaultOriginalDstHeader, h.up.addr())
			resp, err := httpClient.Do(req)
			switch cb {
			case "response_body":
				// The response headers were already sent: the stream is
				// reset instead of answering 503.
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				assert.Error(t, err)
			case "log":
				// on_log runs after the response: the client saw it whole.
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, http.StatusOK, resp.StatusCode)
			default:
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			}
			require.Eventually(t, func() bool {
				resp, _ := h.do("GET", "/after", "", nil)
				return resp.StatusCode == http.StatusServiceUnavailable
			}, 5*time.Second, 10*time.Millisecond, "the VM stays failed")
		})
	}
}

func TestPanicFailOpenPassesThrough(t *testing.T) {
	h := newHarness(t, testPluginPkg, withWorkers(1), withFailurePolicy(FailOpen))
	resp, body := h.do("GET", "/x", "", map[string]string{"X-Tp-Panic-In": "request_headers"})
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the failing request continues without the filter")
	assert.Equal(t, "upstream saw /x body=", body)
	resp, _ = h.do("GET", "/y", "", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("X-Tp-Vm-Nonce"), "the filter is skipped")
	assert.Len(t, h.up.requests(), 2)
}

func TestPanicFailReloadCreatesNewVM(t *testing.T) {
	h := newHarness(t, testPluginPkg, withWorkers(1), withFailurePolicy(FailReload),
		func(_ *Config, p *PluginConfig) { p.ReloadBackoff = 50 * time.Millisecond })
	resp, _ := h.do("GET", "/first", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	nonce := resp.Header.Get("X-Tp-Vm-Nonce")
	require.NotEmpty(t, nonce)

	resp, _ = h.do("GET", "/x", "", map[string]string{"X-Tp-Panic-In": "request_headers"})
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)

	// After the backoff a new VM serves (a new nonce); meanwhile 503s.
	var fresh string
	require.Eventually(t, func() bool {
		resp, _ := h.do("GET", "/again", "", nil)
		if resp.StatusCode == http.StatusOK {
			fresh = resp.Header.Get("X-Tp-Vm-Nonce")
			return true
		}
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		return false
	}, 5*time.Second, 20*time.Millisecond)
	assert.NotEqual(t, nonce, fresh)
	assert.NotEmpty(t, h.logs.Find("reloaded Wasm plugin"))
}

func TestPanicInTickFailsVM(t *testing.T) {
	h := newHarness(t, testPluginPkg, withWorkers(1),
		withPluginConfig(`{"tick_period_ms": 5, "tick_panic_after": 2}`))
	require.Eventually(t, func() bool {
		// A stream in flight when the tick traps is reset: ignore errors.
		req, _ := http.NewRequest("GET", h.url+"/x", nil)
		req.Header.Set(DefaultOriginalDstHeader, h.up.addr())
		resp, err := httpClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	}, 10*time.Second, 10*time.Millisecond, "the worker VM failed in on_tick")
}

// The legacy profile answers poll_oneoff with ENOSYS and does not allow
// it during _initialize or inside the allocator, as Envoy before the 2026
// fix: a Go module that needs it cannot work there.
func TestLegacyWASIProfileRefusesGoModules(t *testing.T) {
	code, err := os.ReadFile(wasmbuild.Build(t, testPluginPkg))
	require.NoError(t, err)
	_, err = CheckModule(code, WASILegacy)
	require.NoError(t, err, "every import of a Go module exists in the legacy set")
	h, err := startHarness(t, testPluginPkg, func(c *Config, _ *PluginConfig) { c.WASIProfile = WASILegacy })
	require.NoError(t, err, "the module starts: its init does not need poll_oneoff")
	// Go's runtime sleeps in poll_oneoff when it collects garbage; ENOSYS
	// there is fatal to the Go runtime, so the VM traps.
	resp, _ := h.do("GET", "/tp/gc", "", nil)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	failures := h.logs.Find("wasm VM failed")
	require.NotEmpty(t, failures)
	assert.Contains(t, failures[0].Attrs["err"], "runtime.netpoll")
}
