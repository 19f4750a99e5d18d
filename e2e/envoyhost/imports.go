package envoyhost

import (
	"fmt"
	"sort"
	"strings"
)

// The functions proxy-wasm-cpp-host offers a module: the single written-down
// copy of the allowed import set in this repository. The host registers
// exactly these (hostcalls.go and wasi.go implement them) and a module
// importing anything else fails to load, as in cpp-host src/v8/v8.cc (link).
//
// Sources:
//   - proxy_* and env.*: cpp-host include/proxy-wasm/exports.h
//     (FOR_ALL_HOST_FUNCTIONS, FOR_ALL_HOST_FUNCTIONS_ABI_SPECIFIC) and
//     src/wasm.cc (registerCallbacks: which ABI-specific ones per version);
//   - WASI: exports.h FOR_ALL_WASI_FUNCTIONS, registered under both
//     wasi_unstable and wasi_snapshot_preview1. WASICurrent is the set after
//     cpp-host #533 (April 2026); WASILegacy the set from #427 (December
//     2024, first in Envoy 1.33) up to #533.
//
// Signatures follow cpp-host's C++ declarations, where Word is i32 on
// wasm32: two of them differ from the WASI spec (path_link has 6 and
// path_symlink 4 parameters), so a module importing those with the spec
// signature gets an import type mismatch, as it would in Envoy.

// WASIProfile selects which cpp-host generation the WASI layer emulates.
type WASIProfile int

const (
	// WASICurrent is cpp-host after #533 (in Envoy through envoy #45756):
	// the full WASI set, poll_oneoff succeeds, a wider _initialize
	// allow-list, poll_oneoff allowed inside the allocator.
	WASICurrent WASIProfile = iota
	// WASILegacy is cpp-host from #427 to #533 (Envoy 1.33 until the 2026
	// fix): 18 WASI functions, poll_oneoff answers ENOSYS and is not allowed
	// during _initialize nor inside the allocator.
	WASILegacy
)

func (p WASIProfile) String() string {
	if p == WASILegacy {
		return "legacy"
	}
	return "current"
}

// ParseWASIProfile reads "current" or "legacy".
func ParseWASIProfile(s string) (WASIProfile, error) {
	switch s {
	case "current", "":
		return WASICurrent, nil
	case "legacy":
		return WASILegacy, nil
	}
	return 0, fmt.Errorf("unknown WASI profile %q (want current or legacy)", s)
}

// importSpec is one host function: name, signature and availability.
type importSpec struct {
	module string // "env" or "wasi" (registered under both WASI module names)
	name   string
	sig    string // params ":" results, i = i32, I = i64
	abis   []ABIVersion
	legacy bool // WASI only: present in WASILegacy too
}

var allABIs = []ABIVersion{ABI010, ABI020, ABI021}

// importSpecs is the table described above.
var importSpecs = []importSpec{
	// env: emscripten helpers cpp-host always registers.
	{module: "env", name: "pthread_equal", sig: "ii:i", abis: allABIs},
	{module: "env", name: "emscripten_notify_memory_growth", sig: "i:", abis: allABIs},
	// env: FOR_ALL_HOST_FUNCTIONS.
	{module: "env", name: "proxy_log", sig: "iii:i", abis: allABIs},
	{module: "env", name: "proxy_get_status", sig: "iii:i", abis: allABIs},
	{module: "env", name: "proxy_set_property", sig: "iiii:i", abis: allABIs},
	{module: "env", name: "proxy_get_property", sig: "iiii:i", abis: allABIs},
	{module: "env", name: "proxy_send_local_response", sig: "iiiiiiii:i", abis: allABIs},
	{module: "env", name: "proxy_get_shared_data", sig: "iiiii:i", abis: allABIs},
	{module: "env", name: "proxy_set_shared_data", sig: "iiiii:i", abis: allABIs},
	{module: "env", name: "proxy_register_shared_queue", sig: "iii:i", abis: allABIs},
	{module: "env", name: "proxy_resolve_shared_queue", sig: "iiiii:i", abis: allABIs},
	{module: "env", name: "proxy_dequeue_shared_queue", sig: "iii:i", abis: allABIs},
	{module: "env", name: "proxy_enqueue_shared_queue", sig: "iii:i", abis: allABIs},
	{module: "env", name: "proxy_get_header_map_value", sig: "iiiii:i", abis: allABIs},
	{module: "env", name: "proxy_add_header_map_value", sig: "iiiii:i", abis: allABIs},
	{module: "env", name: "proxy_replace_header_map_value", sig: "iiiii:i", abis: allABIs},
	{module: "env", name: "proxy_remove_header_map_value", sig: "iii:i", abis: allABIs},
	{module: "env", name: "proxy_get_header_map_pairs", sig: "iii:i", abis: allABIs},
	{module: "env", name: "proxy_set_header_map_pairs", sig: "iii:i", abis: allABIs},
	{module: "env", name: "proxy_get_header_map_size", sig: "ii:i", abis: allABIs},
	{module: "env", name: "proxy_get_buffer_status", sig: "iii:i", abis: allABIs},
	{module: "env", name: "proxy_get_buffer_bytes", sig: "iiiii:i", abis: allABIs},
	{module: "env", name: "proxy_set_buffer_bytes", sig: "iiiii:i", abis: allABIs},
	{module: "env", name: "proxy_http_call", sig: "iiiiiiiiii:i", abis: allABIs},
	{module: "env", name: "proxy_grpc_call", sig: "iiiiiiiiiiii:i", abis: allABIs},
	{module: "env", name: "proxy_grpc_stream", sig: "iiiiiiiii:i", abis: allABIs},
	{module: "env", name: "proxy_grpc_close", sig: "i:i", abis: allABIs},
	{module: "env", name: "proxy_grpc_cancel", sig: "i:i", abis: allABIs},
	{module: "env", name: "proxy_grpc_send", sig: "iiii:i", abis: allABIs},
	{module: "env", name: "proxy_set_tick_period_milliseconds", sig: "i:i", abis: allABIs},
	{module: "env", name: "proxy_get_current_time_nanoseconds", sig: "i:i", abis: allABIs},
	{module: "env", name: "proxy_define_metric", sig: "iiii:i", abis: allABIs},
	{module: "env", name: "proxy_increment_metric", sig: "iI:i", abis: allABIs},
	{module: "env", name: "proxy_record_metric", sig: "iI:i", abis: allABIs},
	{module: "env", name: "proxy_get_metric", sig: "ii:i", abis: allABIs},
	{module: "env", name: "proxy_set_effective_context", sig: "i:i", abis: allABIs},
	{module: "env", name: "proxy_done", sig: ":i", abis: allABIs},
	{module: "env", name: "proxy_call_foreign_function", sig: "iiiiii:i", abis: allABIs},
	// env: FOR_ALL_HOST_FUNCTIONS_ABI_SPECIFIC, per wasm.cc registerCallbacks.
	{module: "env", name: "proxy_get_configuration", sig: "ii:i", abis: []ABIVersion{ABI010}},
	{module: "env", name: "proxy_continue_request", sig: ":i", abis: []ABIVersion{ABI010}},
	{module: "env", name: "proxy_continue_response", sig: ":i", abis: []ABIVersion{ABI010}},
	{module: "env", name: "proxy_clear_route_cache", sig: ":i", abis: []ABIVersion{ABI010}},
	{module: "env", name: "proxy_continue_stream", sig: "i:i", abis: []ABIVersion{ABI020, ABI021}},
	{module: "env", name: "proxy_close_stream", sig: "i:i", abis: []ABIVersion{ABI020, ABI021}},
	{module: "env", name: "proxy_get_log_level", sig: "i:i", abis: []ABIVersion{ABI021}},
	// WASI, legacy set (#427).
	{module: "wasi", name: "fd_write", sig: "iiii:i", legacy: true},
	{module: "wasi", name: "fd_read", sig: "iiii:i", legacy: true},
	{module: "wasi", name: "fd_seek", sig: "iIii:i", legacy: true},
	{module: "wasi", name: "fd_close", sig: "i:i", legacy: true},
	{module: "wasi", name: "fd_fdstat_get", sig: "ii:i", legacy: true},
	{module: "wasi", name: "fd_fdstat_set_flags", sig: "ii:i", legacy: true},
	{module: "wasi", name: "environ_get", sig: "ii:i", legacy: true},
	{module: "wasi", name: "environ_sizes_get", sig: "ii:i", legacy: true},
	{module: "wasi", name: "args_get", sig: "ii:i", legacy: true},
	{module: "wasi", name: "args_sizes_get", sig: "ii:i", legacy: true},
	{module: "wasi", name: "clock_time_get", sig: "iIi:i", legacy: true},
	{module: "wasi", name: "random_get", sig: "ii:i", legacy: true},
	{module: "wasi", name: "sched_yield", sig: ":i", legacy: true},
	{module: "wasi", name: "poll_oneoff", sig: "iiii:i", legacy: true},
	{module: "wasi", name: "proc_exit", sig: "i:", legacy: true},
	{module: "wasi", name: "path_open", sig: "iiiiiIIii:i", legacy: true},
	{module: "wasi", name: "fd_prestat_get", sig: "ii:i", legacy: true},
	{module: "wasi", name: "fd_prestat_dir_name", sig: "iii:i", legacy: true},
	// WASI, added by #533.
	{module: "wasi", name: "fd_fdstat_set_rights", sig: "iII:i"},
	{module: "wasi", name: "clock_res_get", sig: "ii:i"},
	{module: "wasi", name: "fd_advise", sig: "iIIi:i"},
	{module: "wasi", name: "fd_allocate", sig: "iII:i"},
	{module: "wasi", name: "fd_datasync", sig: "i:i"},
	{module: "wasi", name: "fd_filestat_set_size", sig: "iI:i"},
	{module: "wasi", name: "fd_filestat_set_times", sig: "iIIi:i"},
	{module: "wasi", name: "fd_pread", sig: "iiiIi:i"},
	{module: "wasi", name: "fd_pwrite", sig: "iiiIi:i"},
	{module: "wasi", name: "fd_readdir", sig: "iiiIi:i"},
	{module: "wasi", name: "fd_renumber", sig: "ii:i"},
	{module: "wasi", name: "fd_sync", sig: "i:i"},
	{module: "wasi", name: "fd_tell", sig: "ii:i"},
	{module: "wasi", name: "path_create_directory", sig: "iii:i"},
	{module: "wasi", name: "path_filestat_set_times", sig: "iiiiIIi:i"},
	{module: "wasi", name: "path_link", sig: "iiiiii:i"},
	{module: "wasi", name: "path_readlink", sig: "iiiiii:i"},
	{module: "wasi", name: "path_remove_directory", sig: "iii:i"},
	{module: "wasi", name: "path_rename", sig: "iiiiii:i"},
	{module: "wasi", name: "path_symlink", sig: "iiii:i"},
	{module: "wasi", name: "path_unlink_file", sig: "iii:i"},
	{module: "wasi", name: "sock_accept", sig: "iii:i"},
	{module: "wasi", name: "sock_recv", sig: "iiiiii:i"},
	{module: "wasi", name: "sock_send", sig: "iiiii:i"},
	{module: "wasi", name: "sock_shutdown", sig: "ii:i"},
	{module: "wasi", name: "path_filestat_get", sig: "iiiii:i"},
	{module: "wasi", name: "fd_filestat_get", sig: "ii:i"},
}

// wasiModules are the two names every WASI function is registered under.
var wasiModules = []string{"wasi_unstable", "wasi_snapshot_preview1"}

// Restricted-callback allow-lists (cpp-host src/wasm.cc startVm and
// include/proxy-wasm/wasm.h allocMemory). Names are WASI function names
// (allowed under both module names) or "env.<name>".
var (
	initAllowedCurrent = []string{"env.emscripten_notify_memory_growth", "env.proxy_log",
		"fd_write", "args_sizes_get", "args_get", "environ_sizes_get", "environ_get",
		"clock_time_get", "clock_res_get", "random_get", "poll_oneoff", "fd_fdstat_get",
		"fd_fdstat_set_flags", "fd_advise", "fd_allocate", "fd_datasync", "fd_fdstat_set_rights",
		"fd_filestat_get", "fd_filestat_set_size", "fd_filestat_set_times", "fd_pread",
		"fd_prestat_dir_name", "fd_prestat_get", "fd_pwrite", "fd_readdir", "fd_renumber",
		"fd_sync", "fd_tell", "path_create_directory", "path_filestat_get",
		"path_filestat_set_times", "path_link", "path_readlink", "path_remove_directory",
		"path_rename", "path_symlink", "path_unlink_file", "sock_accept", "sock_recv",
		"sock_send", "sock_shutdown"}
	initAllowedLegacy = []string{"env.proxy_log", "fd_write", "args_sizes_get", "args_get",
		"environ_sizes_get", "environ_get", "fd_prestat_get", "fd_prestat_dir_name",
		"clock_time_get", "random_get", "fd_fdstat_get", "fd_fdstat_set_flags"}
	allocAllowedCurrent = []string{"env.proxy_log", "fd_write", "clock_time_get", "poll_oneoff"}
	allocAllowedLegacy  = []string{"env.proxy_log", "fd_write", "clock_time_get"}
)

// The allow-lists as sets, built once.
var (
	initAllowedCurrentSet  = newAllowSet(initAllowedCurrent)
	initAllowedLegacySet   = newAllowSet(initAllowedLegacy)
	allocAllowedCurrentSet = newAllowSet(allocAllowedCurrent)
	allocAllowedLegacySet  = newAllowSet(allocAllowedLegacy)
)

// allowSet is a restricted-callback allow-list keyed by "module.name".
type allowSet map[string]bool

func newAllowSet(names []string) allowSet {
	s := allowSet{}
	for _, n := range names {
		if strings.HasPrefix(n, "env.") {
			s[n] = true
			continue
		}
		for _, m := range wasiModules {
			s[m+"."+n] = true
		}
	}
	return s
}

func parseSig(sig string) FuncType {
	params, results, ok := strings.Cut(sig, ":")
	if !ok {
		panic("bad signature " + sig)
	}
	conv := func(s string) []byte {
		out := make([]byte, 0, len(s))
		for _, c := range s {
			switch c {
			case 'i':
				out = append(out, valI32)
			case 'I':
				out = append(out, valI64)
			default:
				panic("bad signature " + sig)
			}
		}
		return out
	}
	return FuncType{Params: conv(params), Results: conv(results)}
}

func (s importSpec) offered(abi ABIVersion, profile WASIProfile) bool {
	if s.module == "wasi" {
		return profile == WASICurrent || s.legacy
	}
	for _, a := range s.abis {
		if a == abi {
			return true
		}
	}
	return false
}

// AllowedImports returns the functions the emulated host offers a module of
// the given ABI version, keyed "module.name".
func AllowedImports(abi ABIVersion, profile WASIProfile) map[string]FuncType {
	out := map[string]FuncType{}
	for _, s := range importSpecs {
		if !s.offered(abi, profile) {
			continue
		}
		t := parseSig(s.sig)
		if s.module == "wasi" {
			for _, m := range wasiModules {
				out[m+"."+s.name] = t
			}
		} else {
			out[s.module+"."+s.name] = t
		}
	}
	return out
}

// AllowedImportNames lists AllowedImports sorted, for documentation.
func AllowedImportNames(abi ABIVersion, profile WASIProfile) []string {
	m := AllowedImports(abi, profile)
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ImportError is a load failure caused by the module's imports.
type ImportError struct {
	Import Import
	Msg    string
}

func (e *ImportError) Error() string { return e.Msg }

// CheckImports applies cpp-host's link rules (src/v8/v8.cc V8::link) to a
// module's imports, in import order, and returns the first failure: a
// function the host does not offer, a function with another signature, or
// an imported global. Imported memories and tables are accepted (the VM
// creates them).
func CheckImports(info *ModuleInfo, profile WASIProfile) error {
	allowed := AllowedImports(info.ABI, profile)
	for _, imp := range info.Imports {
		switch imp.Kind {
		case kindFunc:
			want, ok := allowed[imp.QualifiedName()]
			if !ok {
				return &ImportError{Import: imp, Msg: "Failed to load Wasm module due to a missing import: " + imp.QualifiedName()}
			}
			if !want.equal(imp.Type) {
				return &ImportError{Import: imp, Msg: fmt.Sprintf(
					"Failed to load Wasm module due to an import type mismatch: %s, want: %s, but host exports: %s",
					imp.QualifiedName(), imp.Type, want)}
			}
		case kindGlobal:
			return &ImportError{Import: imp, Msg: "Failed to load Wasm module due to a missing import: " + imp.QualifiedName()}
		}
	}
	return nil
}

// CheckModule parses a .wasm binary and checks its ABI version export and
// its imports as cpp-host does before instantiating it.
func CheckModule(bin []byte, profile WASIProfile) (*ModuleInfo, error) {
	info, err := ParseModuleInfo(bin)
	if err != nil {
		return nil, err
	}
	if info.ABI == ABIUnknown {
		return info, fmt.Errorf("Missing or unknown Proxy-Wasm ABI version")
	}
	return info, CheckImports(info, profile)
}
