// Package filter is the wasm-epp plugin in its router role, the HTTP filter:
// inside the proxy it reads each OpenAI-style request, picks the vLLM pod
// that should serve it from the metrics snapshot in shared data, and names
// that pod in the destination header an ORIGINAL_DST cluster routes on, or
// answers with an OpenAI-style JSON error. plugin/main.go starts it (or its
// sibling, package receiver, which takes the agents' metric pushes) as the
// configuration's "role" says.
//
// # Files
//
//   - http.go: httpContext, one request; its callbacks in the order Envoy
//     calls them are the request path below.
//   - router.go: Router, the per-VM state and every step the callbacks hand
//     it (model resolution, snapshot cache, decision, counting,
//     destinations).
//   - crdtable.go: the model table agents publish from Kubernetes objects,
//     which replaces the configured models while one is stored.
//   - request.go and jsonscan.go: ParseRequest, the body check in one pass.
//   - reply.go: the local replies (table below) and their JSON bodies.
//   - clock.go: the clock and log-level reads, cached to spare host calls.
//   - flow.go: flow control, the glue between the request path, the
//     router's tick and scheduler/flowcontrol's queue.
//
// # Request path
//
//   - on_request_headers: the client's destination header and
//     x-envoy-original-dst-host are removed, so only the filter ever names a
//     destination. A request without a body (GET /v1/models) goes to the
//     least-loaded fresh endpoint right away; a POST/PUT/PATCH without a body
//     is a 400. A Content-Length above maxBodyBytes is a 413. Content-Length
//     is removed when some configured model may be rewritten (Envoy does not
//     fix it when a filter changes the body). Then Pause: the plugin must be
//     configured with allow_on_headers_stop_iteration: true, or Envoy sends
//     the headers upstream before the body callback can name a destination.
//   - on_request_body: buffered (Pause) until end of stream; more than
//     maxBodyBytes is a 413. The whole body is read once and handed to
//     ParseRequest (strict JSON validation first; see its doc). The model is
//     resolved (criticality, seeded weighted target draw), the snapshot is
//     taken from the per-VM cache, the scheduler decides, and on success the
//     "model" string is spliced in place when the target differs, the
//     destination header is set to ip:port ([v6]:port), and the request
//     continues.
//   - with flowControl configured, a Standard or Sheddable request the
//     scheduler drops for lack of capacity is held instead (Pause at the end
//     of the body), and so is one arriving while requests of its band or a
//     higher one are held (it must not overtake them). The router's tick
//     (releaseInterval) answers those past their TTL with 429, re-reads the
//     snapshot, and offers the rest to the scheduler in order; a released
//     request is rewritten, gets its destination header and continues
//     (proxy_set_effective_context, proxy_continue_stream) exactly as one
//     routed at once. A client that goes away while held leaves the queue in
//     on_log. See flow.go and scheduler/flowcontrol.
//   - on_request_trailers: a request with trailers (HTTP/2) ends here, its
//     last body callback without end of stream. The buffered body is still
//     readable and the headers still writable, so the request is routed
//     here exactly as at the end of its body.
//   - on_response_headers: a request the filter let continue is counted by
//     where its response comes from (the response code details): from the
//     upstream ("via_upstream") or from Envoy after forwarding (a connect
//     failure, a reset or a timeout) it counts as routed (fail_open); from
//     the route table ("direct_response", or no route) as direct_response,
//     since it never went upstream. The optional servedByHeader names the
//     endpoint only on responses from it. A request whose client leaves
//     before any response is counted in on_log, as routed.
//
// # Cost per request
//
// In a Wasm guest the allocator, the garbage collector, map operations,
// host calls and the sheer amount of code a request runs through dominate a
// small request, so the routed path allocates nothing in the steady state:
// the body, the snapshot version and Content-Length are read into buffers
// the router keeps (proxywasm *Into), configured model names are reused,
// request contexts are recycled after proxy_on_log, and destination strings
// are cached per snapshot endpoint. Timing reads the monotonic clock (one
// host call; time.Now is two), the wall clock is read once per decision, and
// the host's log level is asked at most once a second (clock.go).
//
// # Local replies
//
// Bodies are {"error":{"message":…,"type":…,"code":…}} with content-type
// application/json; the response code details (access log
// %RESPONSE_CODE_DETAILS%) are "wasm_epp_<outcome>":
//
//	400 invalid_request_error / <Reason>        wasm_epp_bad_request
//	404 invalid_request_error / model_not_found  wasm_epp_unknown_model
//	413 invalid_request_error / request_too_large wasm_epp_too_large
//	429 rate_limit_error / capacity_exhausted     wasm_epp_dropped (also: flow-control queue full)
//	429 rate_limit_error / capacity_exhausted     wasm_epp_queue_expired (held for its whole TTL;
//	                                              the message says how long it waited)
//	503 service_unavailable / no_endpoint         wasm_epp_no_endpoint
//	500 server_error / internal_error             wasm_epp_internal_error
//
// # Snapshot
//
// The root context's tick re-reads the snapshot every
// snapshotRefreshInterval (Router.OnTick), and requests decide on what it
// read (Router.current): a request re-reads only when the last re-read is
// older than twice the interval (ticks late or not delivered), when the
// snapshot is empty, or with the interval "0s" (every request then). A
// re-read reads one small key, the v2 directory (Router.snapshot,
// wire.Cache.Refresh); only the segments whose generation moved are read
// again, and their endpoints are rewritten in place in this VM's snapshot
// (the scheduler's index is told what moved). A segment that fails to
// read keeps what this VM had of it (its endpoints then age out through
// staleness). No snapshot at all means no endpoint: 503. The directory
// also carries the Kubernetes model table's generation, so the same read
// tells whether that table changed.
//
// Each VM keeps its own copy, so with the scheduler's
// countRoutedSinceSnapshot on it counts every request it routes as waiting
// at the chosen endpoint until the next refresh (Scheduler.Observe): a burst
// between two snapshots spreads instead of herding onto one endpoint. Each
// Envoy worker counts only its own requests.
//
// # Metrics
//
// Envoy shows plugin metrics as wasmcustom.<name>; names use dots so a
// bootstrap stats_tags rule can turn the last segment into a tag:
//
//	wasm_epp.requests.<outcome>     counter: routed, fail_open, direct_response, dropped,
//	                                bad_request, unknown_model, too_large, no_endpoint,
//	                                internal_error, expired, abandoned (each request counts
//	                                exactly once; a held request when it leaves the queue)
//	wasm_epp.path.<path>            counter per scheduler decision path (Scheduler.Paths,
//	                                "/" written as "."), defined at start
//	wasm_epp.snapshot.decodes       counter: snapshots decoded (once per change per VM)
//	wasm_epp.snapshot.decode_errors counter: stored snapshots that failed to decode
//	wasm_epp.snapshot.request_refreshes counter: requests that re-read the snapshot
//	                                themselves (the last re-read older than twice
//	                                snapshotRefreshInterval: ticks late, or the
//	                                VM had no requests for 256 ticks)
//	wasm_epp.snapshot.age_ms        gauge: now minus the snapshot's newest push
//	wasm_epp.snapshot.endpoints     gauge: endpoints in the current snapshot
//	wasm_epp.schedule_us            histogram: time spent in the scheduler per request
//	wasm_epp.request_us             histogram: time spent in the request callbacks per
//	                                request (parsing, snapshot, scheduling, host calls)
//
// With flowControl (per VM, summed over the workers by Envoy):
//
//	wasm_epp.flow.queued.{standard,sheddable}  gauge: requests held per band
//	wasm_epp.flow.queued_bytes                 gauge: their body bytes
//	wasm_epp.flow.wait_ms                      histogram: wait of each released request
//	wasm_epp.flow.{enqueued,released,expired,rejected_full,abandoned,no_endpoint}
//	                                           counters of the queue
//	wasm_epp.flow.bad_ttl_header               counter: malformed TTL headers (ignored)
//	wasm_epp.flow.long_flow_key                counter: flow keys over maxFlowKeyBytes
//	wasm_epp.flow.admission_errors             counter: releases routed without the
//	                                           shared admission record (store error)
//	wasm_epp.flow.admission_contention         counter: releases put off because other
//	                                           workers kept writing the record
//
// A held request counts the scheduler decision that dropped it and the one
// that released it in wasm_epp.path.*; the blocked attempts in between are
// not counted. Its wasm_epp.request_us is its own callback time, the wait
// excluded.
package filter
