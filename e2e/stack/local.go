package stack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/wasm-epp/wasm-epp/plugin/config"
)

// The shape `make run` starts: 4 replicas serving 10 adapters with
// 4 adapter slots each, the agent, and the gateway on the template's ports.
const (
	LocalReplicas    = 4
	LocalMaxLoRAs    = 4
	LocalReplicaPort = 8001
	LocalAgentAddr   = "127.0.0.1:9100"
)

// LocalConfig is the configuration of `make run` for the binaries in binDir
// and the bootstrap template at bootstrap: the template's own ports, replicas
// on 127.0.0.1:8001.., every adapter the router configuration names.
func LocalConfig(binDir, bootstrap string) (Config, error) {
	tmpl, err := os.ReadFile(bootstrap)
	if err != nil {
		return Config{}, err
	}
	info, err := InspectBootstrap(tmpl)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", bootstrap, err)
	}
	return Config{
		BinDir:           binDir,
		Bootstrap:        bootstrap,
		Replicas:         LocalReplicas,
		Model:            DefaultModel,
		Adapters:         Adapters(info.Router, DefaultModel),
		MaxLoRAs:         LocalMaxLoRAs,
		FirstReplicaPort: LocalReplicaPort,
		AgentAddr:        LocalAgentAddr,
	}, nil
}

// Adapters lists, sorted, every name a router configuration can send to a
// replica other than the base model: the models without targets and every
// target. These are the LoRA adapters the replicas must serve.
func Adapters(c *config.Config, base string) []string {
	var out []string
	add := func(n string) {
		if n != base && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	for _, m := range c.Models {
		if len(m.Targets) == 0 {
			add(m.Name)
		}
		for _, t := range m.Targets {
			add(t.Name)
		}
	}
	slices.Sort(out)
	return out
}

// ExecutableDir is the directory of the running binary: bin/ for the
// commands `make build` produces.
func ExecutableDir() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	if exe, err = filepath.EvalSymlinks(exe); err != nil {
		return "", err
	}
	return filepath.Dir(exe), nil
}

// FindBootstrap returns envoy/envoy.yaml from the working directory (make
// runs commands at the repository root), else next to binDir's parent
// (bin/../envoy/envoy.yaml).
func FindBootstrap(binDir string) (string, error) {
	candidates := []string{filepath.Join("envoy", "envoy.yaml")}
	if binDir != "" {
		candidates = append(candidates, filepath.Join(binDir, "..", "envoy", "envoy.yaml"))
	}
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return filepath.Abs(c)
		}
	}
	return "", errors.New("envoy/envoy.yaml not found: run from the repository root or pass the bootstrap path")
}
