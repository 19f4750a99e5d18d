package envoyhost

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDocIndexNamesEveryFile keeps the package doc's index true: every
// non-test source file of the package is listed, and every file listed
// exists.
func TestDocIndexNamesEveryFile(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments)
	require.NoError(t, err)
	doc := f.Doc.Text()
	listed := map[string]bool{}
	// Index rows start with one or two file names, then the description.
	row := regexp.MustCompile(`(?m)^\t([a-z0-9_]+\.go)(?:, ([a-z0-9_]+\.go))?\s`)
	for _, m := range row.FindAllStringSubmatch(doc, -1) {
		for _, name := range m[1:] {
			if name != "" {
				listed[name] = true
			}
		}
	}
	require.NotEmpty(t, listed, "the index is missing from doc.go")
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || name == "doc.go" {
			continue
		}
		// Platform variants are covered by their base file.
		base := regexp.MustCompile(`_(linux|other)\.go$`).ReplaceAllString(name, ".go")
		require.True(t, listed[base], "%s is not in the package doc's index", name)
	}
	for name := range listed {
		_, err := os.Stat(name)
		require.NoError(t, err, "the index names %s", name)
	}
}
