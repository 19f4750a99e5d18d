#!/usr/bin/env bash
# Import boundaries (ARCHITECTURE.md): scheduler/ and metricsagent/ never
# depend on the Wasm binding or plugin/; scheduler/ also stays off net/http.
# The test host (e2e/envoyhost) and the bootstrap reader it shares with
# envoy/ (envoy/bootstrap) stand in for Envoy: they know nothing of the
# plugin they run.
set -euo pipefail
cd "$(dirname "$0")/.."
module=$(go list -m)
fail=0
check() { # check <package pattern> <forbidden regexp>
  local pkgs
  pkgs=$(go list "$1" 2>/dev/null) || return 0
  for p in $pkgs; do
    bad=$(go list -deps "$p" | grep -E "$2" || true)
    if [ -n "$bad" ]; then echo "import boundary: $p depends on: $bad"; fail=1; fi
  done
}
check "./scheduler/..." "^($module/plugin|net/http$|github.com/tetratelabs/proxy-wasm-go-sdk)"
check "./metricsagent/..." "^($module/plugin|github.com/tetratelabs/proxy-wasm-go-sdk)"
check "./e2e/envoyhost/..." "^$module/(plugin|scheduler|metricsagent)"
check "./envoy/bootstrap/..." "^$module/(plugin|scheduler|metricsagent)"
exit $fail
