"""Readable text for any analysis result: scalars as `key: value`, lists of records as tables.

One generic renderer serves the MCP text content (for clients that read text, not
structuredContent) and the CLI, so every tool prints the same facts in both places.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

MAX_CELL = 80        # table cells: kernel names and signatures can run to thousands of characters
MAX_SENTENCE = 1000  # notes, reasons, hints: explanations are cut only when pathological
PROSE = ("note", "notes", "reason", "why", "hint", "caveat", "message", "warning", "title", "next_step",
         "path", "trace", "file")  # paths too: an agent passes them on verbatim


def render(result: BaseModel | dict, title: str | None = None) -> str:
    data = result.model_dump(mode="json") if isinstance(result, BaseModel) else result
    lines: list[str] = [f"## {title}"] if title else []
    _render_dict(data, lines, prefix="")
    return "\n".join(lines).rstrip() + "\n"


def _render_dict(data: dict, lines: list[str], prefix: str) -> None:
    tables: list[tuple[str, list]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables.append((name, value))
        elif isinstance(value, dict) and value and any(isinstance(v, (dict, list)) for v in value.values()):
            _render_dict(value, lines, prefix=f"{name}.")
        elif value is None or value == [] or value == {}:
            continue
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            # Notes, warnings, rules: sentences a reader needs whole, one per line.
            lines.append(f"{name}:")
            lines.extend(f"- {_cell(v, limit=MAX_SENTENCE)}" for v in value)
        else:
            lines.append(f"{name}: {_cell(value, limit=MAX_SENTENCE, key=key)}")
    for name, rows in tables:
        lines.append("")
        if any(isinstance(v, list) and v and isinstance(v[0], dict) for r in rows for v in r.values()):
            # Rows that hold their own tables (e.g. a device with its gap buckets) get a section each.
            for i, row in enumerate(rows):
                lines.append(f"### {name}[{i}]")
                _render_dict(row, lines, prefix="")
                lines.append("")
            continue
        lines.append(f"### {name} ({len(rows)})")
        lines.extend(_table(rows))


def _flatten(row: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            flat.update(_flatten(v, f"{prefix}{k}."))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            flat[f"{prefix}{k}"] = "; ".join(", ".join(f"{_cell(x)}" for x in item.values()) for item in v)
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def _table(rows: list[dict]) -> list[str]:
    flat = [_flatten(r) for r in rows]
    cols: list[str] = []
    for r in flat:
        cols.extend(c for c in r if c not in cols)
    cols = [c for c in cols if any(r.get(c) not in (None, "", []) for r in flat)]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in flat:
        out.append("| " + " | ".join(_cell(r.get(c), key=c, limit=MAX_SENTENCE if _prose(c) else MAX_CELL)
                                     for c in cols) + " |")
    return out


def _prose(column: str) -> bool:
    last = column.split(".")[-1]
    return last in PROSE or last.startswith(("why_", "reason_", "note_")) or last.endswith(("_note", "_reason", "_hint", "_path"))


def _cell(value: Any, limit: int = MAX_CELL, key: str = "", grouped: bool = True) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        text = f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1e15 else str(value)
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, int):
        # Quantities get thousands separators; identifiers (pid, device_id, ...) stay as written.
        plain = not grouped or key.split(".")[-1] in ("pid", "tid", "rank") or key.endswith("_id")
        text = str(value) if plain else f"{value:,}"
    elif isinstance(value, list):
        # Lists hold shapes, grids and ids: digits stay ungrouped so [30522, 512] reads as a shape.
        text = "[" + ", ".join(_cell(v, grouped=False) for v in value) + "]"
    elif isinstance(value, dict):
        text = ", ".join(f"{k}={_cell(v)}" for k, v in value.items())
    else:
        text = str(value)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"
