package vllmsim

import (
	"encoding/binary"
	"hash/fnv"
	"strings"
)

// Token identity. The replica model works on token ids: requests whose
// prompts start with the same tokens (for the same adapter) share KV blocks.
// The fleet workloads generate the ids; the HTTP simulator derives them from
// the text with TextTokens, after rendering chat messages with RenderChat.

// BytesPerToken is the simulator's tokenizer: every 4 bytes of UTF-8 text
// are one token (about what Llama tokenizers give for English text).
const BytesPerToken = 4

// TextTokens splits text into tokens of BytesPerToken bytes: token i is
// bytes 4i..4i+3 read as a little-endian uint32, the last one zero-padded.
// Identical leading text thus gives identical leading tokens (up to the
// last whole 4-byte piece), which is what prefix caching needs. dst is
// reused when it has room.
func TextTokens(dst []uint32, text string) []uint32 {
	dst = dst[:0]
	for len(text) >= BytesPerToken {
		dst = append(dst, uint32(text[0])|uint32(text[1])<<8|uint32(text[2])<<16|uint32(text[3])<<24)
		text = text[BytesPerToken:]
	}
	if len(text) > 0 {
		var last [BytesPerToken]byte
		copy(last[:], text)
		dst = append(dst, binary.LittleEndian.Uint32(last[:]))
	}
	return dst
}

// TextTokenCount is len(TextTokens(text)) without building the slice.
func TextTokenCount(text string) int {
	return (len(text) + BytesPerToken - 1) / BytesPerToken
}

// ChatMessage is one message as the chat template sees it: a role and its
// content already flattened to text (see RenderChat).
type ChatMessage struct {
	Role, Content string
}

// RenderChat applies the simulator's one fixed chat template, as vLLM
// applies the model's template before tokenizing:
//
//	<|role|>content\n   for every message, then
//	<|assistant|>        (the generation prompt)
//
// The same conversation prefix always renders to the same leading bytes, so
// a conversation's next turn shares its history's tokens.
func RenderChat(msgs []ChatMessage) string {
	n := len(chatGenerationPrompt)
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 5
	}
	var b strings.Builder
	b.Grow(n)
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>")
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	b.WriteString(chatGenerationPrompt)
	return b.String()
}

const chatGenerationPrompt = "<|assistant|>"

// fillerToken is token i of the filler that pads a prompt to its
// sim_prompt_tokens length; the same text with the same hint gives the same
// tokens.
func fillerToken(i int) uint32 { return 0xf000_0000 | uint32(i)&0x0fff_ffff }

// OutputToken is the id of the i-th token (from 0) a request generates with
// output seed seed. Generation is a pure function of the seed: two requests
// with the same prompt and seed generate the same tokens (as greedy decoding
// of one prompt does), and a workload that knows the seed can put a
// response into the next turn's prompt token for token.
func OutputToken(seed uint64, i int) uint32 {
	return uint32(fmix64(seed^uint64(i)*0x9e3779b97f4a7c15) >> 16)
}

// Block hashes. vLLM V1 identifies a full block by a hash of (parent block's
// hash, the block's token ids, extra keys), where the extra keys of every
// block start with the LoRA adapter's name (vllm/v1/core/kv_cache_utils.py,
// hash_block_tokens and generate_block_hash_extra_keys). The chain makes a
// hit on block k imply blocks 0..k. The simulator keeps that structure with
// a fast 64-bit mix instead of vLLM's SHA-256 (its hash values never leave
// the replica, so only equality matters).

// noneHash is the parent of a request's first block (vLLM's NONE_HASH).
const noneHash uint64 = 0x243f6a8885a308d3

// adapterKey is the extra key for a LoRA adapter's name; 0 for the base
// model.
func adapterKey(name string) uint64 {
	if name == "" {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return h.Sum64() | 1
}

// hashBlock chains one full block of tokens to its parent's hash.
func hashBlock(parent, extra uint64, tokens []uint32) uint64 {
	h := parent ^ extra*0xff51afd7ed558ccd
	i := 0
	for ; i+1 < len(tokens); i += 2 {
		h = mixWord(h, uint64(tokens[i])|uint64(tokens[i+1])<<32)
	}
	if i < len(tokens) {
		h = mixWord(h, uint64(tokens[i])|1<<63)
	}
	return fmix64(h^uint64(len(tokens))) | 1 // never 0: hashIndex's empty key
}

// hashOutputBlock is hashBlock of the n generated tokens from the
// from-th on (OutputToken(seed, from), ...), without writing them out.
func hashOutputBlock(parent, extra, seed uint64, from, n int) uint64 {
	h := parent ^ extra*0xff51afd7ed558ccd
	i := 0
	for ; i+1 < n; i += 2 {
		h = mixWord(h, uint64(OutputToken(seed, from+i))|uint64(OutputToken(seed, from+i+1))<<32)
	}
	if i < n {
		h = mixWord(h, uint64(OutputToken(seed, from+i))|1<<63)
	}
	return fmix64(h^uint64(n)) | 1
}

func mixWord(h, w uint64) uint64 {
	h = (h ^ w) * 0x9fb21c651e98df25
	return h ^ h>>29
}

// fmix64 is MurmurHash3's 64-bit finalizer.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
