// Package prefix is the plain-Go core of prefix-cache-aware routing: it
// turns a request's prompt into chained block hashes, remembers which
// endpoints recently received which blocks (an index that lives in a
// key/value store with compare-and-swap, Envoy shared data in the plugin),
// and picks an endpoint by rendezvous hashing with bounded loads when the
// index knows nothing about a prompt.
//
// It imports nothing from the plugin or the Wasm binding: the Proxy-Wasm
// plugin and the fleet benchmark run the same code.
//
// # Hashing
//
// A Hasher reads the raw JSON values the request parser already located
// ("prompt", "messages", "tools"), trusting that the document was validated,
// and renders them into one canonical byte stream: the same conversation
// prefix always gives the same bytes, whatever the JSON key order or string
// escaping. The stream is cut into blocks of BlockBytes (64 by default:
// about vLLM's 16-token blocks at 4 bytes per token) and block i's hash
// covers block i and, through the previous hash, every block before it, so
// equal hash i means equal blocks 0..i. The chain's seed covers the target
// model or adapter and the request's cache_salt, so another adapter gives
// other hashes from block 0 on. Hashing allocates nothing once the Hasher's
// buffers have grown.
//
// The canonical stream (byte values are ASCII control codes a prompt does
// not normally contain):
//
//	tools        FS(0x1C) + the tools value without insignificant whitespace
//	each message RS(0x1E) role US(0x1F) parts [US(0x1F) name] [SUB(0x1A) tool_calls] [EM(0x19) tool_call_id]
//	parts        a string content is one text part; parts are joined by GS(0x1D);
//	             a text part is its decoded text; any other part (image_url,
//	             input_audio, ...) is FS(0x1C) + the part object without
//	             insignificant whitespace (opaque bytes)
//	prompt       a string: its decoded text; token ids: 4 little-endian bytes
//	             each (so 64-byte blocks are 16 tokens, vLLM's default); a
//	             batch (array of strings or of token arrays): its first prompt
//
// # Index
//
// See Index.
//
// # Consistent choice
//
// See Rendezvous.
package prefix
