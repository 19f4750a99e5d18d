package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/internal/strictjson"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
)

// Shared data keys the plugin writes on its own.
const (
	ticksKey    = "testplugin/ticks"
	tickCallKey = "testplugin/tick-call"
	initKey     = "testplugin/init"
)

// casRetries bounds every CAS loop.
const casRetries = 100

func init() {
	// Both branches exist to test the host: a restricted host call and a trap
	// during _initialize. Reading the environment is allowed there.
	if os.Getenv("TESTPLUGIN_INIT_PANIC") == "1" {
		panic("testplugin: TESTPLUGIN_INIT_PANIC=1")
	}
	if os.Getenv("TESTPLUGIN_INIT_HOSTCALL") == "1" {
		_ = proxywasm.SetSharedData(initKey, []byte("1"), 0)
	}
	proxywasm.SetVMContext(&vmContext{})
}

// vmContext holds what this VM learned at start and counts its requests.
type vmContext struct {
	vmConfiguration        string
	vmStartPluginConfigErr string
	nonce                  string
	requests               uint64
}

func (v *vmContext) OnVMStart(int) types.OnVMStartStatus {
	cfg, err := proxywasm.GetVMConfiguration()
	if err != nil {
		proxywasm.LogErrorf("testplugin: vm configuration: %v", err)
	}
	v.vmConfiguration = string(cfg)
	switch v.vmConfiguration {
	case "fail-vm-start":
		return types.OnVMStartStatusFailed
	case "panic-vm-start":
		panic("testplugin: panic-vm-start")
	}
	_, err = proxywasm.GetPluginConfiguration()
	v.vmStartPluginConfigErr = errName(err)
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		proxywasm.LogErrorf("testplugin: random nonce: %v", err)
		return types.OnVMStartStatusFailed
	}
	v.nonce = hex.EncodeToString(nonce[:])
	return types.OnVMStartStatusOK
}

func (v *vmContext) NewPluginContext(contextID uint32) types.PluginContext {
	return &pluginContext{vm: v, id: contextID}
}

// pluginConfig is the plugin configuration (see the package doc).
type pluginConfig struct {
	FailConfigure       bool   `json:"fail_configure"`
	PanicInConfigure    bool   `json:"panic_in_configure"`
	TickPeriodMs        uint32 `json:"tick_period_ms"`
	TickStopAfter       int    `json:"tick_stop_after"`
	TickPanicAfter      int    `json:"tick_panic_after"`
	TickHTTPCallCluster string `json:"tick_http_call_cluster"`
	TickHTTPCallPath    string `json:"tick_http_call_path"`
	DelayDone           bool   `json:"delay_done"`
}

func decodeConfig(raw []byte) (pluginConfig, error) {
	var cfg pluginConfig
	if len(bytes.TrimSpace(raw)) == 0 {
		return cfg, nil
	}
	err := strictjson.Decode(raw, &cfg)
	return cfg, err
}

type metrics struct {
	requests     proxywasm.MetricCounter
	active       proxywasm.MetricGauge
	requestBytes proxywasm.MetricHistogram
	ticks        proxywasm.MetricCounter
}

// pluginContext is one root context: configuration, metrics and the timer.
type pluginContext struct {
	types.DefaultPluginContext
	vm        *vmContext
	id        uint32
	config    pluginConfig
	rawConfig string
	metrics   metrics
	ticks     int
	// donePending is set when OnPluginDone answered false; the next tick
	// calls PluginDone.
	donePending bool
}

func (p *pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	raw, err := proxywasm.GetPluginConfiguration()
	if err != nil {
		proxywasm.LogErrorf("testplugin: plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	p.rawConfig = string(raw)
	if p.config, err = decodeConfig(raw); err != nil {
		proxywasm.LogErrorf("testplugin: plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	if p.config.PanicInConfigure {
		panic("testplugin: panic_in_configure")
	}
	if p.config.FailConfigure {
		return types.OnPluginStartStatusFailed
	}
	p.metrics = metrics{
		requests:     proxywasm.DefineCounterMetric("testplugin_requests_total"),
		active:       proxywasm.DefineGaugeMetric("testplugin_active_streams"),
		requestBytes: proxywasm.DefineHistogramMetric("testplugin_request_body_bytes"),
		ticks:        proxywasm.DefineCounterMetric("testplugin_ticks_total"),
	}
	if p.config.TickPeriodMs > 0 {
		if err := proxywasm.SetTickPeriodMilliSeconds(p.config.TickPeriodMs); err != nil {
			proxywasm.LogErrorf("testplugin: tick period: %v", err)
			return types.OnPluginStartStatusFailed
		}
	}
	return types.OnPluginStartStatusOK
}

// OnPluginDone answers true, or with delay_done false, finishing on the next
// tick with PluginDone (proxy_done).
func (p *pluginContext) OnPluginDone() bool {
	if !p.config.DelayDone {
		return true
	}
	p.donePending = true
	if err := proxywasm.SetTickPeriodMilliSeconds(1); err != nil {
		proxywasm.LogErrorf("testplugin: delay_done tick: %v", err)
		return true
	}
	return false
}

func (p *pluginContext) OnTick() {
	if p.donePending {
		p.donePending = false
		proxywasm.LogInfo("testplugin: plugin done")
		proxywasm.PluginDone()
		return
	}
	p.ticks++
	if p.config.TickPanicAfter > 0 && p.ticks >= p.config.TickPanicAfter {
		panic("testplugin: tick_panic_after")
	}
	p.metrics.ticks.Increment(1)
	if _, err := incrementShared(ticksKey); err != nil {
		proxywasm.LogErrorf("testplugin: tick counter: %v", err)
	}
	if c := p.config.TickHTTPCallCluster; c != "" {
		p.tickHTTPCall(c)
	}
	if p.config.TickStopAfter > 0 && p.ticks >= p.config.TickStopAfter {
		if err := proxywasm.SetTickPeriodMilliSeconds(0); err != nil {
			proxywasm.LogErrorf("testplugin: stop tick: %v", err)
		}
	}
}

// tickHTTPCall dispatches from the root context and stores the outcome in
// shared data.
func (p *pluginContext) tickHTTPCall(cluster string) {
	path := p.config.TickHTTPCallPath
	if path == "" {
		path = "/"
	}
	headers := [][2]string{{":method", "GET"}, {":path", path}, {":authority", cluster}}
	_, err := proxywasm.DispatchHttpCall(cluster, headers, nil, nil, 5000, func(numHeaders, bodySize, _ int) {
		result := "failed"
		if numHeaders > 0 {
			status := headerValue(orZero(proxywasm.GetHttpCallResponseHeaders()), ":status")
			body, _ := proxywasm.GetHttpCallResponseBody(0, bodySize)
			result = status + " " + string(body)
		}
		if err := proxywasm.SetSharedData(tickCallKey, []byte(result), 0); err != nil {
			proxywasm.LogErrorf("testplugin: tick call result: %v", err)
		}
	})
	if err := proxywasm.SetSharedData(tickCallKey+"/dispatch", []byte(errName(err)), 0); err != nil {
		proxywasm.LogErrorf("testplugin: tick call dispatch: %v", err)
	}
}

func (p *pluginContext) NewHttpContext(contextID uint32) types.HttpContext {
	p.metrics.active.Add(1)
	return &httpContext{plugin: p, id: contextID, bodyLen: -1}
}

// incrementShared adds one to the decimal counter under key with a CAS loop
// (a missing key counts as 0) and returns the new value.
func incrementShared(key string) (uint64, error) {
	for range casRetries {
		value, cas, err := proxywasm.GetSharedData(key)
		var n uint64
		switch {
		case errors.Is(err, types.ErrorStatusNotFound):
			cas = 0
		case err != nil:
			return 0, err
		default:
			if n, err = strconv.ParseUint(string(value), 10, 64); err != nil {
				return 0, fmt.Errorf("value %q under %s: %w", value, key, err)
			}
		}
		n++
		err = proxywasm.SetSharedData(key, []byte(strconv.FormatUint(n, 10)), cas)
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, types.ErrorStatusCasMismatch) {
			return 0, err
		}
	}
	return 0, errCasRetries
}

var errCasRetries = errors.New("cas_retries")

// errName is the short name of a host error used in x-tp-* headers.
func errName(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, types.ErrorStatusNotFound):
		return "not_found"
	case errors.Is(err, types.ErrorStatusBadArgument):
		return "bad_argument"
	case errors.Is(err, types.ErrorStatusEmpty):
		return "empty"
	case errors.Is(err, types.ErrorStatusCasMismatch):
		return "cas_mismatch"
	case errors.Is(err, types.ErrorInternalFailure):
		return "internal_failure"
	case errors.Is(err, types.ErrorUnimplemented):
		return "unimplemented"
	case errors.Is(err, errCasRetries):
		return "cas_retries"
	}
	return err.Error()
}

// headerValue returns the first value of key in pairs, or "".
func headerValue(pairs [][2]string, key string) string {
	for _, p := range pairs {
		if p[0] == key {
			return p[1]
		}
	}
	return ""
}

// orZero drops the error of a read whose failure shows up as missing data.
func orZero[T any](v T, _ error) T { return v }

// splitKV splits "k=v".
func splitKV(s string) (string, string) {
	k, v, _ := strings.Cut(s, "=")
	return strings.TrimSpace(k), strings.TrimSpace(v)
}
