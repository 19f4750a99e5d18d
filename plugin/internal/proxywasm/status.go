package proxywasm

import (
	"strconv"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"
)

// Host status codes, the proxy-wasm ABI's WasmResult values.
const (
	statusOK                   = 0
	statusNotFound             = 1
	statusBadArgument          = 2
	statusSerializationFailure = 3
	statusParseFailure         = 4
	statusBadExpression        = 5
	statusInvalidMemoryAccess  = 6
	statusEmpty                = 7
	statusCasMismatch          = 8
	statusResultMismatch       = 9
	statusInternalFailure      = 10
	statusBrokenConnection     = 11
	statusUnimplemented        = 12
)

// StatusError is a host status code that has no error value in the SDK's
// types package. It is comparable, so errors.Is works with the constants below.
type StatusError uint32

// Host statuses without an SDK error value.
const (
	ErrorStatusSerializationFailure StatusError = statusSerializationFailure
	ErrorStatusParseFailure         StatusError = statusParseFailure
	ErrorStatusBadExpression        StatusError = statusBadExpression
	ErrorStatusInvalidMemoryAccess  StatusError = statusInvalidMemoryAccess
	ErrorStatusResultMismatch       StatusError = statusResultMismatch
	ErrorStatusBrokenConnection     StatusError = statusBrokenConnection
)

func (e StatusError) Error() string {
	name := "unknown"
	switch e {
	case ErrorStatusSerializationFailure:
		name = "serialization failure"
	case ErrorStatusParseFailure:
		name = "parse failure"
	case ErrorStatusBadExpression:
		name = "bad expression"
	case ErrorStatusInvalidMemoryAccess:
		name = "invalid memory access"
	case ErrorStatusResultMismatch:
		name = "result mismatch"
	case ErrorStatusBrokenConnection:
		name = "broken connection"
	}
	return "error status returned by host: " + name + " (" + strconv.FormatUint(uint64(e), 10) + ")"
}

// statusToError maps a host status to the SDK's error values, so plugin code
// compares errors the same way in both builds.
func statusToError(status uint32) error {
	if status == statusOK {
		return nil
	}
	return statusError(status)
}

// statusError is statusToError for a failure, out of line: statusToError
// is inlined at every host call, and a Wasm guest pays for every byte of
// code on its request path.
//
//go:noinline
func statusError(status uint32) error {
	switch status {
	case statusNotFound:
		return types.ErrorStatusNotFound
	case statusBadArgument:
		return types.ErrorStatusBadArgument
	case statusEmpty:
		return types.ErrorStatusEmpty
	case statusCasMismatch:
		return types.ErrorStatusCasMismatch
	case statusInternalFailure:
		return types.ErrorInternalFailure
	case statusUnimplemented:
		return types.ErrorUnimplemented
	}
	return StatusError(status)
}
