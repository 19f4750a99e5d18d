package scheduler

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The README documents every built-in plugin: what it does, what it reads
// and its parameters with their defaults. These tests hold that section to
// the registry, so a plugin added without docs, a parameter renamed or a
// default changed fails here.

// pluginDoc is one "#### `type` (kind)" section of the README.
type pluginDoc struct {
	kind   string
	does   string
	reads  string
	params []paramDoc // nil with "Parameters: none."
	none   bool
}

type paramDoc struct{ name, def string }

var (
	pluginHeading = regexp.MustCompile("^#### `([a-z0-9-]+)` \\((filter|scorer|picker)\\)$")
	paramRow      = regexp.MustCompile("^\\| `([A-Za-z]+)` \\| (`[^`]+`|—) \\| .+ \\|$")
	profileRow    = regexp.MustCompile("^\\| `([a-z-]+)`( \\(default\\))? \\|")
)

// readmeSection returns the lines of the README section under heading, up
// to the next heading of the same or a higher level.
func readmeSection(t *testing.T, heading string) []string {
	t.Helper()
	raw, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	var out []string
	in := false
	for _, line := range strings.Split(string(raw), "\n") {
		switch {
		case strings.HasPrefix(line, heading):
			in = true
			continue
		case in && (strings.HasPrefix(line, "## ") || strings.HasPrefix(line, "### ")):
			return out
		}
		if in {
			out = append(out, line)
		}
	}
	require.True(t, in, "README has no section %q", heading)
	return out
}

const pluginSection = "### Scheduler profiles and plugins"

func pluginDocs(t *testing.T) map[string]*pluginDoc {
	t.Helper()
	docs := map[string]*pluginDoc{}
	var cur *pluginDoc
	for _, line := range readmeSection(t, pluginSection) {
		if m := pluginHeading.FindStringSubmatch(line); m != nil {
			require.NotContains(t, docs, m[1], "documented twice")
			cur = &pluginDoc{kind: m[2]}
			docs[m[1]] = cur
			continue
		}
		if cur == nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, "Reads: "):
			cur.reads = strings.TrimPrefix(line, "Reads: ")
		case line == "Parameters: none.":
			cur.none = true
		case strings.HasPrefix(line, "| `"):
			m := paramRow.FindStringSubmatch(line)
			require.NotNil(t, m, "malformed parameter row %q", line)
			cur.params = append(cur.params, paramDoc{name: m[1], def: strings.Trim(m[2], "`")})
		case cur.reads == "" && line != "":
			cur.does += line + " "
		}
	}
	return docs
}

func TestEveryPluginIsDocumented(t *testing.T) {
	docs := pluginDocs(t)
	reg := NewRegistry()
	for _, pt := range reg.Types() {
		t.Run(pt.Type, func(t *testing.T) {
			d, ok := docs[pt.Type]
			require.True(t, ok, "README section %q has no \"#### `%s` (%s)\"", pluginSection, pt.Type, pt.Kind)
			assert.Equal(t, pt.Kind.String(), d.kind, "kind")
			assert.NotEmpty(t, strings.TrimSpace(d.does), "what it does")
			assert.NotEmpty(t, d.reads, "a \"Reads: \" line")
			assert.True(t, d.none != (len(d.params) > 0), "either \"Parameters: none.\" or a parameter table")

			defaults, err := pt.New(pt.Type, nil, testHandle{reg})
			require.NoError(t, err)
			if d.none {
				_, err := pt.New(pt.Type, json.RawMessage(`{"undocumented": 1}`), testHandle{reg})
				assert.Error(t, err, "documented without parameters, so none is accepted")
			}
			for _, p := range d.params {
				if p.def == "—" {
					continue // no default value: documented as a choice
				}
				raw := json.RawMessage(`{"` + p.name + `": ` + p.def + `}`)
				got, err := pt.New(pt.Type, raw, testHandle{reg})
				require.NoError(t, err, "documented parameter %s", raw)
				assert.True(t, reflect.DeepEqual(defaults, got), "%s is not the default: the plugin differs from one built without parameters", raw)
			}
		})
	}
	for name := range docs {
		_, ok := reg.Lookup(name)
		assert.True(t, ok, "README documents %q, which is not a registered plugin type", name)
	}
}

func TestEveryBuiltinProfileIsDocumented(t *testing.T) {
	documented := map[string]bool{}
	var dflt string
	for _, line := range readmeSection(t, pluginSection) {
		if strings.HasPrefix(line, "#### ") {
			break // the plugins follow the profile table
		}
		if m := profileRow.FindStringSubmatch(line); m != nil {
			documented[m[1]] = true
			if m[2] != "" {
				dflt = m[1]
			}
		}
	}
	for name := range BuiltinProfiles() {
		assert.True(t, documented[name], "built-in profile %q is not in the README's profile table", name)
	}
	for name := range documented {
		_, ok := BuiltinProfiles()[name]
		assert.True(t, ok, "the README's profile table lists %q, which is not built in", name)
	}
	assert.Equal(t, ProfileDecisionTree, dflt, "the profile marked (default)")
	assert.Equal(t, ProfileDecisionTree, (&Config{}).profileFor(Standard))
}

// testHandle resolves references as a configuration without declared
// plugins does: registered types with default parameters.
type testHandle struct{ reg *Registry }

func (h testHandle) Plugin(ref string) (Plugin, error) {
	t, ok := h.reg.Lookup(ref)
	if !ok {
		return nil, fieldErr("", "unknown plugin "+ref)
	}
	return t.New(ref, nil, h)
}
