package scheduler

import (
	"fmt"
	"time"

	"github.com/wasm-epp/wasm-epp/scheduler/prefix"
)

// PrefixConfig is the "prefix" section of the plugin configuration: how
// prompts are hashed and how the index is kept. Zero fields take the
// defaults. JSON, with the defaults:
//
//	{
//	  "blockBytes": 64,            // canonical prompt bytes per block (about vLLM's 16 tokens)
//	  "maxBlocks": 8192,           // blocks hashed per request (512 KiB); later bytes are not
//	  "index": {
//	    "maxEntries": 65536,       // (block, endpoint) entries kept
//	    "maxBytes": 2097152,       // bytes in shared data (and in each worker VM's copy)
//	    "bucketEntries": 16,       // entries per shared-data key; LRU within it
//	    "recordEvery": 4,          // blocks per recorded position (a match is known to 4 blocks)
//	    "maxRecord": 256,          // entries one request writes at most
//	    "maxPending": 8192         // writes waiting for the next sync per VM
//	  },
//	  "shared": true,              // false: each worker VM keeps its own index (for comparison)
//	  "syncInterval": "50ms"       // how often a VM publishes its writes and reads the others'
//	}
type PrefixConfig struct {
	Hash         prefix.HashConfig
	Index        prefix.IndexConfig
	Shared       bool
	SyncInterval time.Duration
}

// DefaultPrefixSyncInterval is PrefixConfig.SyncInterval's default: a
// worker sees another's writes within two intervals.
const DefaultPrefixSyncInterval = 50 * time.Millisecond

type prefixConfigJSON struct {
	BlockBytes   int                `json:"blockBytes"`
	MaxBlocks    int                `json:"maxBlocks"`
	Index        prefix.IndexConfig `json:"index"`
	Shared       *bool              `json:"shared"`
	SyncInterval string             `json:"syncInterval"`
}

// DefaultPrefixConfig is the configuration of an absent section.
func DefaultPrefixConfig() PrefixConfig {
	return PrefixConfig{Hash: prefix.HashConfig{}.WithDefaults(), Index: prefix.IndexConfig{}.WithDefaults(),
		Shared: true, SyncInterval: DefaultPrefixSyncInterval}
}

// DecodePrefixConfig strictly decodes the "prefix" section (empty or null:
// the defaults) and validates it. Errors are *ConfigError with paths
// relative to the section.
func DecodePrefixConfig(data []byte) (PrefixConfig, error) {
	var j prefixConfigJSON
	if err := DecodeParameters(data, &j); err != nil {
		return PrefixConfig{}, err
	}
	c := PrefixConfig{Hash: prefix.HashConfig{BlockBytes: j.BlockBytes, MaxBlocks: j.MaxBlocks}.WithDefaults(),
		Index: j.Index.WithDefaults(), Shared: j.Shared == nil || *j.Shared, SyncInterval: DefaultPrefixSyncInterval}
	if j.SyncInterval != "" {
		d, err := time.ParseDuration(j.SyncInterval)
		if err != nil || d < time.Millisecond || d > 10*time.Second {
			return PrefixConfig{}, fieldErr("syncInterval", fmt.Sprintf("%q: want a duration from 1ms to 10s, like \"50ms\"", j.SyncInterval))
		}
		c.SyncInterval = d
	}
	if err := c.Hash.Validate(); err != nil {
		return PrefixConfig{}, hashFieldErr(j, err)
	}
	if err := c.Index.Validate(); err != nil {
		return PrefixConfig{}, fieldErr("index", err.Error())
	}
	return c, nil
}

func hashFieldErr(j prefixConfigJSON, err error) error {
	field := "maxBlocks"
	if c := (prefix.HashConfig{BlockBytes: j.BlockBytes}.WithDefaults()); c.Validate() != nil {
		field = "blockBytes"
	}
	return fieldErr(field, err.Error())
}

// UsesPrefix reports whether a selected profile runs a prefix-aware plugin,
// so the caller must hash prompts and keep an index.
func (s *Scheduler) UsesPrefix() bool {
	for _, p := range s.profiles {
		for _, f := range p.Filters {
			if _, ok := f.(*PrefixAffinityFilter); ok {
				return true
			}
		}
		for _, ws := range p.Scorers {
			if _, ok := ws.Scorer.(*PrefixCacheScorer); ok {
				return true
			}
		}
	}
	return false
}
