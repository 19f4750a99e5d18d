//go:build !wasip1

package proxywasm

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// probe is a plugin whose request-headers callback runs a test function, so
// each test calls the forwarding API inside a real proxytest callback.
type probe struct {
	types.DefaultVMContext
	onHeaders func()
	onBody    func()
}

type probePlugin struct {
	types.DefaultPluginContext
	p *probe
}

type probeStream struct {
	types.DefaultHttpContext
	p *probe
}

func (p *probe) NewPluginContext(uint32) types.PluginContext { return &probePlugin{p: p} }
func (p *probePlugin) NewHttpContext(uint32) types.HttpContext {
	return &probeStream{p: p.p}
}

func (s *probeStream) OnHttpRequestHeaders(int, bool) types.Action {
	if s.p.onHeaders != nil {
		s.p.onHeaders()
	}
	return types.ActionContinue
}

func (s *probeStream) OnHttpRequestBody(int, bool) types.Action {
	if s.p.onBody != nil {
		s.p.onBody()
	}
	return types.ActionContinue
}

func runProbe(t *testing.T, opt *proxytest.EmulatorOption, p *probe, body []byte) (proxytest.HostEmulator, uint32) {
	t.Helper()
	host, reset := proxytest.NewHostEmulator(opt.WithVMContext(p))
	t.Cleanup(reset)
	require.Equal(t, types.OnPluginStartStatusOK, host.StartPlugin())
	id := host.InitializeHttpContext()
	host.CallOnRequestHeaders(id, [][2]string{{":path", "/"}}, body == nil)
	if body != nil {
		host.CallOnRequestBody(id, body, true)
	}
	return host, id
}

func TestForwardEmptyIsNotAnError(t *testing.T) {
	var body, config []byte
	var bodyErr, configErr error
	p := &probe{onBody: func() {
		body, bodyErr = GetHttpRequestBody(0, 100)
		config, configErr = GetPluginConfiguration()
	}}
	runProbe(t, proxytest.NewEmulatorOption(), p, []byte{})
	// The SDK reports these as NotFound; Envoy (and the wasip1 build) as empty.
	assert.NoError(t, bodyErr)
	assert.Empty(t, body)
	assert.NoError(t, configErr)
	assert.Empty(t, config)
}

func TestForwardHeadersAndLimits(t *testing.T) {
	var errs []error
	var got [][2]string
	p := &probe{onHeaders: func() {
		errs = append(errs, AddHttpRequestHeader("a", "1"))
		errs = append(errs, ReplaceHttpRequestHeaders(make([][2]string, MaxPairsCount+1)))
		errs = append(errs, SendHttpResponse(200, make([][2]string, MaxPairsCount+1), nil, -1))
		_, err := DispatchHttpCall("c", make([][2]string, MaxPairsCount+1), nil, nil, 10, nil)
		errs = append(errs, err)
		var gerr error
		got, gerr = GetHttpRequestHeaders()
		errs = append(errs, gerr)
	}}
	runProbe(t, proxytest.NewEmulatorOption(), p, nil)
	assert.Equal(t, []error{nil, ErrTooManyPairs, ErrTooManyPairs, ErrTooManyPairs, nil}, errs)
	assert.Equal(t, [][2]string{{":path", "/"}, {"a", "1"}}, got)
}

func TestForwardPropertiesAndCallbacks(t *testing.T) {
	var m [][2]string
	var errs []error
	var calloutErr error
	p := &probe{onHeaders: func() {
		var err error
		m, err = GetPropertyMap([]string{"node", "metadata"})
		errs = append(errs, err)
		_, err = GetProperty(nil)
		errs = append(errs, err)
		errs = append(errs, SetProperty([]string{"x"}, nil))
		level, err := GetLogLevel()
		errs = append(errs, err)
		assert.Equal(t, LogLevelTrace, level)
		_, calloutErr = DispatchHttpCall("c", [][2]string{{":path", "/"}}, nil, nil, 10, nil)
	}}
	enc, err := appendPairs(nil, [][2]string{{"k", "v"}})
	require.NoError(t, err)
	host, id := runProbe(t, proxytest.NewEmulatorOption().WithProperty([]string{"node", "metadata"}, enc), p, nil)
	assert.Equal(t, [][2]string{{"k", "v"}}, m)
	assert.Equal(t, []error{nil, ErrEmptyPropertyPath, ErrEmptyPropertyValue, nil}, errs)
	require.NoError(t, calloutErr)

	// A nil callback is replaced by a no-op, so the response does not panic.
	callouts := host.GetCalloutAttributesFromContext(id)
	require.Len(t, callouts, 1)
	assert.NotPanics(t, func() { host.CallOnHttpCallResponse(callouts[0].CalloutID, nil, nil, nil) })
}

// The *Into functions return the data in the caller's storage when it
// fits, and in a fresh slice when it does not.
func TestForwardInto(t *testing.T) {
	small, big, other := make([]byte, 0, 4), make([]byte, 0, 64), make([]byte, 0, 64)
	var bodySmall, bodyBig, hdr, shared []byte
	var hdrErr, missingErr, sharedErr error
	p := &probe{onBody: func() {
		bodySmall, _ = GetHttpRequestBodyInto(small, 0, 100)
		bodyBig, _ = GetHttpRequestBodyInto(big, 0, 100)
		hdr, hdrErr = GetHttpRequestHeaderInto(small, ":path")
		_, missingErr = GetHttpRequestHeaderInto(small, "absent")
		require.NoError(t, SetSharedData("k", []byte("value"), 0))
		shared, _, sharedErr = GetSharedDataInto(other, "k")
	}}
	runProbe(t, proxytest.NewEmulatorOption(), p, []byte("a body"))
	assert.Equal(t, "a body", string(bodySmall))
	assert.NotSame(t, unsafe.SliceData(small[:1]), unsafe.SliceData(bodySmall), "too big for small")
	assert.Equal(t, "a body", string(bodyBig))
	assert.Same(t, unsafe.SliceData(big[:1]), unsafe.SliceData(bodyBig))
	require.NoError(t, hdrErr)
	assert.Equal(t, "/", string(hdr))
	assert.Same(t, unsafe.SliceData(small[:1]), unsafe.SliceData(hdr))
	assert.ErrorIs(t, missingErr, types.ErrorStatusNotFound)
	require.NoError(t, sharedErr)
	assert.Equal(t, "value", string(shared))
	assert.Same(t, unsafe.SliceData(other[:1]), unsafe.SliceData(shared))
}
