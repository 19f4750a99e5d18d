package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/wasm-epp/wasm-epp/e2e/internal/wasmbuild"
)

func TestChecksModules(t *testing.T) {
	good := wasmbuild.Build(t, "./plugin/internal/testplugin")
	bad := wasmbuild.Build(t, "./e2e/envoyhost/testdata/guests/missingimport")
	var out, errOut bytes.Buffer
	assert.Equal(t, 0, run([]string{"-v", good}, &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), "ABI 0.2.1")
	assert.Contains(t, out.String(), "env.proxy_log")

	out.Reset()
	errOut.Reset()
	assert.Equal(t, 1, run([]string{good, bad}, &out, &errOut))
	assert.Contains(t, errOut.String(), "missing import: wasi_snapshot_preview1.proc_raise")

	junk := filepath.Join(t.TempDir(), "junk.wasm")
	assert.NoError(t, os.WriteFile(junk, []byte("nope"), 0o644))
	assert.Equal(t, 1, run([]string{junk}, &out, &errOut))
	assert.Equal(t, 2, run(nil, &out, &errOut))
}
