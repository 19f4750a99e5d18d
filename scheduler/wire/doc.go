// Package wire is the binary format that carries endpoint metrics from the
// metrics agent to the wasm-epp plugin, and the format the plugin keeps in
// Envoy shared data.
//
// There are two metrics messages, each starting with a two-byte magic and a version
// byte, so a payload of the wrong kind or an unknown version is rejected
// before anything else is read:
//
//   - a Push ("WP", version 1) is what one agent POSTs to every Envoy replica
//     each cycle: its id, a sequence number that only grows, the send time and
//     the state of every endpoint it scrapes;
//   - a Stored snapshot ("WS", version 1) is what the receiver keeps in shared
//     data: the latest accepted push of every agent (Merge), which the filter
//     turns into a scheduler.Snapshot once per change (DecodeSnapshot).
//
// A third message, the configuration record ("WC", version 1, config.go),
// carries the model table agents build from Kubernetes objects.
//
// # Layout (version 1)
//
// Integers are little-endian. uvarint is unsigned LEB128 in its shortest form
// (a longer encoding of the same number is rejected). str is a uvarint byte
// length followed by UTF-8 without control characters. Times are int64 Unix
// nanoseconds and must be positive.
//
//	Push     = "WP" 0x01  agent_id:str  seq:u64  send_time:i64
//	           n:uvarint  Endpoint×n                (sorted, unique by namespace,name)
//	Stored   = "WS" 0x01  n_agents:uvarint  n_endpoints_total:uvarint
//	           Agent×n_agents                       (sorted, unique by agent_id)
//	Agent    = agent_id:str  last_seq:u64  received:i64  n:uvarint  Endpoint×n
//	Endpoint = namespace:str  name:str  addr_len:u8(4|16)  addr:bytes  port:u16
//	           waiting:uvarint  running:uvarint  kv_cache_usage:f64
//	           max_adapters:uvarint
//	           n_active:uvarint  str×n_active       (sorted, unique)
//	           n_waiting:uvarint str×n_waiting      (sorted, unique)
//	           scrape_time:i64  last_error:u8       (0 = healthy)
//
// Every accepted byte string has exactly one encoding: decode then encode
// gives back the same bytes. Sorting makes duplicate detection free of
// allocation and keeps the stored value deterministic across Envoy replicas.
//
// The package is plain Go without net/http so it compiles for GOOS=wasip1
// and runs inside the plugin; decoding allocates a handful of slices per call
// whatever the number of endpoints.
package wire
