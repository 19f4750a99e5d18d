package wire

import (
	"encoding/binary"
	"errors"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
)

// The configuration record ("WC", version 1) is the model table the agents
// build from Kubernetes InferenceObjective and InferenceModelRewrite objects.
// An agent POSTs it to every Envoy replica; the receiver keeps the newest in
// shared data (ConfigKey) and routers apply it on their next request.
//
//	Config    = "WC" 0x01  agent_id:str  pool_namespace:str  pool_name:str
//	            rev_pools:u64  rev_objectives:u64  rev_rewrites:u64
//	            Table
//	Table     = n:uvarint Rewrite×n                (sorted, unique by model)
//	            has_default:u8(0|1) [Targets]      (the rule that matches every model)
//	            n:uvarint Objective×n              (sorted, unique by name)
//	Rewrite   = model:str  Targets
//	Targets   = n:uvarint(≥1) Target×n             (sorted, unique by model)
//	Target    = model:str  weight:uvarint          (≤ MaxWeight; the sum is > 0)
//	Objective = name:str  priority:i32
//
// Model names are at most ConfigLimits.MaxModelNameLen bytes, every other
// string at most 253 (a Kubernetes object name); none is empty or holds a
// control character.
//
// Like the other messages, every accepted byte string has one encoding, so
// two agents that read the same objects send the same Table bytes, and the
// Table's hash (ConfigRecord.TableHash) tells identical content apart from a
// change without comparing tables.

var magicConfig = [2]byte{'W', 'C'}

// MaxWeight bounds a target's weight, as InferenceModelRewrite's schema does.
const MaxWeight = 1_000_000

// ErrConfigNotNewer: a configuration record whose revisions are not ahead of
// the stored record's (the receiver answers 409 and keeps the stored one).
var ErrConfigNotNewer = errors.New("configuration record not newer than the stored one")

// ConfigPath is the receiver's default path for configuration records (on
// the push listener, with the push token).
const ConfigPath = "/wasm-epp/v1/config"

// ConfigKey is the shared-data key of the stored configuration record.
func ConfigKey(prefix string) string { return prefix + "v2.config" }

// ConfigGenOf is the generation of a stored record (Directory.ConfigGen):
// FNV-1a (64 bit) of its bytes, never 0 (0 means no record).
func ConfigGenOf(record []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range record {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return max(h, 1)
}

// ConfigHeldHeader is the response header with which the receiver answers
// every accepted metrics push (an agent's or a relay): which model table it
// holds, ConfigHead.Held of its stored record, or ConfigHeldNone. An agent
// sends its record when that is not its own table (and the aggregators pass
// a summary of their Envoys' answers on to the agents), instead of
// resending it on a timer; no header (an older receiver) means resend.
const ConfigHeldHeader = "x-wasm-epp-config"

// ConfigHeldNone is ConfigHeldHeader's value when no record is stored (an
// Envoy that has just started); ConfigHeldMixed is an aggregator's when
// its Envoys do not all hold the same table.
const (
	ConfigHeldNone  = "none"
	ConfigHeldMixed = "mixed"
)

// ConfigLimits bound a configuration record. A zero field means the
// default shown in DefaultConfigLimits.
type ConfigLimits struct {
	// MaxBytes bounds an encoded record (default 256 KiB).
	MaxBytes int
	// MaxRewrites bounds the rewritten model names (default 1024).
	MaxRewrites int
	// MaxTargets bounds the targets of one rewrite (default 64).
	MaxTargets int
	// MaxObjectives bounds the objectives (default 1024).
	MaxObjectives int
	// MaxModelNameLen bounds model names (default 256, the plugin's default
	// maxModelNameLength).
	MaxModelNameLen int
}

// DefaultConfigLimits returns the limits used when a field is left zero.
func DefaultConfigLimits() ConfigLimits {
	return ConfigLimits{MaxBytes: 256 << 10, MaxRewrites: 1024, MaxTargets: 64, MaxObjectives: 1024, MaxModelNameLen: 256}
}

// Resolved returns l with zero fields set to their defaults.
func (l ConfigLimits) Resolved() ConfigLimits {
	d := DefaultConfigLimits()
	pick := func(v, def int) int {
		if v == 0 {
			return def
		}
		return max(v, 0)
	}
	l.MaxBytes = pick(l.MaxBytes, d.MaxBytes)
	l.MaxRewrites = pick(l.MaxRewrites, d.MaxRewrites)
	l.MaxTargets = pick(l.MaxTargets, d.MaxTargets)
	l.MaxObjectives = pick(l.MaxObjectives, d.MaxObjectives)
	l.MaxModelNameLen = pick(l.MaxModelNameLen, d.MaxModelNameLen)
	return l
}

// ConfigRecord is one agent's model table for one pool.
type ConfigRecord struct {
	AgentID       string
	PoolNamespace string
	PoolName      string
	Revision      ConfigRevision
	Table         ModelTable
}

// ConfigRevision says which state of the Kubernetes objects a table
// reflects: for each watched resource, the highest resourceVersion the agent
// has seen (etcd revisions, which only grow).
type ConfigRevision struct {
	Pools, Objectives, Rewrites uint64
}

// Covers reports whether r is at or past o in every resource: a table
// built from r has seen everything a table built from o has.
func (r ConfigRevision) Covers(o ConfigRevision) bool {
	return r.Pools >= o.Pools && r.Objectives >= o.Objectives && r.Rewrites >= o.Rewrites
}

func (r ConfigRevision) String() string {
	return "pools@" + strconv.FormatUint(r.Pools, 10) + ",objectives@" + strconv.FormatUint(r.Objectives, 10) +
		",rewrites@" + strconv.FormatUint(r.Rewrites, 10)
}

// ModelTable is what routers apply: requested model → weighted targets, and
// objective name → priority.
type ModelTable struct {
	// Rewrites are sorted by Model, unique.
	Rewrites []ModelRewrite
	// Default, when non-empty, serves every model no rewrite names.
	Default []WeightedTarget
	// Objectives are sorted by Name, unique.
	Objectives []Objective
}

// Empty reports whether the table holds nothing; routers then keep their
// bootstrap models.
func (t *ModelTable) Empty() bool {
	return len(t.Rewrites) == 0 && len(t.Default) == 0 && len(t.Objectives) == 0
}

// ModelRewrite sends requests for Model to its targets by weight.
type ModelRewrite struct {
	Model   string
	Targets []WeightedTarget
}

// WeightedTarget is a model name a request is rewritten to, with its share.
// A weight of 0 keeps the target in the table but sends it nothing.
type WeightedTarget struct {
	Model  string
	Weight uint32
}

// Objective is an InferenceObjective: a name requests carry in a header and
// its priority (higher is more important, negative is sheddable).
type Objective struct {
	Name     string
	Priority int32
}

// Normalize sorts the table's lists into wire order. It does not remove
// duplicates: Validate reports them.
func (t *ModelTable) Normalize() {
	slices.SortFunc(t.Rewrites, func(a, b ModelRewrite) int { return strings.Compare(a.Model, b.Model) })
	for i := range t.Rewrites {
		sortTargets(t.Rewrites[i].Targets)
	}
	sortTargets(t.Default)
	slices.SortFunc(t.Objectives, func(a, b Objective) int { return strings.Compare(a.Name, b.Name) })
}

func sortTargets(ts []WeightedTarget) {
	slices.SortFunc(ts, func(a, b WeightedTarget) int { return strings.Compare(a.Model, b.Model) })
}

func (c *ConfigRecord) validate(lim *ConfigLimits) *Error {
	for _, f := range []struct{ name, v string }{{"agent_id", c.AgentID}, {"pool_namespace", c.PoolNamespace}, {"pool_name", c.PoolName}} {
		if err := checkString(f.v, objectNameLen, false); err != nil {
			return err.at("config." + f.name)
		}
	}
	t := &c.Table
	if len(t.Rewrites) > lim.MaxRewrites {
		return errf(ErrLimit, "config.rewrites", -1, strconv.Itoa(len(t.Rewrites))+" entries, limit "+strconv.Itoa(lim.MaxRewrites))
	}
	for i := range t.Rewrites {
		rw := &t.Rewrites[i]
		where := "config.rewrites[" + strconv.Itoa(i) + "]"
		if err := checkString(rw.Model, lim.MaxModelNameLen, false); err != nil {
			return err.at(where + ".model")
		}
		if i > 0 && t.Rewrites[i-1].Model >= rw.Model {
			return errf(ErrInvalidField, where+".model", -1, "rewrites not sorted and unique: "+strconv.Quote(t.Rewrites[i-1].Model)+" then "+strconv.Quote(rw.Model))
		}
		if err := checkTargets(rw.Targets, lim, where+".targets", false); err != nil {
			return err
		}
	}
	if err := checkTargets(t.Default, lim, "config.default", true); err != nil {
		return err
	}
	if len(t.Objectives) > lim.MaxObjectives {
		return errf(ErrLimit, "config.objectives", -1, strconv.Itoa(len(t.Objectives))+" entries, limit "+strconv.Itoa(lim.MaxObjectives))
	}
	for i, o := range t.Objectives {
		where := "config.objectives[" + strconv.Itoa(i) + "]"
		if err := checkString(o.Name, objectNameLen, false); err != nil {
			return err.at(where + ".name")
		}
		if i > 0 && t.Objectives[i-1].Name >= o.Name {
			return errf(ErrInvalidField, where+".name", -1, "objectives not sorted and unique: "+strconv.Quote(t.Objectives[i-1].Name)+" then "+strconv.Quote(o.Name))
		}
	}
	return nil
}

// CheckName applies the record's rules for a string to s: not empty, at
// most max bytes, valid UTF-8 without control characters.
func CheckName(s string, max int) error {
	if err := checkString(s, max, false); err != nil {
		return errors.New(err.Detail)
	}
	return nil
}

// objectNameLen is the longest Kubernetes object name.
const objectNameLen = 253

// MaxObjectNameLen bounds a record's agent_id, pool names and objective
// names (Kubernetes object names).
const MaxObjectNameLen = objectNameLen

// checkTargets checks one target list; an empty list is allowed only for
// the default rule (meaning there is none).
func checkTargets(ts []WeightedTarget, lim *ConfigLimits, where string, mayBeEmpty bool) *Error {
	if len(ts) == 0 {
		if mayBeEmpty {
			return nil
		}
		return errf(ErrInvalidField, where, -1, "no targets")
	}
	if len(ts) > lim.MaxTargets {
		return errf(ErrLimit, where, -1, strconv.Itoa(len(ts))+" entries, limit "+strconv.Itoa(lim.MaxTargets))
	}
	var sum uint64
	for i, t := range ts {
		w := where + "[" + strconv.Itoa(i) + "]"
		if err := checkString(t.Model, lim.MaxModelNameLen, false); err != nil {
			return err.at(w + ".model")
		}
		if i > 0 && ts[i-1].Model >= t.Model {
			return errf(ErrInvalidField, w+".model", -1, "targets not sorted and unique: "+strconv.Quote(ts[i-1].Model)+" then "+strconv.Quote(t.Model))
		}
		if t.Weight > MaxWeight {
			return errf(ErrInvalidField, w+".weight", -1, "weight "+strconv.FormatUint(uint64(t.Weight), 10)+" over "+strconv.Itoa(MaxWeight))
		}
		sum += uint64(t.Weight)
	}
	if sum == 0 {
		return errf(ErrInvalidField, where, -1, "weights add up to 0")
	}
	return nil
}

// AppendConfig validates c and appends its encoding to dst. Nothing that
// DecodeConfig would reject is ever encoded.
func AppendConfig(dst []byte, c *ConfigRecord, lim ConfigLimits) ([]byte, error) {
	lim = lim.Resolved()
	if err := c.validate(&lim); err != nil {
		return dst, err
	}
	start := len(dst)
	dst = appendConfigFields(dst, c)
	if n := len(dst) - start; n > lim.MaxBytes {
		return dst[:start], errf(ErrLimit, "config", -1, "encoded size "+strconv.Itoa(n)+" bytes, limit "+strconv.Itoa(lim.MaxBytes))
	}
	return dst, nil
}

// appendConfigFields writes c as it is; AppendConfig validates first.
func appendConfigFields(dst []byte, c *ConfigRecord) []byte {
	dst = append(dst, magicConfig[0], magicConfig[1], version1)
	dst = appendStr(dst, c.AgentID)
	dst = appendStr(dst, c.PoolNamespace)
	dst = appendStr(dst, c.PoolName)
	dst = binary.LittleEndian.AppendUint64(dst, c.Revision.Pools)
	dst = binary.LittleEndian.AppendUint64(dst, c.Revision.Objectives)
	dst = binary.LittleEndian.AppendUint64(dst, c.Revision.Rewrites)
	t := &c.Table
	dst = binary.AppendUvarint(dst, uint64(len(t.Rewrites)))
	for i := range t.Rewrites {
		dst = appendStr(dst, t.Rewrites[i].Model)
		dst = appendTargets(dst, t.Rewrites[i].Targets)
	}
	if len(t.Default) == 0 {
		dst = append(dst, 0)
	} else {
		dst = append(dst, 1)
		dst = appendTargets(dst, t.Default)
	}
	dst = binary.AppendUvarint(dst, uint64(len(t.Objectives)))
	for _, o := range t.Objectives {
		dst = appendStr(dst, o.Name)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(o.Priority))
	}
	return dst
}

func appendTargets(dst []byte, ts []WeightedTarget) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(ts)))
	for _, t := range ts {
		dst = appendStr(dst, t.Model)
		dst = binary.AppendUvarint(dst, uint64(t.Weight))
	}
	return dst
}

// Sizes of the parts of an encoded record, for a builder that must stay
// under ConfigLimits.MaxBytes: a record's size is ConfigBaseSize plus the
// sizes of its rewrites, default rule and objectives, with the two list
// counts growing past one byte at 128 entries (uvarint).

// ConfigBaseSize is the size of a record with an empty table.
func ConfigBaseSize(agentID, poolNamespace, poolName string) int {
	return 3 + strSize(agentID) + strSize(poolNamespace) + strSize(poolName) + 24 + uvarintSize(0) + 1 + uvarintSize(0)
}

// RewriteSize is the encoded size of one rewrite.
func RewriteSize(rw *ModelRewrite) int { return strSize(rw.Model) + targetsSize(rw.Targets) }

// DefaultSize is what a default rule adds to a record without one.
func DefaultSize(ts []WeightedTarget) int { return targetsSize(ts) }

// ObjectiveSize is the encoded size of one objective.
func ObjectiveSize(o *Objective) int { return strSize(o.Name) + 4 }

// CountSize is the size of a list count of n (the count of 0 is in
// ConfigBaseSize).
func CountSize(n int) int { return uvarintSize(uint64(n)) }

func targetsSize(ts []WeightedTarget) int {
	n := uvarintSize(uint64(len(ts)))
	for _, t := range ts {
		n += strSize(t.Model) + uvarintSize(uint64(t.Weight))
	}
	return n
}

func strSize(s string) int { return uvarintSize(uint64(len(s))) + len(s) }

func uvarintSize(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// EncodeConfig is AppendConfig to a new slice.
func EncodeConfig(c *ConfigRecord, lim ConfigLimits) ([]byte, error) {
	return AppendConfig(nil, c, lim)
}

// DecodedConfig is a decoded record and the hash of its Table bytes.
type DecodedConfig struct {
	ConfigRecord
	// TableHash is FNV-1a (64 bit) of the encoded Table: equal for equal
	// tables, whatever the sender and revisions.
	TableHash uint64
}

// minTargetBytes: a one-byte name and a one-byte weight.
const minTargetBytes = 1 + 1 + 1

// DecodeConfig parses and validates one configuration record. The result
// does not alias b.
func DecodeConfig(b []byte, lim ConfigLimits) (*DecodedConfig, error) {
	lim = lim.Resolved()
	d := newDecoder(b, Limits{MaxNameLen: max(objectNameLen, lim.MaxModelNameLen)}, "config")
	d.header(magicConfig, lim.MaxBytes)
	c := &DecodedConfig{}
	c.AgentID = d.str("agent_id")
	c.PoolNamespace = d.str("pool_namespace")
	c.PoolName = d.str("pool_name")
	c.Revision.Pools = d.u64("rev_pools")
	c.Revision.Objectives = d.u64("rev_objectives")
	c.Revision.Rewrites = d.u64("rev_rewrites")
	tableAt := d.off
	t := &c.Table
	if n := d.count("rewrites", lim.MaxRewrites, 1+1+minTargetBytes); n > 0 {
		t.Rewrites = make([]ModelRewrite, n)
		for i := range t.Rewrites {
			t.Rewrites[i].Model = d.str("rewrites[" + strconv.Itoa(i) + "].model")
			t.Rewrites[i].Targets = d.targets(&lim, "rewrites["+strconv.Itoa(i)+"].targets")
		}
	}
	switch has := d.u8("has_default"); {
	case d.err != nil:
	case has == 1:
		t.Default = d.targets(&lim, "default")
	case has != 0:
		d.fail(ErrInvalidField, "has_default", d.off-1, "value "+strconv.Itoa(int(has))+" (want 0 or 1)")
	}
	if n := d.count("objectives", lim.MaxObjectives, 1+1+4); n > 0 {
		t.Objectives = make([]Objective, n)
		for i := range t.Objectives {
			t.Objectives[i].Name = d.str("objectives[" + strconv.Itoa(i) + "].name")
			t.Objectives[i].Priority = int32(d.u32("objectives[" + strconv.Itoa(i) + "].priority"))
		}
	}
	d.end()
	if d.err != nil {
		return nil, d.err
	}
	if err := c.validate(&lim); err != nil {
		err.Offset = 0
		return nil, err
	}
	h := fnv.New64a()
	h.Write(b[tableAt:])
	c.TableHash = h.Sum64()
	return c, nil
}

// ConfigHead is what the receiver compares before decoding a whole
// record: an agent resends its record every few seconds, and most resends
// carry the stored table.
type ConfigHead struct {
	// Pool is pool_namespace and pool_name as encoded (it aliases the
	// record): equal bytes, equal names.
	Pool     []byte
	Revision ConfigRevision
	// TableHash is DecodedConfig.TableHash.
	TableHash uint64
}

// Held is the record's ConfigHeldHeader value: 16 hex digits of FNV-1a
// (64 bit) over the table hash and the pool, so two records name the same
// value exactly when they carry the same table for the same pool, whatever
// agent sent them and whatever their revisions.
func (h ConfigHead) Held() string {
	f := h.TableHash
	for _, c := range h.Pool {
		f ^= uint64(c)
		f *= 1099511628211
	}
	const digits = "0123456789abcdef"
	var out [16]byte
	for i := 15; i >= 0; i-- {
		out[i] = digits[f&15]
		f >>= 4
	}
	return string(out[:])
}

// PeekConfig reads a record's head and hashes its table without decoding
// or checking the table (DecodeConfig does both). It allocates nothing.
func PeekConfig(b []byte, lim ConfigLimits) (ConfigHead, error) {
	var h ConfigHead
	lim = lim.Resolved()
	if len(b) > lim.MaxBytes {
		return h, errf(ErrLimit, "config", 0, strconv.Itoa(len(b))+" bytes, limit "+strconv.Itoa(lim.MaxBytes))
	}
	switch {
	case len(b) < 3:
		return h, errf(ErrTruncated, "config.magic", 0, "payload of "+strconv.Itoa(len(b))+" bytes")
	case b[0] != magicConfig[0] || b[1] != magicConfig[1]:
		return h, errf(ErrFormat, "config.magic", 0, "got "+strconv.Quote(string(b[:2]))+", want "+strconv.Quote(string(magicConfig[:])))
	case b[2] != version1:
		return h, errf(ErrVersion, "config.version", 2, "version "+strconv.Itoa(int(b[2]))+", this build reads "+strconv.Itoa(version1))
	}
	off := 3
	str := func() bool {
		n, k := binary.Uvarint(b[off:])
		if k <= 0 || n > uint64(len(b)-off-k) {
			return false
		}
		off += k + int(n)
		return true
	}
	if !str() {
		return h, errf(ErrTruncated, "config.agent_id", off, "string cut short")
	}
	poolAt := off
	if !str() || !str() {
		return h, errf(ErrTruncated, "config.pool", off, "string cut short")
	}
	h.Pool = b[poolAt:off:off]
	if len(b)-off < 24 {
		return h, errf(ErrTruncated, "config.revision", off, "need 24 bytes, have "+strconv.Itoa(len(b)-off))
	}
	h.Revision = ConfigRevision{Pools: binary.LittleEndian.Uint64(b[off:]), Objectives: binary.LittleEndian.Uint64(b[off+8:]),
		Rewrites: binary.LittleEndian.Uint64(b[off+16:])}
	off += 24
	f := uint64(14695981039346656037)
	for _, c := range b[off:] {
		f ^= uint64(c)
		f *= 1099511628211
	}
	h.TableHash = f
	return h, nil
}

// targets reads a counted target list (at least one).
func (d *decoder) targets(lim *ConfigLimits, field string) []WeightedTarget {
	at := d.off
	n := d.count(field, lim.MaxTargets, minTargetBytes)
	if d.err != nil {
		return nil
	}
	if n == 0 {
		d.fail(ErrInvalidField, field, at, "no targets")
		return nil
	}
	ts := make([]WeightedTarget, n)
	for i := range ts {
		ts[i].Model = d.str(field + ".model")
		w := d.uvarint(field + ".weight")
		if d.err == nil && w > MaxWeight {
			d.fail(ErrInvalidField, field+".weight", d.off, "weight "+strconv.FormatUint(w, 10)+" over "+strconv.Itoa(MaxWeight))
		}
		ts[i].Weight = uint32(w)
	}
	return ts
}

func (d *decoder) u32(field string) uint32 {
	if !d.need(4, field) {
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b[d.off:])
	d.off += 4
	return v
}

// ConfigDecision is what the receiver does with an incoming record.
type ConfigDecision int

const (
	// ConfigStore: the record is newer than the stored one (or there is
	// none): write it.
	ConfigStore ConfigDecision = iota
	// ConfigUnchanged: same table as stored: write nothing.
	ConfigUnchanged
)

// DecideConfig compares an incoming record with the stored one (nil or
// empty: none) and says whether to store it. It fails with an error
// wrapping ErrConfigNotNewer when the incoming record's revisions do not
// cover the stored record's (an agent that has not yet seen the latest
// change), and with ErrStoredCorrupt when stored cannot be read.
//
// Storing only records that cover the stored revisions is what makes agents
// that briefly disagree converge without flapping: the stored revisions only
// ever move forward, and an agent that lags gets 409 until it has caught up,
// when its table is the same and costs nothing.
func DecideConfig(stored []byte, in *DecodedConfig, lim ConfigLimits) (ConfigDecision, error) {
	if len(stored) == 0 {
		return ConfigStore, nil
	}
	old, err := DecodeConfig(stored, lim)
	if err != nil {
		return ConfigStore, &Error{Kind: ErrStoredCorrupt, Where: "stored config", Offset: -1, Detail: err.Error()}
	}
	if old.TableHash == in.TableHash && old.PoolNamespace == in.PoolNamespace && old.PoolName == in.PoolName {
		return ConfigUnchanged, nil
	}
	if !in.Revision.Covers(old.Revision) || in.Revision == old.Revision {
		return ConfigUnchanged, errf(ErrConfigNotNewer, "config.revision", -1,
			"revisions "+in.Revision.String()+" do not pass the stored "+old.Revision.String()+" (from agent "+strconv.Quote(old.AgentID)+")")
	}
	return ConfigStore, nil
}
