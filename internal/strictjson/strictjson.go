// Package strictjson is the one strict JSON decoder of this repository: the
// plugin configuration, the scheduler's section of it and every scheduler
// plugin's parameters are read through Decode, so they all refuse the same
// mistakes with the same messages.
//
// encoding/json alone is lenient in ways a configuration must not be: it
// ignores unknown fields, matches field names in any letter case
// ({"MAXBODYBYTES": 5} fills MaxBodyBytes), and keeps the last of two copies
// of a key silently, so a document can mean something its author did not
// see. Decode refuses all three, and reports every error as an *Error
// naming the JSON path of the offending value ("models[0].targets[1].weight").
//
// It works in three passes over the document, all with encoding/json: a
// syntax check; a walk of its tokens beside the Go type of the destination,
// which checks keys (unknown, case-mismatched, duplicated) and value types
// with exact paths; then the decode itself, which can no longer fail on
// what the walk checked. Configuration is decoded once at start, so the
// passes cost nothing that matters.
package strictjson

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
)

// Error is a mistake at a JSON path. Path is relative to the decoded
// document: "" for the document itself, "receiver.path", "plugins[2]",
// `profiles["a.b"]` (keys that are not plain names are quoted).
type Error struct {
	Path string
	Msg  string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Decode decodes exactly one JSON value from data into v, a non-nil
// pointer. Besides what encoding/json refuses, it refuses trailing data,
// object keys that do not exactly match a field's JSON name (unknown
// fields, or a known name in another letter case), and a key given twice in
// one object (anywhere in the document, json.RawMessage contents included).
// A json.RawMessage or interface value is not checked against any type:
// decode it with Decode later, against its own. Types with their own
// UnmarshalJSON or UnmarshalText are handed their value as encoding/json
// would, and their error becomes the message at that path. null leaves a
// value unchanged, as in encoding/json.
//
// Every error is an *Error.
func Decode(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return &Error{Msg: fmt.Sprintf("strictjson: Decode needs a non-nil pointer, got %T", v)}
	}
	if err := checkSyntax(data); err != nil {
		return err
	}
	w := newWalker(data)
	if err := w.value(rv.Type().Elem(), ""); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err) // the walk checks all of this; a safety net
	}
	return nil
}

// JoinPath appends a path relative to prefix: JoinPath("scheduler",
// "plugins[0]") is "scheduler.plugins[0]", JoinPath("a", "[1]") is "a[1]".
func JoinPath(prefix, path string) string {
	switch {
	case prefix == "":
		return path
	case path == "":
		return prefix
	case path[0] == '[':
		return prefix + path
	}
	return prefix + "." + path
}

// checkSyntax accepts exactly one JSON value, surrounded by JSON
// whitespace only.
func checkSyntax(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw json.RawMessage
	err := dec.Decode(&raw)
	var syntaxErr *json.SyntaxError
	switch {
	case errors.Is(err, io.EOF):
		return &Error{Msg: "invalid JSON: the document is empty"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &Error{Msg: fmt.Sprintf("invalid JSON at byte %d: unexpected end of JSON input", len(data))}
	case errors.As(err, &syntaxErr):
		return &Error{Msg: fmt.Sprintf("invalid JSON at byte %d: %s", syntaxErr.Offset, syntaxErr.Error())}
	case err != nil:
		return &Error{Msg: "invalid JSON: " + err.Error()}
	}
	end := int(dec.InputOffset())
	for i := end; i < len(data); i++ {
		switch data[i] {
		case ' ', '\t', '\r', '\n':
			continue
		}
		// Counted as encoding/json counts a syntax error's offset: the
		// bytes read when it was found.
		return &Error{Msg: fmt.Sprintf("invalid JSON at byte %d: data after the JSON value", i+1)}
	}
	return nil
}

var (
	rawMessageType      = reflect.TypeFor[json.RawMessage]()
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// walker reads the tokens of a syntactically valid document beside the Go
// type each value is bound for. A nil type means "any value": only keys
// are checked for duplicates.
type walker struct {
	dec    *json.Decoder
	fields map[reflect.Type]map[string]reflect.Type
}

func newWalker(data []byte) *walker {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return &walker{dec: dec, fields: map[reflect.Type]map[string]reflect.Type{}}
}

func (w *walker) value(t reflect.Type, path string) error {
	behindPointer := false
	for t != nil && t.Kind() == reflect.Pointer {
		t, behindPointer = t.Elem(), true
	}
	if t != nil && t.Kind() == reflect.Interface {
		t = nil
	}
	if t == rawMessageType {
		t = nil
	}
	if t != nil && (reflect.PointerTo(t).Implements(unmarshalerType) || reflect.PointerTo(t).Implements(textUnmarshalerType)) {
		return w.custom(t, behindPointer, path)
	}
	tok, err := w.dec.Token()
	if err != nil {
		return &Error{Path: path, Msg: "invalid JSON: " + err.Error()} // checkSyntax passed: unreachable
	}
	switch tok := tok.(type) {
	case json.Delim:
		if tok == '{' {
			return w.object(t, path)
		}
		return w.array(t, path)
	case nil:
		return nil
	case string:
		if t == nil || t.Kind() == reflect.String {
			return nil
		}
		if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 {
			return nil // []byte is base64 text; the decode checks it
		}
		return mismatch(t, "string", path)
	case bool:
		if t == nil || t.Kind() == reflect.Bool {
			return nil
		}
		return mismatch(t, "boolean", path)
	case json.Number:
		return checkNumber(t, tok.String(), path)
	}
	return &Error{Path: path, Msg: fmt.Sprintf("unexpected JSON token %v", tok)}
}

// custom hands a value to the type's own UnmarshalJSON (or UnmarshalText,
// for strings) as encoding/json will, after checking it for duplicate
// keys: null sets a pointer to nil, reaches UnmarshalJSON otherwise, and
// leaves a text type unchanged.
func (w *walker) custom(t reflect.Type, behindPointer bool, path string) error {
	var raw json.RawMessage
	if err := w.dec.Decode(&raw); err != nil {
		return &Error{Path: path, Msg: "invalid JSON: " + err.Error()}
	}
	if err := newWalker(raw).value(nil, path); err != nil {
		return err
	}
	target := reflect.New(t).Interface()
	u, isJSON := target.(json.Unmarshaler)
	if string(raw) == "null" && (behindPointer || !isJSON) {
		return nil
	}
	var err error
	if isJSON {
		err = u.UnmarshalJSON(raw)
	} else {
		var s string
		if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
			return &Error{Path: path, Msg: "expected a string, got JSON " + jsonKind(raw)}
		}
		err = target.(encoding.TextUnmarshaler).UnmarshalText([]byte(s))
	}
	if err == nil {
		return nil
	}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return &Error{Path: path, Msg: fmt.Sprintf("JSON %s is not a valid %s", typeErr.Value, t.Name())}
	}
	return &Error{Path: path, Msg: err.Error()}
}

func (w *walker) object(t reflect.Type, path string) error {
	var fields map[string]reflect.Type
	var elem reflect.Type
	switch {
	case t == nil:
	case t.Kind() == reflect.Struct:
		fields = w.fieldsOf(t)
	case t.Kind() == reflect.Map:
		elem = t.Elem()
	default:
		return mismatch(t, "object", path)
	}
	seen := map[string]bool{}
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return &Error{Path: path, Msg: "invalid JSON: " + err.Error()}
		}
		key, _ := tok.(string)
		if seen[key] {
			return &Error{Path: path, Msg: fmt.Sprintf("duplicate key %q", key)}
		}
		seen[key] = true
		next := elem
		if fields != nil {
			ft, known := fields[key]
			if !known {
				return unknownField(path, key, fields)
			}
			next = ft
		}
		if err := w.value(next, joinKey(path, key)); err != nil {
			return err
		}
	}
	_, err := w.dec.Token() // '}'
	return err
}

func (w *walker) array(t reflect.Type, path string) error {
	var elem reflect.Type
	limit := -1
	switch {
	case t == nil:
	case t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8:
		elem = t.Elem()
	case t.Kind() == reflect.Array:
		elem, limit = t.Elem(), t.Len()
	default:
		return mismatch(t, "array", path)
	}
	for i := 0; w.dec.More(); i++ {
		if i == limit {
			// encoding/json would drop the extra elements silently.
			return &Error{Path: path, Msg: fmt.Sprintf("expected at most %d elements", limit)}
		}
		if err := w.value(elem, path+"["+strconv.Itoa(i)+"]"); err != nil {
			return err
		}
	}
	_, err := w.dec.Token() // ']'
	return err
}

// checkNumber accepts a JSON number where encoding/json would store it.
func checkNumber(t reflect.Type, num, path string) error {
	if t == nil {
		return nil
	}
	var err error
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		_, err = strconv.ParseInt(num, 10, t.Bits())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		_, err = strconv.ParseUint(num, 10, t.Bits())
	case reflect.Float32, reflect.Float64:
		_, err = strconv.ParseFloat(num, t.Bits())
	default:
		return mismatch(t, "number "+num, path)
	}
	if errors.Is(err, strconv.ErrRange) {
		return &Error{Path: path, Msg: fmt.Sprintf("expected %s, got JSON number %s, which is out of range", typeName(t), num)}
	}
	if err != nil {
		return mismatch(t, "number "+num, path)
	}
	return nil
}

func mismatch(t reflect.Type, got, path string) error {
	return &Error{Path: path, Msg: fmt.Sprintf("expected %s, got JSON %s", typeName(t), got)}
}

// typeName says what a Go type takes, in JSON words.
func typeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return t.String()
}

// jsonKind names the JSON type of a valid value.
func jsonKind(raw []byte) string {
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number " + string(raw)
}

func unknownField(path, key string, fields map[string]reflect.Type) error {
	for name := range fields {
		if strings.EqualFold(name, key) {
			return &Error{Path: path, Msg: fmt.Sprintf("unknown field %q (names are case-sensitive: did you mean %q?)", key, name)}
		}
	}
	return &Error{Path: path, Msg: fmt.Sprintf("unknown field %q", key)}
}

// joinKey appends an object key to a path, quoted unless it is a plain
// name (letters, digits, '_' and '-'), so a path is unambiguous and safe
// to log.
func joinKey(path, key string) string {
	plain := key != ""
	for _, r := range key {
		if !(r == '_' || r == '-' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')) {
			plain = false
			break
		}
	}
	if !plain {
		return path + "[" + strconv.Quote(key) + "]"
	}
	return JoinPath(path, key)
}

// fieldsOf maps the JSON names of a struct's fields (embedded structs
// flattened, as encoding/json does) to their types.
func (w *walker) fieldsOf(t reflect.Type) map[string]reflect.Type {
	if f, ok := w.fields[t]; ok {
		return f
	}
	out := map[string]reflect.Type{}
	addFields(out, t)
	w.fields[t] = out
	return out
}

// addFields adds t's own fields first and then those of its embedded
// structs, so an outer field wins over a promoted one of the same name.
func addFields(out map[string]reflect.Type, t reflect.Type) {
	var embedded []reflect.Type
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				embedded = append(embedded, ft)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	for _, et := range embedded {
		inner := map[string]reflect.Type{}
		addFields(inner, et)
		for name, ft := range inner {
			if _, taken := out[name]; !taken {
				out[name] = ft
			}
		}
	}
}

// decodeError turns an error of the final decode into an *Error.
func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return &Error{Path: typeErr.Field, Msg: fmt.Sprintf("expected %s, got JSON %s", typeName(typeErr.Type), typeErr.Value)}
	}
	return &Error{Msg: strings.TrimPrefix(err.Error(), "json: ")}
}
