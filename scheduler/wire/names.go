package wire

// Names shared by the agent, the receiver and the filter, so their defaults
// cannot drift apart.
const (
	// PushPath is the default HTTP path of the plugin's receiver.
	PushPath = "/wasm-epp/v1/push"
	// ContentType is the Content-Type of a push.
	ContentType = "application/octet-stream"
	// DefaultKeyPrefix is the default prefix of the plugin's shared-data keys.
	DefaultKeyPrefix = "wasm-epp."
)
