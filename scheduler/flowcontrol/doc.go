// Package flowcontrol holds requests that found no endpoint with capacity
// instead of refusing them, and releases them when capacity returns. It is
// plain Go (no Wasm binding, no I/O): the Proxy-Wasm plugin runs it inside
// each VM, and the fleet simulation runs the same code in virtual time.
//
// # Order
//
// A Queue has two bands, Standard before Sheddable; Critical requests never
// wait (BandFor). Inside a band, flows (a target model, or the value of a
// configured request header such as a tenant id) are served round-robin,
// one request per turn, so a busy flow cannot starve a quiet one; inside a
// flow, requests leave first in, first out. A flow that could not be served
// (no capacity for its head request) keeps its turn.
//
// # Bounds
//
// The queue is bounded by a request count and by the sum of the held
// bodies' sizes (Config.MaxRequests, Config.MaxBytes); Push refuses what
// does not fit, and the caller answers 429 as it would without flow
// control. Every request has a deadline (Config.TTL, which a request header
// may shorten: ParseTTL); Expire removes those past it. Remove takes out a
// request whose client went away. Flow keys are bounded
// (Config.MaxFlowKeyBytes, FlowKey), and the flow table never holds more
// entries than MaxRequests.
//
// # Release
//
// With flow control on, flow control decides when a Standard or Sheddable
// request goes and the profile decides where: the request is scheduled
// with scheduler.Request.Admitted (the profile's shedding step no longer
// refuses it), and it goes only if the endpoint the profile picks has
// Room (no waiting queue, KV cache below its limit, its adapter's slot);
// otherwise it is held. Room.Take decides a new request; Releaser offers
// held ones, by band, then round-robin between flows, on each tick
// (Release) and on each new snapshot (ReleaseRouted, which only routes).
// The caller counts what it dispatched since the snapshot it schedules on
// (Admission), so one free slot is not filled several times, and worker
// VMs that share one proxy's capacity agree on those counts through
// shared data written with compare-and-swap.
//
// # Cost
//
// A Queue keeps its entries in slices that grow to the configured bounds
// and are reused: Push, Remove, Expire and Release allocate nothing once
// the queue has held that many entries, except for a flow key seen for the
// first time (its string). Every operation is O(log n) in the number of
// queued requests (a deadline heap) or O(1).
//
// A Queue is not safe for concurrent use; a Proxy-Wasm VM is
// single-threaded, so each VM owns one.
package flowcontrol
