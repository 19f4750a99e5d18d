package receiver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/wasm-epp/wasm-epp/plugin/config"
	"github.com/wasm-epp/wasm-epp/plugin/internal/proxywasm"
	"github.com/wasm-epp/wasm-epp/plugin/internal/shareddata"
	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// Configuration records (scheduler/wire ConfigRecord) arrive on their own
// path of the push listener, with the same token. A record is stored whole
// under its own shared-data key, by CAS, only when it is newer than the
// stored one (wire.DecideConfig): a record with the stored table writes
// nothing, one whose revisions do not pass the stored record's gets 409.
// After a write the record's generation (wire.ConfigGenOf) goes into the
// metrics directory, which routers read on every request anyway; they read
// the record only when it moved.
//
// Every accepted metrics push is answered with the table stored
// (heldConfig): agents send their record when that is not theirs, and old
// agents resend theirs every second whatever the answer; nearly every
// record then carries the stored table. So a record is first compared by its
// head and table hash (wire.PeekConfig, no decoding) with what this VM
// knows of the stored record, as long as the directory still names that
// record: the same table costs a hash of its bytes and one directory read.
// Only a record that may be stored is decoded and checked in full.

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
	path     string
	maxBytes int
	limits   wire.ConfigLimits
	key      string
	probe    string
	// known is what this VM last read or wrote of the stored record.
	known knownConfig
	// decodes counts records decoded in full (tests, benchmarks).
	decodes int
	// held is the answer to metrics pushes (wire.ConfigHeldHeader) for
	// the directory's configuration generation heldGen; heldReads counts
	// the stored records read to make it (tests).
	heldGen   uint64
	held      string
	heldBuf   []byte
	heldReads int
}

// knownConfig is the head of the stored record whose generation is gen
// (0: nothing known).
type knownConfig struct {
	gen      uint64
	pool     []byte
	revision wire.ConfigRevision
	table    uint64
	agent    string
}

func (k *knownConfig) set(gen uint64, h wire.ConfigHead, agent string) {
	k.gen, k.pool, k.revision, k.table, k.agent = gen, append(k.pool[:0], h.Pool...), h.Revision, h.TableHash, agent
}

func newConfigRecords(cfg *config.Config, counters map[string]proxywasm.MetricCounter) configRecords {
	for _, o := range configOutcomes {
		counters[o] = proxywasm.DefineCounterMetric("wasm_epp.receiver." + o)
	}
	keys := wire.NewKeys(cfg.SharedDataKeyPrefix)
	return configRecords{path: cfg.Receiver.ConfigPath, maxBytes: cfg.Receiver.MaxConfigBytes,
		limits: cfg.ConfigLimits(), key: cfg.ConfigKey(), probe: keys.Probe}
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
// is valid and newer (or the directory must be told the stored record's
// generation again).
func (r *Receiver) applyConfig(body []byte) (status int, outcome, msg string) {
	start := r.mono()
	defer func() { r.configUs.Record(uint64(r.mono().Sub(start) / time.Microsecond)) }()
	cr := &r.config
	st := shareddata.Store{}
	head, err := wire.PeekConfig(body, cr.limits)
	if err != nil {
		return 400, outcomeConfigInvalid, err.Error()
	}
	dirGen, dirErr := r.writer.ConfigGen(st)
	if k := &cr.known; dirErr == nil && k.gen != 0 && dirGen == k.gen {
		switch {
		case head.TableHash == k.table && bytes.Equal(head.Pool, k.pool):
			return 204, outcomeConfigUnchanged, ""
		case !head.Revision.Covers(k.revision) || head.Revision == k.revision:
			return 409, outcomeConfigNotNewer, notNewer(head.Revision, k)
		}
	}
	cr.decodes++
	rec, err := wire.DecodeConfig(body, cr.limits)
	if err != nil {
		return 400, outcomeConfigInvalid, err.Error()
	}
	for attempt := 0; attempt < maxMergeAttempts; attempt++ {
		stored, cas, err := st.Get(cr.key, nil)
		switch {
		case errors.Is(err, wire.ErrNotFound):
			// Created only if still absent: another VM may be storing
			// another agent's first record right now.
			stored = nil
			if cas, err = wire.CreateToken(st, cr.probe); err != nil {
				return 500, outcomeStoreError, "cannot write shared data: " + err.Error()
			}
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
			r.knowStored(stored, dirGen, dirErr)
			return 409, outcomeConfigNotNewer, err.Error()
		case err != nil:
			return 400, outcomeConfigInvalid, err.Error()
		case decision == wire.ConfigUnchanged:
			r.knowStored(stored, dirGen, dirErr)
			return 204, outcomeConfigUnchanged, ""
		}
		err = st.Set(cr.key, body, cas)
		if errors.Is(err, wire.ErrCASMismatch) {
			continue // another VM stored a record in between: decide again
		}
		if err != nil {
			return 500, outcomeStoreError, "cannot write shared data: " + err.Error()
		}
		// The generation goes into the directory after the record: a
		// router that sees it finds (at least) the new record.
		gen := wire.ConfigGenOf(body)
		if _, err := r.writer.SetConfigGen(st, gen); err != nil {
			proxywasm.LogErrorf("wasm-epp receiver: cannot record the configuration's generation (the next resend does): %v", err)
		} else {
			cr.known.set(gen, head, rec.AgentID)
		}
		proxywasm.LogInfof("wasm-epp receiver: model table of pool %s/%s stored (%d rewritten models, %d objectives, revisions %s, from agent %q)",
			rec.PoolNamespace, rec.PoolName, len(rec.Table.Rewrites), len(rec.Table.Objectives), rec.Revision.String(), rec.AgentID)
		return 204, outcomeConfigStored, ""
	}
	return 503, outcomeContention, fmt.Sprintf("shared data kept changing during %d attempts; retry", maxMergeAttempts)
}

// knowStored remembers the head of the stored record (read and judged
// valid by DecideConfig), and records its generation in the directory if
// the directory names another (a receiver stopped between the two writes,
// or the directory was rebuilt): the next resends compare without
// decoding.
func (r *Receiver) knowStored(stored []byte, dirGen uint64, dirErr error) {
	head, err := wire.PeekConfig(stored, wire.ConfigLimits{MaxBytes: len(stored)})
	if err != nil {
		return
	}
	gen := wire.ConfigGenOf(stored)
	if dirErr != nil || dirGen != gen {
		if _, err := r.writer.SetConfigGen(shareddata.Store{}, gen); err != nil {
			return
		}
	}
	r.config.known.set(gen, head, agentOf(stored))
}

// agentOf is the agent id of a valid record (for messages).
func agentOf(record []byte) string {
	n, k := binary.Uvarint(record[3:])
	return string(record[3+k : 3+k+int(n)])
}

func notNewer(rev wire.ConfigRevision, k *knownConfig) string {
	return "wire: config.revision: revisions " + rev.String() + " do not pass the stored " + k.revision.String() +
		" (from agent " + strconv.Quote(k.agent) + ") (" + wire.ErrConfigNotNewer.Error() + ")"
}

// heldConfig is the wire.ConfigHeldHeader value for an accepted metrics
// push: the generation comes from the directory that push read or wrote
// anyway (wire.Writer.SeenConfigGen), and the stored record is read only
// when that generation moved since this VM last looked. "" (no header:
// the agent keeps resending on its timer) when the record cannot be read.
func (r *Receiver) heldConfig() string {
	cr := &r.config
	gen := r.writer.SeenConfigGen()
	if gen == cr.heldGen && cr.held != "" {
		return cr.held
	}
	if gen == 0 {
		cr.heldGen, cr.held = 0, wire.ConfigHeldNone
		return cr.held
	}
	cr.heldReads++
	b, _, err := shareddata.Store{}.Get(cr.key, cr.heldBuf[:0])
	if cap(b) > cap(cr.heldBuf) {
		cr.heldBuf = b[:0]
	}
	if errors.Is(err, wire.ErrNotFound) {
		// The directory names a record that is not there (shared data
		// rebuilt underneath): the agents are told to send theirs.
		cr.heldGen, cr.held = gen, wire.ConfigHeldNone
		return cr.held
	}
	if err != nil {
		return ""
	}
	head, err := wire.PeekConfig(b, wire.ConfigLimits{MaxBytes: len(b)})
	if err != nil {
		cr.heldGen, cr.held = gen, wire.ConfigHeldNone // unreadable: a valid record replaces it
		return cr.held
	}
	cr.heldGen, cr.held = gen, head.Held()
	return cr.held
}
