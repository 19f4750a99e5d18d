package strictjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// duration is a type with its own UnmarshalJSON, as configurations have.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil // the convention encoding/json documents
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return &json.UnmarshalTypeError{Value: jsonKind(b), Type: reflect.TypeFor[duration]()}
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("expected a duration such as \"2s\", got %q", s)
	}
	*d = duration(v)
	return nil
}

type inner struct {
	Name   string  `json:"name"`
	Weight int     `json:"weight,omitempty"`
	Ratio  float64 `json:"ratio,omitempty"`
}

type Embedded struct {
	Shared string `json:"shared"`
	Outer  string `json:"outer"`
}

type doc struct {
	Embedded
	Outer    int               `json:"outer"`
	Role     string            `json:"role"`
	Max      int               `json:"maxBodyBytes"`
	Seed     *uint64           `json:"seed"`
	On       *bool             `json:"on"`
	Items    []inner           `json:"items"`
	Pair     [2]int            `json:"pair"`
	ByName   map[string]inner  `json:"byName"`
	Raw      json.RawMessage   `json:"raw"`
	Any      any               `json:"any"`
	Wait     duration          `json:"wait"`
	Addr     netip.Addr        `json:"addr"`
	Bytes    []byte            `json:"bytes"`
	Nested   *inner            `json:"nested"`
	WaitPtr  *duration         `json:"waitPtr"`
	AddrPtr  *netip.Addr       `json:"addrPtr"`
	Labels   map[string]string `json:"labels"`
	Small    int8              `json:"small"`
	Internal string            `json:"-"`
	NoTag    string
	hidden   string //nolint:unused // unexported: not a JSON field
}

func TestDecodeAccepts(t *testing.T) {
	var d doc
	require.NoError(t, Decode([]byte(`{
	  "shared": "s", "outer": 7, "role": "router", "maxBodyBytes": 5, "seed": 42, "on": true,
	  "items": [{"name": "a", "weight": 2}, {"name": "b", "ratio": 0.5}], "pair": [1, 2],
	  "byName": {"x": {"name": "y"}}, "raw": {"Any": [1, {"k": 1}]}, "any": {"Free": 1},
	  "wait": "2s", "addr": "10.0.0.1", "bytes": "aGk=", "nested": {"name": "n"},
	  "labels": {"A": "b", "a": "c"}, "small": -128, "NoTag": "t"
	}`), &d))
	assert.Equal(t, "s", d.Shared)
	assert.Equal(t, 7, d.Outer, "the outer field wins over the promoted one")
	assert.Equal(t, uint64(42), *d.Seed)
	assert.Equal(t, []inner{{Name: "a", Weight: 2}, {Name: "b", Ratio: 0.5}}, d.Items)
	assert.Equal(t, [2]int{1, 2}, d.Pair)
	assert.JSONEq(t, `{"Any": [1, {"k": 1}]}`, string(d.Raw))
	assert.Equal(t, duration(2*time.Second), d.Wait)
	assert.Equal(t, netip.MustParseAddr("10.0.0.1"), d.Addr)
	assert.Equal(t, []byte("hi"), d.Bytes)
	assert.Equal(t, map[string]string{"A": "b", "a": "c"}, d.Labels, "map keys are data: any case, both kept")
	assert.Equal(t, "t", d.NoTag)

	w, a := duration(1), netip.MustParseAddr("::1")
	d = doc{Role: "kept", Wait: 5, Addr: a, WaitPtr: &w, AddrPtr: &a}
	require.NoError(t, Decode([]byte(`{"role": null, "wait": null, "items": null, "addr": null, "waitPtr": null, "addrPtr": null}`), &d))
	assert.Equal(t, "kept", d.Role, "null leaves a value unchanged")
	assert.Equal(t, duration(5), d.Wait)
	assert.Equal(t, a, d.Addr)
	assert.Nil(t, d.WaitPtr, "null sets a pointer to nil")
	assert.Nil(t, d.AddrPtr)

	var n int
	require.NoError(t, Decode([]byte(" \t\r\n7 \n"), &n), "JSON whitespace around the value")
	assert.Equal(t, 7, n)
}

func TestDecodeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"empty", ``, "invalid JSON: the document is empty"},
		{"blank", " \n", "invalid JSON: the document is empty"},
		{"syntax", `{"role": }`, "invalid JSON at byte 10: invalid character '}' looking for beginning of value"},
		{"truncated", `{"role": "x"`, "invalid JSON at byte 12: unexpected end of JSON input"},
		{"trailing object", `{} {}`, "invalid JSON at byte 4: data after the JSON value"},
		{"trailing garbage", `{}x`, "invalid JSON at byte 3: data after the JSON value"},
		{"non-JSON whitespace after", "{}\v", "invalid JSON at byte 3: data after the JSON value"},
		{"unknown field", `{"rol": "x"}`, `unknown field "rol"`},
		{"case-mismatched field", `{"MAXBODYBYTES": 5}`, `unknown field "MAXBODYBYTES" (names are case-sensitive: did you mean "maxBodyBytes"?)`},
		{"case-mismatched nested field", `{"items": [{"name": "a"}, {"Name": "b"}]}`, `items[1]: unknown field "Name" (names are case-sensitive: did you mean "name"?)`},
		{"json:\"-\" is not a field", `{"Internal": "x"}`, `unknown field "Internal"`},
		{"unexported is not a field", `{"hidden": "x"}`, `unknown field "hidden"`},
		{"duplicated field", `{"role": "router", "role": "receiver"}`, `duplicate key "role"`},
		{"duplicated after an escape", `{"role": "a", "r\u006fle": "b"}`, `duplicate key "role"`},
		{"duplicated nested", `{"nested": {"name": "a", "name": "b"}}`, `nested: duplicate key "name"`},
		{"duplicated map key", `{"byName": {"x": {}, "x": {}}}`, `byName: duplicate key "x"`},
		{"duplicated in raw", `{"raw": {"a": [{"b": 1, "b": 2}]}}`, `raw.a[0]: duplicate key "b"`},
		{"duplicated in any", `{"any": {"k": 1, "k": 1}}`, `any: duplicate key "k"`},
		{"duplicated in a custom value", `{"wait": {"a": 1, "a": 2}}`, `wait: duplicate key "a"`},
		{"string for int", `{"maxBodyBytes": "5"}`, "maxBodyBytes: expected an integer, got JSON string"},
		{"fraction for int", `{"items": [{"name": "a", "weight": 2.5}]}`, "items[0].weight: expected an integer, got JSON number 2.5"},
		{"exponent for int", `{"maxBodyBytes": 1e3}`, "maxBodyBytes: expected an integer, got JSON number 1e3"},
		{"int out of range", `{"small": 128}`, "small: expected an integer, got JSON number 128, which is out of range"},
		{"negative uint", `{"seed": -1}`, "seed: expected a non-negative integer, got JSON number -1"},
		{"float out of range", `{"items": [{"ratio": 1e999}]}`, "items[0].ratio: expected a number, got JSON number 1e999, which is out of range"},
		{"number for bool", `{"on": 1}`, "on: expected a boolean, got JSON number 1"},
		{"string for bool", `{"on": "yes"}`, "on: expected a boolean, got JSON string"},
		{"bool for string", `{"role": true}`, "role: expected a string, got JSON boolean"},
		{"object for array", `{"items": {}}`, "items: expected an array, got JSON object"},
		{"array for object", `{"nested": []}`, "nested: expected an object, got JSON array"},
		{"array for bytes", `{"bytes": [1]}`, "bytes: expected an array, got JSON array"},
		{"top level type", `[]`, "expected an object, got JSON array"},
		{"too many array elements", `{"pair": [1, 2, 3]}`, "pair: expected at most 2 elements"},
		{"map value type", `{"labels": {"a": 1}}`, "labels.a: expected a string, got JSON number 1"},
		{"odd key quoted in the path", `{"byName": {"a.b": {"nme": 1}}}`, `byName["a.b"]: unknown field "nme"`},
		{"custom type's message", `{"wait": "soon"}`, `wait: expected a duration such as "2s", got "soon"`},
		{"custom type's type error", `{"wait": 2}`, `wait: JSON number 2 is not a valid duration`},
		{"text type's message", `{"addr": "10.0.0.300"}`, `addr: ParseAddr("10.0.0.300"): IPv4 field has value >255`},
		{"text type given a number", `{"addr": 3}`, `addr: expected a string, got JSON number 3`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d doc
			err := Decode([]byte(tc.doc), &d)
			require.Error(t, err)
			var se *Error
			require.True(t, errors.As(err, &se), "%T", err)
			assert.Equal(t, tc.want, err.Error())
		})
	}
	assert.Error(t, Decode([]byte(`{}`), doc{}), "not a pointer")
	assert.Error(t, Decode([]byte(`{}`), (*doc)(nil)))
}

// What encoding/json alone lets through, and Decode does not: the reason
// this package exists.
func TestEncodingJSONIsLenient(t *testing.T) {
	for _, in := range []string{`{"MAXBODYBYTES": 5}`, `{"role": "a", "role": "b"}`, `{"rol": 1}`} {
		var lenient struct {
			Role string `json:"role"`
			Max  int    `json:"maxBodyBytes"`
		}
		if in != `{"rol": 1}` {
			require.NoError(t, json.Unmarshal([]byte(in), &lenient), in)
		}
		require.Error(t, Decode([]byte(in), &lenient), in)
	}
}

func TestJoinPath(t *testing.T) {
	assert.Equal(t, "scheduler.plugins[0]", JoinPath("scheduler", "plugins[0]"))
	assert.Equal(t, "a[1]", JoinPath("a", "[1]"))
	assert.Equal(t, "a", JoinPath("a", ""))
	assert.Equal(t, "b", JoinPath("", "b"))
	assert.Equal(t, `x["a b"]`, joinKey("x", "a b"))
	assert.Equal(t, `[""]`, joinKey("", ""))
	assert.Equal(t, strconv.Quote("\x00"), joinKey("", "\x00")[1:len(joinKey("", "\x00"))-1])
}
