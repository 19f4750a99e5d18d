package flowcontrol

import (
	"strings"
	"testing"
	"time"
)

func TestDecodeConfigDefaults(t *testing.T) {
	for _, in := range []string{"", "null", "{}"} {
		c, err := DecodeConfig([]byte(in))
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		want := Config{MaxRequests: DefaultMaxRequests, MaxBytes: DefaultMaxBytes, TTL: DefaultTTL,
			TTLHeader: DefaultTTLHeader, MaxFlowKeyBytes: DefaultMaxFlowKeyBytes, ReleaseInterval: DefaultReleaseInterval,
			Admit: Room{MaxWaiting: DefaultRoomMaxWaiting, MaxKVCacheUsage: DefaultRoomMaxKVCacheUsage}}
		if c != want {
			t.Fatalf("%q: %+v, want %+v", in, c, want)
		}
	}
}

func TestDecodeConfigAdmit(t *testing.T) {
	for in, want := range map[string]Room{
		`{"admit": {}}`:                                        DefaultRoom(),
		`{"admit": {"maxWaiting": 3}}`:                         {MaxWaiting: 3, MaxKVCacheUsage: DefaultRoomMaxKVCacheUsage},
		`{"admit": {"maxKVCacheUsage": 1}}`:                    {MaxWaiting: DefaultRoomMaxWaiting, MaxKVCacheUsage: 1},
		`{"admit": {"maxWaiting": 0, "maxKVCacheUsage": 0.5}}`: {MaxWaiting: 0, MaxKVCacheUsage: 0.5},
	} {
		c, err := DecodeConfig([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if c.Admit != want {
			t.Errorf("%s: admit %+v, want %+v", in, c.Admit, want)
		}
	}
}

func TestDecodeConfig(t *testing.T) {
	c, err := DecodeConfig([]byte(`{"maxRequests": 50, "maxBytes": 4096, "ttl": "1.5s", "ttlHeader": "-",
		"flowHeader": "x-tenant", "maxFlowKeyBytes": 16, "releaseInterval": "5ms"}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{MaxRequests: 50, MaxBytes: 4096, TTL: 1500 * time.Millisecond, TTLHeader: NoTTLHeader,
		FlowHeader: "x-tenant", MaxFlowKeyBytes: 16, ReleaseInterval: 5 * time.Millisecond, Admit: DefaultRoom()}
	if c != want {
		t.Fatalf("%+v, want %+v", c, want)
	}
}

func TestDecodeConfigErrors(t *testing.T) {
	for in, want := range map[string]string{
		`{"maxRequest": 5}`:                                  "maxRequest",
		`{"MaxRequests": 5}`:                                 "MaxRequests",
		`{"maxRequests": -1}`:                                "maxRequests: must be in [1, 1048576]",
		`{"maxRequests": 2000000}`:                           "maxRequests: must be in",
		`{"maxRequests": "5"}`:                               "maxRequests",
		`{"maxBytes": -1}`:                                   "maxBytes: must be positive",
		`{"ttl": "2h"}`:                                      "ttl: must be in (0, 1h0m0s]",
		`{"ttl": "-1s"}`:                                     "ttl: must be in",
		`{"ttl": "soon"}`:                                    "ttl",
		`{"ttl": 5}`:                                         "ttl",
		`{"releaseInterval": "100us"}`:                       "releaseInterval: must be in [1ms, 10s]",
		`{"releaseInterval": "1m"}`:                          "releaseInterval",
		`{"flowHeader": "X-Tenant"}`:                         "flowHeader: \"X-Tenant\": header names are matched in lower case",
		`{"flowHeader": ":authority"}`:                       "flowHeader: \":authority\" is not an HTTP header name",
		`{"ttlHeader": "a b"}`:                               "ttlHeader",
		`{"maxFlowKeyBytes": 5000}`:                          "maxFlowKeyBytes: must be in [1, 4096]",
		`{"admit": {"maxWaiting": -1}}`:                      "admit.maxWaiting: must be in [0, 65536]",
		`{"admit": {"maxKVCacheUsage": 0}}`:                  "admit.maxKVCacheUsage: must be in (0, 1]",
		`{"admit": {"maxKVCacheUsage": 1.5}}`:                "admit.maxKVCacheUsage: must be in (0, 1]",
		`{"admit": {"maxWaitng": 1}}`:                        "maxWaitng",
		`{"admit": 1}`:                                       "admit",
		`{"maxRequests": 5} {}`:                              "",
		`[]`:                                                 "",
		`{"flowHeader": "` + strings.Repeat("a", 300) + `"}`: "longer than 256 bytes",
	} {
		_, err := DecodeConfig([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one containing %q", in, err, want)
		}
	}
}
