package bootstrap

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // registers the router's typed config for Any
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"
)

// Load decodes a YAML bootstrap strictly into a Bootstrap and validates it,
// the typed configurations inside its Any fields included.
func Load(doc []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, fmt.Errorf("bootstrap YAML: %w", err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, b); err != nil {
		return nil, fmt.Errorf("bootstrap is not an envoy.config.bootstrap.v3.Bootstrap: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("bootstrap validation: %w", err)
	}
	if err := validateNested(b.ProtoReflect(), "bootstrap"); err != nil {
		return nil, err
	}
	return b, nil
}

// Marshal writes b as YAML with the proto field names Envoy's own files use.
// Fields at their zero value are left out; Load reads the result back to an
// equal message.
func Marshal(b *bootstrapv3.Bootstrap) ([]byte, error) {
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	return yaml.JSONToYAML(js)
}

type validator interface{ ValidateAll() error }

// validateNested walks every message field and validates the contents of
// each Any it finds (HCM inside a listener, wasm inside the HCM, ...).
func validateNested(m protoreflect.Message, path string) error {
	var errs []error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := path + "." + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				errs = append(errs, visit(mv.Message(), fmt.Sprintf("%s[%v]", name, k.Interface())))
				return true
			})
		case fd.IsList():
			if fd.Message() == nil {
				return true
			}
			for i := 0; i < v.List().Len(); i++ {
				errs = append(errs, visit(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", name, i)))
			}
		case fd.Message() != nil:
			errs = append(errs, visit(v.Message(), name))
		}
		return true
	})
	return errors.Join(errs...)
}

func visit(m protoreflect.Message, path string) error {
	a, ok := m.Interface().(*anypb.Any)
	if !ok {
		return validateNested(m, path)
	}
	inner, err := a.UnmarshalNew()
	if err != nil {
		return fmt.Errorf("%s: %s: %w", path, a.GetTypeUrl(), err)
	}
	if v, ok := inner.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s (%s): %w", path, a.GetTypeUrl(), err)
		}
	}
	return validateNested(inner.ProtoReflect(), path+"<"+string(inner.ProtoReflect().Descriptor().FullName())+">")
}

// ConnectionManager is an HTTP connection manager unpacked from one network
// filter of a listener.
type ConnectionManager struct {
	Listener *listenerv3.Listener
	// Chain is the filter chain holding Filter (possibly the listener's
	// default_filter_chain).
	Chain  *listenerv3.FilterChain
	Filter *listenerv3.Filter
	HCM    *hcmv3.HttpConnectionManager
}

// Store packs HCM back into the network filter's typed_config.
func (c ConnectionManager) Store() error {
	a, err := pack(c.HCM)
	if err != nil {
		return fmt.Errorf("listener %q: %w", c.Listener.GetName(), err)
	}
	c.Filter.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
	return nil
}

// ConnectionManagers unpacks every HTTP connection manager of l, in filter
// chain order (the default filter chain last). Network filters of other
// types are skipped.
func ConnectionManagers(l *listenerv3.Listener) ([]ConnectionManager, error) {
	var out []ConnectionManager
	chains := slices.Clone(l.GetFilterChains())
	if l.GetDefaultFilterChain() != nil {
		chains = append(chains, l.GetDefaultFilterChain())
	}
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			hcm := &hcmv3.HttpConnectionManager{}
			if f.GetTypedConfig() == nil || !f.GetTypedConfig().MessageIs(hcm) {
				continue
			}
			if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
				return nil, fmt.Errorf("listener %q filter %q: %w", l.GetName(), f.GetName(), err)
			}
			out = append(out, ConnectionManager{Listener: l, Chain: fc, Filter: f, HCM: hcm})
		}
	}
	return out, nil
}

// WasmFilter is one envoy.extensions.filters.http.wasm.v3.Wasm HTTP filter
// unpacked from a connection manager.
type WasmFilter struct {
	ConnectionManager
	// Index is the filter's position in HCM.HttpFilters.
	Index int
	Wasm  *wasmfilterv3.Wasm
}

// Store packs Wasm back into its HTTP filter, then the connection manager
// into its listener. Filters of one connection manager share its HCM, so
// storing each of them after editing keeps all edits.
func (w WasmFilter) Store() error {
	a, err := pack(w.Wasm)
	if err != nil {
		return fmt.Errorf("listener %q http_filters[%d]: %w", w.Listener.GetName(), w.Index, err)
	}
	w.HCM.HttpFilters[w.Index].ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}
	return w.ConnectionManager.Store()
}

// ListenerWasmFilters returns the Wasm HTTP filters of one listener.
func ListenerWasmFilters(l *listenerv3.Listener) ([]WasmFilter, error) {
	cms, err := ConnectionManagers(l)
	if err != nil {
		return nil, err
	}
	var out []WasmFilter
	var errs []error
	for _, cm := range cms {
		for i, f := range cm.HCM.GetHttpFilters() {
			w := &wasmfilterv3.Wasm{}
			if f.GetTypedConfig() == nil || !f.GetTypedConfig().MessageIs(w) {
				continue
			}
			if err := f.GetTypedConfig().UnmarshalTo(w); err != nil {
				errs = append(errs, fmt.Errorf("listener %q http_filters[%d]: %w", l.GetName(), i, err))
				continue
			}
			out = append(out, WasmFilter{ConnectionManager: cm, Index: i, Wasm: w})
		}
	}
	return out, errors.Join(errs...)
}

// WasmFilters returns the Wasm HTTP filters of every static listener.
func WasmFilters(b *bootstrapv3.Bootstrap) ([]WasmFilter, error) {
	var out []WasmFilter
	var errs []error
	for _, l := range b.GetStaticResources().GetListeners() {
		ws, err := ListenerWasmFilters(l)
		errs = append(errs, err)
		out = append(out, ws...)
	}
	return out, errors.Join(errs...)
}

// SocketAddress gives a TCP socket_address with a port_value as host:port.
func SocketAddress(a *corev3.Address) (string, error) {
	sa := a.GetSocketAddress()
	if sa == nil {
		return "", errors.New("only socket_address is supported")
	}
	if sa.GetProtocol() != corev3.SocketAddress_TCP {
		return "", errors.New("only TCP is supported")
	}
	if _, ok := sa.GetPortSpecifier().(*corev3.SocketAddress_PortValue); !ok {
		return "", errors.New("a port_value is required")
	}
	return net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)), nil
}

// SetSocketAddress makes a a TCP socket_address at hostport (host:port,
// numeric port).
func SetSocketAddress(a *corev3.Address, hostport string) error {
	if a == nil {
		return errors.New("address missing")
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return err
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return fmt.Errorf("port %q: %w", port, err)
	}
	a.Address = &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address:       host,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(n)},
	}}
	return nil
}

// pack is anypb.New with deterministic serialisation, so rendering the same
// bootstrap twice gives the same bytes.
func pack(m proto.Message) (*anypb.Any, error) {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		return nil, err
	}
	return a, nil
}
