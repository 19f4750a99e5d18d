package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"testing"
)

// pathGrammar is what an Error's Path may look like: names, indices and
// quoted keys, joined as JoinPath and joinKey join them.
var pathGrammar = regexp.MustCompile(`^(([A-Za-z0-9_-]+|\[[0-9]+\]|\["(\\.|[^"\\])*"\])(\.[A-Za-z0-9_-]+|\[[0-9]+\]|\["(\\.|[^"\\])*"\])*)?$`)

// FuzzDecode: any input is either refused with an *Error whose path is
// well formed, or accepted; an accepted document has no key twice in one
// object (checked here independently of the walker), and encoding/json
// decodes it, with unknown fields disallowed, to the very same value.
//
//	go test -run '^$' -fuzz FuzzDecode -fuzztime 5m ./internal/strictjson/
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		``, `null`, `{}`, `[]`, `7`, `{"role": "router", "maxBodyBytes": 5}`,
		`{"MAXBODYBYTES": 5}`, `{"role": "a", "role": "b"}`, `{"r\u006fle": "a", "role": "b"}`,
		`{"items": [{"name": "a", "weight": 2}, {"Name": "b"}], "pair": [1, 2, 3]}`,
		`{"byName": {"x": {"name": "y"}, "a.b": {}}, "raw": {"k": [1, {"k": 1, "k": 2}]}}`,
		`{"wait": "2s", "addr": "10.0.0.1", "waitPtr": null, "bytes": "aGk=", "small": 128}`,
		`{"seed": -1, "on": "yes", "any": {"a": [true, null, 1e999]}}`, `{} {}`, `{"a":`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got doc
		err := Decode(data, &got)
		if err != nil {
			var se *Error
			if !errors.As(err, &se) {
				t.Fatalf("error %T, not *Error: %v", err, err)
			}
			if !pathGrammar.MatchString(se.Path) {
				t.Fatalf("malformed path %q in %v", se.Path, err)
			}
			return
		}
		if key, dup := firstDuplicateKey(data); dup {
			t.Fatalf("accepted a document with %q twice in one object", key)
		}
		var want doc
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil {
			t.Fatalf("accepted what encoding/json refuses: %v", err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded %+v, encoding/json %+v", got, want)
		}
	})
}

// firstDuplicateKey reports a key given twice in one object anywhere in a
// valid document.
func firstDuplicateKey(data []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		keys      map[string]bool
		expectKey bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		if n := len(stack); n > 0 && stack[n-1].keys != nil && stack[n-1].expectKey {
			if key, ok := tok.(string); ok {
				if stack[n-1].keys[key] {
					return key, true
				}
				stack[n-1].keys[key], stack[n-1].expectKey = true, false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]bool{}, expectKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].expectKey = true // a value ended: a key comes next
		}
	}
}
