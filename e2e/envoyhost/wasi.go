package envoyhost

import (
	"io"
	"log/slog"
	"sort"
	"strings"
)

// WASI preview1 as cpp-host src/exports.cc implements it: there is no file
// system; stdout and stderr go to the log; args are empty; the environment
// is vm_config.environment_variables only.

// WASI errno values used by cpp-host.
const (
	errnoSuccess  = 0
	errnoBadf     = 8
	errnoNotdir   = 20
	errnoFault    = 21
	errnoInval    = 28
	errnoNoent    = 44
	errnoNosys    = 52
	errnoNotsup   = 58
	randomGetMax  = 64 * 1024 // PROXY_WASM_HOST_WASI_RANDOM_GET_MAX_SIZE_BYTES
	fdStdout      = 1
	fdStderr      = 2
	rightsFDWrite = 64 // __WASI_RIGHTS_FD_WRITE
)

// levelTrace is Envoy's trace level in slog terms.
const levelTrace = slog.LevelDebug - 4

func errno(s []uint64, e uint32) { s[0] = uint64(e) }

func stdio(fd uint32) bool { return fd == fdStdout || fd == fdStderr }

// badfUnlessStdio: success for stdout/stderr, BADF for anything else.
func badfUnlessStdio(s []uint64) {
	if stdio(u32(s[0])) {
		errno(s, errnoSuccess)
	} else {
		errno(s, errnoBadf)
	}
}

func returns(e uint32) hostImpl { return func(vm *VM, s []uint64) { errno(s, e) } }

// writev is cpp-host writevImpl: fd 1 logs at info, fd 2 at error, one
// trailing newline is dropped, nothing is logged for an empty write.
func (vm *VM) writev(fd, iovs, iovsLen uint32) (uint32, uint32) {
	var level uint32
	switch fd {
	case fdStdout:
		level = logInfo
	case fdStderr:
		level = logError
	default:
		return 0, errnoBadf
	}
	var sb strings.Builder
	for i := uint32(0); i < iovsLen; i++ {
		buf, ok1 := vm.mem.ReadUint32Le(iovs + i*8)
		n, ok2 := vm.mem.ReadUint32Le(iovs + i*8 + 4)
		if !ok1 || !ok2 {
			return 0, errnoFault
		}
		if n == 0 {
			continue
		}
		b, ok := vm.mem.Read(buf, n)
		if !ok {
			return 0, errnoFault
		}
		sb.Write(b)
	}
	written := uint32(sb.Len())
	if written > 0 {
		vm.logGuest(level, strings.TrimSuffix(sb.String(), "\n"))
	}
	return written, errnoSuccess
}

// sortedEnv gives the environment in a stable order (cpp-host keeps an
// unordered_map, so no order is promised).
func sortedEnv(env []Pair) []Pair {
	out := append([]Pair(nil), env...)
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

var wasiImpls = map[string]hostImpl{
	"fd_write": func(vm *VM, s []uint64) {
		n, e := vm.writev(u32(s[0]), u32(s[1]), u32(s[2]))
		if e != errnoSuccess {
			errno(s, e)
			return
		}
		if !vm.mem.WriteUint32Le(u32(s[3]), n) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoSuccess)
	},
	"fd_pwrite": func(vm *VM, s []uint64) {
		if !stdio(u32(s[0])) {
			errno(s, errnoBadf)
			return
		}
		n, e := vm.writev(u32(s[0]), u32(s[1]), u32(s[2]))
		if e != errnoSuccess {
			errno(s, e)
			return
		}
		if !vm.mem.WriteUint32Le(u32(s[4]), n) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoSuccess)
	},
	"fd_read":  returns(errnoNosys),
	"fd_pread": returns(errnoNosys),
	"fd_seek": func(vm *VM, s []uint64) {
		vm.log.Log(vm.ctx, levelTrace, "wasi_unstable fd_seek")
		errno(s, errnoSuccess)
	},
	"fd_close": func(vm *VM, s []uint64) {
		vm.log.Log(vm.ctx, levelTrace, "wasi_unstable fd_close")
		errno(s, errnoSuccess)
	},
	"fd_fdstat_get": func(vm *VM, s []uint64) {
		if !stdio(u32(s[0])) {
			errno(s, errnoBadf)
			return
		}
		// 24 bytes: filetype/flags zero, fs_rights_base = FD_WRITE,
		// inheriting zero. cpp-host ignores a failed write here.
		stat := make([]byte, 24)
		copy(stat[8:], le64(rightsFDWrite))
		vm.mem.Write(u32(s[1]), stat)
		errno(s, errnoSuccess)
	},
	"fd_fdstat_set_flags":  returns(errnoNosys),
	"fd_fdstat_set_rights": func(vm *VM, s []uint64) { badfUnlessStdio(s) },
	"fd_prestat_get":       returns(errnoBadf),
	"fd_prestat_dir_name":  returns(errnoNosys),
	"fd_filestat_get":      returns(errnoBadf),
	"fd_advise":            returns(errnoSuccess),
	"fd_allocate":          func(vm *VM, s []uint64) { badfUnlessStdio(s) },
	"fd_datasync":          func(vm *VM, s []uint64) { badfUnlessStdio(s) },
	"fd_sync":              func(vm *VM, s []uint64) { badfUnlessStdio(s) },
	"fd_filestat_set_size": func(vm *VM, s []uint64) { badfUnlessStdio(s) },
	"fd_filestat_set_times": func(vm *VM, s []uint64) {
		badfUnlessStdio(s)
	},
	"fd_readdir": func(vm *VM, s []uint64) {
		if !vm.mem.WriteUint32Le(u32(s[4]), 0) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoNotdir)
	},
	"fd_renumber": func(vm *VM, s []uint64) {
		if !stdio(u32(s[0])) || !stdio(u32(s[1])) {
			errno(s, errnoBadf)
			return
		}
		errno(s, errnoNotsup)
	},
	"fd_tell": func(vm *VM, s []uint64) {
		if !stdio(u32(s[0])) {
			errno(s, errnoBadf)
			return
		}
		if !vm.mem.WriteUint64Le(u32(s[1]), 0) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoSuccess)
	},
	"path_open":               returns(errnoNoent),
	"path_filestat_get":       returns(errnoNotsup),
	"path_create_directory":   returns(errnoNotsup),
	"path_filestat_set_times": returns(errnoNotsup),
	"path_link":               returns(errnoNotsup),
	"path_remove_directory":   returns(errnoNotsup),
	"path_rename":             returns(errnoNotsup),
	"path_symlink":            returns(errnoNotsup),
	"path_unlink_file":        returns(errnoNotsup),
	"path_readlink": func(vm *VM, s []uint64) {
		if !vm.mem.WriteUint32Le(u32(s[5]), 0) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoNotsup)
	},
	"sock_accept": func(vm *VM, s []uint64) {
		// cpp-host writes a 64-bit zero here (setDatatype(retptr0, 0UL)).
		if !vm.mem.WriteUint64Le(u32(s[2]), 0) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoNotsup)
	},
	"sock_recv": func(vm *VM, s []uint64) {
		if !vm.mem.WriteUint32Le(u32(s[4]), 0) || !vm.mem.WriteUint16Le(u32(s[5]), 0) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoNotsup)
	},
	"sock_send": func(vm *VM, s []uint64) {
		if !vm.mem.WriteUint32Le(u32(s[4]), 0) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoNotsup)
	},
	"sock_shutdown": returns(errnoNotsup),
	"environ_get": func(vm *VM, s []uint64) {
		arr, buf := u32(s[0]), u32(s[1])
		for _, e := range sortedEnv(vm.group.env) {
			if !vm.mem.WriteUint32Le(arr, buf) {
				errno(s, errnoFault)
				return
			}
			data := e.Key + "=" + e.Value + "\x00"
			if !vm.mem.WriteString(buf, data) {
				errno(s, errnoFault)
				return
			}
			buf += uint32(len(data))
			arr += 4
		}
		errno(s, errnoSuccess)
	},
	"environ_sizes_get": func(vm *VM, s []uint64) {
		size := 0
		for _, e := range vm.group.env {
			size += len(e.Key) + len(e.Value) + 2
		}
		if !vm.mem.WriteUint32Le(u32(s[0]), uint32(len(vm.group.env))) ||
			!vm.mem.WriteUint32Le(u32(s[1]), uint32(size)) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoSuccess)
	},
	"args_get": returns(errnoSuccess),
	"args_sizes_get": func(vm *VM, s []uint64) {
		if !vm.mem.WriteUint32Le(u32(s[0]), 0) || !vm.mem.WriteUint32Le(u32(s[1]), 0) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoSuccess)
	},
	"clock_time_get": func(vm *VM, s []uint64) {
		var t uint64
		switch u32(s[0]) {
		case 0: // realtime
			t = uint64(vm.host.clock.Now().UnixNano())
		case 1: // monotonic
			t = vm.host.monotonicNanos()
		default:
			errno(s, errnoNotsup)
			return
		}
		if !vm.mem.WriteUint64Le(u32(s[2]), t) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoSuccess)
	},
	"clock_res_get": func(vm *VM, s []uint64) {
		switch u32(s[0]) {
		case 0, 1:
		default:
			errno(s, errnoNotsup)
			return
		}
		if !vm.mem.WriteUint64Le(u32(s[1]), 1) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoSuccess)
	},
	"random_get": func(vm *VM, s []uint64) {
		n := u32(s[1])
		if n > randomGetMax {
			errno(s, errnoInval)
			return
		}
		if n == 0 {
			errno(s, errnoSuccess)
			return
		}
		b := make([]byte, n)
		vm.host.randMu.Lock()
		_, err := io.ReadFull(vm.host.rand, b)
		vm.host.randMu.Unlock()
		if err != nil || !vm.mem.Write(u32(s[0]), b) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoSuccess)
	},
	"sched_yield": returns(errnoSuccess),
	"poll_oneoff": func(vm *VM, s []uint64) {
		if vm.host.cfg.WASIProfile == WASILegacy {
			// The legacy WASI set answers ENOSYS, which Go's runtime treats
			// as fatal in its scheduler's sleep.
			errno(s, errnoNosys)
			return
		}
		if !vm.mem.WriteUint32Le(u32(s[3]), 0) {
			errno(s, errnoFault)
			return
		}
		errno(s, errnoSuccess)
	},
	"proc_exit": func(vm *VM, s []uint64) {
		// cpp-host logs (Context::error is a trace log in Envoy) and
		// returns: the guest keeps running.
		vm.log.Log(vm.ctx, levelTrace, "wasi_unstable proc_exit", "code", u32(s[0]))
	},
}
