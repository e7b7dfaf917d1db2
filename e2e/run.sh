#!/usr/bin/env bash
# End-to-end check against real MCP clients, offline. Skips when node is absent.
#  1. MCP Inspector CLI: tools/list, then tools/call trace_info and diagnose on a fixture.
#  2. Claude Code CLI (the installed `claude`, else npx @anthropic-ai/claude-code):
#     `claude mcp add` + `claude mcp list` in a temporary HOME must say Connected;
#  3. then a headless session: `gpuscope install claude` into a temporary project, and
#     `claude -p "analyze this trace ..."` against e2e/scripted_model.py, a local stand-in for the
#     model API that plays the skill's opening moves. The check asserts on what Claude Code sent:
#     our skill listed and its SKILL.md loaded, our tools offered, trace_info and diagnose results
#     returned without error, diagnose ranking the fixture's known bottleneck first.
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
if run "${INSPECTOR[@]}" --method tools/call --tool-name diagnose --tool-arg "trace=$PROFILE"; then
  grep -q '"isError": true' "$WORK/last" && { echo "e2e: FAILED: diagnose returned an error"; fail=1; }
  grep -q 'findings' "$WORK/last" || { echo "e2e: FAILED: diagnose output lacks findings"; fail=1; }
fi

if command -v claude >/dev/null 2>&1; then CLAUDE=(claude); else CLAUDE=(npx -y @anthropic-ai/claude-code); fi
CHOME="$WORK/home"; mkdir -p "$CHOME"; cd "$WORK"  # outside the repo: its plugin .mcp.json is not read
if run env HOME="$CHOME" "${CLAUDE[@]}" --version; then
  run env HOME="$CHOME" "${CLAUDE[@]}" mcp add gpuscope -- "$GPUSCOPE" serve
  if run env HOME="$CHOME" "${CLAUDE[@]}" mcp list; then
    grep -q 'gpuscope.*Connected' "$WORK/last" || { echo "e2e: FAILED: claude mcp list does not report gpuscope Connected"; fail=1; }
  fi

  # Headless "analyze this trace" in a fresh project set up the way the README says.
  PHOME="$WORK/phome"; PROJ="$WORK/project"; mkdir -p "$PHOME" "$PROJ"
  TRACE="$PROJ/sync_bound.sqlite"
  run "$PY" -c "from gpuscope.fixtures.scenarios_diagnose import SCENARIOS; from gpuscope.fixtures.writers import nsys; nsys.write(SCENARIOS['sync_bound'](), '$TRACE')"
  (cd "$PROJ" && run env HOME="$PHOME" PATH="$(dirname "$(command -v "${CLAUDE[0]}")"):$PATH" "$GPUSCOPE" install claude --scope project) || fail=1
  # What approving the project's .mcp.json server in the interactive prompt writes.
  printf '{"enabledMcpjsonServers": ["gpuscope"]}\n' > "$PROJ/.claude/settings.local.json"
  PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$PY" "$REPO/e2e/scripted_model.py" serve "$PORT" "$WORK/model.jsonl" "$TRACE" & MODEL_PID=$!
  sleep 1
  (cd "$PROJ" && run env HOME="$PHOME" ANTHROPIC_BASE_URL="http://127.0.0.1:$PORT" ANTHROPIC_API_KEY=sk-e2e-offline \
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 timeout 300 "${CLAUDE[@]}" -p "analyze this trace: $TRACE" \
      --allowedTools "Skill mcp__gpuscope__trace_info mcp__gpuscope__diagnose") || fail=1
  kill "$MODEL_PID" 2>/dev/null
  run "$PY" "$REPO/e2e/scripted_model.py" check "$WORK/model.jsonl" sync "$PROJ/.claude/skills/trace-analysis/SKILL.md" || fail=1
else
  echo "e2e: FAILED: Claude Code CLI unavailable (npm install -g @anthropic-ai/claude-code)"; fail=1
fi

if [ "$fail" = 0 ]; then echo "e2e: OK"; else echo "e2e: FAILED"; fi
exit "$fail"
