"""Reports written to a file the user names (CLI only; the MCP tools stay read-only).

    write_report(trace, path, include_unlinked=True) -> {sheet: rows}   xlsx.py (TraceLens-style workbook)
"""

from .xlsx import ReportWritten, write_report, write_report_for_cli

__all__ = ["ReportWritten", "write_report", "write_report_for_cli"]
