package prefix

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

type usageResult struct {
	prompt, cached         int64
	havePrompt, haveCached bool
}

func scanAll(chunks ...string) usageResult {
	var s UsageScanner
	for _, c := range chunks {
		s.Write([]byte(c))
	}
	s.Finish()
	p, c, hp, hc := s.Result()
	return usageResult{p, c, hp, hc}
}

const chatResponse = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"The \"usage\": {\"prompt_tokens\": 9} is text."},"finish_reason":"stop"}],"usage":{"prompt_tokens":1234,"total_tokens":1300,"completion_tokens":66,"prompt_tokens_details":{"cached_tokens":1024}}}`

const streamResponse = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n" +
	"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo {\\\"usage\\\"\"},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n" +
	"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":500,\"total_tokens\":510,\"completion_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":480}}}\n\n" +
	"data: [DONE]\n\n"

func TestUsageFromJSONBody(t *testing.T) {
	got := scanAll(chatResponse)
	if got != (usageResult{1234, 1024, true, true}) {
		t.Fatalf("got %+v", got)
	}
}

func TestUsageFromStreamAtEverySplit(t *testing.T) {
	want := usageResult{500, 480, true, true}
	if got := scanAll(streamResponse); got != want {
		t.Fatalf("whole stream: %+v", got)
	}
	for i := range len(streamResponse) {
		if got := scanAll(streamResponse[:i], streamResponse[i:]); got != want {
			t.Fatalf("split at %d: %+v", i, got)
		}
	}
	// Byte by byte.
	chunks := strings.Split(streamResponse, "")
	if got := scanAll(chunks...); got != want {
		t.Fatalf("byte by byte: %+v", got)
	}
}

func TestUsageAbsentOrPartial(t *testing.T) {
	cases := []struct {
		name string
		body string
		want usageResult
	}{
		{"stream without a usage chunk", "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n", usageResult{}},
		{"no details", `{"usage":{"prompt_tokens":12,"completion_tokens":3}}`, usageResult{12, 0, true, false}},
		{"details null", `{"usage":{"prompt_tokens":12,"prompt_tokens_details":null}}`, usageResult{12, 0, true, false}},
		{"usage null", `{"usage":null}`, usageResult{}},
		{"cached_tokens outside details", `{"usage":{"prompt_tokens":7,"cached_tokens":5},"prompt_tokens_details":{"cached_tokens":6}}`, usageResult{7, 0, true, false}},
		{"nested elsewhere", `{"x":{"usage":{"prompt_tokens":3}},"prompt_tokens":99}`, usageResult{3, 0, true, false}},
		{"whitespace", "{ \"usage\" :\n { \"prompt_tokens\" : 40 , \"prompt_tokens_details\" : { \"cached_tokens\" : 32 } } }", usageResult{40, 32, true, true}},
		{"continuous usage: last wins", `data: {"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":8}}}` + "\n\n" + `data: {"usage":{"prompt_tokens":10}}` + "\n\n", usageResult{10, 0, true, false}},
		{"garbage", "\x00\xff}}}]]]\"\n::::123", usageResult{}},
		{"broken event then a good one", "data: {\"usage\":{\"prompt_tokens\":\"unterminated\n\ndata: {\"usage\":{\"prompt_tokens\":5}}\n\n", usageResult{5, 0, true, false}},
	}
	for _, c := range cases {
		if got := scanAll(c.body); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestUsageScannerAllocatesNothing(t *testing.T) {
	var s UsageScanner
	b := []byte(streamResponse + chatResponse)
	if n := testing.AllocsPerRun(100, func() { s.Reset(); s.Write(b); s.Finish() }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

func TestJudge(t *testing.T) {
	// Predicted 100 of 100 blocks; the server reported 2,000 of 4,000 tokens cached.
	pred, forget := Judge(100, 100, 4000, 2000, 4)
	if pred != 4000 || forget != 50 {
		t.Fatalf("Judge = %d, %d; want 4000, 50", pred, forget)
	}
	// Within rounding: nothing to forget.
	if _, forget := Judge(100, 96, 4000, 3780, 4); forget != -1 {
		t.Fatalf("a near match forgets from %d", forget)
	}
	// A hit bigger than predicted corrects nothing either.
	if _, forget := Judge(100, 0, 4000, 3000, 4); forget != -1 {
		t.Fatal("an unpredicted hit forgets")
	}
	// Nonsense reports are clamped, not trusted.
	if _, forget := Judge(100, 100, 4000, 9999, 4); forget != -1 {
		t.Fatal("cached > prompt forgets")
	}
	if p, forget := Judge(0, 0, 0, 0, 4); p != 0 || forget != -1 {
		t.Fatal("an empty prompt judged")
	}
}

func FuzzUsageScanner(f *testing.F) {
	f.Add([]byte(chatResponse), 10)
	f.Add([]byte(streamResponse), 77)
	f.Add([]byte(`{"usage":{"prompt_tokens":1}}`), 0)
	f.Fuzz(func(t *testing.T, body []byte, split int) {
		var whole, parts UsageScanner
		whole.Write(body)
		whole.Finish()
		if len(body) > 0 {
			split = ((split % len(body)) + len(body)) % len(body)
		} else {
			split = 0
		}
		parts.Write(body[:split])
		parts.Write(body[split:])
		parts.Finish()
		a1, b1, c1, d1 := whole.Result()
		a2, b2, c2, d2 := parts.Result()
		if a1 != a2 || b1 != b2 || c1 != c2 || d1 != d2 {
			t.Fatalf("chunking changed the result: %v %v %v %v vs %v %v %v %v", a1, b1, c1, d1, a2, b2, c2, d2)
		}
		if a1 < 0 || b1 < 0 {
			t.Fatalf("negative counts %d %d", a1, b1)
		}
	})
}

// scanEverywhere is the scanner tokenizing every byte, as it did before
// it searched for the "usage" key.
func scanEverywhere(chunks ...[]byte) usageResult {
	s := UsageScanner{everywhere: true}
	for _, c := range chunks {
		s.Write(c)
	}
	s.Finish()
	p, c, hp, hc := s.Result()
	return usageResult{p, c, hp, hc}
}

func scanChunks(chunks ...[]byte) usageResult {
	var s UsageScanner
	for _, c := range chunks {
		s.Write(c)
	}
	s.Finish()
	p, c, hp, hc := s.Result()
	return usageResult{p, c, hp, hc}
}

// Searching for the key finds what tokenizing everything finds, on
// responses full of decoys ("usage" in strings, escaped, as a value, as a
// longer key, null usage in earlier events), split anywhere.
func TestUsageSearchFindsWhatTokenizingFinds(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	decoys := []string{
		`"content":"the \"usage\": {\"prompt_tokens\": 9}"`, `"role":"usage"`, `"usage_x":{"prompt_tokens":5}`,
		`"x\\":"usage"`, `"say \"usage":{"prompt_tokens":777}`, `"usage":null`, `"a":"\\\"usage\\\""`, `"n":[1,{"usage":null},"usage"]`, `"usage" : null`,
	}
	for trial := range 400 {
		var b strings.Builder
		events := 1 + r.IntN(3)
		for e := range events {
			if r.IntN(2) == 0 {
				b.WriteString("data: ")
			}
			b.WriteString(`{"id":"c"`)
			for range r.IntN(4) {
				b.WriteString("," + decoys[r.IntN(len(decoys))])
			}
			if e == events-1 || r.IntN(3) == 0 {
				fmt.Fprintf(&b, `, "usage" :{"prompt_tokens":%d,"x":{"prompt_tokens":1},"prompt_tokens_details":{"cached_tokens":%d}}`, r.IntN(5000), r.IntN(5000))
			}
			for range r.IntN(3) { // decoys after the usage too
				b.WriteString("," + decoys[r.IntN(len(decoys))])
			}
			b.WriteString("}\n\n")
		}
		body := []byte(b.String())
		want := scanEverywhere(body)
		if !want.havePrompt || !want.haveCached {
			t.Fatalf("trial %d: the reference found no usage in %s", trial, body)
		}
		if got := scanChunks(body); got != want {
			t.Fatalf("trial %d: whole %+v, want %+v\n%s", trial, got, want, body)
		}
		for range 20 {
			i, j := r.IntN(len(body)+1), r.IntN(len(body)+1)
			i, j = min(i, j), max(i, j)
			if got := scanChunks(body[:i], body[i:j], body[j:]); got != want {
				t.Fatalf("trial %d: split at %d, %d: %+v, want %+v\n%s", trial, i, j, got, want, body)
			}
		}
		// Byte by byte.
		chunks := make([][]byte, len(body))
		for i := range body {
			chunks[i] = body[i : i+1]
		}
		if got := scanChunks(chunks...); got != want {
			t.Fatalf("trial %d: byte by byte %+v, want %+v", trial, got, want)
		}
	}
}

// FuzzUsageSearch: on valid JSON, searching for the key gives what
// tokenizing every byte gives, whole or in two chunks.
func FuzzUsageSearch(f *testing.F) {
	f.Add([]byte(chatResponse), 10)
	f.Add([]byte(`{"a":"\"usage\"","usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":1}}}`), 3)
	f.Add([]byte(`["usage",{"usage":null},{"usage":{"prompt_tokens":2}}]`), 9)
	f.Fuzz(func(t *testing.T, body []byte, split int) {
		if !json.Valid(body) {
			return
		}
		want := scanEverywhere(body)
		if got := scanChunks(body); got != want {
			t.Fatalf("whole: %+v, want %+v", got, want)
		}
		if len(body) > 0 {
			split = ((split % len(body)) + len(body)) % len(body)
		}
		if got := scanChunks(body[:split], body[split:]); got != want {
			t.Fatalf("split at %d: %+v, want %+v", split, got, want)
		}
	})
}

// The usual usage objects are read whole (readUsage) and give what
// tokenizing every byte gives; the shapes it leaves to the tokenizer too.
func TestUsageReadWholeIsTheTokenizersReading(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 36))
	members := []string{`"prompt_tokens":%d`, `"completion_tokens":7`, `"total_tokens":1.5e3`, `"prompt_tokens":null`,
		`"prompt_tokens":-4`, `"prompt_tokens":12.75`, `"prompt_tokens":"9"`, `"note":"plain"`, `"ok":true`,
		`"prompt_tokens_details":{"cached_tokens":%d,"audio_tokens":0}`, `"prompt_tokens_details":null`,
		`"prompt_tokens_details":{"cached_tokens":null}`, `"prompt_tokens_details" : { "cached_tokens" : %d }`,
		"\n\t\"prompt_tokens\" :\r\n %d", `"cached_tokens":%d`, `"prompt_tokens_details":{"prompt_tokens":%d}`,
		// Left to the tokenizer:
		`"x":{"prompt_tokens":1}`, `"arr":[1,2]`, `"esc":"a\"b"`, `"usage":{"prompt_tokens":3}`,
		`"prompt_tokens_details":{"cached_tokens":%d,"more":{"a":1}}`}
	readWhole := 0
	for trial := range 3000 {
		var b strings.Builder
		b.WriteString(`{"id":"x","usage":{`)
		for m := range r.IntN(6) {
			if m > 0 {
				b.WriteString(",")
			}
			f := members[r.IntN(len(members))]
			if strings.Contains(f, "%d") {
				f = fmt.Sprintf(f, r.IntN(1<<20))
			}
			b.WriteString(f)
		}
		b.WriteString("}}")
		body := []byte(b.String())
		want := scanEverywhere(body)
		if got := scanChunks(body); got != want {
			t.Fatalf("trial %d: %+v, want %+v\n%s", trial, got, want, body)
		}
		var s UsageScanner
		if _, ok := s.readUsage(body, strings.Index(b.String(), usageToken)); ok {
			readWhole++
		}
		for range 5 {
			i := r.IntN(len(body) + 1)
			if got := scanChunks(body[:i], body[i:]); got != want {
				t.Fatalf("trial %d: split at %d: %+v, want %+v\n%s", trial, i, got, want, body)
			}
		}
	}
	if readWhole < 1000 {
		t.Fatalf("only %d of 3000 usage objects were read whole", readWhole)
	}
	var s UsageScanner
	if _, ok := s.readUsage([]byte(chatResponse), strings.Index(chatResponse, `"usage":{`)); !ok {
		t.Fatal("a chat response's usage was not read whole")
	}
}

// TestIndexUsageTokenIsTheFirstOccurrence checks the word-at-a-time search
// against strings.Index from every start, on strings dense in quotes, 'u's
// and partial tokens (where the masks flag extra candidates).
func TestIndexUsageTokenIsTheFirstOccurrence(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	pieces := []string{`"`, `u`, `"u`, `"usag`, `"usage`, `"usage"`, `\"usage"`, `x`, `"usagE"`, `uu"`}
	for range 3000 {
		var b strings.Builder
		for range r.IntN(12) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		s := b.String()
		for i := 0; i <= len(s); i++ {
			want := strings.Index(s[i:], usageToken)
			if want >= 0 {
				want += i
			}
			if got := indexUsageToken([]byte(s), i); got != want {
				t.Fatalf("indexUsageToken(%q, %d) = %d, want %d", s, i, got, want)
			}
		}
	}
}
