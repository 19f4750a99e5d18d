package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sampleConfig is the record of testdata/config-v1.hex.
func sampleConfig() *ConfigRecord {
	return &ConfigRecord{
		AgentID: "node-a", PoolNamespace: "llm", PoolName: "pool",
		Revision: ConfigRevision{Pools: 10, Objectives: 20, Rewrites: 300},
		Table: ModelTable{
			Rewrites: []ModelRewrite{
				{Model: "chat", Targets: []WeightedTarget{{Model: "llama-a", Weight: 90}, {Model: "llama-b", Weight: 10}}},
				{Model: "sql", Targets: []WeightedTarget{{Model: "sql-lora-v2", Weight: 1}}},
			},
			Default:    []WeightedTarget{{Model: "base", Weight: 0}, {Model: "base-2", Weight: 1_000_000}},
			Objectives: []Objective{{Name: "batch", Priority: -5}, {Name: "interactive", Priority: 10}},
		},
	}
}

func encodeConfig(t testing.TB, c *ConfigRecord) []byte {
	t.Helper()
	b, err := EncodeConfig(c, ConfigLimits{})
	require.NoError(t, err)
	return b
}

// TestConfigGolden pins the version 1 layout: a change to these bytes is
// a new wire version, not an edit.
func TestConfigGolden(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "config-v1.hex"))
	require.NoError(t, err)
	want, err := hex.DecodeString(strings.Join(strings.Fields(string(raw)), ""))
	require.NoError(t, err)
	got := encodeConfig(t, sampleConfig())
	require.Equal(t, hex.Dump(want), hex.Dump(got))

	dec, err := DecodeConfig(want, ConfigLimits{})
	require.NoError(t, err)
	assert.Equal(t, *sampleConfig(), dec.ConfigRecord)
	assert.Equal(t, uint64(0x61dec18b4dc86afb), dec.TableHash, "FNV-1a of the table bytes (%#x)", dec.TableHash)
}

func TestConfigRoundTrip(t *testing.T) {
	long := strings.Repeat("m", 256)
	for _, c := range []*ConfigRecord{
		{AgentID: "a", PoolNamespace: "n", PoolName: "p"}, // empty table
		sampleConfig(),
		{AgentID: strings.Repeat("x", 253), PoolNamespace: "n", PoolName: "p", Table: ModelTable{
			Rewrites:   []ModelRewrite{{Model: long, Targets: []WeightedTarget{{Model: long, Weight: MaxWeight}}}},
			Objectives: []Objective{{Name: "o", Priority: -1 << 31}, {Name: "p", Priority: 1<<31 - 1}}}},
		{AgentID: "ü", PoolNamespace: "n", PoolName: "p", Table: ModelTable{Default: []WeightedTarget{{Model: "模型", Weight: 3}}}},
	} {
		b := encodeConfig(t, c)
		got, err := DecodeConfig(b, ConfigLimits{})
		require.NoError(t, err)
		assert.Equal(t, *c, got.ConfigRecord)
		assert.Equal(t, b, encodeConfig(t, &got.ConfigRecord), "one encoding per record")
	}
}

func TestConfigSizes(t *testing.T) {
	for _, c := range []*ConfigRecord{sampleConfig(), {AgentID: "a", PoolNamespace: "n", PoolName: "p"}, func() *ConfigRecord {
		c := &ConfigRecord{AgentID: "a", PoolNamespace: "n", PoolName: "p"}
		for i := range 300 { // counts past one byte
			c.Table.Rewrites = append(c.Table.Rewrites, ModelRewrite{Model: fmt.Sprintf("m%03d", i), Targets: []WeightedTarget{{Model: "t", Weight: 200}}})
			c.Table.Objectives = append(c.Table.Objectives, Objective{Name: fmt.Sprintf("o%03d", i), Priority: int32(i)})
		}
		return c
	}()} {
		want := ConfigBaseSize(c.AgentID, c.PoolNamespace, c.PoolName) + CountSize(len(c.Table.Rewrites)) - CountSize(0) +
			CountSize(len(c.Table.Objectives)) - CountSize(0)
		for i := range c.Table.Rewrites {
			want += RewriteSize(&c.Table.Rewrites[i])
		}
		if len(c.Table.Default) > 0 {
			want += DefaultSize(c.Table.Default)
		}
		for i := range c.Table.Objectives {
			want += ObjectiveSize(&c.Table.Objectives[i])
		}
		assert.Equal(t, want, len(encodeConfig(t, c)))
	}
}

func TestConfigTableHashIgnoresSenderAndRevision(t *testing.T) {
	a := sampleConfig()
	b := sampleConfig()
	b.AgentID, b.Revision = "node-b", ConfigRevision{Pools: 1, Objectives: 2, Rewrites: 3}
	da, err := DecodeConfig(encodeConfig(t, a), ConfigLimits{})
	require.NoError(t, err)
	db, err := DecodeConfig(encodeConfig(t, b), ConfigLimits{})
	require.NoError(t, err)
	assert.Equal(t, da.TableHash, db.TableHash)
	b.Table.Rewrites[0].Targets[0].Weight = 89
	db, err = DecodeConfig(encodeConfig(t, b), ConfigLimits{})
	require.NoError(t, err)
	assert.NotEqual(t, da.TableHash, db.TableHash)
}

func TestConfigNormalize(t *testing.T) {
	c := sampleConfig()
	slicesReverse := func(t *ModelTable) {
		t.Rewrites[0], t.Rewrites[1] = t.Rewrites[1], t.Rewrites[0]
		t.Rewrites[1].Targets[0], t.Rewrites[1].Targets[1] = t.Rewrites[1].Targets[1], t.Rewrites[1].Targets[0]
		t.Default[0], t.Default[1] = t.Default[1], t.Default[0]
		t.Objectives[0], t.Objectives[1] = t.Objectives[1], t.Objectives[0]
	}
	slicesReverse(&c.Table)
	_, err := EncodeConfig(c, ConfigLimits{})
	require.ErrorIs(t, err, ErrInvalidField)
	c.Table.Normalize()
	assert.Equal(t, sampleConfig(), c)
}

// TestConfigInvalid: every rule, both on encoding (Validate) and on decoding
// bytes written past the validation.
func TestConfigInvalid(t *testing.T) {
	targets := func(ts ...WeightedTarget) []WeightedTarget { return ts }
	tests := []struct {
		name   string
		mutate func(c *ConfigRecord)
		lim    ConfigLimits
		kind   error
		msg    string
	}{
		{"empty agent id", func(c *ConfigRecord) { c.AgentID = "" }, ConfigLimits{}, ErrInvalidField, "config.agent_id"},
		{"control character in pool name", func(c *ConfigRecord) { c.PoolName = "a\nb" }, ConfigLimits{}, ErrInvalidField, "control character"},
		{"pool namespace too long", func(c *ConfigRecord) { c.PoolNamespace = strings.Repeat("n", 254) }, ConfigLimits{}, ErrLimit, "config.pool_namespace"},
		{"too many rewrites", func(c *ConfigRecord) {}, ConfigLimits{MaxRewrites: 1}, ErrLimit, "config.rewrites: 2 entries, limit 1"},
		{"rewrites out of order", func(c *ConfigRecord) {
			c.Table.Rewrites[0], c.Table.Rewrites[1] = c.Table.Rewrites[1], c.Table.Rewrites[0]
		}, ConfigLimits{}, ErrInvalidField, "rewrites not sorted and unique"},
		{"same model twice", func(c *ConfigRecord) { c.Table.Rewrites[1].Model = "chat" }, ConfigLimits{}, ErrInvalidField, "rewrites not sorted and unique"},
		{"empty model", func(c *ConfigRecord) { c.Table.Rewrites[0].Model = "" }, ConfigLimits{}, ErrInvalidField, "rewrites[0].model"},
		{"model name too long", func(c *ConfigRecord) {}, ConfigLimits{MaxModelNameLen: 3}, ErrLimit, "config.rewrites[0].model"},
		{"no targets", func(c *ConfigRecord) { c.Table.Rewrites[0].Targets = nil }, ConfigLimits{}, ErrInvalidField, "no targets"},
		{"too many targets", func(c *ConfigRecord) {}, ConfigLimits{MaxTargets: 1}, ErrLimit, "config.rewrites[0].targets: 2 entries, limit 1"},
		{"weights add up to 0", func(c *ConfigRecord) {
			c.Table.Rewrites[0].Targets = targets(WeightedTarget{"a", 0}, WeightedTarget{"b", 0})
		}, ConfigLimits{}, ErrInvalidField, "weights add up to 0"},
		{"weight over the maximum", func(c *ConfigRecord) { c.Table.Rewrites[1].Targets[0].Weight = MaxWeight + 1 }, ConfigLimits{}, ErrInvalidField, "over 1000000"},
		{"same target twice", func(c *ConfigRecord) {
			c.Table.Rewrites[0].Targets = targets(WeightedTarget{"a", 1}, WeightedTarget{"a", 2})
		}, ConfigLimits{}, ErrInvalidField, "targets not sorted and unique"},
		{"default weights add up to 0", func(c *ConfigRecord) { c.Table.Default = targets(WeightedTarget{"a", 0}) }, ConfigLimits{}, ErrInvalidField, "config.default"},
		{"too many objectives", func(c *ConfigRecord) {}, ConfigLimits{MaxObjectives: 1}, ErrLimit, "config.objectives: 2 entries, limit 1"},
		{"objectives out of order", func(c *ConfigRecord) {
			c.Table.Objectives[0], c.Table.Objectives[1] = c.Table.Objectives[1], c.Table.Objectives[0]
		}, ConfigLimits{}, ErrInvalidField, "objectives not sorted and unique"},
		{"empty objective name", func(c *ConfigRecord) { c.Table.Objectives[0].Name = "" }, ConfigLimits{}, ErrInvalidField, "objectives[0].name"},
		{"record too large", func(c *ConfigRecord) {}, ConfigLimits{MaxBytes: 40}, ErrLimit, "limit 40"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := sampleConfig()
			tc.mutate(c)
			_, err := EncodeConfig(c, tc.lim)
			require.ErrorIs(t, err, tc.kind)
			assert.Contains(t, err.Error(), tc.msg)

			// The same record written without validation is refused on decoding.
			_, err = DecodeConfig(rawConfig(c), tc.lim)
			require.ErrorIs(t, err, tc.kind)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

// rawConfig encodes c without validating it.
func rawConfig(c *ConfigRecord) []byte { return appendConfigFields(nil, c) }

// TestDecodeConfigBytes: malformed bytes, each with its kind.
func TestDecodeConfigBytes(t *testing.T) {
	good := encodeConfig(t, sampleConfig())
	withByte := func(at int, v byte) []byte { b := bytes.Clone(good); b[at] = v; return b }
	hasDefaultAt := bytes.Index(good, []byte("base")) - 3 // has_default, n, len("base")
	require.Equal(t, byte(1), good[hasDefaultAt])
	tests := []struct {
		name string
		b    []byte
		kind error
		msg  string
	}{
		{"empty", nil, ErrTruncated, "magic"},
		{"a push", []byte("WP\x01"), ErrFormat, `got "WP"`},
		{"version 2", withByte(2, 2), ErrVersion, "version 2"},
		{"truncated", good[:len(good)-1], ErrTruncated, "priority"},
		{"trailing byte", append(bytes.Clone(good), 0), ErrTrailing, "1 bytes after"},
		{"has_default 2", withByte(hasDefaultAt, 2), ErrInvalidField, "want 0 or 1"},
		{"a count beyond the bytes", append(bytes.Clone(good[:3+7+4+5+24]), 0x7f), ErrTruncated, "cannot fit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeConfig(tc.b, ConfigLimits{})
			require.ErrorIs(t, err, tc.kind)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestDecideConfig(t *testing.T) {
	decode := func(c *ConfigRecord) *DecodedConfig {
		d, err := DecodeConfig(encodeConfig(t, c), ConfigLimits{})
		require.NoError(t, err)
		return d
	}
	stored := sampleConfig()
	storedBytes := encodeConfig(t, stored)
	at := func(p, o, r uint64, change bool) *DecodedConfig {
		c := sampleConfig()
		c.AgentID = "node-b"
		c.Revision = ConfigRevision{Pools: p, Objectives: o, Rewrites: r}
		if change {
			c.Table.Rewrites[0].Targets[0].Weight = 0
		}
		return decode(c)
	}
	tests := []struct {
		name string
		in   *DecodedConfig
		want ConfigDecision
		err  error
	}{
		{"same table, newer revisions", at(11, 21, 301, false), ConfigUnchanged, nil},
		{"same table, older revisions", at(1, 1, 1, false), ConfigUnchanged, nil},
		{"changed, newer in one resource", at(10, 20, 301, true), ConfigStore, nil},
		{"changed, newer in all", at(11, 21, 301, true), ConfigStore, nil},
		{"changed, same revisions", at(10, 20, 300, true), ConfigUnchanged, ErrConfigNotNewer},
		{"changed, older", at(10, 20, 299, true), ConfigUnchanged, ErrConfigNotNewer},
		{"changed, ahead in one and behind in another", at(10, 21, 299, true), ConfigUnchanged, ErrConfigNotNewer},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecideConfig(storedBytes, tc.in, ConfigLimits{})
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				assert.Contains(t, err.Error(), `from agent "node-a"`)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}

	got, err := DecideConfig(nil, at(1, 1, 1, true), ConfigLimits{})
	require.NoError(t, err)
	assert.Equal(t, ConfigStore, got, "nothing stored yet")

	other := sampleConfig()
	other.PoolName = "other-pool"
	other.Revision = ConfigRevision{Pools: 11, Objectives: 20, Rewrites: 300}
	got, err = DecideConfig(storedBytes, decode(other), ConfigLimits{})
	require.NoError(t, err)
	assert.Equal(t, ConfigStore, got, "another pool, same table, newer: stored (the pool is part of what is applied)")

	_, err = DecideConfig([]byte("garbage"), at(1, 1, 1, false), ConfigLimits{})
	require.True(t, errors.Is(err, ErrStoredCorrupt), "%v", err)
}

// FuzzDecodeConfig: never panics; an accepted record re-encodes to the same
// bytes; a rejected one names a known kind; DecideConfig against the sample
// never panics either. PeekConfig never panics, fails only with a known
// kind, and agrees with DecodeConfig on every record DecodeConfig accepts.
func FuzzDecodeConfig(f *testing.F) {
	f.Add(encodeConfig(f, sampleConfig()))
	f.Add(encodeConfig(f, &ConfigRecord{AgentID: "a", PoolNamespace: "n", PoolName: "p"}))
	f.Add(rawConfig(&ConfigRecord{AgentID: "a", PoolNamespace: "n", PoolName: "p", Table: ModelTable{
		Rewrites: []ModelRewrite{{Model: "m", Targets: []WeightedTarget{{Model: "t", Weight: 0}}}}}}))
	stored := encodeConfig(f, sampleConfig())
	f.Fuzz(func(t *testing.T, b []byte) {
		head, peekErr := PeekConfig(b, ConfigLimits{})
		if peekErr != nil {
			requireKnownKind(t, peekErr)
		}
		c, err := DecodeConfig(b, ConfigLimits{})
		if err != nil {
			requireKnownKind(t, err)
			return
		}
		require.NoError(t, peekErr, "DecodeConfig accepts what PeekConfig refuses")
		requireHeadOf(t, head, c)
		again, err := EncodeConfig(&c.ConfigRecord, ConfigLimits{})
		require.NoError(t, err)
		require.True(t, bytes.Equal(b, again), "re-encoding differs")
		d, err := DecideConfig(stored, c, ConfigLimits{})
		if err != nil {
			require.ErrorIs(t, err, ErrConfigNotNewer)
		} else if d == ConfigUnchanged {
			sc, _ := DecodeConfig(stored, ConfigLimits{})
			require.Equal(t, sc.Table, c.Table)
		}
	})
}

func requireHeadOf(t *testing.T, head ConfigHead, c *DecodedConfig) {
	t.Helper()
	require.Equal(t, c.TableHash, head.TableHash)
	require.Equal(t, c.Revision, head.Revision)
	want := binary.AppendUvarint(nil, uint64(len(c.PoolNamespace)))
	want = append(want, c.PoolNamespace...)
	want = binary.AppendUvarint(want, uint64(len(c.PoolName)))
	want = append(want, c.PoolName...)
	require.Equal(t, want, head.Pool)
}

// PeekConfig reads what DecodeConfig reads of the head, and the same
// table hash; it refuses what is not a record, cut short, or too large.
func TestPeekConfig(t *testing.T) {
	b := encodeConfig(t, sampleConfig())
	c, err := DecodeConfig(b, ConfigLimits{})
	require.NoError(t, err)
	head, err := PeekConfig(b, ConfigLimits{})
	require.NoError(t, err)
	requireHeadOf(t, head, c)
	require.Zero(t, testing.AllocsPerRun(10, func() { _, _ = PeekConfig(b, ConfigLimits{}) }))

	other := sampleConfig()
	other.AgentID, other.Revision.Rewrites = "another-agent", other.Revision.Rewrites+5
	h2, err := PeekConfig(encodeConfig(t, other), ConfigLimits{})
	require.NoError(t, err)
	require.Equal(t, head.TableHash, h2.TableHash, "same table from another agent: same hash")
	require.Equal(t, head.Pool, h2.Pool)

	for n := 0; n < 3+1+len(c.AgentID)+2+len(c.PoolNamespace)+len(c.PoolName)+24; n++ {
		_, err := PeekConfig(b[:n], ConfigLimits{})
		require.ErrorIs(t, err, ErrTruncated, "cut at %d", n)
	}
	_, err = PeekConfig(append([]byte("WP"), b[2:]...), ConfigLimits{})
	require.ErrorIs(t, err, ErrFormat)
	_, err = PeekConfig(append([]byte{'W', 'C', 9}, b[3:]...), ConfigLimits{})
	require.ErrorIs(t, err, ErrVersion)
	_, err = PeekConfig(b, ConfigLimits{MaxBytes: len(b) - 1})
	require.ErrorIs(t, err, ErrLimit)
}
