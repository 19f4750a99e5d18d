package proxywasm

import (
	"strconv"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// dispatcher routes host callbacks to the plugin's contexts. It is plain Go so
// the bookkeeping is unit-tested natively; the wasip1 exports call into it.
// One VM runs one callback at a time, so it needs no locking.
type dispatcher struct {
	vm      types.VMContext
	roots   map[uint32]*rootContext
	streams map[uint32]streamContext // by value: no allocation per stream
	// active is the context of the callback in progress; DispatchHttpCall
	// records it so the response is delivered back to it.
	active uint32
	// depth counts nested callbacks (the host never nests them in practice);
	// host buffers are released when it returns to 0.
	depth int
	// lastID and last cache the stream found last (lastID 0: none): the
	// callbacks of one request mostly arrive in a row, and a map lookup per
	// callback is a noticeable share of a request in a Wasm guest.
	lastID uint32
	last   streamContext
}

type rootContext struct {
	ctx      types.PluginContext
	callouts map[uint32]callout
}

type streamContext struct {
	ctx  types.HttpContext
	root uint32
}

type callout struct {
	callback func(numHeaders, bodySize, numTrailers int)
	caller   uint32
}

func newDispatcher() *dispatcher {
	return &dispatcher{
		roots:   make(map[uint32]*rootContext),
		streams: make(map[uint32]streamContext),
	}
}

func (d *dispatcher) vmContext() types.VMContext {
	if d.vm == nil {
		panic("proxywasm: no VMContext: call proxywasm.SetVMContext from an init function")
	}
	return d.vm
}

func (d *dispatcher) root(id uint32) *rootContext {
	r, ok := d.roots[id]
	if !ok {
		panic("proxywasm: unknown root context " + strconv.FormatUint(uint64(id), 10))
	}
	return r
}

func (d *dispatcher) stream(id uint32) types.HttpContext {
	if id == d.lastID && id != 0 {
		return d.last.ctx
	}
	s, ok := d.streams[id]
	if !ok {
		panic("proxywasm: unknown stream context " + strconv.FormatUint(uint64(id), 10))
	}
	d.lastID, d.last = id, s
	return s.ctx
}

// contextCreate handles proxy_on_context_create: parent 0 makes a root
// (plugin) context, anything else an HTTP stream context of that root.
func (d *dispatcher) contextCreate(id, parent uint32) {
	d.active = id
	if parent == 0 {
		ctx := d.vmContext().NewPluginContext(id)
		if ctx == nil {
			panic("proxywasm: VMContext.NewPluginContext returned nil")
		}
		d.roots[id] = &rootContext{ctx: ctx, callouts: make(map[uint32]callout)}
		return
	}
	if _, dup := d.streams[id]; dup {
		panic("proxywasm: duplicate context " + strconv.FormatUint(uint64(id), 10))
	}
	ctx := d.root(parent).ctx.NewHttpContext(id)
	if ctx == nil {
		// Only HTTP filters are supported; the SDK traps the same way.
		panic("proxywasm: PluginContext.NewHttpContext returned nil (only HTTP filters are supported)")
	}
	s := streamContext{ctx: ctx, root: parent}
	d.streams[id] = s
	d.lastID, d.last = id, s
}

func (d *dispatcher) vmStart(root uint32, vmConfigurationSize int) bool {
	d.active = root
	return bool(d.vmContext().OnVMStart(vmConfigurationSize))
}

func (d *dispatcher) configure(root uint32, pluginConfigurationSize int) bool {
	r := d.root(root)
	d.active = root
	return bool(r.ctx.OnPluginStart(pluginConfigurationSize))
}

func (d *dispatcher) tick(root uint32) {
	r := d.root(root)
	d.active = root
	r.ctx.OnTick()
}

func (d *dispatcher) queueReady(root, queueID uint32) {
	r := d.root(root)
	d.active = root
	r.ctx.OnQueueReady(queueID)
}

// httpStream makes id the active context and returns its HttpContext.
func (d *dispatcher) httpStream(id uint32) types.HttpContext {
	ctx := d.stream(id)
	d.active = id
	return ctx
}

// log handles proxy_on_log: OnHttpStreamDone for streams, nothing for roots.
func (d *dispatcher) log(id uint32) {
	if s, ok := d.findStream(id); ok {
		d.active = id
		s.ctx.OnHttpStreamDone()
	}
}

// done handles proxy_on_done: roots answer OnPluginDone, streams are done.
func (d *dispatcher) done(id uint32) bool {
	if id == d.lastID && id != 0 {
		return true // a stream, the usual case
	}
	if r, ok := d.roots[id]; ok {
		d.active = id
		return r.ctx.OnPluginDone()
	}
	return true
}

// delete forgets a context. Unknown ids are ignored: the host may delete a
// context whose creation trapped. Deleting a root drops its pending callouts.
func (d *dispatcher) delete(id uint32) {
	if id == d.lastID {
		d.lastID, d.last = 0, streamContext{}
	}
	delete(d.streams, id)
	delete(d.roots, id)
}

// findStream returns the stream context id.
func (d *dispatcher) findStream(id uint32) (streamContext, bool) {
	if id == d.lastID && id != 0 {
		return d.last, true
	}
	s, ok := d.streams[id]
	return s, ok
}

// registerCallout remembers the callback of an HTTP call made by the active
// context. The host delivers the response to the caller's root context.
func (d *dispatcher) registerCallout(token uint32, callback func(numHeaders, bodySize, numTrailers int)) {
	root := d.active
	if s, ok := d.streams[d.active]; ok {
		root = s.root
	}
	d.root(root).callouts[token] = callout{callback: callback, caller: d.active}
}

// httpCallResponse handles proxy_on_http_call_response. The callback runs with
// its caller as active context; for a stream caller, setEffective points the
// host's header/body calls at that stream. A response for a stream that is
// gone, or for an unknown token, is dropped (returns false).
func (d *dispatcher) httpCallResponse(root, token uint32, numHeaders, bodySize, numTrailers int, setEffective func(uint32) error) bool {
	r := d.root(root)
	c, ok := r.callouts[token]
	if !ok {
		return false
	}
	delete(r.callouts, token)
	if c.caller != root {
		if _, alive := d.streams[c.caller]; !alive {
			return false
		}
		if err := setEffective(c.caller); err != nil {
			return false
		}
	}
	d.active = c.caller
	if c.callback != nil {
		c.callback(numHeaders, bodySize, numTrailers)
	}
	return true
}
