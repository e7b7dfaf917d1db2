"""Readable text for any analysis result: scalars as `key: value`, lists of records as tables.

One generic renderer serves the MCP text content (for clients that read text, not
structuredContent) and the CLI, so every tool prints the same facts in both places.

Profile text is data written by the profiled program: a kernel name or NVTX range can hold ESC
sequences, carriage returns or bidi overrides that rewrite a terminal or hide text from a reader.
Every text meant for a person or an agent goes through `visible`, which shows those characters as
escapes (`\\x1b`, `\\u202e`); structured results keep the raw strings.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel

from gpuscope.tools.model.limits import memory_limit_now

MAX_CELL = 80        # table cells: kernel names and signatures can run to thousands of characters
MAX_SENTENCE = 1000  # notes, reasons, hints: explanations are cut only when pathological
PROSE = ("note", "notes", "reason", "why", "hint", "caveat", "message", "warning", "title", "next_step",
         "path", "trace", "file")  # paths too: an agent passes them on verbatim


def out_of_memory_advice() -> str:
    """What to do after running out of memory, with the limit in force (GPUSCOPE_MEMORY_LIMIT, or its default)."""
    return ("Narrow the request: pass a time window, one device or a smaller limit; or give gpuscope more memory: raise "
            f"{memory_limit_now()} in the server's environment (see the README).")


def out_of_memory(exc: BaseException) -> str:
    """'MemoryError' or 'OutOfMemoryException: could not allocate ...', short and escaped. Only DuckDB's first line:
    the rest is its own advice (SET threads, SET memory_limit), which a gpuscope user cannot act on."""
    detail = visible(str(exc).split("\n", 1)[0][:300])
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


# Characters that move the cursor, change the text direction or cannot be seen: every code point of
# Unicode categories Cc, Cf, Zl, Zp and Cs (C0 incl. ESC/CR/BS/NUL, DEL, C1, bidi embeddings,
# overrides and isolates, zero-width characters, BOM, interlinear annotations, tag characters, lone
# surrogates — which no terminal encoding accepts), plus invisible fillers and variation selectors
# that can carry hidden text (Hangul fillers, CGJ, U+FE00-FE0F, U+E0100-E01EF).
_OTHER_HIDDEN = (r"\x7f-\x9f\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u17b4\u17b5"
                 r"\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ud800-\udfff\ufe00-\ufe0f\ufeff\uffa0"
                 r"\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
                 r"\U000e0000-\U000e0fff")
_HIDDEN = re.compile(rf"[\x00-\x1f{_OTHER_HIDDEN}]")
_HIDDEN_BUT_NEWLINE = re.compile(rf"[\x00-\x09\x0b-\x1f{_OTHER_HIDDEN}]")
_HIDDEN_IN_JSON = re.compile(f"[{_OTHER_HIDDEN}]")  # json.dumps already escapes C0
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str, keep_newlines: bool = False) -> str:
    """`text` with every hidden or terminal-controlling character shown as a Python-style escape.

    Newlines and tabs are escaped too (`\\n`, `\\t`): cells, keys, values and error messages are one
    line each, so a name cannot start a fake line or heading. `keep_newlines` keeps real line breaks
    for text gpuscope lays out itself (the remote_context block, tracebacks in the log).
    Backslashes are left alone: the text is for reading, not for parsing back.
    """
    return (_HIDDEN_BUT_NEWLINE if keep_newlines else _HIDDEN).sub(_escape, text)


def _json_escape(match: re.Match) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xd800 + (code >> 10):04x}\\u{0xdc00 + (code & 0x3ff):04x}"


def visible_json(data: Any) -> str:
    """Indented JSON whose values parse back to the raw strings, with no hidden character in the text.

    json.dumps escapes C0 controls but writes DEL, C1 and bidi characters raw; those can only occur
    inside string literals there, so they become JSON escapes. Other non-ASCII text stays readable.
    """
    return _HIDDEN_IN_JSON.sub(_json_escape, json.dumps(data, indent=2, ensure_ascii=False))


def render(result: BaseModel | dict, title: str | None = None) -> str:
    data = result.model_dump(mode="json") if isinstance(result, BaseModel) else result
    # The layout version is for programs (structured output, --format json); a reader needs none of it.
    data = {k: v for k, v in data.items() if k != "schema_version"}
    lines: list[str] = [f"## {visible(title)}"] if title else []
    _render_dict(data, lines, prefix="")
    return "\n".join(lines).rstrip() + "\n"


def _render_dict(data: dict, lines: list[str], prefix: str) -> None:
    tables: list[tuple[str, list]] = []
    for key, value in data.items():
        name = visible(f"{prefix}{key}")
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
    out = ["| " + " | ".join(visible(c).replace("|", "\\|") for c in cols) + " |", "|" + "---|" * len(cols)]
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
    if len(text) > limit:  # cut the raw text, so that no escape is cut in half
        text = text[: limit - 1] + "…"
    return visible(text).replace("|", "\\|")
