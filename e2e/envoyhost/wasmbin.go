package envoyhost

import (
	"errors"
	"fmt"
)

// A minimal reader of the WebAssembly binary format: just enough to see a
// module's imports (with their kinds and function signatures) and exports,
// which is what cpp-host inspects before instantiating (src/bytecode_util.cc
// for the ABI version, src/v8/v8.cc for the import check).

// Value type bytes of the binary format.
const (
	valI32 byte = 0x7f
	valI64 byte = 0x7e
	valF32 byte = 0x7d
	valF64 byte = 0x7c
)

// External kinds.
const (
	kindFunc   byte = 0
	kindTable  byte = 1
	kindMemory byte = 2
	kindGlobal byte = 3
)

// FuncType is a function signature: parameter and result value types.
type FuncType struct {
	Params  []byte
	Results []byte
}

// String prints the signature the way cpp-host src/v8/v8.cc does in its
// import type mismatch message: kinds separated by spaces, "void" if none.
func (t FuncType) String() string {
	return valTypesString(t.Params) + " -> " + valTypesString(t.Results)
}

func (t FuncType) equal(o FuncType) bool {
	return string(t.Params) == string(o.Params) && string(t.Results) == string(o.Results)
}

func valTypesString(ts []byte) string {
	if len(ts) == 0 {
		return "void"
	}
	s := ""
	for i, t := range ts {
		if i > 0 {
			s += " "
		}
		switch t {
		case valI32:
			s += "i32"
		case valI64:
			s += "i64"
		case valF32:
			s += "f32"
		case valF64:
			s += "f64"
		default:
			s += fmt.Sprintf("0x%02x", t)
		}
	}
	return s
}

// Import is one entry of a module's import section.
type Import struct {
	Module string
	Name   string
	Kind   byte
	Type   FuncType // set when Kind is a function
}

// QualifiedName is "module.name", the form cpp-host prints.
func (i Import) QualifiedName() string { return i.Module + "." + i.Name }

// Export is one entry of a module's export section.
type Export struct {
	Name  string
	Kind  byte
	Index uint32
}

// ModuleInfo is what wasmbin reads from a module.
type ModuleInfo struct {
	Imports []Import
	Exports []Export
	// ABI is the first proxy_abi_version_* function export, in export order.
	ABI ABIVersion
}

var errCorrupt = errors.New("Failed to parse corrupted Wasm module")

// ParseModuleInfo reads imports and exports from a .wasm binary.
func ParseModuleInfo(bin []byte) (*ModuleInfo, error) {
	if len(bin) < 8 || string(bin[:4]) != "\x00asm" {
		return nil, errCorrupt
	}
	r := &binReader{b: bin, pos: 8}
	info := &ModuleInfo{}
	var types []FuncType
	for r.pos < len(r.b) {
		id, err := r.byte()
		if err != nil {
			return nil, err
		}
		size, err := r.u32()
		if err != nil {
			return nil, err
		}
		end := r.pos + int(size)
		if end > len(r.b) || end < r.pos {
			return nil, errCorrupt
		}
		sec := &binReader{b: r.b[:end], pos: r.pos}
		switch id {
		case 1:
			if types, err = readTypes(sec); err != nil {
				return nil, err
			}
		case 2:
			if info.Imports, err = readImports(sec, types); err != nil {
				return nil, err
			}
		case 7:
			if info.Exports, err = readExports(sec); err != nil {
				return nil, err
			}
		}
		r.pos = end
	}
	for _, e := range info.Exports {
		if v, ok := abiExportNames[e.Name]; ok && e.Kind == kindFunc {
			info.ABI = v
			break
		}
	}
	return info, nil
}

func readTypes(r *binReader) ([]FuncType, error) {
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	types := make([]FuncType, 0, n)
	for i := uint32(0); i < n; i++ {
		form, err := r.byte()
		if err != nil || form != 0x60 {
			return nil, errCorrupt
		}
		params, err := r.valTypes()
		if err != nil {
			return nil, err
		}
		results, err := r.valTypes()
		if err != nil {
			return nil, err
		}
		types = append(types, FuncType{Params: params, Results: results})
	}
	return types, nil
}

func readImports(r *binReader, types []FuncType) ([]Import, error) {
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	imports := make([]Import, 0, n)
	for i := uint32(0); i < n; i++ {
		mod, err := r.name()
		if err != nil {
			return nil, err
		}
		name, err := r.name()
		if err != nil {
			return nil, err
		}
		kind, err := r.byte()
		if err != nil {
			return nil, err
		}
		imp := Import{Module: mod, Name: name, Kind: kind}
		switch kind {
		case kindFunc:
			idx, err := r.u32()
			if err != nil || int(idx) >= len(types) {
				return nil, errCorrupt
			}
			imp.Type = types[idx]
		case kindTable:
			if _, err := r.byte(); err != nil {
				return nil, err
			}
			if err := r.limits(); err != nil {
				return nil, err
			}
		case kindMemory:
			if err := r.limits(); err != nil {
				return nil, err
			}
		case kindGlobal:
			if _, err := r.byte(); err != nil {
				return nil, err
			}
			if _, err := r.byte(); err != nil {
				return nil, err
			}
		default:
			return nil, errCorrupt
		}
		imports = append(imports, imp)
	}
	return imports, nil
}

func readExports(r *binReader) ([]Export, error) {
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	exports := make([]Export, 0, n)
	for i := uint32(0); i < n; i++ {
		name, err := r.name()
		if err != nil {
			return nil, err
		}
		kind, err := r.byte()
		if err != nil {
			return nil, err
		}
		idx, err := r.u32()
		if err != nil {
			return nil, err
		}
		exports = append(exports, Export{Name: name, Kind: kind, Index: idx})
	}
	return exports, nil
}

type binReader struct {
	b   []byte
	pos int
}

func (r *binReader) byte() (byte, error) {
	if r.pos >= len(r.b) {
		return 0, errCorrupt
	}
	c := r.b[r.pos]
	r.pos++
	return c, nil
}

// u32 reads an unsigned LEB128 of at most 5 bytes.
func (r *binReader) u32() (uint32, error) {
	var v uint32
	for shift := uint(0); shift < 35; shift += 7 {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint32(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, nil
		}
	}
	return 0, errCorrupt
}

func (r *binReader) name() (string, error) {
	n, err := r.u32()
	if err != nil {
		return "", err
	}
	if r.pos+int(n) > len(r.b) || r.pos+int(n) < r.pos {
		return "", errCorrupt
	}
	s := string(r.b[r.pos : r.pos+int(n)])
	r.pos += int(n)
	return s, nil
}

func (r *binReader) valTypes() ([]byte, error) {
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	if r.pos+int(n) > len(r.b) {
		return nil, errCorrupt
	}
	ts := append([]byte{}, r.b[r.pos:r.pos+int(n)]...)
	r.pos += int(n)
	return ts, nil
}

func (r *binReader) limits() error {
	flags, err := r.byte()
	if err != nil {
		return err
	}
	if _, err := r.u32(); err != nil {
		return err
	}
	if flags&1 != 0 {
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	return nil
}
