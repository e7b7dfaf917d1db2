"""The text rendering that MCP clients without structuredContent (and the CLI) read."""

from __future__ import annotations

from gpuscope.server.render import MAX_CELL, render


def test_sentences_are_whole_and_names_are_cut():
    note = "device 0: host-link % uses a datasheet peak; the real slot may be slower " + "x" * 200
    name = "void at::native::elementwise_kernel<" + "T, " * 100 + ">(int)"
    text = render({"notes": [note, "second | note"], "shape": [30522, 512],
                   "rows": [{"name": name, "count": 1234567, "reason": note, "device_id": 10000, "path": "/d/" + "p" * 150}]}, "T")
    lines = text.splitlines()
    assert lines[0] == "## T"
    assert lines[1:4] == ["notes:", f"- {note}", "- second \\| note"]  # whole, one per line, pipes escaped
    assert "shape: [30522, 512]" in lines                                # shapes stay ungrouped and inline
    row = lines[-1]
    assert f"| {name[:MAX_CELL - 1]}… |" in row                        # kernel names are cut in tables
    assert f"| {note} |" in row and "| 1,234,567 |" in row and "| 10000 |" in row
    assert f"| /d/{'p' * 150} |" in row                               # paths are passed on verbatim: never cut
