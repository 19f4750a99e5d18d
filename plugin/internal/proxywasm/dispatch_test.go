package proxywasm

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// recorder is a plugin recording every callback it gets, in order.
type recorder struct {
	calls  *[]string
	noHTTP bool
}

type recPlugin struct {
	types.DefaultPluginContext
	r  *recorder
	id uint32
}

type recStream struct {
	types.DefaultHttpContext
	r  *recorder
	id uint32
}

func (r *recorder) add(s string) { *r.calls = append(*r.calls, s) }

func (r *recorder) OnVMStart(size int) types.OnVMStartStatus {
	r.add("vm_start")
	return size == 0
}

func (r *recorder) NewPluginContext(id uint32) types.PluginContext {
	r.add("new_plugin")
	return &recPlugin{r: r, id: id}
}

func (p *recPlugin) OnPluginStart(size int) types.OnPluginStartStatus {
	p.r.add("configure")
	return size < 10
}
func (p *recPlugin) OnTick()             { p.r.add("tick") }
func (p *recPlugin) OnQueueReady(uint32) { p.r.add("queue") }
func (p *recPlugin) OnPluginDone() bool  { p.r.add("plugin_done"); return false }
func (p *recPlugin) NewHttpContext(id uint32) types.HttpContext {
	if p.r.noHTTP {
		return nil
	}
	p.r.add("new_http")
	return &recStream{r: p.r, id: id}
}

func (s *recStream) OnHttpRequestHeaders(n int, eos bool) types.Action {
	s.r.add("req_headers")
	if eos {
		return types.ActionContinue
	}
	return types.ActionPause
}
func (s *recStream) OnHttpStreamDone() { s.r.add("stream_done") }

func newRecorded() (*dispatcher, *[]string) {
	var calls []string
	d := newDispatcher()
	d.vm = &recorder{calls: &calls}
	return d, &calls
}

func TestDispatcherLifecycle(t *testing.T) {
	d, calls := newRecorded()
	d.contextCreate(1, 0)
	assert.True(t, d.vmStart(1, 0))
	assert.False(t, d.vmStart(1, 5))
	assert.True(t, d.configure(1, 3))
	assert.False(t, d.configure(1, 30))
	d.tick(1)
	d.queueReady(1, 7)

	d.contextCreate(2, 1)
	assert.Equal(t, uint32(2), d.active)
	assert.Equal(t, types.ActionPause, d.httpStream(2).OnHttpRequestHeaders(3, false))
	d.log(2)
	assert.True(t, d.done(2), "streams are always done")
	d.delete(2)
	assert.NotContains(t, d.streams, uint32(2))

	d.log(1) // roots have no OnHttpStreamDone
	assert.False(t, d.done(1))
	d.delete(1)
	d.delete(42) // unknown ids are ignored
	assert.Empty(t, d.roots)

	assert.Equal(t, []string{"new_plugin", "vm_start", "vm_start", "configure", "configure", "tick", "queue",
		"new_http", "req_headers", "stream_done", "plugin_done"}, *calls)
}

func TestDispatcherMisuse(t *testing.T) {
	d := newDispatcher()
	assert.PanicsWithValue(t, "proxywasm: no VMContext: call proxywasm.SetVMContext from an init function",
		func() { d.contextCreate(1, 0) })
	assert.Panics(t, func() { d.vmStart(1, 0) })

	d, _ = newRecorded()
	assert.Panics(t, func() { d.contextCreate(2, 1) }, "unknown root")
	d.contextCreate(1, 0)
	d.contextCreate(2, 1)
	assert.Panics(t, func() { d.contextCreate(2, 1) }, "duplicate stream")
	assert.Panics(t, func() { d.httpStream(3) }, "unknown stream")
	assert.Panics(t, func() { d.tick(9) }, "unknown root")

	d.vm.(*recorder).noHTTP = true
	assert.Panics(t, func() { d.contextCreate(4, 1) }, "NewHttpContext returned nil")
}

func TestDispatcherCallouts(t *testing.T) {
	d, _ := newRecorded()
	d.contextCreate(1, 0)
	d.contextCreate(2, 1)
	d.contextCreate(3, 1)

	var got []string
	var effective []uint32
	setEffective := func(id uint32) error { effective = append(effective, id); return nil }

	// A stream dispatches: the response goes to its root, the callback runs
	// with the stream active and effective.
	d.httpStream(2)
	d.registerCallout(10, func(h, b, tr int) { got = append(got, "stream2"); assert.Equal(t, []int{1, 2, 3}, []int{h, b, tr}) })
	// The root dispatches from a tick.
	d.tick(1)
	d.registerCallout(11, func(int, int, int) { got = append(got, "root") })
	// Stream 3 dispatches, then goes away before the response.
	d.httpStream(3)
	d.registerCallout(12, func(int, int, int) { got = append(got, "stream3") })
	d.delete(3)
	// A nil callback just drops the response.
	d.httpStream(2)
	d.registerCallout(13, nil)

	d.active = 0
	assert.True(t, d.httpCallResponse(1, 10, 1, 2, 3, setEffective))
	assert.Equal(t, uint32(2), d.active)
	assert.True(t, d.httpCallResponse(1, 11, 0, 0, 0, setEffective))
	assert.Equal(t, uint32(1), d.active)
	assert.False(t, d.httpCallResponse(1, 12, 0, 0, 0, setEffective), "caller deleted")
	assert.False(t, d.httpCallResponse(1, 10, 0, 0, 0, setEffective), "token already used")
	assert.False(t, d.httpCallResponse(1, 99, 0, 0, 0, setEffective), "unknown token")
	assert.True(t, d.httpCallResponse(1, 13, 0, 0, 0, setEffective))
	assert.Equal(t, []string{"stream2", "root"}, got)
	assert.Equal(t, []uint32{2, 2}, effective, "effective context only for stream callers")

	// setEffective failing drops the response.
	d.httpStream(2)
	d.registerCallout(14, func(int, int, int) { t.Fatal("must not run") })
	assert.False(t, d.httpCallResponse(1, 14, 0, 0, 0, func(uint32) error { return errors.New("gone") }))

	// Deleting the root drops its pending callouts.
	d.registerCallout(15, func(int, int, int) { t.Fatal("must not run") })
	d.delete(1)
	require.Panics(t, func() { d.httpCallResponse(1, 15, 0, 0, 0, setEffective) })
}

// Streams found through the one-entry cache are the right ones, interleaved
// or not, and a deleted stream is not served from it.
func TestDispatcherStreamCache(t *testing.T) {
	d, _ := newRecorded()
	d.contextCreate(1, 0)
	d.contextCreate(2, 1)
	d.contextCreate(3, 1)
	for _, id := range []uint32{3, 3, 2, 3, 2, 2} {
		assert.Equal(t, id, d.httpStream(id).(*recStream).id)
		assert.Equal(t, id, d.active)
	}
	assert.True(t, d.done(2))
	assert.False(t, d.done(1), "roots answer OnPluginDone")
	d.delete(2)
	assert.Panics(t, func() { d.httpStream(2) })
	assert.Equal(t, uint32(3), d.httpStream(3).(*recStream).id)
	d.delete(3)
	assert.Panics(t, func() { d.httpStream(3) })
	assert.True(t, d.done(3), "an unknown context is done")
}
