package proxywasm

// SendHttpResponseWithDetails is SendHttpResponse with Envoy's response code
// details (%RESPONSE_CODE_DETAILS% in access logs; Envoy turns spaces into
// underscores), which the SDK's signature cannot pass. Added for the
// wasm-epp filter so every local reply names its reason in access logs.
func SendHttpResponseWithDetails(statusCode uint32, details string, headers [][2]string, body []byte, gRPCStatus int32) error {
	buf, err := appendPairs(scratch[:0], headers)
	if err != nil {
		return err
	}
	st := proxySendLocalResponse(statusCode, stringData(details), uint32(len(details)),
		bytesData(body), uint32(len(body)), bytesData(buf), uint32(len(buf)), gRPCStatus)
	releaseScratch(buf)
	return statusToError(st)
}
