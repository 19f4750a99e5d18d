package scheduler

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"strconv"
	"strings"
)

// checkDuplicateKeys walks a JSON document and reports the first object key
// that appears twice in one object. encoding/json silently keeps the last
// value, which would let `{"profile": "scoring", ..., "profile": "random"}`
// mean something its author did not see. Syntax errors are left to the
// decoder, which reports them with offsets.
func checkDuplicateKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		object bool
		keys   map[string]bool
		key    string // last key read (objects)
		index  int    // next element index (arrays)
		path   string
		atKey  bool // objects: the next token is a key
	}
	var stack []*frame
	childPath := func() string {
		if len(stack) == 0 {
			return ""
		}
		f := stack[len(stack)-1]
		if f.object {
			if f.path == "" {
				return f.key
			}
			return f.path + "." + f.key
		}
		return f.path + "[" + strconv.Itoa(f.index) + "]"
	}
	// valueDone advances the parent after one complete value.
	valueDone := func() {
		if len(stack) == 0 {
			return
		}
		f := stack[len(stack)-1]
		if f.object {
			f.atKey = true
		} else {
			f.index++
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // end of input, or a syntax error the decoder will report
		}
		if len(stack) > 0 {
			if f := stack[len(stack)-1]; f.object && f.atKey {
				if key, ok := tok.(string); ok {
					if f.keys[key] {
						return fieldErr(f.path, fmt.Sprintf("duplicate key %q", key))
					}
					f.keys[key] = true
					f.key, f.atKey = key, false
					continue
				}
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, keys: map[string]bool{}, path: childPath(), atKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{path: childPath()})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}

// checkFieldNames walks a decoded JSON value alongside the Go type it is
// about to be decoded into and rejects object keys that do not exactly
// match a field's JSON name. encoding/json matches names case-insensitively
// ("Threshold" and "tHreshold" both fill Threshold), which strict
// configuration must not accept. json.RawMessage fields are skipped: they
// are decoded, and checked, on their own later.
func checkFieldNames(v any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessageType {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil // a type mismatch; the decoder reports it
		}
		fields := jsonFields(t)
		for _, k := range sortedKeys(obj) {
			ft, known := fields[k]
			if !known {
				return fieldErr(path, fmt.Sprintf("unknown field %q", k))
			}
			if err := checkFieldNames(obj[k], ft, joinPath(path, k)); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		arr, ok := v.([]any)
		if !ok {
			return nil
		}
		for i, el := range arr {
			if err := checkFieldNames(el, t.Elem(), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		for _, k := range sortedKeys(obj) {
			if err := checkFieldNames(obj[k], t.Elem(), joinPath(path, k)); err != nil {
				return err
			}
		}
	}
	return nil
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// jsonFields maps the JSON names of t's fields (embedded structs
// flattened, as encoding/json does) to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			maps.Copy(out, jsonFields(f.Type))
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}
