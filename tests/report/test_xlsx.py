"""The TraceLens-style workbook (tools/report/xlsx.py): every sheet read back equals the tool output it
was written from (same rows, same numbers); the CLI `report` subcommand; bad output paths."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from conftest import DATA
from gpuscope.server.cli import main
from gpuscope.tools import analyses as A
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace
from gpuscope.tools.report import write_report
from gpuscope.tools.report.xlsx import ROW_LIMIT, cell_value

QWEN = DATA / "pytorch" / "nv_h100_qwen1.5-0.5b_infer_tracelens.json.gz"

from gpuscope.tools.analyses.perf_summary import perf_summary


def _read(path: Path) -> dict[str, pd.DataFrame]:
    return pd.read_excel(path, sheet_name=None, engine="openpyxl")


def _same(actual, expected) -> bool:
    expected = cell_value(expected)
    if expected is None:
        return actual is None or (isinstance(actual, float) and math.isnan(actual))
    if isinstance(expected, bool):
        return bool(actual) == expected
    if isinstance(expected, float):
        return math.isclose(float(actual), expected, rel_tol=1e-12, abs_tol=0.0)
    if isinstance(expected, int):
        return float(actual) == expected and int(actual) == expected
    if isinstance(expected, str) and expected.lstrip("-").isdigit() and len(expected) > 15:
        return int(actual) == int(expected)  # integer beyond 2^53, written as text
    return str(actual) == expected


def assert_sheet(df: pd.DataFrame, rows: list, extra: dict | None = None) -> None:
    """The sheet is the rows (pydantic models) written one per line, columns = field names (+ leading extras)."""
    dumped = [{**(extra or {}), **r.model_dump()} if not isinstance(r, dict) else r for r in rows]
    cols = list(dumped[0]) if dumped else list(df.columns)
    assert list(df.columns) == cols
    assert len(df) == len(dumped)
    for i, exp in enumerate(dumped):
        for c in cols:
            assert _same(df.at[i, c], exp[c]), (i, c, df.at[i, c], exp[c])


def assert_note(df: pd.DataFrame, *words: str) -> None:
    assert list(df.columns) == ["note"] and len(df) == 1
    text = str(df.iloc[0]["note"]).lower()
    assert all(w in text for w in words), text


def check_workbook(trace, path: Path, sheets: dict[str, int]) -> dict[str, pd.DataFrame]:
    book = _read(path)
    assert list(book) == list(sheets)
    assert list(book)[:8] == ["info", "gpu_timeline", "gpu_timeline_streams", "ops_summary", "ops_summary_by_category",
                              "ops_unique_args", "kernel_summary", "unified_perf_summary"]
    info = dict(zip(book["info"]["field"], book["info"]["value"]))
    assert info["profile"] == str(trace.path)
    assert "nanoseconds" in info["units"]
    for name in sheets:
        assert f"sheet {name}" in info or name == "info"

    tl = A.gpu_timeline(trace, limit=ROW_LIMIT)
    rows = [{"scope": "device", **t.model_dump()} for t in tl.timelines]
    if tl.all_devices:
        rows.append({"scope": "all_devices", **tl.all_devices.model_dump()})
    assert_sheet(book["gpu_timeline"], rows)
    assert_sheet(book["gpu_timeline_streams"], tl.streams)

    name = A.ops_summary(trace, group_by="name", limit=ROW_LIMIT)
    assert_sheet(book["ops_summary"], name.rows)
    assert_sheet(book["ops_summary_by_category"], A.ops_summary(trace, group_by="category", limit=ROW_LIMIT).rows)
    assert_sheet(book["kernel_summary"], A.ops_summary(trace, group_by="kernels", limit=ROW_LIMIT).rows)
    if name.attribution == "cpu_op":
        assert_sheet(book["ops_unique_args"], A.ops_summary(trace, group_by="shapes", limit=ROW_LIMIT).rows)
    else:
        assert_note(book["ops_unique_args"], "shapes")
        assert_note(book["unified_perf_summary"], "shapes")
        assert len(book) == 8
    if name.attribution == "cpu_op":
        perf = perf_summary(trace, limit=ROW_LIMIT)
        assert_sheet(book["unified_perf_summary"], perf.rows)
        cats = list(dict.fromkeys(r.category for r in perf.rows))
        assert list(book)[8:] == cats  # plain category names are valid sheet names here
        for cat in cats:
            assert_sheet(book[cat], [r for r in perf.rows if r.category == cat])
    for sheet, df in book.items():
        assert sheets[sheet] == (0 if list(df.columns) == ["note"] else len(df))
    return book


@pytest.mark.parametrize("fmt", ["kineto", "nsys", "rocpd"])
def test_sample_profile_sheets_equal_tool_outputs(profiles, tmp_path, fmt):
    trace = load_trace(profiles[fmt])
    try:
        before = sorted(p.name for p in profiles[fmt].parent.iterdir())
        out = tmp_path / "report.xlsx"
        sheets = write_report(trace, out)
        book = check_workbook(trace, out, sheets)
        # the user's path only: nothing next to the profile, no temporary files left
        assert sorted(p.name for p in profiles[fmt].parent.iterdir()) == before
        assert [p.name for p in tmp_path.iterdir()] == ["report.xlsx"]
        if fmt != "kineto":
            assert book["ops_summary"]["launcher_kind"].isin(["range", "kernel", "runtime", "graph", "unattributed"]).all()
    finally:
        trace.close()


def test_header_bold_frozen_and_widths(profiles, tmp_path):
    from openpyxl import load_workbook

    trace = load_trace(profiles["kineto"])
    try:
        write_report(trace, tmp_path / "r.xlsx")
    finally:
        trace.close()
    wb = load_workbook(tmp_path / "r.xlsx")
    for ws in wb.worksheets:
        assert ws.freeze_panes == "A2"
        assert all(c.font.bold for c in ws[1])
        assert all(8 <= (ws.column_dimensions[c.column_letter].width or 0) <= 120 for c in ws[1])


def test_linked_only(profiles, tmp_path):
    trace = load_trace(profiles["kineto"])
    try:
        out = tmp_path / "r.xlsx"
        write_report(trace, out, include_unlinked=False)
        book = _read(out)
        assert_sheet(book["ops_summary"], A.ops_summary(trace, include_unlinked=False, limit=ROW_LIMIT).rows)
        assert "<unattributed>" not in set(book["ops_summary"]["name"])
    finally:
        trace.close()


@pytest.mark.skipif(not QWEN.exists(), reason="shared H100 Qwen trace not present")
def test_h100_qwen_report(tmp_path):
    trace = load_trace(QWEN)
    try:
        out = tmp_path / "qwen.xlsx"
        sheets = write_report(trace, out)
        book = check_workbook(trace, out, sheets)
    finally:
        trace.close()
    ops = book["ops_summary"].set_index("name")
    # TraceLens golden (analysis-semantics.md §4): aten::mul 6752.90 µs x220, aten::mm x96
    assert ops.loc["aten::mul", "count"] == 220 and ops.loc["aten::mm", "count"] == 96
    assert ops.loc["aten::mul", "total_direct_kernel_time_ns"] == pytest.approx(6_752_900, abs=1_000)
    assert json.loads(ops.loc["aten::mm", "categories"]) == ["GEMM"]
    assert sheets["ops_unique_args"] > 0 and "GEMM" in sheets and "SDPA_fwd" in sheets


def test_cli_report(profiles, tmp_path, capsys):
    out = tmp_path / "out.xlsx"
    main(["report", str(profiles["kineto"]), "--xlsx", str(out)])
    assert out.is_file()
    text = capsys.readouterr().out
    assert "ops_summary" in text and str(out.resolve()) in text
    assert "ops_summary" in _read(out)


@pytest.mark.parametrize("bad,words", [("missing_dir/out.xlsx", ["does not exist"]), ("out.csv", [".xlsx"]),
                                       ("a_dir.xlsx", ["folder"])])
def test_cli_bad_output_path(profiles, tmp_path, capsys, bad, words):
    (tmp_path / "a_dir.xlsx").mkdir()
    with pytest.raises(SystemExit) as exc:
        main(["report", str(profiles["kineto"]), "--xlsx", str(tmp_path / bad)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuscope:") and all(w in err for w in words), err
    assert not (tmp_path / "missing_dir").exists() and not (tmp_path / "out.csv").exists()


def test_cli_report_requires_xlsx(profiles):
    with pytest.raises(SystemExit) as exc:
        main(["report", str(profiles["kineto"])])
    assert exc.value.code == 2


def test_write_report_bad_path_raises(profiles, tmp_path):
    trace = load_trace(profiles["nsys"])
    try:
        with pytest.raises(ProfileError, match="does not exist"):
            write_report(trace, tmp_path / "nope" / "r.xlsx")
    finally:
        trace.close()
