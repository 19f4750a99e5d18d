package receiver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Configuration records (scheduler/wire ConfigRecord) arrive on their own
// path of the push listener, with the same token. A record is decoded
// strictly and stored whole under its own shared-data key, by CAS, only
// when it is newer than the stored one (wire.DecideConfig): a record with
// the stored table writes nothing, one whose revisions do not pass the
// stored record's gets 409. After a write the record's 8-byte version key
// changes, which is what routers read on every request.

// Outcomes of configuration records (metric wasm_epp.receiver.<outcome>).
const (
	outcomeConfigStored    = "config_stored"
	outcomeConfigUnchanged = "config_unchanged"
	outcomeConfigNotNewer  = "config_not_newer"
	outcomeConfigInvalid   = "config_bad_request"
	outcomeConfigReset     = "config_stored_reset"
)

var configOutcomes = []string{outcomeConfigStored, outcomeConfigUnchanged, outcomeConfigNotNewer, outcomeConfigInvalid, outcomeConfigReset}

// configRecords is the receiver's configuration-record state.
type configRecords struct {
	path        string
	maxBytes    int
	limits      wire.ConfigLimits
	key, genKey string
}

func newConfigRecords(cfg *config.Config, counters map[string]proxywasm.MetricCounter) configRecords {
	for _, o := range configOutcomes {
		counters[o] = proxywasm.DefineCounterMetric("wasm_epp.receiver." + o)
	}
	return configRecords{path: cfg.Receiver.ConfigPath, maxBytes: cfg.Receiver.MaxConfigBytes,
		limits: cfg.ConfigLimits(), key: cfg.ConfigKey(), genKey: cfg.ConfigGenKey()}
}

// maxBytes is the body bound of the request at hand.
func (c *pushContext) maxBytes() int {
	if c.config {
		return c.r.config.maxBytes
	}
	return c.r.maxBytes
}

// applyConfig stores one configuration record if it is newer than the
// stored one. It returns the HTTP status, the outcome counter and, on
// failure, a message for the agent. Nothing is written unless the record
// is valid and newer.
func (r *Receiver) applyConfig(body []byte) (status int, outcome, msg string) {
	cr := &r.config
	rec, err := wire.DecodeConfig(body, cr.limits)
	if err != nil {
		return 400, outcomeConfigInvalid, err.Error()
	}
	for attempt := 0; attempt < maxMergeAttempts; attempt++ {
		stored, cas, err := proxywasm.GetSharedData(cr.key)
		switch {
		case errors.Is(err, types.ErrorStatusNotFound):
			stored, cas = nil, 0
		case err != nil:
			return 500, outcomeStoreError, "cannot read shared data: " + err.Error()
		}
		decision, err := wire.DecideConfig(stored, rec, cr.limits)
		switch {
		case errors.Is(err, wire.ErrStoredCorrupt):
			// Our own state is unreadable (another build wrote it): the
			// valid record replaces it.
			proxywasm.LogErrorf("wasm-epp receiver: stored configuration record unreadable, replacing it: %v", err)
			r.counters[outcomeConfigReset].Increment(1)
		case errors.Is(err, wire.ErrConfigNotNewer):
			return 409, outcomeConfigNotNewer, err.Error()
		case err != nil:
			return 400, outcomeConfigInvalid, err.Error()
		case decision == wire.ConfigUnchanged:
			return 204, outcomeConfigUnchanged, ""
		}
		err = proxywasm.SetSharedData(cr.key, body, cas)
		if errors.Is(err, types.ErrorStatusCasMismatch) {
			continue // another VM stored a record in between: decide again
		}
		if err != nil {
			return 500, outcomeStoreError, "cannot write shared data: " + err.Error()
		}
		// Written after the record: a router that sees the new version
		// finds (at least) the new record.
		if err := proxywasm.SetSharedData(cr.genKey, configGen(body), 0); err != nil {
			proxywasm.LogErrorf("wasm-epp receiver: cannot write the configuration version: %v", err)
		}
		proxywasm.LogInfof("wasm-epp receiver: model table of pool %s/%s stored (%d rewritten models, %d objectives, revisions %s, from agent %q)",
			rec.PoolNamespace, rec.PoolName, len(rec.Table.Rewrites), len(rec.Table.Objectives), rec.Revision.String(), rec.AgentID)
		return 204, outcomeConfigStored, ""
	}
	return 503, outcomeContention, fmt.Sprintf("shared data kept changing during %d attempts; retry", maxMergeAttempts)
}

// configGen is the 8-byte version of a stored record: it changes whenever
// the record's bytes do.
func configGen(record []byte) []byte {
	h := fnv.New64a()
	h.Write(record)
	return binary.LittleEndian.AppendUint64(nil, h.Sum64())
}
