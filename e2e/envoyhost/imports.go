package envoyhost

import (
	"fmt"
	"sort"
	"strings"
)

// The functions proxy-wasm-cpp-host offers a module, written down once: the
// env.* functions are the ABI table in hostcalls.go, the WASI functions are
// wasiSpecs below (implemented in wasi.go). The host registers exactly these
// and a module importing anything else fails to load, as in cpp-host
// src/v8/v8.cc (link).
//
// Sources:
//   - proxy_* and env.*: cpp-host include/proxy-wasm/exports.h
//     (FOR_ALL_HOST_FUNCTIONS, FOR_ALL_HOST_FUNCTIONS_ABI_SPECIFIC) and
//     src/wasm.cc (registerCallbacks: which ABI-specific ones per version);
//   - WASI: exports.h FOR_ALL_WASI_FUNCTIONS, registered under both
//     wasi_unstable and wasi_snapshot_preview1. WASICurrent is the set cpp-host
//     registers since April 2026; WASILegacy the smaller set it registered
//     from December 2024 (first in Envoy 1.33) until then.
//
// Signatures follow cpp-host's C++ declarations, where Word is i32 on
// wasm32: two of them differ from the WASI spec (path_link has 6 and
// path_symlink 4 parameters), so a module importing those with the spec
// signature gets an import type mismatch, as it would in Envoy.

// WASIProfile selects which cpp-host generation the WASI layer emulates.
type WASIProfile int

const (
	// WASICurrent is cpp-host since April 2026 (in Envoy from mid-2026):
	// the full WASI set, poll_oneoff succeeds, a wider _initialize
	// allow-list, poll_oneoff allowed inside the allocator.
	WASICurrent WASIProfile = iota
	// WASILegacy is cpp-host from December 2024 to April 2026 (Envoy 1.33
	// until the 2026 fix): 18 WASI functions, poll_oneoff answers ENOSYS and is not allowed
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

// wasiSpec is one WASI function: name, signature with cpp-host's parameter
// names (src/exports.cc; Word is i32, uint64_t and int64_t are i64) and
// whether WASILegacy has it too. The env.* functions are the ABI table in
// hostcalls.go, where each Go signature is the Wasm one.
type wasiSpec struct {
	name   string
	sig    string // "(name type, ...) result", types i32 or i64
	legacy bool
}

var allABIs = []ABIVersion{ABI010, ABI020, ABI021}

// wasiSpecs is the WASI part of the import set.
var wasiSpecs = []wasiSpec{
	// The legacy set (cpp-host from December 2024).
	{"fd_write", "(fd i32, iovs i32, iovs_len i32, nwritten_ptr i32) i32", true},
	{"fd_read", "(fd i32, iovs_ptr i32, iovs_len i32, nread_ptr i32) i32", true},
	{"fd_seek", "(fd i32, offset i64, whence i32, newoffset_ptr i32) i32", true},
	{"fd_close", "(fd i32) i32", true},
	{"fd_fdstat_get", "(fd i32, stat_out i32) i32", true},
	{"fd_fdstat_set_flags", "(fd i32, flags i32) i32", true},
	{"environ_get", "(environ_array_ptr i32, environ_buf i32) i32", true},
	{"environ_sizes_get", "(count_ptr i32, buf_size_ptr i32) i32", true},
	{"args_get", "(argv_array_ptr i32, argv_buf_ptr i32) i32", true},
	{"args_sizes_get", "(argc_ptr i32, argv_buf_size_ptr i32) i32", true},
	{"clock_time_get", "(clock_id i32, precision i64, result_time_uint64_ptr i32) i32", true},
	{"random_get", "(result_buf_ptr i32, buf_len i32) i32", true},
	{"sched_yield", "() i32", true},
	{"poll_oneoff", "(in i32, out i32, nsubscriptions i32, nevents_ptr i32) i32", true},
	{"proc_exit", "(exit_code i32)", true},
	{"path_open", "(fd i32, dir_flags i32, path i32, path_len i32, oflags i32, fs_rights_base i64, fs_rights_inheriting i64, fd_flags i32, nwritten_ptr i32) i32", true},
	{"fd_prestat_get", "(fd i32, buf_ptr i32) i32", true},
	{"fd_prestat_dir_name", "(fd i32, path_ptr i32, path_len i32) i32", true},
	// Added in April 2026.
	{"fd_fdstat_set_rights", "(fd i32, fs_rights_base i64, fs_rights_inheriting i64) i32", false},
	{"clock_res_get", "(clock_id i32, result_resolution_uint64_ptr i32) i32", false},
	{"fd_advise", "(fd i32, offset i64, len i64, advice i32) i32", false},
	{"fd_allocate", "(fd i32, offset i64, len i64) i32", false},
	{"fd_datasync", "(fd i32) i32", false},
	{"fd_filestat_set_size", "(fd i32, size i64) i32", false},
	{"fd_filestat_set_times", "(fd i32, atim i64, mtim i64, fst_flags i32) i32", false},
	{"fd_pread", "(fd i32, iovs_ptr i32, iovs_len i32, offset i64, nread_ptr i32) i32", false},
	{"fd_pwrite", "(fd i32, iovs_ptr i32, iovs_len i32, offset i64, nwritten_ptr i32) i32", false},
	{"fd_readdir", "(fd i32, buf_ptr i32, buf_len i32, cookie i64, nread_ptr i32) i32", false},
	{"fd_renumber", "(fd i32, to i32) i32", false},
	{"fd_sync", "(fd i32) i32", false},
	{"fd_tell", "(fd i32, retptr0 i32) i32", false},
	{"path_create_directory", "(fd i32, path_ptr i32, path_len i32) i32", false},
	{"path_filestat_set_times", "(fd i32, flags i32, path_ptr i32, path_len i32, atim i64, mtim i64, fst_flags i32) i32", false},
	// path_link and path_symlink take 6 and 4 parameters in cpp-host, not
	// the WASI spec's 7 and 5.
	{"path_link", "(old_fd i32, old_flags i32, old_path_ptr i32, old_path_len i32, new_fd i32, new_path_ptr i32) i32", false},
	{"path_readlink", "(fd i32, path_ptr i32, path_len i32, buf_ptr i32, buf_len i32, retptr0 i32) i32", false},
	{"path_remove_directory", "(fd i32, path_ptr i32, path_len i32) i32", false},
	{"path_rename", "(fd i32, old_path_ptr i32, old_path_len i32, new_fd i32, new_path_ptr i32, new_path_len i32) i32", false},
	{"path_symlink", "(old_path_ptr i32, old_path_len i32, fd i32, new_path_ptr i32) i32", false},
	{"path_unlink_file", "(fd i32, path_ptr i32, path_len i32) i32", false},
	{"sock_accept", "(fd i32, flags i32, retptr0 i32) i32", false},
	{"sock_recv", "(fd i32, ri_data_ptr i32, ri_data_len i32, ri_flags i32, retptr0 i32, retptr1 i32) i32", false},
	{"sock_send", "(fd i32, si_data_ptr i32, si_data_len i32, si_flags i32, retptr0 i32) i32", false},
	{"sock_shutdown", "(fd i32, how i32) i32", false},
	{"path_filestat_get", "(fd i32, flags i32, path i32, path_len i32, buf i32) i32", false},
	{"fd_filestat_get", "(fd i32, buf_ptr i32) i32", false},
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

// parseSig reads a wasiSpec signature: "(name type, ...) result".
func parseSig(sig string) FuncType {
	bad := func() { panic("bad signature " + sig) }
	typ := func(t string) byte {
		switch t {
		case "i32":
			return valI32
		case "i64":
			return valI64
		}
		bad()
		return 0
	}
	if !strings.HasPrefix(sig, "(") {
		bad()
	}
	params, result, ok := strings.Cut(sig[1:], ")")
	if !ok {
		bad()
	}
	var ft FuncType
	if params != "" {
		for _, p := range strings.Split(params, ", ") {
			name, t, ok := strings.Cut(p, " ")
			if !ok || name == "" {
				bad()
			}
			ft.Params = append(ft.Params, typ(t))
		}
	}
	if r := strings.TrimSpace(result); r != "" {
		ft.Results = append(ft.Results, typ(r))
	}
	return ft
}

func offeredIn(abis []ABIVersion, abi ABIVersion) bool {
	for _, a := range abis {
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
	for _, c := range proxyABI {
		if offeredIn(c.abis, abi) {
			_, t, err := adaptProxyCall(c.fn)
			if err != nil {
				panic(err) // a mistake in the table; every test that loads a module finds it
			}
			out["env."+c.name] = t
		}
	}
	for _, w := range wasiSpecs {
		if profile == WASICurrent || w.legacy {
			t := parseSig(w.sig)
			for _, m := range wasiModules {
				out[m+"."+w.name] = t
			}
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
