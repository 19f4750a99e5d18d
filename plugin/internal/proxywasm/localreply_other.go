//go:build !wasip1

package proxywasm

// SendHttpResponseWithDetails forwards to SendHttpResponse: the SDK (and so
// proxytest) has no way to pass response code details, so they are dropped
// in native builds. The wasip1 build sends them to the host.
func SendHttpResponseWithDetails(statusCode uint32, details string, headers [][2]string, body []byte, gRPCStatus int32) error {
	return SendHttpResponse(statusCode, headers, body, gRPCStatus)
}
