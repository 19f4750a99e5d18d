package envoyhost

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"
)

// Properties (proxy_get_property). The path is split at NUL bytes; the
// first segment names a top-level value, later ones index maps (envoy
// source/extensions/common/wasm/context.cc getProperty and findValue,
// source/extensions/filters/common/expr/context.cc for request, response,
// source, destination, connection, upstream). Values are serialised as
// envoy serializeValue does: strings raw, integers 8 bytes little-endian,
// booleans one byte, timestamps and durations as int64 nanoseconds, maps in
// the pairs format.

type propKind int

const (
	propString propKind = iota
	propInt
	propUint
	propBool
	propMap
	propOpaque // a wrapper Envoy cannot serialise as a whole
)

type propValue struct {
	kind propKind
	s    string
	i    int64
	u    uint64
	b    bool
	m    func(key string) (propValue, bool) // map lookup
	keys func() []Pair                      // map serialisation (values as strings)
}

func pString(s string) (propValue, bool) { return propValue{kind: propString, s: s}, true }
func pInt(i int64) (propValue, bool)     { return propValue{kind: propInt, i: i}, true }

func (v propValue) serialize() ([]byte, WasmResult) {
	switch v.kind {
	case propString:
		return []byte(v.s), ResultOK
	case propInt:
		return le64(uint64(v.i)), ResultOK
	case propUint:
		return le64(v.u), ResultOK
	case propBool:
		if v.b {
			return []byte{1}, ResultOK
		}
		return []byte{0}, ResultOK
	case propMap:
		if v.keys == nil {
			return nil, ResultSerializationFailure
		}
		return encodePairs(v.keys()), ResultOK
	}
	return nil, ResultSerializationFailure
}

// getProperty resolves a NUL-separated path.
func (c *wasmContext) getProperty(path string) ([]byte, WasmResult) {
	if path == "" {
		return nil, ResultNotFound
	}
	parts := strings.Split(path, "\x00")
	if parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	v, ok := c.topLevelProperty(parts[0])
	if !ok {
		return nil, ResultNotFound
	}
	for _, part := range parts[1:] {
		if v.kind != propMap && v.kind != propOpaque || v.m == nil {
			return nil, ResultNotFound
		}
		if v, ok = v.m(part); !ok {
			return nil, ResultNotFound
		}
	}
	return v.serialize()
}

func (c *wasmContext) topLevelProperty(name string) (propValue, bool) {
	st := c.stream
	if st != nil {
		switch name {
		case "request":
			return propValue{kind: propOpaque, m: st.requestProperty}, true
		case "response":
			return propValue{kind: propOpaque, m: st.responseProperty}, true
		case "source":
			return addressProperty(st.remoteAddr), true
		case "destination":
			return addressProperty(st.localAddr), true
		case "connection":
			return propValue{kind: propOpaque, m: st.connectionProperty}, true
		case "upstream":
			return propValue{kind: propOpaque, m: st.upstreamProperty}, true
		case "xds":
			return propValue{kind: propOpaque, m: st.xdsProperty}, true
		}
	}
	// The Wasm-specific tokens (context.cc PROPERTY_TOKENS).
	switch name {
	case "plugin_name":
		if p := c.pluginForProperties(); p != nil {
			return pString(p.name)
		}
		return propValue{}, false
	case "plugin_root_id":
		if p := c.pluginForProperties(); p != nil {
			return pString(p.rootID)
		}
		return pString("")
	case "plugin_vm_id":
		return pString(c.vm.group.vmID)
	case "connection_id":
		if st != nil {
			return propValue{kind: propUint, u: st.connID}, true
		}
		return propValue{}, false
	}
	// Anything else is filter state written with set_property.
	if st != nil {
		if v, ok := st.filterState["wasm."+name]; ok {
			return pString(string(v))
		}
	}
	return propValue{}, false
}

func (c *wasmContext) pluginForProperties() *Plugin {
	if c.stream != nil {
		return c.stream.plugin
	}
	if r := c.rootCtx(); r.plugin != nil {
		return r.plugin
	}
	return nil
}

func addressProperty(addr string) propValue {
	return propValue{kind: propOpaque, m: func(key string) (propValue, bool) {
		switch key {
		case "address":
			return pString(addr)
		case "port":
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				return propValue{}, false
			}
			n, err := strconv.Atoi(port)
			if err != nil {
				return propValue{}, false
			}
			return pInt(int64(n))
		}
		return propValue{}, false
	}}
}

// headersProperty is a header map as a CEL map: lookups by lower-case
// name, several values joined with ",".
func headersProperty(m *HeaderMap) propValue {
	return propValue{kind: propMap,
		m: func(key string) (propValue, bool) {
			if m == nil {
				return propValue{}, false
			}
			vs := m.Values(key)
			if len(vs) == 0 {
				return propValue{}, false
			}
			return pString(strings.Join(vs, ","))
		},
		keys: func() []Pair {
			if m == nil {
				return nil
			}
			var out []Pair
			seen := map[string]int{}
			for _, p := range m.Pairs() {
				if i, ok := seen[p.Key]; ok {
					out[i].Value += "," + p.Value
					continue
				}
				seen[p.Key] = len(out)
				out = append(out, p)
			}
			return out
		}}
}

// activeRequestHeaders is the header map the request properties read: the
// live map while the filter may see it, the final one in the log phase,
// none otherwise (expr context.cc reads through activation headers).
func (s *stream) activeRequestHeaders() *HeaderMap {
	if s.accessLogPhase {
		return s.logReqHeaders
	}
	return s.reqHeaders
}

func (s *stream) activeResponseHeaders() *HeaderMap {
	if s.accessLogPhase {
		return s.logRespHeaders
	}
	return s.respHeaders
}

func (s *stream) requestProperty(key string) (propValue, bool) {
	h := s.activeRequestHeaders()
	header := func(name string) (propValue, bool) {
		if h == nil {
			return propValue{}, false
		}
		v, ok := h.Get(name)
		if !ok {
			return propValue{}, false
		}
		return pString(v)
	}
	switch key {
	case "headers":
		return headersProperty(h), true
	case "time":
		return pInt(s.startTime.UnixNano())
	case "size":
		if h != nil {
			if v, ok := h.Get("content-length"); ok {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					return pInt(n)
				}
			}
		}
		return pInt(s.bytesReceived.Load())
	case "total_size":
		n := s.bytesReceived.Load()
		if h != nil {
			n += int64(h.ByteSize())
		}
		return pInt(n)
	case "duration":
		if s.completeAfter > 0 {
			return pInt(int64(s.completeAfter))
		}
		return propValue{}, false
	case "protocol":
		// Http::Utility::getProtocolString.
		if s.r.ProtoMajor == 2 {
			return pString("HTTP/2")
		}
		return pString("HTTP/1.1")
	case "path":
		return header(":path")
	case "url_path":
		if h == nil {
			return propValue{}, false
		}
		p, _ := h.Get(":path")
		if i := strings.IndexByte(p, '?'); i >= 0 {
			p = p[:i]
		}
		return pString(p)
	case "host":
		return header(":authority")
	case "scheme":
		return header(":scheme")
	case "method":
		return header(":method")
	case "referer":
		return header("referer")
	case "id":
		return header("x-request-id")
	case "useragent":
		return header("user-agent")
	case "query":
		if h == nil {
			return propValue{}, false
		}
		p, _ := h.Get(":path")
		i := strings.IndexByte(p, '?')
		if i < 0 {
			return pString("")
		}
		q := p[i+1:]
		if j := strings.IndexByte(q, '#'); j >= 0 {
			q = q[:j]
		}
		return pString(q)
	}
	return propValue{}, false
}

func (s *stream) responseProperty(key string) (propValue, bool) {
	h := s.activeResponseHeaders()
	switch key {
	case "code":
		code := s.responseCode.Load()
		if code == 0 {
			return propValue{}, false
		}
		return pInt(code)
	case "code_details":
		d := s.getDetails()
		if d == "" {
			return propValue{}, false
		}
		return pString(d)
	case "headers":
		return headersProperty(h), true
	case "trailers":
		return headersProperty(s.respTrailers), true
	case "size":
		return pInt(s.bytesSent.Load())
	case "total_size":
		n := s.bytesSent.Load()
		if h != nil {
			n += int64(h.ByteSize())
		}
		return pInt(n)
	case "flags":
		return pInt(0)
	}
	return propValue{}, false
}

func (s *stream) connectionProperty(key string) (propValue, bool) {
	switch key {
	case "id":
		return propValue{kind: propUint, u: s.connID}, true
	case "mtls":
		return propValue{kind: propBool, b: false}, true
	case "requested_server_name":
		return pString("")
	}
	return propValue{}, false
}

func (s *stream) upstreamProperty(key string) (propValue, bool) {
	if s.upstreamHost == "" {
		return propValue{}, false
	}
	return addressProperty(s.upstreamHost).m(key)
}

func (s *stream) xdsProperty(key string) (propValue, bool) {
	switch key {
	case "cluster_name":
		if s.clusterName == "" {
			return propValue{}, false
		}
		return pString(s.clusterName)
	case "route_name":
		return pString(s.routeName)
	}
	return propValue{}, false
}

func le64(v uint64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, v)
	return b
}
