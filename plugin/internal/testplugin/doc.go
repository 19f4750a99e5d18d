// Command testplugin is a small Proxy-Wasm HTTP filter, built on the binding in
// plugin/internal/proxywasm, that exercises every host call the binding offers.
// It exists so the Envoy-faithful test host (e2e/envoyhost) can be tested with a
// real Go wasip1 module, and so the binding is tested through a real host.
//
// Build:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o bin/testplugin.wasm ./plugin/internal/testplugin
//
// Natively (go test) the same code runs under the SDK's proxytest emulator.
//
// # Registration
//
// init() only calls proxywasm.SetVMContext (stores a Go value, no host call).
// In c-shared (reactor) mode main.main is never run. Everything else happens in
// callbacks.
//
// # Environment variables (vm_config.environment_variables), read in init()
//
//	TESTPLUGIN_INIT_HOSTCALL=1  init() calls proxy_set_shared_data("testplugin/init", "1", 0):
//	                            a restricted call during _initialize (V8 Envoy rejects it).
//	TESTPLUGIN_INIT_PANIC=1     init() panics: _initialize traps, the module fails to start.
//
// # VM configuration (vm_config.configuration), read in on_vm_start
//
//	"fail-vm-start"   on_vm_start returns false.
//	"panic-vm-start"  on_vm_start panics (trap).
//	anything else     kept and reported by /tp/start-info.
//
// on_vm_start also tries GetPluginConfiguration and records the error it gets
// (Envoy: NotFound; the plugin configuration is readable only in on_configure).
// It draws a random per-VM nonce (crypto/rand, WASI random_get) that identifies
// the VM in the x-tp-vm-nonce response header.
//
// # Plugin configuration (JSON object, read in on_configure; empty = all defaults)
//
//	"fail_configure": true         on_configure returns false (config rejected).
//	"panic_in_configure": true     on_configure panics (trap).
//	"tick_period_ms": N            SetTickPeriodMilliSeconds(N) in on_configure.
//	"tick_stop_after": N           after N ticks of this root context, set the period to 0.
//	"tick_panic_after": N          the Nth tick panics (trap), N >= 1.
//	"tick_http_call_cluster": "c"  every tick dispatches GET tick_http_call_path (default "/")
//	                               with :authority = cluster to cluster "c" from the root
//	                               context; the callback stores "<:status> <body>" (or
//	                               "failed" when called with no headers) in shared data
//	                               key "testplugin/tick-call"; the dispatch status (ok,
//	                               bad_argument, ...) goes to "testplugin/tick-call/dispatch".
//	"tick_http_call_path": "/p"
//	"delay_done": true             on_done of the root context returns false and sets a 1 ms
//	                               tick; that tick calls PluginDone (proxy_done) and logs
//	                               "testplugin: plugin done" at info.
//
// Unknown fields or invalid JSON make on_configure return false.
//
// Each tick: counter testplugin_ticks_total += 1 and the decimal value under
// shared data key "testplugin/ticks" is incremented with a CAS retry loop.
//
// # Metrics (defined in on_configure)
//
//	testplugin_requests_total       counter, +1 per on_request_headers
//	testplugin_active_streams       gauge,   +1 when an HTTP context is created, -1 in on_log
//	testplugin_request_body_bytes   histogram, records the request body size at end of stream
//	testplugin_ticks_total          counter, +1 per tick
//
// # Request handling
//
// Control request headers work on any path (the request then goes upstream
// unless a local reply is made):
//
//	x-tp-add: k=v              AddHttpRequestHeader(k, v)
//	x-tp-replace: k=v          ReplaceHttpRequestHeader(k, v)
//	x-tp-remove: k             RemoveHttpRequestHeader(k)
//	x-tp-set-pairs: k=v        ReplaceHttpRequestHeaders(all current pairs + (k, v))
//	x-tp-get: k                GetHttpRequestHeader(k): response header x-tp-got = value,
//	                           or x-tp-got-error = not_found|bad_argument|...
//	x-tp-headers-action: pause on_request_headers returns Pause (only when the request
//	                           has a body, i.e. end_of_stream is false). Nothing resumes
//	                           it: without allow_on_headers_stop_iteration Envoy then never
//	                           delivers the body (StopAll). To pause and resume, use
//	                           /tp/http-call?...&resume=1 (its body callbacks follow the resume).
//	x-tp-body: MODE            request body handling (see below); for replace/append/
//	                           prepend the plugin removes content-length in on_request_headers
//	x-tp-resp-body: MODE       response body handling: buffer | replace:T | append:T |
//	                           prepend:T (content-length is removed from the response
//	                           headers for the mutating modes)
//	x-tp-local-reply: STATUS   SendHttpResponse(STATUS, headers, body, grpc) in
//	                           on_request_headers; body from x-tp-local-reply-body, one
//	                           extra header from x-tp-local-reply-header: k=v, grpc status
//	                           from x-tp-local-reply-grpc (default -1 = none); with
//	                           x-tp-local-reply-details: D it uses
//	                           SendHttpResponseWithDetails (details D; Envoy turns spaces
//	                           into "_" in %RESPONSE_CODE_DETAILS%)
//	x-tp-panic-in: CALLBACK    panic (trap) in request_headers | request_body |
//	                           response_headers | response_body | log
//	x-tp-trailer-add: k=v      AddHttpRequestTrailer(k, v) in on_request_trailers
//	x-tp-resp-property: P,Q    in on_response_headers, GetProperty of each dotted path;
//	                           response header x-tp-resp-property-<path> = the value
//	                           (text as is, 8-byte numbers as "int:N", else "hex:..."),
//	                           or the error name
//	x-tp-resp-call: CLUSTER    on_response_headers dispatches GET / to CLUSTER and returns
//	                           Pause; the callback sets response header
//	                           x-tp-resp-call-status (:status of the reply, or "failed")
//	                           and calls ResumeHttpResponse
//
// Request body MODE (x-tp-body): every on_request_body call is recorded as
// "size:eos" and, except for "none", returns Pause until end_of_stream, then:
//
//	buffer       Continue (nothing else)
//	replace:T    ReplaceHttpRequestBody(T)
//	append:T     AppendHttpRequestBody(T)
//	prepend:T    PrependHttpRequestBody(T)
//	echo         local reply 200 whose body is the whole request body
//	none         Continue on every call (default when the header is absent)
//
// At end of stream (any mode but none) the plugin reads the whole body with
// GetHttpRequestBody(0, size), records its length in the histogram, and tries
// ReplaceHttpRequestHeader("x-tp-body-seen", LENGTH), recording the status.
//
// Every response (upstream or local reply) gets, in on_response_headers:
//
//	x-tp-vm-nonce            hex nonce of the VM that served the stream
//	x-tp-root-id             root context id; x-tp-context-id: stream context id
//	x-tp-vm-requests         requests seen by this VM so far (decimal)
//	x-tp-req-body-calls      on_request_body calls as "size:eos,size:eos,..." (may be empty)
//	x-tp-req-body-len        length read at end of stream (absent if never read)
//	x-tp-req-header-after-body  ok | bad_argument | ... (status of the replace above)
//	x-tp-resp-headers-count  num_headers passed to on_response_headers
//	x-tp-got / x-tp-got-error   see x-tp-get
//	x-tp-req-trailers        number of request trailers seen by on_request_trailers
//	                         (absent if it was not called)
//	x-tp-trailers-body-len   in on_request_trailers, the length GetHttpRequestBody read
//	                         (or its error name)
//	x-tp-trailers-header     in on_request_trailers, the status of
//	                         ReplaceHttpRequestHeader("x-tp-trailers-seen", <trailer count>)
//
// on_log reads request :path and response :status and logs them at info as
// "testplugin log: path=P status=S"; on_done and on_delete only bookkeep.
//
// Local-reply endpoints (answered in on_request_headers, never sent upstream):
//
//	/tp/echo              200, JSON {"headers": [[k, v], ...]} = GetHttpRequestHeaders after
//	                      the control-header edits above
//	/tp/start-info        200, JSON {"vm_configuration", "vm_start_plugin_config_error",
//	                      "plugin_configuration", "root_context_id", "log_level", "vm_nonce"}
//	/tp/config            GetPluginConfiguration outside on_configure: 200 + body if OK,
//	                      else 500 with x-tp-error (Envoy gives not_found)
//	/tp/shared/get?key=K  200 + value body + x-tp-cas; 404 + x-tp-error: not_found
//	/tp/shared/set?key=K&value=V&cas=N   200 + x-tp-cas (cas read back) on success,
//	                      409 + x-tp-error: cas_mismatch, 500 + x-tp-error otherwise
//	/tp/shared/incr?key=K CAS-loop increment of a decimal value (missing = 0), 200 + new
//	                      value as body; 503 + x-tp-error: cas_retries after 100 retries
//	/tp/property?path=a.b.c   GetProperty(["a","b","c"]): 200 + raw value body (numbers are
//	                      8-byte little endian); 404 not_found; 500 other (x-tp-error)
//	/tp/property-map?path=a.b GetPropertyMap: 200 JSON [[k, v], ...]
//	/tp/set-property?path=a.b&value=V  SetProperty: 200, or 500 + x-tp-error
//	/tp/metrics           200, JSON {"requests_total", "active_streams", "ticks_total"}
//	                      read back with get_metric (this VM's view)
//	/tp/log               logs "testplugin level <L>" at each of the six levels
//	                      (trace debug info warn error critical); 200 with
//	                      x-tp-log-level = GetLogLevel() as a name ("info", ...)
//	/tp/stdout            writes "testplugin stdout" to os.Stdout and "testplugin stderr" to
//	                      os.Stderr (WASI fd_write: fd 1 -> info log, fd 2 -> error log); 200
//	/tp/env?name=N        200, body = os.Getenv(N) (WASI environ)
//	/tp/time              200, body = time.Now().UnixNano() decimal (WASI clock_time_get)
//	/tp/random            200, body = 32 random bytes as hex (WASI random_get)
//	/tp/gc                allocates ~8 MiB of garbage with runtime.GC() between host calls
//	                      that return data (header pairs, a header, a property); 200 "ok"
//	                      if every read was consistent, 500 otherwise
//	/tp/panic             panic (trap) in on_request_headers
//	/tp/http-call?cluster=C[&path=/p][&method=GET][&authority=A][&timeout_ms=5000]
//	              [&omit=:authority][&resume=1]
//	                      DispatchHttpCall from the stream context; returns Pause. On the
//	                      reply: 200 local reply with body = callout body, x-tp-call-status =
//	                      callout :status, x-tp-call-headers = num headers; with resume=1
//	                      instead adds request header x-tp-call-status and calls
//	                      ResumeHttpRequest (the request goes upstream). A failed callout
//	                      (no headers) gives 502 + x-tp-call: failed. A dispatch error gives
//	                      500 + x-tp-error (unknown cluster or a missing pseudo header:
//	                      bad_argument). omit drops one of :method/:path/:authority.
//
// Error names in x-tp-error and friends: not_found, bad_argument, empty,
// cas_mismatch, internal_failure, unimplemented, or the error text otherwise.
package main
