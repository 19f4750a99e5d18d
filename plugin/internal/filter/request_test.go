package filter

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testMaxModelLen = 64

func TestParseRequestAccepts(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		model  string
		stream bool
		kind   Kind
	}{
		{"chat", `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`, "llama", false, KindChat},
		{"completion streaming", `{"model":"llama","prompt":"once upon","stream":true}`, "llama", true, KindCompletion},
		{"prompt array", `{"prompt":[1,2,3],"model":"m"}`, "m", false, KindCompletion},
		{"stream false and null", `{"model":"m","stream":null}`, "m", false, KindOther},
		// vLLM reads stream with pydantic's lax parsing; the router is not
		// its validator, and only "stream": true counts as streaming here.
		{"stream as a string", `{"model":"m","stream":"yes"}`, "m", false, KindOther},
		{"stream as the string true", `{"model":"m","stream":"true"}`, "m", false, KindOther},
		{"stream as a number", `{"model":"m","stream":1}`, "m", false, KindOther},
		{"stream as an object", `{"model":"m","stream":{"x":[1]}}`, "m", false, KindOther},
		{"stream given twice: the last copy, as Python's json", `{"model":"m","stream":false,"stream":true}`, "m", true, KindOther},
		{"stream given twice, escaped", `{"model":"m","stream":true,"str\u0065am":0}`, "m", false, KindOther},
		{"whitespace everywhere", " \r\n\t{ \"model\" : \"m\" , \"n\" : 1 } \n", "m", false, KindOther},
		{"escaped model", `{"model":"sql\u002dlora\/v2"}`, "sql-lora/v2", false, KindOther},
		{"unicode model", `{"model":"modèle-日本"}`, "modèle-日本", false, KindOther},
		{"nested model keys are not the model", `{"model":"m","messages":[{"model":"x","content":{"model":1}}]}`, "m", false, KindChat},
		{"model of max length", `{"model":"` + strings.Repeat("a", testMaxModelLen) + `"}`, strings.Repeat("a", testMaxModelLen), false, KindOther},
		{"numbers", `{"model":"m","temperature":-0.5e-3,"n":0,"max_tokens":10E2,"x":[true,false,null,{}]}`, "m", false, KindOther},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseRequest([]byte(tc.body), testMaxModelLen)
			require.NoError(t, err)
			assert.Equal(t, tc.model, p.Model)
			assert.Equal(t, tc.stream, p.Stream)
			assert.Equal(t, tc.kind, p.Kind)
			var tok string
			require.NoError(t, json.Unmarshal([]byte(tc.body[p.ModelStart:p.ModelEnd]), &tok), "span is the raw model token")
			assert.Equal(t, tc.model, tok)
		})
	}
}

// TestParseRequestRejects covers every malformed body the parser decides
// (the "row N" cases are the ones the end-to-end bad-input test
// e2e/filtertest TestBadInputRequests sends through the real module too)
// and more.
func TestParseRequestRejects(t *testing.T) {
	cases := []struct {
		name string
		body string
		want Reason
	}{
		{"row 1: empty body", ``, ReasonEmptyBody},
		{"row 2: not JSON", `hello`, ReasonInvalidJSON},
		{"row 3: truncated", `{"model":"a"`, ReasonInvalidJSON},
		{"row 3: truncated string", `{"model":"a`, ReasonInvalidJSON},
		{"row 4: two objects", `{"model":"a"}{"model":"b"}`, ReasonTrailingData},
		{"row 4: trailing garbage", `{"model":"a"} x`, ReasonTrailingData},
		{"row 5: no model", `{"messages":[]}`, ReasonMissingModel},
		{"row 5: model only nested", `{"messages":[{"model":"a"}]}`, ReasonMissingModel},
		{"row 6: number", `{"model":123}`, ReasonModelNotString},
		{"row 6: null", `{"model":null}`, ReasonModelNotString},
		{"row 6: array", `{"model":["a"]}`, ReasonModelNotString},
		{"row 6: object", `{"model":{"name":"a"}}`, ReasonModelNotString},
		{"row 6: bool", `{"model":true}`, ReasonModelNotString},
		{"row 7: duplicate", `{"model":"a","model":"b"}`, ReasonDuplicateKey},
		{"row 7: duplicate same value", `{"model":"a","model":"a"}`, ReasonDuplicateKey},
		{"row 7: escaped duplicate", `{"model":"a","mod\u0065l":"b"}`, ReasonDuplicateKey},
		{"row 9: too long", `{"model":"` + strings.Repeat("a", testMaxModelLen+1) + `"}`, ReasonModelTooLong},
		{"row 9: too long escaped", `{"model":"` + strings.Repeat(`\u0061`, 6*testMaxModelLen+1) + `"}`, ReasonModelTooLong},
		{"row 9: control char", `{"model":"a\u0000b"}`, ReasonInvalidModel},
		{"row 9: newline", `{"model":"a\nb"}`, ReasonInvalidModel},
		{"row 9: DEL", "{\"model\":\"a\x7fb\"}", ReasonInvalidModel},
		{"row 9: raw invalid UTF-8", "{\"model\":\"a\xffb\"}", ReasonInvalidModel},
		{"row 9: lone surrogate", `{"model":"a\ud800b"}`, ReasonInvalidModel},
		{"row 9: raw control char is invalid JSON", "{\"model\":\"a\x01b\"}", ReasonInvalidJSON},
		{"row 12: array", `[{"model":"a"}]`, ReasonNotObject},
		{"row 12: string", `"model"`, ReasonNotObject},
		{"row 12: number", `42`, ReasonNotObject},
		{"row 12: null", `null`, ReasonNotObject},
		{"empty model", `{"model":""}`, ReasonEmptyModel},
		{"whitespace only", "  \n", ReasonInvalidJSON},
		{"messages not array", `{"model":"a","messages":"hi"}`, ReasonInvalidField},
		{"prompt not string", `{"model":"a","prompt":5}`, ReasonInvalidField},
		{"too deep", `{"model":"a","x":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`, ReasonTooDeep},
		{"1 MiB of [", strings.Repeat("[", 1<<20), ReasonTooDeep},
		{"single quotes", `{'model':'a'}`, ReasonInvalidJSON},
		{"trailing comma", `{"model":"a",}`, ReasonInvalidJSON},
		{"leading zero", `{"model":"a","n":01}`, ReasonInvalidJSON},
		{"bad escape", `{"model":"a\x"}`, ReasonInvalidJSON},
		{"NaN", `{"model":"a","t":NaN}`, ReasonInvalidJSON},
		{"comment", `{"model":"a"/*x*/}`, ReasonInvalidJSON},
		{"BOM", "\xef\xbb\xbf{\"model\":\"a\"}", ReasonInvalidJSON},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRequest([]byte(tc.body), testMaxModelLen)
			var re *RequestError
			require.True(t, errors.As(err, &re), "want a *RequestError, got %v", err)
			assert.Equal(t, tc.want, re.Reason, re.Msg)
			assert.NotContains(t, re.Msg, "\x00")
			assert.NotContains(t, re.Msg, "\n")
		})
	}
}

// TestScanJSONMatchesEncodingJSON checks the validator against
// encoding/json.Valid on hand-picked documents (the fuzz target checks the
// same on random ones).
func TestScanJSONMatchesEncodingJSON(t *testing.T) {
	docs := []string{
		``, ` `, `{}`, `[]`, `""`, `0`, `-0`, `-`, `1.`, `1.5e`, `1e+5`, `.5`, `01`, `[1,]`, `[,1]`, `{"a"}`,
		`{"a":}`, `{"a":1,}`, `{,}`, `[[[]]]`, `[[[]]`, `{"a":[{"b":{}}]}`, `"\u12"`, `"\u12G4"`, `"\uD834\uDD1E"`,
		"\"\t\"", `tru`, `true`, `truex`, `nul`, `null `, ` false`, `[1 2]`, `{"a" "b"}`, `{"a":1 "b":2}`,
		`"a\"b"`, `"a\\"`, `"a\\\"`, `{"\\":"\\"}`, `1 2`, `{}}`, `[]]`, `{]`, `[}`,
	}
	for _, d := range docs {
		ok, _, _ := scanJSON([]byte(d), func(member) bool { return true })
		assert.Equal(t, json.Valid([]byte(d)), ok, "%q", d)
	}
}

func TestScanJSONMembers(t *testing.T) {
	doc := []byte(`{"a":1, "b" : {"c":[2,{"d":3}]} ,"e":"x","f":[]}`)
	var got []string
	ok, _, err := scanJSON(doc, func(m member) bool {
		got = append(got, string(doc[m.keyStart:m.keyEnd])+"="+string(doc[m.start:m.end]))
		return true
	})
	require.True(t, ok)
	require.Nil(t, err)
	assert.Equal(t, []string{`a=1`, `b={"c":[2,{"d":3}]}`, `e="x"`, `f=[]`}, got)
}

func TestSpliceModel(t *testing.T) {
	body := []byte(`{"model" : "sql" ,"prompt":"x"}`)
	p, err := ParseRequest(body, testMaxModelLen)
	require.NoError(t, err)
	out := spliceModel(body, &p, `sql-v"2`)
	assert.Equal(t, `{"model" : "sql-v\"2" ,"prompt":"x"}`, string(out))
	p2, err := ParseRequest(out, testMaxModelLen)
	require.NoError(t, err)
	assert.Equal(t, `sql-v"2`, p2.Model)
	assert.Equal(t, `{"model" : "sql" ,"prompt":"x"}`, string(body), "the original is not modified")
}

func TestErrorBodyIsJSON(t *testing.T) {
	for _, msg := range []string{"plain", `quote " and \ backslash`, "ctl \x00\x1f\x7f", "bad utf8 \xff", "ünï"} {
		b := errorBody(msg, "t", "c")
		var v map[string]map[string]string
		require.NoError(t, json.Unmarshal(b, &v), "%q", b)
		assert.Equal(t, strings.ToValidUTF8(msg, "\uFFFD"), v["error"]["message"])
		assert.False(t, bytes.ContainsAny(b, "\x00\x1f\x7f"))
	}
}

// body4K is a chat request of about 4 KiB, the benchmark size.
func body4K(model string) []byte {
	content := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 88)
	return []byte(`{"model":"` + model + `","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"` +
		content + `"}],"stream":true,"max_tokens":256,"temperature":0.7}`)
}

func BenchmarkParseRequest(b *testing.B) {
	body := body4K("sql-lora")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseRequest(body, 256); err != nil {
			b.Fatal(err)
		}
	}
}

func TestSpecial8(t *testing.T) {
	isSpecial := func(c byte) bool { return c == '"' || c == '\\' || c < 0x20 }
	word := func(b [8]byte) uint64 { return binary.LittleEndian.Uint64(b[:]) }
	// Every byte value at every position, among plain bytes.
	for v := 0; v < 256; v++ {
		for pos := 0; pos < 8; pos++ {
			b := [8]byte{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'}
			b[pos] = byte(v)
			require.Equal(t, isSpecial(byte(v)), special8(word(b)), "byte %#x at %d", v, pos)
		}
	}
	// Random words: as a whole-word answer the bit trick is exact.
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		var b [8]byte
		for j := range b {
			b[j] = byte(rng.IntN(256))
			if rng.IntN(2) == 0 {
				b[j] = byte(0x20 + rng.IntN(0x60)) // mostly printable ASCII
			}
		}
		want := false
		for _, c := range b {
			want = want || isSpecial(c)
		}
		require.Equal(t, want, special8(word(b)), "%q", b[:])
	}
}

// scanString finds the end of a string, an escape or an invalid byte at
// every offset of a long run, whichever word (of the 64- or 8-byte skips,
// or the byte-wise tail) it falls in.
func TestScanStringEveryOffset(t *testing.T) {
	for n := 0; n < 200; n++ {
		plain := strings.Repeat("é", n/2) + strings.Repeat("a", n%2) // multi-byte UTF-8 too
		doc := []byte(plain + `"`)
		end, esc := scanString(doc, 0)
		require.Equal(t, len(doc), end, "closing quote after %d bytes", len(plain))
		require.False(t, esc)

		doc = []byte(plain + `\n"`)
		end, esc = scanString(doc, 0)
		require.Equal(t, len(doc), end, "escape after %d bytes", len(plain))
		require.True(t, esc)

		doc = []byte(plain + "\x01" + `"`)
		end, _ = scanString(doc, 0)
		require.Equal(t, -(len(plain) + 1), end, "control byte after %d bytes", len(plain))

		end, _ = scanString([]byte(plain), 0)
		require.Equal(t, -(len(plain) + 1), end, "unterminated after %d bytes", len(plain))
	}
}

// A configured model name is taken from the router's own string: parsing a
// request allocates nothing. Escaped or unknown names are decoded.
func TestParseRequestKnownModel(t *testing.T) {
	const name = "sql-lora"
	known := func(b []byte) (string, bool) {
		if string(b) == name {
			return name, true
		}
		return "", false
	}
	body := []byte(`{"model":"sql-lora","messages":[{"role":"user","content":"hi"}]}`)
	p, err := parseRequest(body, testMaxModelLen, known)
	require.NoError(t, err)
	assert.Equal(t, name, p.Model)
	// No allocation: the decoded name is the known string itself, not a copy.
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = parseRequest(body, testMaxModelLen, known) }))

	p, err = parseRequest([]byte(`{"model":"sql-\u006cora"}`), testMaxModelLen, known)
	require.NoError(t, err)
	assert.Equal(t, name, p.Model, "escaped: decoded")
	p, err = parseRequest([]byte(`{"model":"other"}`), testMaxModelLen, known)
	require.NoError(t, err)
	assert.Equal(t, "other", p.Model)
	_, err = parseRequest([]byte(`{"model":""}`), testMaxModelLen, known)
	require.Error(t, err, "empty is still refused")
}

func TestParseDecimal(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"0", 0, true}, {"4096", 4096, true}, {"000123", 123, true},
		{"18446744073709551609", 18446744073709551609, true},
		{"", 0, false}, {"-1", 0, false}, {"1 ", 0, false}, {"0x10", 0, false},
		{"99999999999999999999", 0, false}, {"18446744073709551615", 0, false},
	} {
		n, ok := parseDecimal([]byte(tc.in))
		assert.Equal(t, tc.ok, ok, tc.in)
		assert.Equal(t, tc.want, n, tc.in)
		if ref, err := strconv.ParseUint(tc.in, 10, 64); err == nil && ok {
			assert.Equal(t, ref, n, tc.in)
		}
	}
}
