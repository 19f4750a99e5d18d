// Package config decodes and validates the wasm-epp plugin configuration: the
// JSON document Envoy hands the plugin as its `configuration`. It is plain Go,
// so the plugin (at start), the Envoy/Kubernetes config tests and the tools all
// judge a configuration by the same rules.
//
// Decoding is strict: unknown, duplicated and case-mismatched fields are
// errors, every error names the JSON path of the offending value, and
// omitted fields take documented defaults.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/wasm-epp/wasm-epp/internal/strictjson"
	"github.com/wasm-epp/wasm-epp/scheduler"
	"github.com/wasm-epp/wasm-epp/scheduler/flowcontrol"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Role selects what a plugin instance does.
type Role string

const (
	// RoleRouter routes client requests (the default).
	RoleRouter Role = "router"
	// RoleReceiver accepts metrics pushes from agents into shared data.
	RoleReceiver Role = "receiver"
)

// UnknownModelPolicy says what happens to a model not in Models.
type UnknownModelPolicy string

const (
	// UnknownModelReject answers 404 (the default, as upstream).
	UnknownModelReject UnknownModelPolicy = "reject"
	// UnknownModelPassthrough schedules the request unchanged as Sheddable.
	UnknownModelPassthrough UnknownModelPolicy = "passthrough"
)

// NoFreshEndpointPolicy says what happens when every endpoint is stale.
type NoFreshEndpointPolicy string

const (
	// NoFreshFailOpen routes to a random endpoint of the last snapshot (the
	// default): stale metrics are better than refusing all traffic.
	NoFreshFailOpen NoFreshEndpointPolicy = "fail-open"
	// NoFreshReject answers 503.
	NoFreshReject NoFreshEndpointPolicy = "reject"
)

// Criticality names, as in upstream's InferenceModel.
const (
	CriticalityCritical  = "Critical"
	CriticalityStandard  = "Standard"
	CriticalitySheddable = "Sheddable"
)

// Defaults.
const (
	DefaultMaxBodyBytes       = 1 << 20
	DefaultMaxModelNameLength = 256
	DefaultStaleAfter         = 2 * time.Second
	// DefaultSnapshotRefresh is snapshotRefreshInterval's default: well
	// under a relay interval (50 ms), and the default flow-control
	// releaseInterval, so the two share every tick.
	DefaultSnapshotRefresh = 20 * time.Millisecond
	// MaxSnapshotRefresh bounds snapshotRefreshInterval.
	MaxSnapshotRefresh         = time.Second
	DefaultDestinationHeader   = "x-gateway-destination-endpoint"
	DefaultSharedDataKeyPrefix = wire.DefaultKeyPrefix
	DefaultReceiverPath        = wire.PushPath
	DefaultReceiverTokenEnv    = "WASM_EPP_PUSH_TOKEN"
	DefaultMaxPushBytes        = 2 << 20
	DefaultMaxEndpoints        = 1024
	DefaultMaxAgents           = 4096
	DefaultMaxTotalEndpoints   = 16384
	DefaultMaxClockSkew        = time.Second
	DefaultConfigPath          = wire.ConfigPath
	DefaultMaxConfigBytes      = 256 << 10
)

// Config is the whole plugin configuration.
type Config struct {
	Role Role `json:"role,omitempty"`

	// Models maps requested model names to criticality and targets.
	Models        []Model            `json:"models,omitempty"`
	UnknownModels UnknownModelPolicy `json:"unknownModels,omitempty"`

	// Scheduler is the scheduler's own configuration (profiles, plugin
	// parameters, countRoutedSinceSnapshot), decoded by the scheduler
	// package (scheduler.Config documents it).
	Scheduler json.RawMessage `json:"scheduler,omitempty"`
	// SchedulerConfig is Scheduler decoded and checked against the built-in
	// plugin registry by Decode, so the plugin does not decode it twice.
	SchedulerConfig scheduler.Config `json:"-"`

	MaxBodyBytes       int `json:"maxBodyBytes,omitempty"`
	MaxModelNameLength int `json:"maxModelNameLength,omitempty"`

	// StaleAfter: endpoints whose metrics are older are not scheduled on.
	StaleAfter          Duration              `json:"staleAfter,omitempty"`
	WhenNoFreshEndpoint NoFreshEndpointPolicy `json:"whenNoFreshEndpoint,omitempty"`
	// SnapshotRefreshInterval is how often each worker VM's tick re-reads
	// the snapshot from shared data; a request re-reads it itself only
	// when the last re-read is older than twice this (ticks late or not
	// delivered). "0s": every request re-reads (no tick for it). Absent:
	// DefaultSnapshotRefresh, or a quarter of StaleAfter when that is
	// shorter (whole milliseconds; 0 under 1ms). Use SnapshotRefresh for
	// the value.
	SnapshotRefreshInterval *Duration `json:"snapshotRefreshInterval,omitempty"`

	DestinationHeader string `json:"destinationHeader,omitempty"`
	// TargetPort, when non-zero, replaces the port reported for every
	// endpoint (like upstream InferencePool's targetPortNumber).
	TargetPort          int    `json:"targetPort,omitempty"`
	SharedDataKeyPrefix string `json:"sharedDataKeyPrefix,omitempty"`
	// ServedByHeader, when set, names a response header carrying the chosen
	// endpoint (off by default).
	ServedByHeader string `json:"servedByHeader,omitempty"`

	Receiver Receiver `json:"receiver,omitempty"`

	// FlowControl, when present (even as {}), holds Standard and Sheddable
	// requests that find no endpoint with capacity instead of refusing
	// them; decoded by the flowcontrol package (flowcontrol.Config
	// documents it). Absent or null: off, every such request gets 429.
	FlowControl json.RawMessage `json:"flowControl,omitempty"`
	// FlowControlConfig is FlowControl decoded with its defaults; nil when
	// flow control is off.
	FlowControlConfig *flowcontrol.Config `json:"-"`

	// Prefix configures prefix hashing and the shared prefix index
	// (scheduler.PrefixConfig documents it); used when the scheduler runs
	// a prefix-aware plugin (the prefix-aware profile). Absent: defaults.
	Prefix json.RawMessage `json:"prefix,omitempty"`
	// PrefixConfig is Prefix decoded with its defaults.
	PrefixConfig scheduler.PrefixConfig `json:"-"`

	// Seed, when set, seeds every random choice of the plugin (weighted
	// target draws, the scheduler's tie breaks, fail-open picks) so tests
	// and benchmarks are reproducible. Unset: seeded from crypto/rand per
	// plugin instance. Never set it in production: every Envoy worker would
	// then make the same "random" choices.
	Seed *uint64 `json:"seed,omitempty"`
}

// Model is one servable model name, like upstream's InferenceModel.
type Model struct {
	Name        string   `json:"name"`
	Criticality string   `json:"criticality,omitempty"`
	Targets     []Target `json:"targets,omitempty"`
}

// Target is a model or LoRA adapter the requested name resolves to, with
// its share of traffic.
type Target struct {
	Name   string `json:"name"`
	Weight int    `json:"weight"`
}

// Receiver configures the push receiver role.
type Receiver struct {
	Path string `json:"path,omitempty"`
	// TokenEnv names the VM environment variable holding the bearer token
	// (vm_config.environment_variables, fed from a Kubernetes Secret).
	TokenEnv     string `json:"tokenEnv,omitempty"`
	MaxPushBytes int    `json:"maxPushBytes,omitempty"`
	MaxEndpoints int    `json:"maxEndpoints,omitempty"`
	// MaxAgents and MaxTotalEndpoints bound what shared data keeps.
	MaxAgents         int `json:"maxAgents,omitempty"`
	MaxTotalEndpoints int `json:"maxTotalEndpoints,omitempty"`
	// MaxClockSkew: a push sent more than this ahead of the receiver's
	// clock is refused (400). Freshness is always judged on the receiver's
	// clock, so a tolerated skew never makes metrics look fresher.
	MaxClockSkew Duration `json:"maxClockSkew,omitempty"`
	// ConfigPath takes the agents' configuration records (the model table
	// from InferenceObjective and InferenceModelRewrite objects), with the
	// same token; MaxConfigBytes bounds one.
	ConfigPath     string `json:"configPath,omitempty"`
	MaxConfigBytes int    `json:"maxConfigBytes,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("2s").
type Duration time.Duration

// UnmarshalJSON accepts a duration string such as "500ms" or "2s"; null
// leaves the value unchanged.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("expected a duration such as \"2s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("expected a duration such as \"2s\", got %q", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Error is a configuration error at a JSON path.
type Error struct {
	Path string
	Msg  string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return "plugin configuration: " + e.Msg
	}
	return "plugin configuration: " + e.Path + ": " + e.Msg
}

// Decode parses and validates a configuration, filling in defaults. An empty
// document is a valid router configuration with every default (and no
// models, so only pass-through traffic is routed if enabled). Decoding is
// strict (internal/strictjson): unknown, duplicated and case-mismatched
// fields are errors, as in the scheduler section.
func Decode(data []byte) (*Config, error) {
	cfg := &Config{}
	if len(bytes.TrimSpace(data)) > 0 {
		if err := strictjson.Decode(data, cfg); err != nil {
			var se *strictjson.Error
			if errors.As(err, &se) {
				return nil, &Error{Path: se.Path, Msg: se.Msg}
			}
			return nil, &Error{Msg: err.Error()}
		}
	}
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := cfg.decodeScheduler(); err != nil {
		return nil, err
	}
	if err := cfg.decodeFlowControl(); err != nil {
		return nil, err
	}
	pc, err := scheduler.DecodePrefixConfig(cfg.Prefix)
	if err != nil {
		err = scheduler.PrefixError("prefix", err)
		var ce *scheduler.ConfigError
		if errors.As(err, &ce) {
			return nil, &Error{Path: ce.Path, Msg: ce.Msg}
		}
		return nil, &Error{Path: "prefix", Msg: err.Error()}
	}
	cfg.PrefixConfig = pc
	return cfg, nil
}

// decodeFlowControl decodes the "flowControl" section, if any, with paths
// under "flowControl".
func (c *Config) decodeFlowControl() error {
	if raw := bytes.TrimSpace(c.FlowControl); len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	fc, err := flowcontrol.DecodeConfig(c.FlowControl)
	if err != nil {
		err = scheduler.PrefixError("flowControl", err)
		var ce *scheduler.ConfigError
		if errors.As(err, &ce) {
			return &Error{Path: ce.Path, Msg: ce.Msg}
		}
		return &Error{Path: "flowControl", Msg: err.Error()}
	}
	for _, h := range []struct{ field, name string }{{"ttlHeader", fc.TTLHeader}, {"flowHeader", fc.FlowHeader}} {
		if h.name == c.DestinationHeader {
			return &Error{Path: "flowControl." + h.field, Msg: fmt.Sprintf("%q is the destination header, which the filter removes from every request", h.name)}
		}
	}
	c.FlowControlConfig = &fc
	return nil
}

// decodeScheduler decodes the "scheduler" section and builds a throwaway
// scheduler from it, so unknown plugin types, bad parameters and dangling
// references fail here, at configuration time, with a path under
// "scheduler".
func (c *Config) decodeScheduler() error {
	sc, err := scheduler.DecodeConfig(c.Scheduler)
	if err == nil {
		_, err = scheduler.New(sc, scheduler.NewRegistry(), scheduler.Options{Rand: rand.NewPCG(0, 0)})
	}
	if err != nil {
		err = scheduler.PrefixError("scheduler", err)
		var ce *scheduler.ConfigError
		if errors.As(err, &ce) {
			return &Error{Path: ce.Path, Msg: ce.Msg}
		}
		return &Error{Path: "scheduler", Msg: err.Error()}
	}
	c.SchedulerConfig = sc
	return nil
}

func (c *Config) applyDefaults() {
	if c.Role == "" {
		c.Role = RoleRouter
	}
	if c.UnknownModels == "" {
		c.UnknownModels = UnknownModelReject
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxModelNameLength == 0 {
		c.MaxModelNameLength = DefaultMaxModelNameLength
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = Duration(DefaultStaleAfter)
	}
	if c.SnapshotRefreshInterval == nil {
		d := Duration(c.SnapshotRefresh())
		c.SnapshotRefreshInterval = &d
	}
	if c.WhenNoFreshEndpoint == "" {
		c.WhenNoFreshEndpoint = NoFreshFailOpen
	}
	if c.DestinationHeader == "" {
		c.DestinationHeader = DefaultDestinationHeader
	}
	if c.SharedDataKeyPrefix == "" {
		c.SharedDataKeyPrefix = DefaultSharedDataKeyPrefix
	}
	for i := range c.Models {
		if c.Models[i].Criticality == "" {
			c.Models[i].Criticality = CriticalityStandard
		}
	}
	r := &c.Receiver
	if r.Path == "" {
		r.Path = DefaultReceiverPath
	}
	if r.TokenEnv == "" {
		r.TokenEnv = DefaultReceiverTokenEnv
	}
	if r.MaxPushBytes == 0 {
		r.MaxPushBytes = DefaultMaxPushBytes
	}
	if r.MaxEndpoints == 0 {
		r.MaxEndpoints = DefaultMaxEndpoints
	}
	if r.ConfigPath == "" {
		r.ConfigPath = DefaultConfigPath
	}
	if r.MaxConfigBytes == 0 {
		r.MaxConfigBytes = DefaultMaxConfigBytes
	}
	if r.MaxClockSkew == 0 {
		r.MaxClockSkew = Duration(DefaultMaxClockSkew)
	}
	if r.MaxAgents == 0 {
		r.MaxAgents = DefaultMaxAgents
	}
	if r.MaxTotalEndpoints == 0 {
		r.MaxTotalEndpoints = DefaultMaxTotalEndpoints
	}
}

func (c *Config) validate() error {
	switch c.Role {
	case RoleRouter, RoleReceiver:
	default:
		return &Error{Path: "role", Msg: fmt.Sprintf("unknown role %q (want router or receiver)", c.Role)}
	}
	switch c.UnknownModels {
	case UnknownModelReject, UnknownModelPassthrough:
	default:
		return &Error{Path: "unknownModels", Msg: fmt.Sprintf("unknown policy %q (want reject or passthrough)", c.UnknownModels)}
	}
	switch c.WhenNoFreshEndpoint {
	case NoFreshFailOpen, NoFreshReject:
	default:
		return &Error{Path: "whenNoFreshEndpoint", Msg: fmt.Sprintf("unknown policy %q (want fail-open or reject)", c.WhenNoFreshEndpoint)}
	}
	if c.MaxBodyBytes < 0 || c.MaxBodyBytes > 64<<20 {
		return &Error{Path: "maxBodyBytes", Msg: "must be in [1, 67108864]"}
	}
	if c.MaxModelNameLength < 0 || c.MaxModelNameLength > 4096 {
		return &Error{Path: "maxModelNameLength", Msg: "must be in [1, 4096]"}
	}
	if c.StaleAfter < 0 {
		return &Error{Path: "staleAfter", Msg: "must be positive"}
	}
	if d := c.SnapshotRefresh(); d != 0 && (d < time.Millisecond || d > MaxSnapshotRefresh) {
		return &Error{Path: "snapshotRefreshInterval", Msg: fmt.Sprintf("%s is outside [1ms, %s] (\"0s\": every request re-reads the snapshot)", d, MaxSnapshotRefresh)}
	} else if d%time.Millisecond != 0 {
		return &Error{Path: "snapshotRefreshInterval", Msg: fmt.Sprintf("%s is not a whole number of milliseconds (the tick's unit)", d)}
	} else if 4*d > time.Duration(c.StaleAfter) {
		return &Error{Path: "snapshotRefreshInterval", Msg: fmt.Sprintf("%s is more than a quarter of staleAfter (%s): a router's snapshot may be twice the interval old, and fresh endpoints would look stale", d, time.Duration(c.StaleAfter))}
	}
	if c.TargetPort < 0 || c.TargetPort > 65535 {
		return &Error{Path: "targetPort", Msg: "must be in [0, 65535] (0 keeps the reported port)"}
	}
	for _, h := range []struct{ path, v string }{{"destinationHeader", c.DestinationHeader}, {"servedByHeader", c.ServedByHeader}} {
		if h.v != "" && !validHeaderName(h.v) {
			return &Error{Path: h.path, Msg: fmt.Sprintf("%q is not a lower-case HTTP header name", h.v)}
		}
	}
	seen := make(map[string]int, len(c.Models))
	for i, m := range c.Models {
		p := fmt.Sprintf("models[%d]", i)
		if err := ValidModelName(m.Name, c.MaxModelNameLength); err != nil {
			return &Error{Path: p + ".name", Msg: err.Error()}
		}
		if j, dup := seen[m.Name]; dup {
			return &Error{Path: p + ".name", Msg: fmt.Sprintf("%q is already defined at models[%d]", m.Name, j)}
		}
		seen[m.Name] = i
		switch m.Criticality {
		case CriticalityCritical, CriticalityStandard, CriticalitySheddable:
		default:
			return &Error{Path: p + ".criticality", Msg: fmt.Sprintf("unknown criticality %q (want Critical, Standard or Sheddable)", m.Criticality)}
		}
		total := 0
		targets := make(map[string]bool, len(m.Targets))
		for j, t := range m.Targets {
			tp := fmt.Sprintf("%s.targets[%d]", p, j)
			if err := ValidModelName(t.Name, c.MaxModelNameLength); err != nil {
				return &Error{Path: tp + ".name", Msg: err.Error()}
			}
			if targets[t.Name] {
				return &Error{Path: tp + ".name", Msg: fmt.Sprintf("target %q listed twice", t.Name)}
			}
			targets[t.Name] = true
			if t.Weight < 0 || t.Weight > 1_000_000 {
				return &Error{Path: tp + ".weight", Msg: "must be in [0, 1000000]"}
			}
			total += t.Weight
		}
		if len(m.Targets) > 0 && total == 0 {
			return &Error{Path: p + ".targets", Msg: "weights add up to 0: at least one target needs a positive weight"}
		}
	}
	r := c.Receiver
	if !strings.HasPrefix(r.Path, "/") {
		return &Error{Path: "receiver.path", Msg: "must start with /"}
	}
	if r.MaxPushBytes < 0 || r.MaxPushBytes > 64<<20 {
		return &Error{Path: "receiver.maxPushBytes", Msg: "must be in [1, 67108864]"}
	}
	if r.MaxEndpoints < 0 || r.MaxEndpoints > 65535 {
		return &Error{Path: "receiver.maxEndpoints", Msg: "must be in [1, 65535]"}
	}
	if !strings.HasPrefix(r.ConfigPath, "/") || r.ConfigPath == r.Path {
		return &Error{Path: "receiver.configPath", Msg: "must start with / and differ from receiver.path"}
	}
	if r.MaxConfigBytes < 0 || r.MaxConfigBytes > 16<<20 {
		return &Error{Path: "receiver.maxConfigBytes", Msg: "must be in [1, 16777216]"}
	}
	if r.MaxClockSkew < 0 {
		return &Error{Path: "receiver.maxClockSkew", Msg: "must not be negative"}
	}
	if r.MaxAgents < 0 || r.MaxAgents > 65535 {
		return &Error{Path: "receiver.maxAgents", Msg: "must be in [1, 65535]"}
	}
	if r.MaxTotalEndpoints < 0 || r.MaxTotalEndpoints > 1<<20 {
		return &Error{Path: "receiver.maxTotalEndpoints", Msg: "must be in [1, 1048576]"}
	}
	return nil
}

// Model name errors, shared by configuration checks and the request parser
// so a name the configuration accepts is exactly a name a request may carry.
var (
	ErrNameEmpty   = errors.New("must not be empty")
	ErrNameTooLong = errors.New("longer than maxModelNameLength")
	ErrNameControl = errors.New("contains a control character or invalid UTF-8")
)

// ValidModelName accepts what may safely travel in a body, a log line or a
// metric label: non-empty, at most maxLen bytes, valid UTF-8 without C0/C1
// control characters, DEL or U+FFFD (what a decoder makes of invalid
// UTF-8 or a lone surrogate escape). Errors wrap ErrNameEmpty,
// ErrNameTooLong or ErrNameControl; the control-character message quotes
// the name with %q so it is safe to log.
func ValidModelName(s string, maxLen int) error {
	if s == "" {
		return ErrNameEmpty
	}
	if len(s) > maxLen {
		return fmt.Errorf("%w (%d bytes)", ErrNameTooLong, maxLen)
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf { // ASCII fast path
			if c < 0x20 || c == 0x7f {
				return fmt.Errorf("%q %w", s, ErrNameControl)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError || (r >= 0x80 && r <= 0x9f) {
			return fmt.Errorf("%q %w", s, ErrNameControl)
		}
		i += size
	}
	return nil
}

// validHeaderName accepts lower-case HTTP token characters only: Envoy keeps
// header keys lower case, and a pseudo-header (":path") must not be set.
func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for _, r := range h {
		if !(r == '-' || r == '_' || r == '.' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9')) {
			return false
		}
	}
	return true
}

// SnapshotRefresh is SnapshotRefreshInterval with its default applied (0:
// every request re-reads the snapshot).
func (c *Config) SnapshotRefresh() time.Duration {
	if c.SnapshotRefreshInterval == nil {
		// A quarter of staleAfter when that is shorter (validate's bound);
		// under 1ms, none: every request re-reads.
		return min(DefaultSnapshotRefresh, (time.Duration(c.StaleAfter) / 4).Truncate(time.Millisecond))
	}
	return time.Duration(*c.SnapshotRefreshInterval)
}

// AdmissionKey is the shared-data key of flow control's admission record
// (flowcontrol.Admission): the requests every worker VM released to each
// endpoint since the current snapshot.
func (c *Config) AdmissionKey() string { return c.SharedDataKeyPrefix + "v2.admit" }

// ConfigKey is the shared-data key of the stored configuration record
// (receivers write it, routers read it when the metrics directory's
// config_gen moves).
func (c *Config) ConfigKey() string { return wire.ConfigKey(c.SharedDataKeyPrefix) }

// ConfigLimits bound the configuration records a receiver accepts and a
// router reads: model names as long as requests may carry.
func (c *Config) ConfigLimits() wire.ConfigLimits {
	return wire.ConfigLimits{MaxBytes: c.Receiver.MaxConfigBytes, MaxModelNameLen: c.MaxModelNameLength}
}
