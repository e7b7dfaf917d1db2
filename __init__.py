"""gpuscope: read-only GPU profile analysis for coding agents (MCP server + CLI)."""

__version__ = "0.1.0"
