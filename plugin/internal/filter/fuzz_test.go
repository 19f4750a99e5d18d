package filter

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// FuzzParseRequest: ParseRequest never panics, and its result is always one
// of the defined outcomes: a Parsed whose model span decodes (by
// encoding/json) to a valid model name and whose Stream is true exactly
// when encoding/json's last "stream" is true, or a *RequestError with a known
// Reason that agrees with encoding/json about whether the body is JSON.
// Corpus: testdata/fuzz/FuzzParseRequest (the malformed bodies of
// TestParseRequestRejects, named rowNN after its cases, and what fuzzing
// found).
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"model":"a","messages":[{"role":"user","content":"line\none"}]}`, `{"model":"a","x\"y":1}`,
		`{"model":"a","model":"b"}`, `{"model":"a"`, `{"model":"a","stream":"yes","str\u0065am":true}`, `[{"model":"a"}]`, `{"model":"a\u0000"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		const maxLen = 32
		p, err := ParseRequest(body, maxLen)
		valid := json.Valid(body)
		if err == nil {
			if !valid {
				t.Fatalf("accepted invalid JSON %q", body)
			}
			var top map[string]json.RawMessage
			if e := json.Unmarshal(body, &top); e != nil {
				t.Fatalf("accepted a non-object %q: %v", body, e)
			}
			var tok, whole string
			if e := json.Unmarshal(body[p.ModelStart:p.ModelEnd], &tok); e != nil || tok != p.Model {
				t.Fatalf("model span %q does not decode to %q: %v", body[p.ModelStart:p.ModelEnd], p.Model, e)
			}
			if e := json.Unmarshal(top["model"], &whole); e != nil || whole != p.Model {
				t.Fatalf("encoding/json reads model %q, parser %q", whole, p.Model)
			}
			if e := config.ValidModelName(p.Model, maxLen); e != nil {
				t.Fatalf("accepted an invalid model name %q: %v", p.Model, e)
			}
			// "stream" is read as vLLM's parser reads keys: the last copy.
			if want := string(top["stream"]) == "true"; p.Stream != want {
				t.Fatalf("stream %t, encoding/json's last copy is %q", p.Stream, top["stream"])
			}
			// The prefix hasher trusts this to mean no backslash at all.
			if want := !bytes.Contains(body, []byte{'\\'}); p.NoEscapes != want {
				t.Fatalf("NoEscapes %t for %q", p.NoEscapes, body)
			}
			return
		}
		var re *RequestError
		if !errors.As(err, &re) || !slices.Contains(Reasons, re.Reason) {
			t.Fatalf("undefined outcome %#v for %q", err, body)
		}
		switch re.Reason {
		case ReasonInvalidJSON, ReasonTrailingData, ReasonEmptyBody:
			if valid {
				t.Fatalf("valid JSON %q refused as %s", body, re.Reason)
			}
		case ReasonTooDeep, ReasonDuplicateKey:
			// Decided before (or without) full validation.
		default:
			if !valid {
				t.Fatalf("invalid JSON %q refused as %s, not as invalid", body, re.Reason)
			}
		}
	})
}

// FuzzScanJSON: the validator agrees with encoding/json.Valid on every
// document not nested deeper than maxJSONDepth, and the members it reports
// are the top-level object's, in order, each value a valid JSON value.
func FuzzScanJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":"c\"d"}],"e":-1.5e3}`, `[[]]`, `"\u00e9"`, `{"a":1}x`, `tru`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		var members []member
		ok, _, jerr := scanJSON(doc, func(m member) bool {
			members = append(members, m)
			return true
		})
		if jerr != nil && jerr.kind == jsonTooDeep {
			return
		}
		if ok != json.Valid(doc) {
			t.Fatalf("scanJSON says %v, encoding/json says %v for %q", ok, !ok, doc)
		}
		if !ok {
			return
		}
		var top map[string]json.RawMessage
		if json.Unmarshal(doc, &top) != nil {
			if len(members) > 0 {
				t.Fatalf("members reported for a non-object %q", doc)
			}
			return
		}
		for _, m := range members {
			if !json.Valid(doc[m.start:m.end]) {
				t.Fatalf("member value %q is not a JSON value", doc[m.start:m.end])
			}
			var key string
			if json.Unmarshal(doc[m.keyStart-1:m.keyEnd+1], &key) != nil {
				t.Fatalf("member key %q is not a JSON string", doc[m.keyStart-1:m.keyEnd+1])
			}
			if _, found := top[key]; !found {
				t.Fatalf("member %q is not a top-level key of %q", key, doc)
			}
		}
	})
}
