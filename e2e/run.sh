#!/usr/bin/env bash
# End-to-end check against real MCP clients: the MCP Inspector CLI (tools/list, tools/call) and
# Claude Code (`claude mcp add` + `claude mcp list` must say Connected). Skips when node is absent.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
GPUSCOPE="$REPO/.venv/bin/gpuscope"
PY="$REPO/.venv/bin/python"

if ! command -v node >/dev/null 2>&1 || ! command -v npx >/dev/null 2>&1; then
  echo "e2e: SKIPPED (node/npx not installed)"; exit 0
fi
[ -x "$GPUSCOPE" ] || { echo "e2e: $GPUSCOPE missing; run make install"; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail=0
run() {  # run CMD..., print it and its output; remember failures
  echo "+ $*"
  if ! out=$("$@" 2>&1); then echo "$out"; echo "e2e: FAILED: $*"; fail=1; return 1; fi
  printf '%s' "$out" > "$WORK/last"
  # Long JSON (tools/list is ~12k lines) is summarised: its first lines and the line count.
  if [ "$(printf '%s\n' "$out" | wc -l)" -gt 40 ]; then
    printf '%s\n' "$out" | head -20; echo "... ($(printf '%s\n' "$out" | wc -l) lines in all)"
  else
    echo "$out"
  fi
}

PROFILE="$WORK/e2e.sqlite"
run "$PY" -c "from gpuscope.fixtures.catalog import SCENARIOS; from gpuscope.fixtures.writers import nsys; nsys.write(SCENARIOS['concurrent_streams'](), '$PROFILE')" || exit 1

INSPECTOR=(npx -y @modelcontextprotocol/inspector --cli "$GPUSCOPE" serve)
if run "${INSPECTOR[@]}" --method tools/list; then
  grep -q '"name": "trace_info"' "$WORK/last" || { echo "e2e: FAILED: tools/list lacks trace_info"; fail=1; }
  echo "tools listed: $(grep -c '"inputSchema"' "$WORK/last")"
fi
if run "${INSPECTOR[@]}" --method tools/call --tool-name trace_info --tool-arg "trace=$PROFILE"; then
  grep -q '"isError": true' "$WORK/last" && { echo "e2e: FAILED: trace_info returned an error"; fail=1; }
  grep -q 'kernels' "$WORK/last" || { echo "e2e: FAILED: trace_info output lacks kernel counts"; fail=1; }
fi

if command -v claude >/dev/null 2>&1; then
  CHOME="$WORK/home"; mkdir -p "$CHOME"; cd "$WORK"  # outside the repo: its plugin .mcp.json is not read
  run env HOME="$CHOME" claude mcp add gpuscope -- "$GPUSCOPE" serve
  if run env HOME="$CHOME" claude mcp list; then
    grep -q 'gpuscope.*Connected' "$WORK/last" || { echo "e2e: FAILED: claude mcp list does not report gpuscope Connected"; fail=1; }
  fi
else
  echo "e2e: claude CLI not installed: Claude Code check skipped (npm install -g @anthropic-ai/claude-code)"
fi

if [ "$fail" = 0 ]; then echo "e2e: OK"; else echo "e2e: FAILED"; fi
exit "$fail"
