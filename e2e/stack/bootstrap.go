package stack

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasm-epp/wasm-epp/envoy"
	"github.com/wasm-epp/wasm-epp/envoy/bootstrap"
	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// BootstrapOptions says how RenderBootstrap derives a runnable bootstrap from
// a template such as envoy/envoy.yaml. Empty fields keep the template's value.
type BootstrapOptions struct {
	// WasmPath replaces vm_config.code.local.filename of every wasm-epp
	// plugin. It is made absolute: Envoy resolves a relative name against
	// its working directory, and the stack may run Envoy elsewhere.
	WasmPath string
	// ClientAddr, PushAddr and AdminAddr (host:port) replace the address of
	// the router listener, the receiver listener and the admin interface.
	ClientAddr, PushAddr, AdminAddr string
	// RouterPatch and ReceiverPatch are JSON merge patches (RFC 7386) applied
	// to the plugin configuration of the router and of the receiver: a key
	// set to nil is removed, objects merge, anything else replaces.
	RouterPatch, ReceiverPatch map[string]any
	// ExtraRouters adds copies of the router listener, each with its own
	// name, address and configuration patch (applied after RouterPatch).
	// They share the router's vm_config, so they read the same shared data.
	ExtraRouters []RouterListener
}

// RouterListener is an additional client listener.
type RouterListener struct {
	Name  string
	Addr  string // host:port
	Patch map[string]any
}

// RenderBootstrap applies o to the YAML bootstrap template and returns the
// result as YAML. The template is read, edited and written back as typed
// Envoy messages (envoy/bootstrap), and the output is checked the way the
// project checks every bootstrap (bootstrap.Load and envoy.Check), so a
// template or option mistake fails here with the field named, not later
// inside Envoy.
func RenderBootstrap(template []byte, o BootstrapOptions) ([]byte, error) {
	b, err := bootstrap.Load(template)
	if err != nil {
		return nil, fmt.Errorf("bootstrap template: %w", err)
	}
	if o.WasmPath != "" {
		abs, err := filepath.Abs(o.WasmPath)
		if err != nil {
			return nil, err
		}
		o.WasmPath = abs
	}
	if o.AdminAddr != "" {
		if b.GetAdmin().GetAddress() == nil {
			return nil, errors.New("bootstrap: admin.address missing")
		}
		if err := bootstrap.SetSocketAddress(b.GetAdmin().GetAddress(), o.AdminAddr); err != nil {
			return nil, fmt.Errorf("admin: %w", err)
		}
	}
	plugins, err := envoy.Plugins(b)
	if err != nil {
		return nil, fmt.Errorf("bootstrap template: %w", err)
	}
	var routerListener *listenerv3.Listener
	found := map[config.Role]int{}
	for _, p := range plugins {
		found[p.Config.Role]++
		if err := renderPlugin(p, o, &routerListener); err != nil {
			return nil, fmt.Errorf("listener %q: %w", p.Listener.GetName(), err)
		}
	}
	if found[config.RoleRouter] != 1 || found[config.RoleReceiver] != 1 {
		return nil, fmt.Errorf("bootstrap template must have exactly one router and one receiver plugin, found %d and %d",
			found[config.RoleRouter], found[config.RoleReceiver])
	}
	// Copy before the router's own address changes, so copies start from
	// the template and get their own address below.
	statics := b.GetStaticResources()
	for _, extra := range o.ExtraRouters {
		if extra.Name == "" || extra.Addr == "" {
			return nil, errors.New("extra router listener needs a name and an address")
		}
		cp := proto.Clone(routerListener).(*listenerv3.Listener)
		cp.Name = extra.Name
		if err := bootstrap.SetSocketAddress(cp.GetAddress(), extra.Addr); err != nil {
			return nil, fmt.Errorf("listener %s: %w", extra.Name, err)
		}
		filters, err := bootstrap.ListenerWasmFilters(cp)
		if err != nil {
			return nil, fmt.Errorf("listener %s: %w", extra.Name, err)
		}
		for _, w := range filters {
			if err := patchPluginConfig(w.Wasm, extra.Patch); err != nil {
				return nil, fmt.Errorf("listener %s: %w", extra.Name, err)
			}
			if err := w.Store(); err != nil {
				return nil, err
			}
		}
		statics.Listeners = append(statics.Listeners, cp)
	}
	if o.ClientAddr != "" {
		if err := bootstrap.SetSocketAddress(routerListener.GetAddress(), o.ClientAddr); err != nil {
			return nil, fmt.Errorf("listener %q: %w", routerListener.GetName(), err)
		}
	}

	out, err := bootstrap.Marshal(b)
	if err != nil {
		return nil, err
	}
	rendered, err := bootstrap.Load(out)
	if err != nil {
		return nil, fmt.Errorf("rendered bootstrap: %w", err)
	}
	if err := envoy.Check(rendered, envoy.Rules{}); err != nil {
		return nil, fmt.Errorf("rendered bootstrap: %w", err)
	}
	return out, nil
}

// renderPlugin applies o to one plugin of the template: its code path, its
// role's configuration patch and, for the receiver, its listener address.
// The router's listener is remembered for the copies and the client address.
func renderPlugin(p envoy.Plugin, o BootstrapOptions, routerListener **listenerv3.Listener) error {
	if o.WasmPath != "" {
		local := p.Wasm.GetConfig().GetVmConfig().GetCode().GetLocal()
		if local == nil {
			return errors.New("plugin vm_config.code.local missing")
		}
		local.Specifier = &corev3.DataSource_Filename{Filename: o.WasmPath}
	}
	var err error
	switch p.Config.Role {
	case config.RoleRouter:
		if *routerListener == nil {
			*routerListener = p.Listener
		}
		err = patchPluginConfig(p.Wasm, o.RouterPatch)
	case config.RoleReceiver:
		err = patchPluginConfig(p.Wasm, o.ReceiverPatch)
		if err == nil && o.PushAddr != "" {
			err = bootstrap.SetSocketAddress(p.Listener.GetAddress(), o.PushAddr)
		}
	}
	if err != nil {
		return err
	}
	return p.Store()
}

// BootstrapInfo is what the stack needs to know about a rendered bootstrap.
type BootstrapInfo struct {
	// Router is the (first) router plugin's configuration with defaults.
	Router *config.Config
	// Receiver is the receiver plugin's configuration with defaults.
	Receiver *config.Config
	// Listeners maps listener names to their host:port.
	Listeners map[string]string
	// ClientListener and PushListener name the router's and the
	// receiver's listener.
	ClientListener, PushListener string
	AdminAddr                    string
}

// InspectBootstrap reads addresses and plugin configurations from a YAML
// bootstrap.
func InspectBootstrap(doc []byte) (*BootstrapInfo, error) {
	b, err := bootstrap.Load(doc)
	if err != nil {
		return nil, err
	}
	plugins, err := envoy.Plugins(b)
	if err != nil {
		return nil, err
	}
	info := &BootstrapInfo{Listeners: map[string]string{}}
	if info.AdminAddr, err = bootstrap.SocketAddress(b.GetAdmin().GetAddress()); err != nil {
		return nil, fmt.Errorf("admin.address: %w", err)
	}
	for _, l := range b.GetStaticResources().GetListeners() {
		if info.Listeners[l.GetName()], err = bootstrap.SocketAddress(l.GetAddress()); err != nil {
			return nil, fmt.Errorf("listener %q: %w", l.GetName(), err)
		}
	}
	for _, p := range plugins {
		switch p.Config.Role {
		case config.RoleRouter:
			if info.Router == nil {
				info.Router, info.ClientListener = p.Config, p.Listener.GetName()
			}
		case config.RoleReceiver:
			if info.Receiver == nil {
				info.Receiver, info.PushListener = p.Config, p.Listener.GetName()
			}
		}
	}
	if info.Router == nil || info.Receiver == nil {
		return nil, errors.New("bootstrap needs a router and a receiver plugin")
	}
	return info, nil
}

// patchPluginConfig applies a JSON merge patch to the plugin configuration
// (a StringValue holding JSON; envoy.Plugins has checked that) and checks the
// result with the plugin's own decoder.
func patchPluginConfig(w *wasmfilterv3.Wasm, patch map[string]any) error {
	if len(patch) == 0 {
		return nil
	}
	pc := w.GetConfig()
	s := &wrapperspb.StringValue{}
	if err := pc.GetConfiguration().UnmarshalTo(s); err != nil {
		return fmt.Errorf("plugin configuration: %w", err)
	}
	var v map[string]any
	dec := json.NewDecoder(strings.NewReader(s.GetValue()))
	dec.UseNumber() // keep numbers exactly as written
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("plugin configuration: %w", err)
	}
	mergePatch(v, patch)
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if _, err := config.Decode(js); err != nil {
		return fmt.Errorf("patched plugin configuration: %w", err)
	}
	a, err := anypb.New(wrapperspb.String(string(js) + "\n"))
	if err != nil {
		return err
	}
	pc.Configuration = a
	return nil
}

// mergePatch applies an RFC 7386 JSON merge patch to dst in place.
func mergePatch(dst, patch map[string]any) {
	for k, pv := range patch {
		if pv == nil {
			delete(dst, k)
			continue
		}
		if pm, ok := pv.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergePatch(dm, pm)
				continue
			}
			fresh := map[string]any{}
			mergePatch(fresh, pm)
			dst[k] = fresh
			continue
		}
		dst[k] = pv
	}
}
