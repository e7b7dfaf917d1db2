#!/usr/bin/env bash
# End-to-end check against real MCP clients, offline. Skips when node is absent.
#  1. MCP Inspector CLI: tools/list, then tools/call trace_info and diagnose on a fixture.
#  2. Claude Code CLI (the installed `claude`, else npx @anthropic-ai/claude-code):
#     `claude mcp add` + `claude mcp list` in a temporary HOME must say Connected;
#  3. then headless sessions after `gpuscope install claude` into a temporary project (the model picks
#     the skill; the user types /trace-analysis and only the skill's allowed-tools approves our tools)
#     and with the repository installed as a plugin (/gpuscope:trace-analysis): `claude -p` against
#     e2e/scripted_model.py, a local stand-in for the model API that plays the skill's opening
#     moves. The check asserts on what Claude Code sent:
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

  # Headless "analyze this trace": session HOME PROJECT SKILL_MD PROMPT_PREFIX [ALLOWED_TOOLS], profile in PROJECT.
  # Without ALLOWED_TOOLS our tools run only if the skill's own allowed-tools pre-approves them.
  session() {
    local home=$1 proj=$2 skill_md=$3 prefix=$4 allowed=${5:-} port model_pid log
    log="$WORK/model-$((++SESSIONS)).jsonl"
    port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$PY" "$REPO/e2e/scripted_model.py" serve "$port" "$log" "$proj/sync_bound.sqlite" & model_pid=$!
    sleep 1
    (cd "$proj" && run env HOME="$home" ANTHROPIC_BASE_URL="http://127.0.0.1:$port" ANTHROPIC_API_KEY=sk-e2e-offline \
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 timeout 300 "${CLAUDE[@]}" -p "${prefix}analyze this trace: $proj/sync_bound.sqlite" \
        ${allowed:+--allowedTools "$allowed"}) || fail=1
    kill "$model_pid" 2>/dev/null
    run "$PY" "$REPO/e2e/scripted_model.py" check "$log" sync "$skill_md" || fail=1
  }
  SESSIONS=0
  write_trace() { run "$PY" -c "from gpuscope.fixtures.scenarios_diagnose import SCENARIOS; from gpuscope.fixtures.writers import nsys; nsys.write(SCENARIOS['sync_bound'](), '$1/sync_bound.sqlite')"; }

  # a) set up the way the README says: gpuscope install claude in a fresh project.
  PHOME="$WORK/phome"; PROJ="$WORK/project"; mkdir -p "$PHOME" "$PROJ"; write_trace "$PROJ"
  (cd "$PROJ" && run env HOME="$PHOME" PATH="$(dirname "$(command -v "${CLAUDE[0]}")"):$PATH" "$GPUSCOPE" install claude --scope project) || fail=1
  # What approving the project's .mcp.json server in the interactive prompt writes.
  printf '{"enabledMcpjsonServers": ["gpuscope"]}\n' > "$PROJ/.claude/settings.local.json"
  # The model picks the skill from its description (tools allowed on the command line), then the user types
  # /trace-analysis with nothing allowed: the skill's allowed-tools must pre-approve our tools.
  session "$PHOME" "$PROJ" "$PROJ/.claude/skills/trace-analysis/SKILL.md" "" "Skill mcp__gpuscope__trace_info mcp__gpuscope__diagnose"
  session "$PHOME" "$PROJ" "$PROJ/.claude/skills/trace-analysis/SKILL.md" "/trace-analysis "

  # b) the repository as a Claude Code plugin: local marketplace, plugin install, a project with no gpuscope files.
  GHOME="$WORK/ghome"; GPROJ="$WORK/plugin-project"; mkdir -p "$GHOME" "$GPROJ"; write_trace "$GPROJ"
  (cd "$GPROJ" && run env HOME="$GHOME" "${CLAUDE[@]}" plugin marketplace add "$REPO" \
     && run env HOME="$GHOME" "${CLAUDE[@]}" plugin install gpuscope@gpuscope) || fail=1
  session "$GHOME" "$GPROJ" "$REPO/skills/trace-analysis/SKILL.md" "/gpuscope:trace-analysis "
else
  echo "e2e: FAILED: Claude Code CLI unavailable (npm install -g @anthropic-ai/claude-code)"; fail=1
fi

if [ "$fail" = 0 ]; then echo "e2e: OK"; else echo "e2e: FAILED"; fi
exit "$fail"
