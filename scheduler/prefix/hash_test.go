package prefix

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func newTestHasher(t testing.TB, cfg HashConfig) *Hasher {
	t.Helper()
	h, err := NewHasher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func chatBlocks(t testing.TB, h *Hasher, target, messages string) []uint64 {
	t.Helper()
	if err := h.HashMessages(target, nil, nil, []byte(messages)); err != nil {
		t.Fatalf("HashMessages(%s): %v", messages, err)
	}
	return slices.Clone(h.Blocks())
}

func promptBlocks(t testing.TB, h *Hasher, target, prompt string) []uint64 {
	t.Helper()
	if err := h.HashPrompt(target, nil, []byte(prompt)); err != nil {
		t.Fatalf("HashPrompt(%s): %v", prompt, err)
	}
	return slices.Clone(h.Blocks())
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// commonPrefix is how many leading hashes a and b share.
func commonPrefix(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestSamePrefixSameLeadingHashes(t *testing.T) {
	h := newTestHasher(t, HashConfig{})
	ctx := strings.Repeat("The quarterly report covers revenue, costs and outlook. ", 40) + "Notes:" // 2,246 bytes
	a := promptBlocks(t, h, "m", jsonString(ctx+"Question one: what grew, and which of the product lines grew the most?"))
	b := promptBlocks(t, h, "m", jsonString(ctx+"Question two: what shrank fastest of all, and which region was worst hit?"))
	shared := len(ctx) / DefaultBlockBytes
	if got := commonPrefix(a, b); got != shared {
		t.Fatalf("prompts sharing %d bytes share %d leading hashes, want %d", len(ctx), got, shared)
	}
	if a[shared] == b[shared] {
		t.Fatal("the first block that differs has the same hash")
	}
	// A later difference never changes earlier hashes, and a hash equal at
	// block i is equal at every block before (chaining).
	c := promptBlocks(t, h, "m", jsonString("X"+ctx[1:]+"Question one: what grew, and which of the product lines grew the most?"))
	if commonPrefix(a, c) != 0 {
		t.Fatal("prompts differing in byte 0 share a hash")
	}
	for i := range c {
		if c[i] == a[i] {
			t.Fatalf("block %d equal after a difference in block 0: hashes are not chained", i)
		}
	}
}

func TestTargetAndSaltChangeEveryHash(t *testing.T) {
	h := newTestHasher(t, HashConfig{})
	p := jsonString(strings.Repeat("abcdefgh", 64))
	base := promptBlocks(t, h, "sql-lora-1", p)
	other := promptBlocks(t, h, "sql-lora-2", p)
	if len(base) != 8 || len(other) != 8 {
		t.Fatalf("got %d and %d blocks, want 8", len(base), len(other))
	}
	for i := range base {
		if base[i] == other[i] {
			t.Fatalf("block %d has the same hash under another adapter", i)
		}
	}
	if err := h.HashPrompt("sql-lora-1", []byte(`"tenant-a"`), []byte(p)); err != nil {
		t.Fatal(err)
	}
	if commonPrefix(base, h.Blocks()) != 0 {
		t.Fatal("cache_salt does not change the first hash")
	}
}

func TestChatRenderingIsCanonical(t *testing.T) {
	h := newTestHasher(t, HashConfig{BlockBytes: 16})
	sys := strings.Repeat("You answer questions about SQL. ", 8)
	ref := chatBlocks(t, h, "m", `[{"role":"system","content":`+jsonString(sys)+`},{"role":"user","content":"List the tables, please."}]`)
	same := []struct{ name, messages string }{
		{"key order", `[{"content":` + jsonString(sys) + `,"role":"system"},{"content":"List the tables, please.","role":"user"}]`},
		{"whitespace", "[ {\n\t\"role\" : \"system\" , \"content\" : " + jsonString(sys) + " } ,{\"role\":\"user\",\"content\":\"List the tables, please.\"}\n]"},
		{"escapes", `[{"role":"sys\u0074em","content":` + jsonString(sys) + `},{"role":"user","content":"List the t\u0061bles, please\u002e"}]`},
		{"text part", `[{"role":"system","content":[{"type":"text","text":` + jsonString(sys) + `}]},{"role":"user","content":[{"text":"List the tables, please.","type":"text"}]}]`},
		{"unknown field", `[{"role":"system","content":` + jsonString(sys) + `,"x":1},{"role":"user","content":"List the tables, please."}]`},
	}
	for _, c := range same {
		if got := chatBlocks(t, h, "m", c.messages); !slices.Equal(got, ref) {
			t.Errorf("%s: hashes differ from the reference rendering", c.name)
		}
	}
	differ := []struct{ name, messages string }{
		{"role", `[{"role":"user","content":` + jsonString(sys) + `},{"role":"user","content":"List the tables, please."}]`},
		{"message boundary", `[{"role":"system","content":` + jsonString(sys+"List") + `},{"role":"user","content":" the tables, please."}]`},
		{"two parts", `[{"role":"system","content":` + jsonString(sys) + `},{"role":"user","content":[{"type":"text","text":"List the tables,"},{"type":"text","text":" please."}]}]`},
		{"name", `[{"role":"system","name":"ann","content":` + jsonString(sys) + `},{"role":"user","content":"List the tables, please."}]`},
		{"content before role", `[{"content":` + jsonString(sys) + `,"role":"user"},{"role":"user","content":"List the tables, please."}]`},
	}
	for _, c := range differ {
		got := chatBlocks(t, h, "m", c.messages)
		if slices.Equal(got, ref) {
			t.Errorf("%s: same hashes as the reference, want them to differ", c.name)
		}
	}
}

func TestMultiTurnSharesEveryFullBlockOfTheEarlierTurn(t *testing.T) {
	h := newTestHasher(t, HashConfig{})
	turn1 := `{"role":"system","content":"You are terse."},{"role":"user","content":` + jsonString(strings.Repeat("Explain B-trees. ", 20)) + `}`
	turn2 := turn1 + `,{"role":"assistant","content":` + jsonString(strings.Repeat("They are balanced. ", 15)) + `},{"role":"user","content":"And LSM trees?"}`
	a := chatBlocks(t, h, "m", "["+turn1+"]")
	b := chatBlocks(t, h, "m", "["+turn2+"]")
	if len(a) == 0 || commonPrefix(a, b) != len(a) {
		t.Fatalf("turn 2 shares %d of turn 1's %d blocks, want all", commonPrefix(a, b), len(a))
	}
}

func TestNonTextPartsAreOpaqueBytes(t *testing.T) {
	h := newTestHasher(t, HashConfig{BlockBytes: 16})
	img := func(url string) string {
		return `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + url + `"}},{"type":"text","text":"What is this?"}]}]`
	}
	a := chatBlocks(t, h, "m", img("data:image/png;base64,"+strings.Repeat("QUJD", 40)))
	b := chatBlocks(t, h, "m", img("data:image/png;base64,"+strings.Repeat("QUJD", 39)+"QUJE"))
	c := chatBlocks(t, h, "m", strings.ReplaceAll(img("data:image/png;base64,"+strings.Repeat("QUJD", 40)), `":{"`, `": { "`))
	if slices.Equal(a, b) {
		t.Fatal("two different images hash the same")
	}
	if !slices.Equal(a, c) {
		t.Fatal("whitespace inside an image part changes its hash")
	}
	// Deeply nested parts and unknown part types are opaque too.
	nested := `[{"role":"user","content":[{"type":"x","v":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}]}]`
	if err := h.HashMessages("m", nil, nil, []byte(nested)); err != nil {
		t.Fatalf("deeply nested part: %v", err)
	}
}

func TestTokenIDs(t *testing.T) {
	h := newTestHasher(t, HashConfig{})
	ids := make([]string, 40)
	for i := range ids {
		ids[i] = fmt.Sprint(1000 + i)
	}
	a := promptBlocks(t, h, "m", "["+strings.Join(ids, ",")+"]")
	if len(a) != 2 { // 40 tokens × 4 bytes = 160 bytes: 2 full blocks of 16 tokens
		t.Fatalf("40 token ids gave %d blocks, want 2", len(a))
	}
	b := promptBlocks(t, h, "m", "[["+strings.Join(ids[:32], ", ")+"],[1,2]]")
	if !slices.Equal(a, b) {
		t.Fatal("a batch's first token array does not hash like the same single prompt")
	}
	text := promptBlocks(t, h, "m", jsonString(strings.Repeat("x", 160)))
	if commonPrefix(a, text) != 0 {
		t.Fatal("token ids and text share hashes")
	}
	batch := promptBlocks(t, h, "m", `["`+strings.Repeat("y", 130)+`","other"]`)
	single := promptBlocks(t, h, "m", `"`+strings.Repeat("y", 130)+`"`)
	if !slices.Equal(batch, single) {
		t.Fatal("a batch of strings does not hash its first prompt")
	}
}

func TestBadShapes(t *testing.T) {
	h := newTestHasher(t, HashConfig{})
	prompts := []string{`5`, `{}`, `true`, `null`, `[1.5]`, `[-1]`, `[4294967296]`, `[1,"a"]`, `["a",1]`, `[[1],["a"]]`, `[[1],[2.5]]`, `[{}]`, `[null]`}
	for _, p := range prompts {
		if err := h.HashPrompt("m", nil, []byte(p)); !errors.Is(err, ErrPromptShape) {
			t.Errorf("prompt %s: err %v, want ErrPromptShape", p, err)
		}
	}
	messages := []string{`{}`, `[1]`, `["hi"]`, `[{"content":"no role"}]`, `[{"role":5,"content":"x"}]`,
		`[{"role":"user","content":5}]`, `[{"role":"user","content":{"text":"x"}}]`, `[{"role":"user","content":[5]}]`, `[{"role":"user","content":[null]}]`}
	for _, m := range messages {
		if err := h.HashMessages("m", nil, nil, []byte(m)); !errors.Is(err, ErrMessageShape) {
			t.Errorf("messages %s: err %v, want ErrMessageShape", m, err)
		}
	}
	ok := []string{`[]`, `[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]`, `[{"role":"user"}]`, `[{"role":"user","content":["plain string part"]}]`}
	for _, m := range ok {
		if err := h.HashMessages("m", nil, nil, []byte(m)); err != nil {
			t.Errorf("messages %s: %v", m, err)
		}
	}
	if err := h.HashPrompt("m", nil, []byte(`""`)); err != nil || len(h.Blocks()) != 0 {
		t.Errorf("empty prompt: err %v, %d blocks", err, len(h.Blocks()))
	}
}

func TestMaxBlocksBoundsWork(t *testing.T) {
	h := newTestHasher(t, HashConfig{BlockBytes: 64, MaxBlocks: 10})
	big := jsonString(strings.Repeat("z", 64*100+5))
	if err := h.HashPrompt("m", nil, []byte(big)); err != nil {
		t.Fatal(err)
	}
	if len(h.Blocks()) != 10 || !h.Truncated() || h.Bytes() != 64*100+5 {
		t.Fatalf("blocks %d truncated %v bytes %d", len(h.Blocks()), h.Truncated(), h.Bytes())
	}
}

func TestKeyOfShortPrompts(t *testing.T) {
	h := newTestHasher(t, HashConfig{})
	key := func(p string) uint64 {
		if err := h.HashPrompt("m", nil, []byte(p)); err != nil {
			t.Fatal(err)
		}
		return h.Key()
	}
	if key(`"hi"`) == key(`"ho"`) {
		t.Fatal("short prompts that differ share a key")
	}
	long := strings.Repeat("q", 64)
	if key(jsonString(long+"a")) != key(jsonString(long+"bbbbbb")) {
		t.Fatal("prompts sharing their first block have different keys")
	}
	if key(`""`) != key(`[]`) {
		t.Fatal("empty prompts have different keys")
	}
}

func TestHashingAllocatesNothing(t *testing.T) {
	h := newTestHasher(t, HashConfig{})
	msgs := []byte(benchChat(4 << 10))
	prompt := []byte(jsonString(strings.Repeat("abc ", 1024)))
	_ = h.HashMessages("m", nil, nil, msgs) // grow the block slice once
	if n := testing.AllocsPerRun(50, func() {
		_ = h.HashMessages("sql-lora-1", []byte(`"salt"`), []byte(`[{"type":"function"}]`), msgs)
		_ = h.HashPrompt("sql-lora-1", nil, prompt)
	}); n != 0 {
		t.Fatalf("%v allocations per request, want 0", n)
	}
}

// benchChat is a chat body's "messages" of about n bytes: a system prompt,
// then user/assistant turns with some escapes.
func benchChat(n int) string {
	var b strings.Builder
	b.WriteString(`[{"role":"system","content":"You are a helpful assistant that writes careful, well-tested Go code.\nAnswer briefly."}`)
	turn := 0
	for b.Len() < n {
		role := "user"
		if turn%2 == 1 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `,{"role":%q,"content":%s}`, role, jsonString(fmt.Sprintf("Turn %d: %s \"quoted\" and a tab\t.", turn, strings.Repeat("lorem ipsum dolor sit amet ", 20))))
		turn++
	}
	b.WriteString("]")
	return b.String()
}

func BenchmarkHashMessages(b *testing.B) {
	for _, kib := range []int{4, 64, 256} {
		msgs := []byte(benchChat(kib << 10))
		b.Run(fmt.Sprintf("%dKiB", kib), func(b *testing.B) {
			h := newTestHasher(b, HashConfig{})
			b.SetBytes(int64(len(msgs)))
			b.ReportAllocs()
			for b.Loop() {
				if err := h.HashMessages("sql-lora-1", nil, nil, msgs); err != nil {
					b.Fatal(err)
				}
			}
			reportPerKiB(b, len(msgs))
		})
	}
}

func BenchmarkHashPrompt(b *testing.B) {
	for _, kib := range []int{4, 64, 256} {
		p := []byte(jsonString(strings.Repeat("lorem ipsum dolor sit amet ", kib<<10/27)))
		b.Run(fmt.Sprintf("%dKiB", kib), func(b *testing.B) {
			h := newTestHasher(b, HashConfig{})
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				if err := h.HashPrompt("m", nil, p); err != nil {
					b.Fatal(err)
				}
			}
			reportPerKiB(b, len(p))
		})
	}
}

// reportPerKiB reports nanoseconds per KiB of input.
func reportPerKiB(b *testing.B, size int) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(float64(size)/1024), "ns/KiB")
}

func TestHashTokensIsThePromptOfIDs(t *testing.T) {
	h := newTestHasher(t, HashConfig{})
	ids := make([]uint32, 100)
	strs := make([]string, 100)
	for i := range ids {
		ids[i] = uint32(i * 7919)
		strs[i] = fmt.Sprint(ids[i])
	}
	want := promptBlocks(t, h, "m", "["+strings.Join(strs, ",")+"]")
	h.HashTokens("m", nil, ids)
	if !slices.Equal(want, h.Blocks()) || len(want) != 6 {
		t.Fatalf("HashTokens gave %d blocks differing from the prompt's %d", len(h.Blocks()), len(want))
	}
}

// The one-pass path (whole plain blocks hashed while they are checked for
// the string's end) gives the hashes of the canonical stream written
// byte for byte, wherever escapes fall, from any block offset, and stops
// at MaxBlocks.
func TestOnePassStringHashingIsTheStream(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for trial := range 300 {
		// Long plain runs (whole plain blocks) with escapes here and there.
		n := r.IntN(700)
		text := make([]byte, n)
		for i := range text {
			text[i] = "abcdefgh ijklmnop"[r.IntN(17)]
			if r.IntN(150) == 0 {
				text[i] = "\"\\\n\té"[r.IntN(6)]
			}
		}
		if !utf8.Valid(text) {
			text = []byte(strings.ToValidUTF8(string(text), "?"))
		}
		maxBlocks := []int{DefaultMaxBlocks, 1 + r.IntN(6)}[r.IntN(2)]
		h := newTestHasher(t, HashConfig{MaxBlocks: maxBlocks})
		ref := newTestHasher(t, HashConfig{MaxBlocks: maxBlocks})
		lead := strings.Repeat("x", r.IntN(70)) // the block offset the string starts at
		if err := h.HashPrompt("m", nil, []byte(jsonString(lead+string(text)))); err != nil {
			t.Fatal(err)
		}
		ref.Reset(Seed("m", ModeText, nil))
		ref.Write([]byte(lead))
		ref.Write(text)
		if !slices.Equal(h.Blocks(), ref.Blocks()) || h.Key() != ref.Key() || h.Truncated() != ref.Truncated() {
			t.Fatalf("trial %d (%d bytes after %d, maxBlocks %d): %d blocks, want %d", trial, n, len(lead), maxBlocks, len(h.Blocks()), len(ref.Blocks()))
		}
		if !h.Truncated() && h.Bytes() != ref.Bytes() {
			t.Fatalf("trial %d: %d bytes counted, want %d", trial, h.Bytes(), ref.Bytes())
		}
	}
}

// The hashes are part of what other VMs, Envoy replicas and the fleet
// benchmark's results hold: a faster hashing loop must give exactly these
// (pinned from the hashes the fleet results were measured with). A change
// of the hash itself changes them, and needs the seedBase version raised.
func TestBlockHashesArePinned(t *testing.T) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40)
	chat := `[{"role":"system","content":"You are \"helpful\".\n"},{"role":"user","content":` + jsonString(text+"é\u2028") +
		`},{"role":"assistant","content":[{"type":"text","text":"Sure"},{"type":"image_url","image_url":{"url":"x"}}]}]`
	ids := make([]uint32, 100)
	for i := range ids {
		ids[i] = uint32(i * 7919)
	}
	cases := []struct {
		name      string
		blockSize int
		hash      func(h *Hasher) error
		want      uint64
	}{
		{"chat", 64, func(h *Hasher) error { return h.HashMessages("m", nil, nil, []byte(chat)) }, 0x24f61307bdd083ed},
		{"prompt", 64, func(h *Hasher) error { return h.HashPrompt("adapter-1", []byte(`"salt"`), []byte(jsonString(text))) }, 0x526fef005cad9fff},
		{"tokens", 64, func(h *Hasher) error { h.HashTokens("m", nil, ids); return nil }, 0x4b1aab32c791a132},
		{"chat, 48-byte blocks", 48, func(h *Hasher) error { return h.HashMessages("m", nil, nil, []byte(chat)) }, 0x1d31d6fb715164dd},
	}
	for _, c := range cases {
		h := newTestHasher(t, HashConfig{BlockBytes: c.blockSize})
		if err := c.hash(h); err != nil {
			t.Fatal(err)
		}
		// One number for the whole chain, and the key.
		d := h.Key()
		for _, b := range h.Blocks() {
			d = d*prime1 ^ b
		}
		if d != c.want {
			t.Errorf("%s: %d blocks, digest %#x, want %#x", c.name, len(h.Blocks()), d, c.want)
		}
	}
}

// specialWord flags a word's first quote or backslash, and nothing in a
// word without one (it may flag bytes after a real one), as
// quoteOrBackslash does.
func TestSpecialWordFindsTheFirstQuoteOrBackslash(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	alphabet := []byte{0, 1, ' ', '!', '"', '#', '[', '\\', ']', 'a', 0x7f, 0x80, 0x81, 0xa2, 0xdc, 0xe2, 0xff}
	for trial := range 200000 {
		var w [8]byte
		for i := range w {
			if trial%2 == 0 {
				w[i] = alphabet[r.IntN(len(alphabet))]
			} else {
				w[i] = byte(r.Uint32())
			}
		}
		first := -1
		for i, c := range w {
			if c == '"' || c == '\\' {
				first = i
				break
			}
		}
		x := binary.LittleEndian.Uint64(w[:])
		for name, got := range map[string]uint64{"specialWord": specialWord(x) & 0x8080808080808080, "quoteOrBackslash": quoteOrBackslash(x)} {
			flagged := -1
			if got != 0 {
				flagged = bits.TrailingZeros64(got) / 8
			}
			if flagged != first {
				t.Fatalf("%s(% x): first flagged byte %d, want %d", name, w, flagged, first)
			}
		}
	}
}
