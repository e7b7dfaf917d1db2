#!/bin/sh
# Starts the gpuscope MCP server for the Claude Code plugin (.mcp.json runs `sh ${CLAUDE_PLUGIN_ROOT}/.claude-plugin/serve.sh`).
# Uses the plugin's own environment (`make install` in the plugin directory creates .venv/), else a `gpuscope`
# on PATH (the package installed with pip or pipx), else says on stderr what to do.
root=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd) || exit 1
if [ -x "$root/.venv/bin/gpuscope" ]; then
    exec "$root/.venv/bin/gpuscope" serve "$@"
fi
if command -v gpuscope >/dev/null 2>&1; then
    exec gpuscope serve "$@"
fi
echo "gpuscope plugin: no gpuscope installation found. Run 'make install' in $root (it creates $root/.venv), or install the package so that 'gpuscope' is on PATH (e.g. 'pipx install $root'), then restart Claude Code." >&2
exit 127
