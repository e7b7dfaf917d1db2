"""`gpuscope report PROFILE --html out.html`: one offline file whose charts show exactly the tools' figures.

Each chart's data is embedded beside it as JSON; the tests compare it with the tool called directly, check that the
file loads nothing (no script, stylesheet, font or image source, a Content-Security-Policy that forbids them), that
every bar drawn is a row of the data, that profile text cannot break out of the markup, and that a section whose tool
cannot answer says why."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import DATA, write_scenario
from gpuscope.fixtures.catalog import SCENARIOS
from gpuscope.fixtures.scenarios_iterations import profiler_steps
from gpuscope.server.cli import main
from gpuscope.tools import analyses as A
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace
from gpuscope.tools.report.html import SECTIONS, TOP, embedded_data, write_html

BERT = DATA / "pytorch" / "nv_h100_bert-small_infer_tracelens.json.gz"


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _parse(text: str) -> list[tuple[str, dict]]:
    p = _Tags()
    p.feed(text)
    return p.tags


def _offline(text: str) -> None:
    tags = _parse(text)
    assert not [t for t, a in tags if t in ("link", "img", "iframe", "object", "embed")]
    assert all(a.get("type") == "application/json" and "src" not in a for t, a in tags if t == "script")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text) and "@import" not in text and "url(" not in text
    csp = [a for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]["content"]


def _check_against_tools(trace, text: str) -> dict:
    data = embedded_data(text)
    tl = A.gpu_timeline(trace)
    assert data["gpu_timeline"] == [{"device_id": t.device_id, "device_name": t.device_name, "computation_ns": t.computation_ns,
                                     "exposed_comm_ns": t.exposed_comm_ns, "exposed_memcpy_ns": t.exposed_memcpy_ns,
                                     "idle_ns": t.idle_ns, "total_ns": t.total_ns} for t in tl.timelines]
    tk = A.top_kernels(trace, limit=TOP)
    for dev in tk.devices:
        rows = data[f"top_kernels_{dev.device_id}"]
        assert [(r["name"], r["count"], r["total_ns"]) for r in rows] == [
            (k.name, k.count, k.total_ns) for k in tk.kernels if k.device_id == dev.device_id]
        # one bar per row, no more
        chart = re.search(rf'<svg[^>]*id="chart-top_kernels_{dev.device_id}".*?</svg>', text, re.S).group(0)
        assert chart.count("<rect") == len(rows)
    for p in A.gap_histogram(trace).profiles:
        assert data[f"gap_histogram_{p.device_id}"] == [b.model_dump() for b in p.buckets]
    return data


def test_fixture_report_matches_the_tools(tmp_path):
    trace = load_trace(write_scenario(profiler_steps(), "kineto", tmp_path / "steps.pt.trace.json"))
    res = write_html(trace, tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    _offline(text)
    data = _check_against_tools(trace, text)
    steps = A.iterations(trace).steps
    assert [(r["name"], r["wall_ns"]) for r in data["iterations"]] == [(s.name, s.wall_ns) for s in steps]
    assert [s.section for s in res.sections] == list(SECTIONS)
    assert {s.section for s in res.sections if s.chart} >= {"gpu_timeline", "top_kernels", "gap_histogram", "iterations"}
    ids = {a.get("id") for t, a in _parse(text) if t == "section"}
    assert ids == set(SECTIONS)
    assert res.bytes == (tmp_path / "r.html").stat().st_size
    trace.close()


def test_a_tool_that_cannot_answer_leaves_a_note_with_its_reason(tmp_path):
    trace = load_trace(write_scenario(SCENARIOS["concurrent_streams"](), "nsys", tmp_path / "p.sqlite"))
    res = write_html(trace, tmp_path / "r.html")
    roof = next(s for s in res.sections if s.section == "roofline")
    assert not roof.chart and "operators" in roof.note  # an Nsight export holds no PyTorch ops
    with pytest.raises(ProfileError) as info:
        A.roofline(trace)
    assert roof.note == str(info.value)
    assert "roofline" not in embedded_data((tmp_path / "r.html").read_text())
    trace.close()


def test_profile_text_cannot_break_out(tmp_path):
    s = SCENARIOS["concurrent_streams"]()
    evil = '</script><script>alert(1)</script><img src=x onerror=alert(2)>\u202eevil\x1b[31m'
    s.kernels[0].name = s.kernels[0].short_name = evil
    trace = load_trace(write_scenario(s, "nsys", tmp_path / "e.sqlite"))  # Nsight stores the short name as written
    write_html(trace, tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    _offline(text)
    assert "<script>alert" not in text and "<img" not in text and "\u202e" not in text and "\x1b" not in text
    names = [r["name"] for k, v in embedded_data(text).items() if k.startswith("top_kernels") for r in v]
    assert evil in names  # the data keeps the raw name; only the markup escapes it
    trace.close()


@pytest.mark.skipif(not BERT.exists(), reason="../shared/data absent")
def test_real_profile_report(tmp_path):
    trace = load_trace(BERT)
    res = write_html(trace, tmp_path / "bert.html")
    text = (tmp_path / "bert.html").read_text()
    _offline(text)
    data = _check_against_tools(trace, text)
    rated = [r for r in A.roofline(trace).rows if r.rated and (r.arithmetic_intensity or 0) > 0 and (r.achieved_tflops or 0) > 0]
    assert [(p["name"], p["total_time_ns"]) for p in data["roofline"]["points"]] == [(r.name, r.total_time_ns) for r in rated]
    assert res.bytes < 2_000_000
    trace.close()


def test_cli_writes_html_and_xlsx_and_needs_one(tmp_path, capsys):
    path = write_scenario(SCENARIOS["concurrent_streams"](), "rocpd", tmp_path / "p_results.db")
    with pytest.raises(SystemExit) as info:
        main(["report", str(path)])
    assert info.value.code == 2 and "--html" in capsys.readouterr().err
    main(["report", str(path), "--html", str(tmp_path / "r.html"), "--xlsx", str(tmp_path / "r.xlsx"), "--json"])
    assert (tmp_path / "r.html").stat().st_size > 0 and (tmp_path / "r.xlsx").stat().st_size > 0
    assert (tmp_path / "r.html").stat().st_mode & 0o044  # readable like any file the user writes, not 0600


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no headless browser installed (.ci/run installs chromium with apt-get)")


def _console(page: Path) -> tuple[str, list[str]]:
    """The DOM a headless browser built from the page, and every console line it logged. Chromium writes them as
    `INFO:CONSOLE:1] "..."` (newer) or `CONSOLE(1)` (older); a CSP refusal or script error is one of them, and the
    report logs nothing at all, so any console line is a failure."""
    out = subprocess.run([BROWSER, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr", "--v=0",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=90)
    return out.stdout, [line for line in out.stderr.splitlines() if re.search(r"CONSOLE[:(]\d+", line)]


@needs_browser
def test_the_console_check_sees_errors_and_refused_loads(tmp_path):
    report = tmp_path / "r.html"
    write_html(load_trace(write_scenario(profiler_steps(), "kineto", tmp_path / "s.pt.trace.json")), report)
    text = report.read_text()
    bad = tmp_path / "bad.html"
    # The report's own CSP must refuse the image, and the inline script must not run (or, if run, throw).
    bad.write_text(text.replace("</body>", '<img src="https://example.invalid/x.png"><script>undefinedFn()</script></body>'))
    _, lines = _console(bad)
    assert any("example.invalid" in line and re.search(r"violates|Refused|blocked", line) for line in lines), lines


@needs_browser
def test_a_headless_browser_opens_it_without_console_errors(tmp_path):
    trace = load_trace(write_scenario(profiler_steps(), "kineto", tmp_path / "steps.pt.trace.json"))
    write_html(trace, tmp_path / "r.html")
    dom, lines = _console(tmp_path / "r.html")
    assert dom.count("<svg") >= 3  # the charts were parsed into the DOM, not just shipped as text
    assert lines == []
    trace.close()


def test_memory_chart_is_the_tool_s_series(tmp_path):
    from gpuscope.fixtures.scenarios_memory import SCENARIOS as MEMORY

    name = next(iter(MEMORY))
    trace = load_trace(write_scenario(MEMORY[name](), "kineto", tmp_path / "m.pt.trace.json"))
    res = write_html(trace, tmp_path / "r.html")
    assert next(s for s in res.sections if s.section == "memory_timeline").chart
    data = embedded_data((tmp_path / "r.html").read_text())
    for d in A.memory_timeline(trace).devices:
        got = data[f"memory_timeline_{d.device_id}"]
        assert got["series"] == [p.model_dump() for p in d.series]
        assert (got["peak_allocated_bytes"], got["peak_ts_ns"]) == (d.peak_allocated_bytes, d.peak_ts_ns)
    trace.close()


def test_os_memory_charts_are_the_tool_s_wddm_series(tmp_path):
    """memory_wddm written as Nsight: one chart per device and segment group whose embedded data is memory_timeline's
    os_memory entries (the profiled process and all processes summed) exactly, titled as OS-reported WDDM usage."""
    from gpuscope.fixtures.scenarios_memory import memory_wddm

    trace = load_trace(write_scenario(memory_wddm(), "nsys", tmp_path / "w.sqlite"))
    res = write_html(trace, tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    _offline(text)
    assert next(s for s in res.sections if s.section == "memory_timeline").chart
    data = embedded_data(text)
    os_memory = A.memory_timeline(trace).os_memory
    assert {o.segment_group for o in os_memory} == {"local", "non-local"} and {o.pid for o in os_memory} == {100, None}
    charts = {}
    for o in os_memory:
        charts.setdefault(f"os_memory_{o.device_id}_{o.segment_group.replace('-', '_')}", []).append(o)
    assert {k for k in data if k.startswith("os_memory_")} == set(charts)
    for chart, entries in charts.items():
        assert data[chart] == [{"pid": o.pid, "process_name": o.process_name, "peak_usage_bytes": o.peak_usage_bytes,
                                "peak_usage_ts_ns": o.peak_usage_ts_ns, "budget_bytes": o.budget_bytes,
                                "pct_of_budget": o.pct_of_budget, "series": [p.model_dump() for p in o.series]}
                               for o in entries]
        svg = re.search(rf'<svg[^>]*id="chart-{chart}".*?</svg>', text, re.S).group(0)
        # the process's usage and all processes summed; its budget (4000-16000 MiB against usage under 400 MiB)
        # would flatten them: it is named under the chart instead
        assert svg.count("<polyline") == 2 and "stroke-dasharray" not in svg
        budget = max(p.budget_bytes for o in entries if o.pid == 100 for p in o.series if p.budget_bytes is not None)
        assert re.search(rf"budget, pid 100[^:<]*: up to {budget:,} B", text.split(f'id="chart-{chart}"')[1].split("<svg")[0])
    # from the scenario: process 100 peaks at 150 MiB local at 55 us (+300 ns) under its 4000 MiB budget
    local = data["os_memory_0_local"][0]
    assert (local["pid"], local["peak_usage_bytes"], local["peak_usage_ts_ns"], local["budget_bytes"]) == (
        100, 150 << 20, 55_300, 4000 << 20)
    assert text.count("OS-reported WDDM usage") == len(charts) and "not allocator bytes" in text
    if BROWSER is not None:
        dom, lines = _console(tmp_path / "r.html")
        assert dom.count('id="chart-os_memory_') == len(charts)
        assert lines == []
    trace.close()


def test_step_lines_draw_a_budget_on_scale_and_wrap_a_long_legend():
    """A budget within OFF_SCALE times the usage is drawn (dashed); nine lines wrap the legend onto three rows inside
    the chart, the plot moving down under them."""
    from gpuscope.tools.report import html as H

    usage = [(0, 100), (10, 300), (20, 50)]
    lines = [(f"usage, pid {i}", "#000", False, usage) for i in range(8)] + [("budget, pid 0", "#000", True, [(0, 1000)])]
    svg = H._step_lines("x", lines, (10, 300, "usage"))
    height = int(re.search(r'height="(\d+)"', svg).group(1))
    assert height == H.H + 28  # 3 legend rows of 4
    legend = [(float(x), float(y)) for x, y in re.findall(r'<line x1="([\d.]+)" y1="([\d.]+)" x2="[\d.]+" y2="[\d.]+" stroke="#000" stroke-width="3"', svg)]
    assert len(legend) == 9 and len(set(legend)) == 9
    assert max(x for x, _ in legend) + H.LEGEND_W <= H.W and sorted({y for _, y in legend}) == [9, 23, 37]
    assert svg.count("<polyline") == 9 and svg.count('stroke-dasharray="5 3"') == 1
