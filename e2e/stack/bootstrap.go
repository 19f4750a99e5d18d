package stack

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"

	"sigs.k8s.io/yaml"

	"github.com/wasm-epp/wasm-epp/envoy"
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

const (
	hcmFilter  = "envoy.filters.network.http_connection_manager"
	wasmFilter = "envoy.filters.http.wasm"
)

// RenderBootstrap applies o to the YAML bootstrap template and returns the
// result as YAML. The output is checked the way the project checks every
// bootstrap (envoy.LoadBootstrap and envoy.Check), so a template or option
// mistake fails here with the field named, not later inside Envoy.
func RenderBootstrap(template []byte, o BootstrapOptions) ([]byte, error) {
	js, err := yaml.YAMLToJSONStrict(template)
	if err != nil {
		return nil, fmt.Errorf("bootstrap template: %w", err)
	}
	var root map[string]any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber() // keep port numbers and byte limits exactly as written
	if err := dec.Decode(&root); err != nil {
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
		admin, err := path(root, "admin", "address")
		if err != nil {
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
		if err := setSocketAddress(admin, o.AdminAddr); err != nil {
			return nil, fmt.Errorf("admin: %w", err)
		}
	}
	statics, err := obj(root, "static_resources")
	if err != nil {
		return nil, err
	}
	listeners, _ := statics["listeners"].([]any)
	var routerListener map[string]any
	found := map[config.Role]int{}
	for i, l := range listeners {
		lm, ok := l.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("static_resources.listeners[%d] is not an object", i)
		}
		plugins, err := wasmPlugins(lm)
		if err != nil {
			return nil, fmt.Errorf("listener %v: %w", lm["name"], err)
		}
		for _, p := range plugins {
			role, err := pluginRole(p)
			if err != nil {
				return nil, fmt.Errorf("listener %v: %w", lm["name"], err)
			}
			found[role]++
			if o.WasmPath != "" {
				if err := setCodePath(p, o.WasmPath); err != nil {
					return nil, fmt.Errorf("listener %v: %w", lm["name"], err)
				}
			}
			switch role {
			case config.RoleRouter:
				if routerListener == nil {
					routerListener = lm
				}
				err = patchPluginConfig(p, o.RouterPatch)
			case config.RoleReceiver:
				err = patchPluginConfig(p, o.ReceiverPatch)
				if err == nil && o.PushAddr != "" {
					err = setListenerAddress(lm, o.PushAddr)
				}
			}
			if err != nil {
				return nil, fmt.Errorf("listener %v: %w", lm["name"], err)
			}
		}
	}
	if found[config.RoleRouter] != 1 || found[config.RoleReceiver] != 1 {
		return nil, fmt.Errorf("bootstrap template must have exactly one router and one receiver plugin, found %d and %d",
			found[config.RoleRouter], found[config.RoleReceiver])
	}
	// Copy before the router's own address changes, so copies start from
	// the template and get their own address below.
	for _, extra := range o.ExtraRouters {
		if extra.Name == "" || extra.Addr == "" {
			return nil, errors.New("extra router listener needs a name and an address")
		}
		cp, err := deepCopy(routerListener)
		if err != nil {
			return nil, err
		}
		cp["name"] = extra.Name
		if err := setListenerAddress(cp, extra.Addr); err != nil {
			return nil, fmt.Errorf("listener %s: %w", extra.Name, err)
		}
		plugins, _ := wasmPlugins(cp)
		for _, p := range plugins {
			if err := patchPluginConfig(p, extra.Patch); err != nil {
				return nil, fmt.Errorf("listener %s: %w", extra.Name, err)
			}
		}
		listeners = append(listeners, cp)
	}
	statics["listeners"] = listeners
	if o.ClientAddr != "" {
		if err := setListenerAddress(routerListener, o.ClientAddr); err != nil {
			return nil, fmt.Errorf("listener %v: %w", routerListener["name"], err)
		}
	}

	outJSON, err := json.Marshal(root)
	if err != nil {
		return nil, err
	}
	out, err := yaml.JSONToYAML(outJSON)
	if err != nil {
		return nil, err
	}
	b, err := envoy.LoadBootstrap(out)
	if err != nil {
		return nil, fmt.Errorf("rendered bootstrap: %w", err)
	}
	if err := envoy.Check(b, envoy.Rules{}); err != nil {
		return nil, fmt.Errorf("rendered bootstrap: %w", err)
	}
	return out, nil
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
	b, err := envoy.LoadBootstrap(doc)
	if err != nil {
		return nil, err
	}
	plugins, err := envoy.Plugins(b)
	if err != nil {
		return nil, err
	}
	info := &BootstrapInfo{Listeners: map[string]string{}}
	sa := b.GetAdmin().GetAddress().GetSocketAddress()
	info.AdminAddr = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	for _, l := range b.GetStaticResources().GetListeners() {
		sa := l.GetAddress().GetSocketAddress()
		info.Listeners[l.GetName()] = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
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

func obj(m map[string]any, key string) (map[string]any, error) {
	v, ok := m[key].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("bootstrap: %q missing or not an object", key)
	}
	return v, nil
}

func path(m map[string]any, keys ...string) (map[string]any, error) {
	cur := m
	for i, k := range keys {
		next, ok := cur[k].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%v missing or not an object", keys[:i+1])
		}
		cur = next
	}
	return cur, nil
}

// wasmPlugins returns the typed_config.config object of every wasm HTTP
// filter of a listener.
func wasmPlugins(listener map[string]any) ([]map[string]any, error) {
	var out []map[string]any
	chains, _ := listener["filter_chains"].([]any)
	for _, c := range chains {
		cm, _ := c.(map[string]any)
		filters, _ := cm["filters"].([]any)
		for _, f := range filters {
			fm, _ := f.(map[string]any)
			if fm["name"] != hcmFilter {
				continue
			}
			hcm, err := path(fm, "typed_config")
			if err != nil {
				return nil, err
			}
			httpFilters, _ := hcm["http_filters"].([]any)
			for _, hf := range httpFilters {
				hfm, _ := hf.(map[string]any)
				if hfm["name"] != wasmFilter {
					continue
				}
				pc, err := path(hfm, "typed_config", "config")
				if err != nil {
					return nil, err
				}
				out = append(out, pc)
			}
		}
	}
	return out, nil
}

func pluginConfigValue(p map[string]any) (map[string]any, error) {
	c, err := path(p, "configuration")
	if err != nil {
		return nil, err
	}
	s, ok := c["value"].(string)
	if !ok {
		return nil, errors.New("plugin configuration must be a StringValue with a JSON value")
	}
	var v map[string]any
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("plugin configuration: %w", err)
	}
	return v, nil
}

func pluginRole(p map[string]any) (config.Role, error) {
	v, err := pluginConfigValue(p)
	if err != nil {
		return "", err
	}
	switch r := v["role"].(type) {
	case nil:
		return config.RoleRouter, nil
	case string:
		return config.Role(r), nil
	}
	return "", errors.New("plugin configuration: role is not a string")
}

func patchPluginConfig(p map[string]any, patch map[string]any) error {
	if len(patch) == 0 {
		return nil
	}
	v, err := pluginConfigValue(p)
	if err != nil {
		return err
	}
	mergePatch(v, patch)
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if _, err := config.Decode(js); err != nil {
		return fmt.Errorf("patched plugin configuration: %w", err)
	}
	c, _ := path(p, "configuration")
	c["value"] = string(js) + "\n"
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

func setCodePath(p map[string]any, file string) error {
	local, err := path(p, "vm_config", "code", "local")
	if err != nil {
		return fmt.Errorf("plugin vm_config: %w", err)
	}
	delete(local, "inline_bytes")
	delete(local, "inline_string")
	local["filename"] = file
	return nil
}

func setListenerAddress(l map[string]any, hostport string) error {
	a, err := path(l, "address")
	if err != nil {
		return err
	}
	return setSocketAddress(a, hostport)
}

// setSocketAddress sets an envoy.config.core.v3.Address object's
// socket_address.
func setSocketAddress(address map[string]any, hostport string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return err
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return fmt.Errorf("port %q: %w", port, err)
	}
	sa, err := path(address, "socket_address")
	if err != nil {
		return err
	}
	sa["address"] = host
	sa["port_value"] = json.Number(strconv.FormatUint(n, 10))
	return nil
}

func deepCopy(m map[string]any) (map[string]any, error) {
	js, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}
