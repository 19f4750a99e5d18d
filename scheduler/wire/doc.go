// Package wire is the binary format that carries endpoint metrics from the
// metrics agents (directly, or relayed by aggregators) to the wasm-epp
// plugin, and the layout the plugin keeps them in, in Envoy shared data.
//
// Every message starts with a two-byte magic and a version byte, so a
// payload of the wrong kind or an unknown version is refused before
// anything else is read, with the versions this build reads in the error.
//
//   - A push ("WP") is what an agent POSTs each cycle. Version 2 (push2.go)
//     carries agent blocks (block.go): one from an agent (kind agent), the
//     latest of many agents from an aggregator (kind relay). Version 1
//     (push.go, codec.go) is the first design's: one agent's endpoints,
//     still accepted and converted to a block.
//   - Shared data, layout version 2 (segment.go): a directory ("WD") and
//     NumSegments segments ("WG") holding agent blocks, each agent in the
//     segment its id hashes to. Writer (writer.go) is the receiver's write
//     step; Cache (cache.go) a router's view, read at the cost of what
//     changed.
//   - The configuration record ("WC", version 1, config.go) carries the
//     model table agents build from Kubernetes objects.
//
// # Push version 1
//
// Integers are little-endian. uvarint is unsigned LEB128 in its shortest form
// (a longer encoding of the same number is rejected). str is a uvarint byte
// length followed by UTF-8 without control characters. Times are int64 Unix
// nanoseconds and must be positive.
//
//	Push     = "WP" 0x01  agent_id:str  seq:u64  send_time:i64
//	           n:uvarint  Endpoint×n                (sorted, unique by namespace,name)
//	Endpoint = namespace:str  name:str  addr_len:u8(4|16)  addr:bytes  port:u16
//	           waiting:uvarint  running:uvarint  kv_cache_usage:f64
//	           max_adapters:uvarint
//	           n_active:uvarint  str×n_active       (sorted, unique)
//	           n_waiting:uvarint str×n_waiting      (sorted, unique)
//	           scrape_time:i64  last_error:u8       (0 = healthy)
//
// Every accepted version 1 byte string has exactly one encoding: decode then
// encode gives back the same bytes.
//
// # Version 2
//
// The grammar of blocks, pushes, segments and the directory is in block.go,
// push2.go and segment.go; testdata/*-v2.hex pin them byte for byte. Blocks
// are read in place: fixed-size records refer to a string table by index,
// so a reader checks bounds and values instead of rebuilding, and a block
// whose identity (strings and endpoints) a reader knows is read for its
// values only.
//
// Times never cross machines. A push carries durations on the sender's
// clock (each scrape's age, how long a relay held a block); the receiver
// counts them back from its own clock when it stores the block, so an
// endpoint is never fresher than the push that carried it, whatever the
// sender's clock says, and a push sent further ahead of the receiver's
// clock than Limits.MaxClockSkew is refused.
//
// The package is plain Go without net/http so it compiles for GOOS=wasip1
// and runs inside the plugin. Writer and Cache allocate nothing per push
// or refresh once warm (a block's strings are made when its identity
// changes).
package wire
