package flowcontrol

import (
	"fmt"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler"
)

// Defaults. A VM holding DefaultMaxRequests bodies of 4 KiB stays well
// under 16 MiB of guest memory (the bodies stay in the proxy's buffers;
// BENCHMARKS.md has the measurement).
const (
	DefaultMaxRequests     = 1000
	DefaultMaxBytes        = 32 << 20
	DefaultTTL             = 10 * time.Second
	DefaultReleaseInterval = 20 * time.Millisecond
	DefaultTTLHeader       = "x-wasm-epp-queue-ttl-ms"
	DefaultMaxFlowKeyBytes = 128
)

// Upper bounds of the configuration: larger values are mistakes, and the
// tables a Queue grows are sized by them.
const (
	MaxMaxRequests     = 1 << 20
	MaxTTL             = time.Hour
	MinReleaseInterval = time.Millisecond
	MaxReleaseInterval = 10 * time.Second
	MaxMaxFlowKeyBytes = 4096
)

// Config is the flowControl section of the plugin configuration. Zero
// fields take the defaults (Config.WithDefaults). JSON, with the defaults:
//
//	{
//	  "maxRequests": 1000,            // requests held per VM; more get 429
//	  "maxBytes": 33554432,           // sum of held body sizes per VM; more get 429
//	  "ttl": "10s",                   // longest wait; then 429
//	  "ttlHeader": "x-wasm-epp-queue-ttl-ms", // request header that may shorten it ("-": none)
//	  "flowHeader": "",               // request header naming the flow ("": the target model)
//	  "maxFlowKeyBytes": 128,         // longer header values share the anonymous flow
//	  "releaseInterval": "20ms",      // how often queued requests are offered to the scheduler
//	  "admit": {                      // when an endpoint takes a Standard or Sheddable request (Room)
//	    "maxWaiting": 0,              //   its waiting queue, with what this proxy sent since the snapshot
//	    "maxKVCacheUsage": 0.9        //   its KV-cache usage
//	  }
//	}
type Config struct {
	MaxRequests     int
	MaxBytes        int64
	TTL             time.Duration
	TTLHeader       string
	FlowHeader      string
	MaxFlowKeyBytes int
	ReleaseInterval time.Duration
	// Admit is when an endpoint takes a Standard or Sheddable request;
	// the zero value means DefaultRoom (a zero MaxKVCacheUsage is never
	// valid, so it marks an unset Room).
	Admit Room
}

// configJSON is Config as written: durations are Go duration strings.
type configJSON struct {
	MaxRequests     int       `json:"maxRequests"`
	MaxBytes        int64     `json:"maxBytes"`
	TTL             string    `json:"ttl"`
	TTLHeader       string    `json:"ttlHeader"`
	FlowHeader      string    `json:"flowHeader"`
	MaxFlowKeyBytes int       `json:"maxFlowKeyBytes"`
	ReleaseInterval string    `json:"releaseInterval"`
	Admit           *roomJSON `json:"admit"`
}

// roomJSON is Room as written; absent fields take the defaults.
type roomJSON struct {
	MaxWaiting      *int     `json:"maxWaiting"`
	MaxKVCacheUsage *float64 `json:"maxKVCacheUsage"`
}

// NoTTLHeader as Config.TTLHeader turns the TTL header off.
const NoTTLHeader = "-"

// DecodeConfig strictly decodes the flowControl section (unknown or
// wrongly-cased fields, wrong types and trailing data are errors), applies
// the defaults and validates it. Errors are *scheduler.ConfigError with
// paths relative to the section.
func DecodeConfig(data []byte) (Config, error) {
	var j configJSON
	if err := scheduler.DecodeParameters(data, &j); err != nil {
		return Config{}, err
	}
	c := Config{MaxRequests: j.MaxRequests, MaxBytes: j.MaxBytes, TTLHeader: j.TTLHeader,
		FlowHeader: j.FlowHeader, MaxFlowKeyBytes: j.MaxFlowKeyBytes}
	var err error
	if c.TTL, err = parseDuration("ttl", j.TTL); err != nil {
		return Config{}, err
	}
	if c.ReleaseInterval, err = parseDuration("releaseInterval", j.ReleaseInterval); err != nil {
		return Config{}, err
	}
	if a := j.Admit; a != nil {
		c.Admit = DefaultRoom()
		if a.MaxWaiting != nil {
			c.Admit.MaxWaiting = *a.MaxWaiting
		}
		if a.MaxKVCacheUsage != nil {
			c.Admit.MaxKVCacheUsage = *a.MaxKVCacheUsage
			if *a.MaxKVCacheUsage == 0 {
				return Config{}, fieldErr("admit.maxKVCacheUsage", "must be in (0, 1]")
			}
		}
	}
	c = c.WithDefaults()
	return c, c.Validate()
}

// parseDuration reads a Go duration string; "" is 0 (the default).
func parseDuration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fieldErr(field, fmt.Sprintf("%q is not a duration (write it like \"500ms\" or \"10s\")", s))
	}
	if d == 0 {
		return 0, fieldErr(field, "must be positive")
	}
	return d, nil
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.MaxRequests == 0 {
		c.MaxRequests = DefaultMaxRequests
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.TTLHeader == "" {
		c.TTLHeader = DefaultTTLHeader
	}
	if c.MaxFlowKeyBytes == 0 {
		c.MaxFlowKeyBytes = DefaultMaxFlowKeyBytes
	}
	if c.ReleaseInterval == 0 {
		c.ReleaseInterval = DefaultReleaseInterval
	}
	if c.Admit == (Room{}) {
		c.Admit = DefaultRoom()
	}
	return c
}

// Validate checks a configuration with its defaults applied.
func (c Config) Validate() error {
	switch {
	case c.MaxRequests < 1 || c.MaxRequests > MaxMaxRequests:
		return fieldErr("maxRequests", fmt.Sprintf("must be in [1, %d]", MaxMaxRequests))
	case c.MaxBytes < 1:
		return fieldErr("maxBytes", "must be positive")
	case c.TTL <= 0 || c.TTL > MaxTTL:
		return fieldErr("ttl", fmt.Sprintf("must be in (0, %s]", MaxTTL))
	case c.MaxFlowKeyBytes < 1 || c.MaxFlowKeyBytes > MaxMaxFlowKeyBytes:
		return fieldErr("maxFlowKeyBytes", fmt.Sprintf("must be in [1, %d]", MaxMaxFlowKeyBytes))
	case c.ReleaseInterval < MinReleaseInterval || c.ReleaseInterval > MaxReleaseInterval:
		return fieldErr("releaseInterval", fmt.Sprintf("must be in [%s, %s]", MinReleaseInterval, MaxReleaseInterval))
	}
	if err := c.Admit.validate(); err != nil {
		return err
	}
	if c.TTLHeader != NoTTLHeader {
		if err := validHeaderName(c.TTLHeader); err != nil {
			return fieldErr("ttlHeader", err.Error())
		}
	}
	if c.FlowHeader != "" {
		if err := validHeaderName(c.FlowHeader); err != nil {
			return fieldErr("flowHeader", err.Error())
		}
	}
	return nil
}

// validHeaderName accepts what the proxy's header maps hold as a name: a
// non-empty lower-case token (Envoy lower-cases HTTP/1 names and HTTP/2
// requires lower case), not a pseudo-header.
func validHeaderName(s string) error {
	if s == "" {
		return fmt.Errorf("must not be empty")
	}
	if len(s) > 256 {
		return fmt.Errorf("longer than 256 bytes")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' || c == '_' || c == '.' || c == '!' || c == '#' || c == '$' || c == '%' || c == '&' ||
			c == '\'' || c == '*' || c == '+' || c == '^' || c == '`' || c == '|' || c == '~':
		case c >= 'A' && c <= 'Z':
			return fmt.Errorf("%q: header names are matched in lower case; write it in lower case", s)
		default:
			return fmt.Errorf("%q is not an HTTP header name", s)
		}
	}
	return nil
}

func fieldErr(path, msg string) error { return &scheduler.ConfigError{Path: path, Msg: msg} }
