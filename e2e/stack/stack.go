package stack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Gateway selects what runs the bootstrap.
type Gateway string

const (
	// GatewayAuto is real Envoy when an envoy binary is on PATH (or
	// Config.EnvoyBinary is set), otherwise bin/envoyhost.
	GatewayAuto Gateway = ""
	// GatewayEnvoy is a real Envoy (version >= 1.40, see envoy/envoy.yaml).
	GatewayEnvoy Gateway = "envoy"
	// GatewayEnvoyHost is bin/envoyhost, the project's Envoy-faithful host
	// running the same .wasm and the same bootstrap.
	GatewayEnvoyHost Gateway = "envoyhost"
)

// Binary names expected in Config.BinDir (what `make build` produces).
const (
	SimBinary       = "vllm-sim"
	AgentBinary     = "metricsagent"
	EnvoyHostBinary = "envoyhost"
	WasmFile        = "wasm-epp.wasm"
)

// DefaultModel is the base model of envoy/envoy.yaml's plugin configuration.
const DefaultModel = "meta-llama/Llama-2-7b-hf"

// Config describes a stack. Zero values take the defaults named per field.
type Config struct {
	// BinDir holds vllm-sim, metricsagent and envoyhost. Required.
	BinDir string
	// WasmPath is the plugin; default BinDir/wasm-epp.wasm.
	WasmPath string
	// Bootstrap is the template, such as envoy/envoy.yaml. Required.
	Bootstrap string
	// Gateway chooses Envoy or envoyhost; EnvoyBinary overrides the envoy
	// found on PATH; GatewayArgs are extra command-line arguments.
	Gateway     Gateway
	EnvoyBinary string
	GatewayArgs []string
	// CompilationCache, for envoyhost, is a directory where wazero keeps
	// the compiled plugin across runs (several times faster starts); empty
	// compiles every time. Real Envoy ignores it.
	CompilationCache string
	// WorkDir receives the rendered bootstrap, the token file and one log
	// per process. Default: a new temporary directory, removed by Stop.
	WorkDir string
	// Gateways is the number of gateway processes (default 1). Each gets
	// its own copy of the bootstrap with its own free ports (so every
	// address must have port 0 when there are several); the agent pushes
	// to all of them, as it pushes to every Envoy replica of a cluster.
	Gateways int

	// Replicas is the number of vllm-sim processes (may be 0 when
	// ExtraTargets stand in for them).
	Replicas int
	// Model is the served base model (default DefaultModel); Adapters the
	// LoRA adapters every replica serves, MaxLoRAs its adapter slots
	// (default 4), TimeScale its speed-up (default 1).
	Model     string
	Adapters  []string
	MaxLoRAs  int
	TimeScale float64
	// ReplicaArgs are extra vllm-sim flags for every replica.
	ReplicaArgs []string
	// FirstReplicaPort: replica i listens on 127.0.0.1:FirstReplicaPort+i;
	// 0 picks free ports.
	FirstReplicaPort int
	// ExtraTargets are more host:port addresses the agent scrapes
	// (tests' own metric servers).
	ExtraTargets []string

	// NoAgent starts the stack without the metrics agent (StartAgent
	// starts it later).
	NoAgent bool
	// AgentInterval is the scrape and push period (default 50ms);
	// AgentArgs extra metricsagent flags; AgentAddr its --listen address
	// (default a free loopback port).
	AgentInterval time.Duration
	AgentArgs     []string
	AgentAddr     string

	// ClientAddr, PushAddr and AdminAddr replace the template's addresses
	// when set; a port of 0 means a free loopback port chosen at start.
	ClientAddr, PushAddr, AdminAddr string
	// RouterPatch, ReceiverPatch and ExtraRouters: see BootstrapOptions.
	// An ExtraRouters Addr with port 0 gets a free port.
	RouterPatch, ReceiverPatch map[string]any
	ExtraRouters               []RouterListener
	// Token is the push bearer token; default 32 random bytes, hex.
	Token string

	// ReadyTimeout bounds Start (default 60s); StopGrace is how long a
	// process gets after SIGTERM before SIGKILL (default 5s).
	ReadyTimeout time.Duration
	StopGrace    time.Duration
	// Logf, if set, receives one line per lifecycle event.
	Logf func(format string, args ...any)
}

// gatewayCopy is one gateway process and its rendered bootstrap.
type gatewayCopy struct {
	name      string
	bootstrap string
	info      *BootstrapInfo
	proc      *Process // guarded by Stack.mu
}

// Replica is one simulated vLLM replica.
type Replica struct {
	Name string // sent by vllm-sim in its x-vllm-sim-replica header
	Addr string // 127.0.0.1:port, as the plugin names it in served-by headers
	proc *Process
}

// URL is the replica's base URL.
func (r *Replica) URL() string { return "http://" + r.Addr }

// Process is the replica's process.
func (r *Replica) Process() *Process { return r.proc }

// Stack is a running set of processes. Its methods are safe for concurrent
// use.
type Stack struct {
	cfg       Config
	gateway   Gateway
	gateways  []*gatewayCopy // [0] is the one Info, ClientURL, ... describe
	bootstrap string         // gateways[0].bootstrap
	info      *BootstrapInfo // gateways[0].info
	tokenFile string
	ownsDir   bool
	replicas  []*Replica

	mu        sync.Mutex
	agent     *Process
	agentAddr string
	stopped   bool
	failed    chan *ExitError
	watch     sync.WaitGroup
	quit      chan struct{}
}

// Start launches the replicas, the gateway and the agent, and returns when
// a request through the gateway is routed to a replica (or, with NoAgent,
// when every listener accepts connections). On error everything already
// started is stopped and the Stack is nil; the logs stay in Config.WorkDir
// when the caller chose it.
func Start(ctx context.Context, cfg Config) (s *Stack, err error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	s = &Stack{cfg: cfg, failed: make(chan *ExitError, 16), quit: make(chan struct{})}
	if s.cfg.WorkDir == "" {
		if s.cfg.WorkDir, err = os.MkdirTemp("", "wasm-epp-stack-"); err != nil {
			return nil, err
		}
		s.ownsDir = true
	} else if err := os.MkdirAll(s.cfg.WorkDir, 0o755); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Stop()
			s = nil
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyTimeout)
	defer cancel()

	if s.gateway, err = s.chooseGateway(); err != nil {
		return s, err
	}
	for i := range s.cfg.Gateways {
		if err = s.renderBootstrap(i); err != nil {
			return s, err
		}
	}
	s.tokenFile = filepath.Join(s.cfg.WorkDir, "push-token")
	if err = os.WriteFile(s.tokenFile, []byte(s.cfg.Token+"\n"), 0o600); err != nil {
		return s, err
	}
	if err = s.startReplicas(ctx); err != nil {
		return s, err
	}
	for i := range s.gateways {
		if err = s.StartGateway(ctx, i); err != nil {
			return s, err
		}
	}
	if !s.cfg.NoAgent {
		if err = s.StartAgent(ctx); err != nil {
			return s, err
		}
		if err = s.WaitRouted(ctx); err != nil {
			return s, err
		}
	}
	return s, nil
}

func (c *Config) defaults() error {
	if c.BinDir == "" {
		return errors.New("stack: BinDir is required (the directory `make build` fills)")
	}
	if c.Bootstrap == "" {
		return errors.New("stack: Bootstrap (the envoy.yaml template) is required")
	}
	if c.WasmPath == "" {
		c.WasmPath = filepath.Join(c.BinDir, WasmFile)
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.MaxLoRAs == 0 {
		c.MaxLoRAs = 4
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.AgentInterval == 0 {
		c.AgentInterval = 50 * time.Millisecond
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 60 * time.Second
	}
	if c.StopGrace == 0 {
		c.StopGrace = 5 * time.Second
	}
	if c.Token == "" {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		c.Token = hex.EncodeToString(b)
	}
	if c.Gateways == 0 {
		c.Gateways = 1
	}
	if c.Gateways < 0 {
		return errors.New("stack: Gateways must be >= 1")
	}
	if c.Gateways > 1 {
		for _, a := range append([]string{c.ClientAddr, c.PushAddr, c.AdminAddr}, routerAddrs(c.ExtraRouters)...) {
			if _, port, err := net.SplitHostPort(a); err != nil || port != "0" {
				return fmt.Errorf("stack: %d gateways need every listener and admin address with port 0, got %q", c.Gateways, a)
			}
		}
	}
	if c.Replicas < 0 || (c.Replicas == 0 && len(c.ExtraTargets) == 0) {
		return errors.New("stack: need at least one replica or extra target")
	}
	need := []string{filepath.Join(c.BinDir, SimBinary), filepath.Join(c.BinDir, AgentBinary), c.WasmPath}
	var missing []string
	for _, p := range need {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("stack: missing %s (run `make build`)", strings.Join(missing, ", "))
	}
	return nil
}

func routerAddrs(rs []RouterListener) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Addr
	}
	return out
}

func (c *Config) logf(format string, args ...any) {
	if c.Logf != nil {
		c.Logf(format, args...)
	}
}

func (s *Stack) chooseGateway() (Gateway, error) {
	g := s.cfg.Gateway
	if g == GatewayAuto {
		g = GatewayEnvoyHost
		if s.cfg.EnvoyBinary != "" {
			g = GatewayEnvoy
		} else if p, err := exec.LookPath("envoy"); err == nil {
			s.cfg.EnvoyBinary, g = p, GatewayEnvoy
		}
	}
	switch g {
	case GatewayEnvoy:
		if s.cfg.EnvoyBinary == "" {
			p, err := exec.LookPath("envoy")
			if err != nil {
				return "", fmt.Errorf("stack: gateway envoy: %w", err)
			}
			s.cfg.EnvoyBinary = p
		}
	case GatewayEnvoyHost:
		p := filepath.Join(s.cfg.BinDir, EnvoyHostBinary)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("stack: %s missing and no envoy on PATH (run `make build`)", p)
		}
	default:
		return "", fmt.Errorf("stack: unknown gateway %q (want envoy or envoyhost)", g)
	}
	return g, nil
}

// handedOut is every port freeAddr returned in this process: a port is
// free again once freeAddr's probe closes it, and the kernel may give it
// to the next probe before its first owner binds it (a gateway listener
// and a replica were seen to get the same one).
var handedOut struct {
	sync.Mutex
	ports map[string]bool
}

// freeAddr resolves a host:0 address to a port free right now and not
// handed out before in this process.
func freeAddr(addr string) (string, error) {
	if addr == "" {
		return "", nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if port != "0" {
		return addr, nil
	}
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[string]bool{}
	}
	for range 100 {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return "", err
		}
		got := ln.Addr().String()
		ln.Close()
		if !handedOut.ports[got] {
			handedOut.ports[got] = true
			return got, nil
		}
	}
	return "", fmt.Errorf("no port on %s not handed out already", host)
}

// renderBootstrap writes gateway i's copy of the bootstrap (the first one
// is envoy.yaml, later ones envoy-<i>.yaml) with its free ports.
func (s *Stack) renderBootstrap(i int) error {
	tmpl, err := os.ReadFile(s.cfg.Bootstrap)
	if err != nil {
		return fmt.Errorf("stack: bootstrap template: %w", err)
	}
	o := BootstrapOptions{WasmPath: s.cfg.WasmPath, RouterPatch: s.cfg.RouterPatch, ReceiverPatch: s.cfg.ReceiverPatch}
	for _, a := range []struct{ in, out *string }{
		{&s.cfg.ClientAddr, &o.ClientAddr}, {&s.cfg.PushAddr, &o.PushAddr}, {&s.cfg.AdminAddr, &o.AdminAddr},
	} {
		if *a.out, err = freeAddr(*a.in); err != nil {
			return fmt.Errorf("stack: %w", err)
		}
	}
	for _, r := range s.cfg.ExtraRouters {
		if r.Addr, err = freeAddr(r.Addr); err != nil {
			return fmt.Errorf("stack: %w", err)
		}
		o.ExtraRouters = append(o.ExtraRouters, r)
	}
	out, err := RenderBootstrap(tmpl, o)
	if err != nil {
		return fmt.Errorf("stack: %s: %w", s.cfg.Bootstrap, err)
	}
	g := &gatewayCopy{name: "gateway", bootstrap: filepath.Join(s.cfg.WorkDir, "envoy.yaml")}
	if i > 0 {
		g.name = fmt.Sprintf("gateway-%d", i)
		g.bootstrap = filepath.Join(s.cfg.WorkDir, fmt.Sprintf("envoy-%d.yaml", i))
	}
	if g.info, err = InspectBootstrap(out); err != nil {
		return fmt.Errorf("stack: rendered bootstrap: %w", err)
	}
	s.gateways = append(s.gateways, g)
	if i == 0 {
		s.info, s.bootstrap = g.info, g.bootstrap
	}
	return os.WriteFile(g.bootstrap, out, 0o644)
}

func (s *Stack) startReplicas(ctx context.Context) error {
	for i := range s.cfg.Replicas {
		addr := "127.0.0.1:0"
		if s.cfg.FirstReplicaPort != 0 {
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.cfg.FirstReplicaPort+i))
		}
		addr, err := freeAddr(addr)
		if err != nil {
			return fmt.Errorf("stack: replica %d: %w", i, err)
		}
		r := &Replica{Name: fmt.Sprintf("replica-%d", i), Addr: addr}
		args := []string{
			filepath.Join(s.cfg.BinDir, SimBinary),
			"--addr", addr, "--name", r.Name, "--model", s.cfg.Model,
			"--time-scale", strconv.FormatFloat(s.cfg.TimeScale, 'g', -1, 64),
			"--seed", strconv.Itoa(i + 1),
		}
		if len(s.cfg.Adapters) > 0 {
			args = append(args, "--adapters", strings.Join(s.cfg.Adapters, ","), "--max-loras", strconv.Itoa(s.cfg.MaxLoRAs))
		}
		args = append(args, s.cfg.ReplicaArgs...)
		if r.proc, err = s.start(r.Name, args, nil); err != nil {
			return err
		}
		s.replicas = append(s.replicas, r)
	}
	for _, r := range s.replicas {
		if err := waitFor(ctx, r.proc, 20*time.Millisecond, r.Name, httpOK(r.URL()+"/health")); err != nil {
			return err
		}
		s.cfg.logf("replica %s serving on %s (pid %d)", r.Name, r.Addr, r.proc.Pid())
	}
	return nil
}

// StartGateway starts gateway i (again, after KillGateway or StopGateway)
// on its ports and waits until its admin interface is ready and every
// listener accepts connections.
func (s *Stack) StartGateway(ctx context.Context, i int) error {
	g := s.gateways[i]
	s.mu.Lock()
	if g.proc != nil && !g.proc.Exited() {
		s.mu.Unlock()
		return fmt.Errorf("stack: %s already running", g.name)
	}
	s.mu.Unlock()
	var args []string
	switch s.gateway {
	case GatewayEnvoy:
		// No hot restart: several stacks (tests) may run side by side, and
		// hot restart would make them share a base id.
		args = []string{s.cfg.EnvoyBinary, "-c", g.bootstrap, "--disable-hot-restart", "--concurrency", "2", "--log-level", "info"}
	default:
		args = []string{filepath.Join(s.cfg.BinDir, EnvoyHostBinary), "-c", g.bootstrap, "--concurrency", "2"}
		if s.cfg.CompilationCache != "" {
			args = append(args, "--compilation-cache", s.cfg.CompilationCache)
		}
	}
	args = append(args, s.cfg.GatewayArgs...)
	env := []string{g.info.Receiver.Receiver.TokenEnv + "=" + s.cfg.Token}
	p, err := s.start(g.name, args, env)
	if err != nil {
		return err
	}
	s.mu.Lock()
	g.proc = p
	s.mu.Unlock()
	if err := waitFor(ctx, p, 20*time.Millisecond, g.name, httpOK(s.GatewayAdminURL(i)+"/ready")); err != nil {
		return err
	}
	for name, addr := range g.info.Listeners {
		if err := waitFor(ctx, p, 20*time.Millisecond, g.name+" listener "+name, dialOK(addr)); err != nil {
			return err
		}
	}
	s.cfg.logf("%s (%s) listening on %s (pushes on %s, admin %s, pid %d)", g.name, s.gateway,
		g.info.Listeners[g.info.ClientListener], g.info.Listeners[g.info.PushListener], g.info.AdminAddr, p.Pid())
	return nil
}

// KillGateway kills gateway i with SIGKILL, as a crash would; requests in
// flight on it are cut. StartGateway brings it back on the same ports.
func (s *Stack) KillGateway(i int) {
	s.mu.Lock()
	p := s.gateways[i].proc
	s.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// Gateways is the number of gateway processes.
func (s *Stack) Gateways() int { return len(s.gateways) }

// GatewayInfo describes gateway i's rendered bootstrap (its addresses).
func (s *Stack) GatewayInfo(i int) *BootstrapInfo { return s.gateways[i].info }

// GatewayProcess is gateway i's current process (nil before it started).
func (s *Stack) GatewayProcess(i int) *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gateways[i].proc
}

// GatewayClientURL is the base URL of gateway i's router listener.
func (s *Stack) GatewayClientURL(i int) string {
	info := s.gateways[i].info
	return "http://" + dialable(info.Listeners[info.ClientListener])
}

// GatewayPushURL is gateway i's push endpoint.
func (s *Stack) GatewayPushURL(i int) string {
	info := s.gateways[i].info
	return "http://" + dialable(info.Listeners[info.PushListener]) + info.Receiver.Receiver.Path
}

// GatewayAdminURL is gateway i's admin base URL.
func (s *Stack) GatewayAdminURL(i int) string {
	return "http://" + dialable(s.gateways[i].info.AdminAddr)
}

// StartAgent starts the metrics agent (again, after StopAgent) and waits
// for its health endpoint.
func (s *Stack) StartAgent(ctx context.Context) error {
	s.mu.Lock()
	if s.agent != nil && !s.agent.Exited() {
		s.mu.Unlock()
		return errors.New("stack: agent already running")
	}
	s.mu.Unlock()
	addr := s.cfg.AgentAddr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	addr, err := freeAddr(addr)
	if err != nil {
		return err
	}
	targets := append([]string{}, s.cfg.ExtraTargets...)
	for _, r := range s.replicas {
		targets = append(targets, r.Addr)
	}
	var envoys []string
	for _, g := range s.gateways {
		envoys = append(envoys, g.info.Listeners[g.info.PushListener])
	}
	args := []string{
		filepath.Join(s.cfg.BinDir, AgentBinary),
		"--targets", strings.Join(targets, ","),
		"--envoy-targets", strings.Join(envoys, ","),
		"--push-path", s.info.Receiver.Receiver.Path,
		"--push-token-file", s.tokenFile,
		"--interval", s.cfg.AgentInterval.String(),
		"--heartbeat", AgentHeartbeat(time.Duration(s.info.Router.StaleAfter)).String(),
		"--listen", addr,
	}
	args = append(args, s.cfg.AgentArgs...)
	p, err := s.start("agent", args, nil)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.agent, s.agentAddr = p, addr
	s.mu.Unlock()
	if err := waitFor(ctx, p, 20*time.Millisecond, "agent", httpOK("http://"+addr+"/healthz")); err != nil {
		return err
	}
	s.cfg.logf("agent scraping %d targets every %s, pushing to %s (pid %d)", len(targets), s.cfg.AgentInterval,
		strings.Join(envoys, ", "), p.Pid())
	return nil
}

// AgentHeartbeat is the agent's --heartbeat for a router's staleAfter: a
// quarter of it, as the agent's default is of the default staleAfter (test
// bootstraps use short ones), never above the agent's default.
func AgentHeartbeat(staleAfter time.Duration) time.Duration {
	return min(staleAfter/4, wire.DefaultSendThresholds().Heartbeat)
}

// StopAgent stops the agent gracefully.
func (s *Stack) StopAgent() {
	s.mu.Lock()
	p := s.agent
	s.mu.Unlock()
	if p != nil {
		p.Stop(s.cfg.StopGrace)
	}
}

// WaitRouted waits until GET /v1/models through every gateway is answered
// by a replica: the agent has pushed and the plugin routes.
func (s *Stack) WaitRouted(ctx context.Context) error {
	for i := range s.gateways {
		if err := s.WaitGatewayRouted(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// WaitGatewayRouted is WaitRouted for gateway i alone.
func (s *Stack) WaitGatewayRouted(ctx context.Context, i int) error {
	gw := s.GatewayProcess(i)
	return waitFor(ctx, gw, 25*time.Millisecond, "routing through "+s.gateways[i].name, httpOK(s.GatewayClientURL(i)+"/v1/models"))
}

// start launches a process and watches it for unexpected exits.
func (s *Stack) start(name string, argv, env []string) (*Process, error) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil, errors.New("stack: stopped")
	}
	s.mu.Unlock()
	p, err := startProcess(name, argv, env, s.cfg.WorkDir, filepath.Join(s.cfg.WorkDir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("stack: %w", err)
	}
	s.watch.Add(1)
	go func() {
		defer s.watch.Done()
		select {
		case <-p.Done():
		case <-s.quit:
			return
		}
		if p.expected() {
			return
		}
		select {
		case s.failed <- p.exitError():
		default:
		}
	}()
	return p, nil
}

// AgentURL is the base URL of the agent's /metrics, /healthz and /readyz
// ("" before the agent started).
func (s *Stack) AgentURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agentAddr == "" {
		return ""
	}
	return "http://" + s.agentAddr
}

// Failed delivers every process that exited without being asked to.
func (s *Stack) Failed() <-chan *ExitError { return s.failed }

// Stop stops the agent, then the gateway and the replicas (SIGTERM, then
// SIGKILL after StopGrace, always to the whole process group), and removes
// the work directory if Start created it. It is safe to call more than once.
func (s *Stack) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	agent := s.agent
	var gws []*Process
	for _, g := range s.gateways {
		gws = append(gws, g.proc)
	}
	s.mu.Unlock()
	if agent != nil {
		agent.Stop(s.cfg.StopGrace)
	}
	var wg sync.WaitGroup
	stop := func(p *Process) {
		if p == nil {
			return
		}
		wg.Add(1)
		go func() { defer wg.Done(); p.Stop(s.cfg.StopGrace) }()
	}
	for _, gw := range gws {
		stop(gw)
	}
	for _, r := range s.replicas {
		stop(r.proc)
	}
	wg.Wait()
	close(s.quit)
	s.watch.Wait()
	if s.ownsDir {
		os.RemoveAll(s.cfg.WorkDir)
	}
	s.cfg.logf("stack stopped")
}

// KillReplica kills replica i with SIGKILL, as a crash would.
func (s *Stack) KillReplica(i int) { s.replicas[i].proc.Kill() }

// Replicas lists the simulated replicas.
func (s *Stack) Replicas() []*Replica { return s.replicas }

// Gateway says what runs the bootstrap.
func (s *Stack) Gateway() Gateway { return s.gateway }

// Info describes the rendered bootstrap (addresses, plugin configurations).
func (s *Stack) Info() *BootstrapInfo { return s.info }

// Token is the push bearer token.
func (s *Stack) Token() string { return s.cfg.Token }

// WorkDir holds the rendered bootstrap and the logs.
func (s *Stack) WorkDir() string { return s.cfg.WorkDir }

// BootstrapPath is the rendered bootstrap.
func (s *Stack) BootstrapPath() string { return s.bootstrap }

// ClientURL is the base URL of the router listener.
func (s *Stack) ClientURL() string { return s.ListenerURL(s.info.ClientListener) }

// ListenerURL is the base URL of a listener of the rendered bootstrap.
func (s *Stack) ListenerURL(name string) string {
	return "http://" + dialable(s.info.Listeners[name])
}

// PushURL is the receiver's push endpoint.
func (s *Stack) PushURL() string {
	return s.ListenerURL(s.info.PushListener) + s.info.Receiver.Receiver.Path
}

// AdminURL is the gateway's admin base URL.
func (s *Stack) AdminURL() string { return "http://" + dialable(s.info.AdminAddr) }

// Processes lists every process the stack started that is still known,
// for logs and diagnostics.
func (s *Stack) Processes() []*Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Process
	for _, r := range s.replicas {
		out = append(out, r.proc)
	}
	for _, g := range s.gateways {
		if g.proc != nil {
			out = append(out, g.proc)
		}
	}
	if s.agent != nil {
		out = append(out, s.agent)
	}
	return out
}

// dialable turns a wildcard listen address into one a client can dial.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "0.0.0.0", "", "::":
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

var probeClient = &http.Client{Timeout: 2 * time.Second}

func httpOK(url string) func(context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := probeClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s %s", url, resp.Status, strings.TrimSpace(string(body)))
		}
		return nil
	}
}

func dialOK(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", dialable(addr))
		if err != nil {
			return err
		}
		return c.Close()
	}
}
