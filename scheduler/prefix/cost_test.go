package prefix

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// The request shapes of e2e/envoyhost's BenchmarkPrefixFilterCallbacks, to
// split the plugin's per-request cost into its prefix parts (run these
// natively, or built for wasip1 to count the guest's share).

// hostBenchBody is that benchmark's chat body of about kib KiB: a system
// prompt and one long user message, role first.
func hostBenchBody(kib int) (messages []byte, response []byte) {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	content := strings.Repeat("The quick brown fox jumps over the lazy dog. ", kib*1024/45)
	messages = []byte(`[{"role":"system","content":` + q("You are helpful.") + `},{"role":"user","content":` + q(content) + `}]`)
	response = []byte(`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"Sure."}}],"usage":{"prompt_tokens":` +
		strconv.Itoa(len(messages)/4) + `,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":` + strconv.Itoa(len(messages)/4-16) + `}}}`)
	return messages, response
}

func BenchmarkHashHostBody(b *testing.B) {
	for _, kib := range []int{4, 64, 220, 256} {
		msgs, _ := hostBenchBody(kib)
		b.Run(fmt.Sprintf("%dKiB", kib), func(b *testing.B) {
			h := newTestHasher(b, HashConfig{})
			b.SetBytes(int64(len(msgs)))
			for b.Loop() {
				if err := h.HashMessages("chat", nil, nil, msgs); err != nil {
					b.Fatal(err)
				}
			}
			reportPerKiB(b, len(msgs))
		})
	}
}

// BenchmarkHashHostBodyNoEscapes is BenchmarkHashHostBody as the plugin
// hashes it: the filter's parser found no backslash in the body.
func BenchmarkHashHostBodyNoEscapes(b *testing.B) {
	for _, kib := range []int{4, 256} {
		msgs, _ := hostBenchBody(kib)
		b.Run(fmt.Sprintf("%dKiB", kib), func(b *testing.B) {
			h := newTestHasher(b, HashConfig{})
			h.SetNoEscapes(true)
			b.SetBytes(int64(len(msgs)))
			for b.Loop() {
				if err := h.HashMessages("chat", nil, nil, msgs); err != nil {
					b.Fatal(err)
				}
			}
			reportPerKiB(b, len(msgs))
		})
	}
}

func BenchmarkUsageScanHostResponse(b *testing.B) {
	_, resp := hostBenchBody(4)
	var s UsageScanner
	b.SetBytes(int64(len(resp)))
	for b.Loop() {
		s.Reset()
		s.Write(resp)
		s.Finish()
	}
	if _, _, hp, hc := s.Result(); !hp || !hc {
		b.Fatal("no usage found")
	}
}

// BenchmarkUsageScanLongResponse: a 4 KiB completion before the usage,
// searched (the scanner) or tokenized byte by byte (as before it searched).
func BenchmarkUsageScanLongResponse(b *testing.B) {
	resp := []byte(`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":` +
		strconv.Quote(strings.Repeat("Sure, here is the \"code\": {x: 1}.\n", 4096/36)) +
		`}}],"usage":{"prompt_tokens":1000,"completion_tokens":900,"prompt_tokens_details":{"cached_tokens":960}}}`)
	for _, everywhere := range []bool{false, true} {
		b.Run(map[bool]string{false: "search", true: "tokenize"}[everywhere], func(b *testing.B) {
			var s UsageScanner
			b.SetBytes(int64(len(resp)))
			for b.Loop() {
				s.Reset()
				s.everywhere = everywhere
				s.Write(resp)
				s.Finish()
			}
			if _, c, _, hc := s.Result(); !hc || c != 960 {
				b.Fatal("no usage found")
			}
		})
	}
}
