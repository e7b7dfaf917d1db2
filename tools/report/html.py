"""One self-contained HTML report: `gpuscope report PROFILE --html out.html`.

The file loads nothing: no script, stylesheet, font or image from anywhere, so it opens offline and in a mail or CI
artifact viewer. Charts are inline SVG drawn here from the tools' own results; every chart's data is embedded next
to it as JSON (`<script type="application/json" id="data-<chart>">`, not executed by the browser), which is exactly
what was drawn, so a test or a reader can check the picture against the tools. Sections, each from one tool:

    diagnosis        diagnose: verdict and ranked findings (table)
    gpu_timeline     gpu_timeline: per device, computation / exposed comm / exposed memcpy / idle (stacked bar, ns)
    top_kernels      top_kernels: per device, the top groups by summed time (bars, ns) and the table
    gap_histogram    gap_histogram: per device, idle gaps by length bucket (bars: count, and idle ns in the table)
    iterations       iterations: wall time per step (bars, ns) and the summary
    roofline         roofline: achieved vs attainable per rated op (log-log scatter with the roofs)
    memory_timeline  memory_timeline (when the profile records allocations): allocated bytes over time per device; and,
                     where Windows reported it (os_memory), WDDM usage per device and segment group: each profiled
                     process's usage and budget and all processes summed (step lines), with peak, budget, % of budget

A tool that cannot answer on this profile gives its section a note with its reason (the tool's own message), never
an empty chart. Profile text (kernel names, paths) is escaped for HTML, and hidden or direction-changing characters
are shown as escapes, as on the terminal.
"""

from __future__ import annotations

import html
import json
import math
import re
import time
import unicodedata
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, Field

from ..model.errors import ProfileError, shown_path
from ..model.trace import Trace
from .files import atomic_output

COLORS = {"computation": "#4c78a8", "exposed_comm": "#f58518", "exposed_memcpy": "#54a24b", "idle": "#d0d0d0"}
TOP = 10  # bars per top-kernels chart
W, H = 760, 260  # chart size, px


class SectionWritten(BaseModel):
    section: str
    chart: bool = Field(description="true when the section holds a chart (else a note says why not)")
    note: str | None = None


class HtmlReportWritten(BaseModel):
    trace: str
    path: str
    bytes: int = Field(description="size of the HTML file, bytes")
    build_s: float = Field(description="seconds to compute the tools and write the file")
    sections: list[SectionWritten]


def _shown(text: Any) -> str:
    """HTML-escaped text with control, format (bidi, zero-width) and line-breaking characters as visible escapes."""
    s = str(text)
    s = "".join(c if c == " " or unicodedata.category(c)[0] not in "CZ" else
                ("\\x%02x" % ord(c) if ord(c) < 0x100 else "\\u%04x" % ord(c)) for c in s)
    return html.escape(s)


def _num(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 1e15 else f"{v:.3g}"
    return _shown(v)


def _table(rows: list[dict], columns: list[str]) -> str:
    head = "".join(f"<th>{_shown(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_num(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _data(chart: str, data: Any) -> str:
    # JSON inside <script> ends at "</": escape it (and '<!--') so no profile text can close the element.
    text = json.dumps(data, ensure_ascii=True).replace("<", "\\u003c").replace(">", "\\u003e")
    return f'<script type="application/json" id="data-{chart}">{text}</script>'


def _el(tag: str, content: str | None = None, **attrs: Any) -> str:
    """One SVG/HTML element; attribute values escaped (names: python keywords end in _, '_' becomes '-')."""
    rendered = "".join(" " + k.rstrip("_").replace("_", "-") + '="' + html.escape(str(v), quote=True) + '"'
                       for k, v in attrs.items())
    return f"<{tag}{rendered}/>" if content is None else f"<{tag}{rendered}>{content}</{tag}>"


def _svg(chart: str, width: int, height: int, parts: list[str]) -> str:
    return _el("svg", "".join(parts), class_="chart", id="chart-" + chart, viewBox=f"0 0 {width} {height}",
               width=width, height=height, role="img")


def _bars(chart: str, labels: list[str], values: list[int], unit: str) -> str:
    """Horizontal bars, one per label."""
    n = max(len(values), 1)
    h = 22 * n + 30
    top = max(values) if values and max(values) > 0 else 1
    out = []
    for i, (label, v) in enumerate(zip(labels, values)):
        y = 10 + 22 * i
        w = int(round((W - 330) * v / top))
        out += [_el("text", _shown(label[:48]), x=0, y=y + 14, class_="lbl"),
                _el("rect", _el("title", f"{_shown(label)}: {v:,} {unit}"), x=300, y=y, width=w, height=16, fill="#4c78a8"),
                _el("text", f"{v:,}", x=304 + w, y=y + 13, class_="val")]
    return _svg(chart, W, h, out)


def _stacked(chart: str, rows: list[tuple[str, dict[str, int]]]) -> str:
    """One horizontal stacked bar per row (device), parts in COLORS order, widths as shares of the row's total."""
    h = 30 * len(rows) + 40
    out = []
    for i, (label, parts) in enumerate(rows):
        y = 10 + 30 * i
        total = sum(parts.values()) or 1
        x = 160.0
        out.append(_el("text", _shown(label[:24]), x=0, y=y + 15, class_="lbl"))
        for part, v in parts.items():
            w = (W - 170) * v / total
            out.append(_el("rect", _el("title", f"{part}: {v:,} ns ({100 * v / total:.1f} %)"), x=f"{x:.1f}", y=y,
                           width=f"{w:.1f}", height=20, fill=COLORS[part]))
            x += w
    legend_y = 10 + 30 * len(rows) + 10
    for j, (part, color) in enumerate(COLORS.items()):
        out += [_el("rect", x=160 + 150 * j, y=legend_y, width=10, height=10, fill=color),
                _el("text", part, x=174 + 150 * j, y=legend_y + 10, class_="val")]
    return _svg(chart, W, h, out)


def _scatter_loglog(chart: str, points: list[dict], roofs: dict) -> str:
    """Achieved TFLOP/s against arithmetic intensity on log axes, with the memory and compute roofs."""
    xs = [p["arithmetic_intensity"] for p in points] + [roofs["ridge"]]
    ys = [p["achieved_tflops"] for p in points] + [roofs["compute_tflops"]]
    lx0, lx1 = math.floor(math.log10(min(xs))) - 1, math.ceil(math.log10(max(xs))) + 1
    ly0, ly1 = math.floor(math.log10(min(ys))) - 1, math.ceil(math.log10(max(ys))) + 1

    def px(x: float) -> float:
        return 50 + (W - 70) * (math.log10(x) - lx0) / (lx1 - lx0)

    def py(y: float) -> float:
        return H - 30 - (H - 50) * (math.log10(y) - ly0) / (ly1 - ly0)

    out = [_el("line", x1=50, y1=H - 30, x2=W - 20, y2=H - 30, stroke="#888"),
           _el("line", x1=50, y1=20, x2=50, y2=H - 30, stroke="#888"),
           _el("text", f"FLOP/byte (log, 10^{lx0}..10^{lx1})", x=W // 2, y=H - 5, class_="val"),
           _el("text", f"TFLOP/s (log, 10^{ly0}..10^{ly1})", x=0, y=14, class_="val")]
    # memory roof: y = bw(TB/s) * x up to the ridge, then the compute roof
    x_lo = 10 ** lx0
    y_lo = max(roofs["memory_tb_per_s"] * x_lo, 10 ** ly0)
    roof = [(px(x_lo), py(y_lo)), (px(roofs["ridge"]), py(roofs["compute_tflops"])), (px(10 ** lx1), py(roofs["compute_tflops"]))]
    out.append(_el("polyline", fill="none", stroke="#e45756", points=" ".join(f"{a:.1f},{b:.1f}" for a, b in roof)))
    for p in points:
        out.append(_el("circle", _el("title", f"{_shown(p['name'])}: {p['achieved_tflops']:.3g} TFLOP/s at "
                                              f"{p['arithmetic_intensity']:.3g} FLOP/B"),
                       cx=f"{px(p['arithmetic_intensity']):.1f}", cy=f"{py(p['achieved_tflops']):.1f}", r=4, fill="#4c78a8"))
    return _svg(chart, W, H, out)


# -- sections: (title, builder) -> (html, chart drawn?) --------------------------------------------------------------

def _diagnosis(trace: Trace) -> tuple[str, bool]:
    from ..analyses.diagnose import diagnose

    d = diagnose(trace).model_dump(mode="json")
    rows = [{"rank": f["rank"], "bottleneck": f["bottleneck"], "title": f["title"], "share_pct": f["share_pct"],
             "time_at_stake_ns": f["time_at_stake_ns"], "confidence": f["confidence"]} for f in d["findings"]]
    return (f"<p>{_shown(d['verdict'])}</p>" + _data("diagnosis", rows)
            + _table(rows, ["rank", "bottleneck", "title", "share_pct", "time_at_stake_ns", "confidence"])), False


def _timeline(trace: Trace) -> tuple[str, bool]:
    from ..analyses.gpu_timeline import gpu_timeline

    tl = gpu_timeline(trace).model_dump(mode="json")
    data = [{"device_id": t["device_id"], "device_name": t["device_name"], "computation_ns": t["computation_ns"],
             "exposed_comm_ns": t["exposed_comm_ns"], "exposed_memcpy_ns": t["exposed_memcpy_ns"], "idle_ns": t["idle_ns"],
             "total_ns": t["total_ns"]} for t in tl["timelines"]]
    svg = _stacked("gpu_timeline", [(f"GPU {r['device_id']}", {"computation": r["computation_ns"], "exposed_comm": r["exposed_comm_ns"],
                                                              "exposed_memcpy": r["exposed_memcpy_ns"], "idle": r["idle_ns"]})
                                    for r in data])
    return svg + _data("gpu_timeline", data) + _table(data, list(data[0]) if data else []), bool(data)


def _top_kernels(trace: Trace) -> tuple[str, bool]:
    from ..analyses.top_kernels import top_kernels

    tk = top_kernels(trace, limit=TOP).model_dump(mode="json")
    out = []
    for dev in tk["devices"]:
        rows = [k for k in tk["kernels"] if k["device_id"] == dev["device_id"]]
        data = [{"name": k["name"], "count": k["count"], "total_ns": k["total_ns"],
                 "pct_of_device_kernel_time": k["pct_of_device_kernel_time"]} for k in rows]
        chart = f"top_kernels_{dev['device_id']}"
        out.append(f"<h3>GPU {dev['device_id']}: {_shown(dev['device_name'] or '')}</h3>"
                   + _bars(chart, [r["name"] for r in data], [r["total_ns"] for r in data], "ns")
                   + _data(chart, data) + _table(data, ["name", "count", "total_ns", "pct_of_device_kernel_time"]))
    return "".join(out), bool(out)


def _gaps(trace: Trace) -> tuple[str, bool]:
    from ..analyses.gap_histogram import gap_histogram

    gh = gap_histogram(trace).model_dump(mode="json")
    out = []
    for p in gh["profiles"]:
        data = p["buckets"]
        chart = f"gap_histogram_{p['device_id']}"
        out.append(f"<h3>GPU {p['device_id']}: {p['gap_count']:,} gaps, {p['idle_in_gpu_span_ns']:,} ns idle in the GPU span</h3>"
                   + _bars(chart, [b["bucket"] for b in data], [b["count"] for b in data], "gaps")
                   + _data(chart, data) + _table(data, ["bucket", "count", "total_ns"]))
    return "".join(out), bool(out)


def _iterations(trace: Trace) -> tuple[str, bool]:
    from ..analyses.iterations import iterations

    it = iterations(trace).model_dump(mode="json")
    data = [{"index": s["index"], "name": s["name"], "wall_ns": s["wall_ns"], "warmup": s["warmup"]} for s in it["steps"]]
    summary = [{k: s[k] for k in ("pid", "tid", "steps", "wall_median_ns", "wall_min_ns", "wall_max_ns", "steady_median_ns")}
               for s in it["summaries"]]
    return (f"<p>steps: {_shown(it['choice']['how'])} {_shown(it['choice']['pattern'])}</p>"
            + _bars("iterations", [f"{r['name']}" for r in data], [r["wall_ns"] for r in data], "ns")
            + _data("iterations", data) + _table(summary, list(summary[0]) if summary else [])), bool(data)


def _roofline(trace: Trace) -> tuple[str, bool]:
    from ..analyses.roofline import roofline

    rf = roofline(trace).model_dump(mode="json")
    points = [{"name": r["name"], "arithmetic_intensity": r["arithmetic_intensity"], "achieved_tflops": r["achieved_tflops"],
               "bound": r["bound"], "pct_of_roof": r["pct_of_roof"], "total_time_ns": r["total_time_ns"]}
              for r in rf["rows"] if r["rated"] and (r["arithmetic_intensity"] or 0) > 0 and (r["achieved_tflops"] or 0) > 0]
    if not points:
        return "<p class=note>no op could be rated against a roof (see `gpuscope roofline` for why)</p>", False
    first = next(r for r in rf["rows"] if r["rated"])
    roofs = {"memory_tb_per_s": first["memory_roof_tb_per_s"], "compute_tflops": first["compute_roof_tflops"],
             "ridge": first["ridge_flops_per_byte"]}
    return (f"<p>{_shown(rf['device_name'] or '')}: peaks {_shown(rf['peaks_model'] or 'unknown')}</p>"
            + _scatter_loglog("roofline", points, roofs) + _data("roofline", {"roofs": roofs, "points": points})
            + _table(points, list(points[0]))), True


def _step_lines(chart: str, lines: list[tuple[str, str, bool, list[tuple[int, int]]]], peak: tuple[int, int, str]) -> str:
    """Bytes over time as step lines (a level holds until the line's next point), one per (label, color, dashed,
    points), on one time and byte scale; the peak (ts, bytes, what) marked."""
    pts_all = [p for *_, pts in lines for p in pts]
    t0 = min(t for t, _ in pts_all)
    t1 = max(max(t for t, _ in pts_all), t0 + 1)
    top = max(max(b for _, b in pts_all), peak[1], 1)
    # The legend (only where there is more than one line) wraps onto rows above the plot, which moves down for them.
    per_row = (W - 80) // LEGEND_W
    rows = -(-len(lines) // per_row) if len(lines) > 1 else 1
    lift = 14 * (rows - 1)
    height = H + lift

    def px(t: int) -> float:
        return 60 + (W - 80) * (t - t0) / (t1 - t0)

    def py(b: int) -> float:
        return height - 30 - (H - 50) * b / top

    out = [_el("line", x1=60, y1=height - 30, x2=W - 20, y2=height - 30, stroke="#888"),
           _el("line", x1=60, y1=20 + lift, x2=60, y2=height - 30, stroke="#888"),
           _el("text", f"{top:,} B", x=0, y=24 + lift, class_="val"),
           _el("text", f"time, ns ({t1 - t0:,} ns shown)", x=W // 2, y=height - 5, class_="val")]
    for j, (label, color, dashed, pts) in enumerate(lines):
        steps = []
        for (ta, ba), (tb, _) in zip(pts, pts[1:] + [pts[-1]]):
            steps += [(px(ta), py(ba)), (px(tb), py(ba))]
        out.append(_el("polyline", _el("title", _shown(label)), fill="none", stroke=color,
                       points=" ".join(f"{a:.1f},{b:.1f}" for a, b in steps), **({"stroke_dasharray": "5 3"} if dashed else {})))
        if len(lines) > 1:
            x, y = 80 + LEGEND_W * (j % per_row), 9 + 14 * (j // per_row)
            out += [_el("line", x1=x, y1=y, x2=x + 14, y2=y, stroke=color, stroke_width=3,
                        **({"stroke_dasharray": "4 2"} if dashed else {})),
                    _el("text", _shown(label[:26]), x=x + 18, y=y + 4, class_="val")]
    out.append(_el("circle", _el("title", f"{_shown(peak[2])} peak {peak[1]:,} B at {peak[0]:,} ns"), cx=f"{px(peak[0]):.1f}",
                   cy=f"{py(peak[1]):.1f}", r=4, fill="#e45756"))
    return _svg(chart, W, height, out)


OS_COLORS = ("#4c78a8", "#54a24b", "#b279a2", "#9d755d")  # profiled processes' usage; the sum is grey, budgets dashed
LEGEND_W = 170  # px per legend entry
OFF_SCALE = 4  # a budget above this many times the highest usage is named under the chart, not drawn: it would flatten the usage


def _os_memory(os_memory: list[dict]) -> list[str]:
    """memory_timeline's os_memory: one chart per device and segment group: each profiled process's usage, its budget
    (dashed) and, grey, all processes the OS reported on the adapter summed; the table gives every entry's peak."""
    out = []
    groups: dict[tuple[int, str], list[dict]] = {}
    for o in os_memory:
        groups.setdefault((o["device_id"], o["segment_group"]), []).append(o)
    for (dev, seg), entries in groups.items():
        chart = f"os_memory_{dev}_" + re.sub(r"\W", "_", seg)
        data = [{k: o[k] for k in ("pid", "process_name", "peak_usage_bytes", "peak_usage_ts_ns", "budget_bytes",
                                   "pct_of_budget", "series")} for o in entries]
        lines = []
        for i, o in enumerate(e for e in entries if e["pid"] is not None and e["series"]):
            who = f"pid {o['pid']} {o['process_name'] or ''}".strip()
            color = OS_COLORS[i % len(OS_COLORS)]
            lines.append(("usage, " + who, color, False, [(p["ts_ns"], p["usage_bytes"]) for p in o["series"]]))
            budget = [(p["ts_ns"], p["budget_bytes"]) for p in o["series"] if p["budget_bytes"] is not None]
            if budget:
                lines.append(("budget, " + who, color, True, budget))
        lines += [("usage, all processes", "#999", False, [(p["ts_ns"], p["usage_bytes"]) for p in o["series"]])
                  for o in entries if o["pid"] is None and o["series"]]
        usage_top = max((b for _, _, dashed, pts in lines if not dashed for _, b in pts), default=0)
        off = [line for line in lines if line[2] and usage_top and max(b for _, b in line[3]) > OFF_SCALE * usage_top]
        lines = [line for line in lines if line not in off]
        caption = "".join(_el("p", f"{_shown(label)}: up to {max(b for _, b in pts):,} B, "
                                   f"{max(b for _, b in pts) / usage_top:.1f}x the highest usage shown: left off the chart's "
                                   "scale (the table gives it)", class_="note") for label, _, _, pts in off)
        first = next((o for o in entries if o["pid"] is not None), entries[0])
        rows = [{"process": "all processes (summed)" if o["pid"] is None else f"pid {o['pid']} {o['process_name'] or ''}".strip(),
                 "peak_usage_bytes": o["peak_usage_bytes"], "peak_usage_ts_ns": o["peak_usage_ts_ns"],
                 "budget_bytes": o["budget_bytes"], "pct_of_budget": o["pct_of_budget"]} for o in entries]
        out.append(_el("h3", f"GPU {dev}: {_shown(entries[0]['device_name'] or '')}, OS-reported WDDM usage, "
                             f"{_shown(seg)} segment group (not allocator bytes)")
                   + (_step_lines(chart, lines, (first["peak_usage_ts_ns"], first["peak_usage_bytes"], "usage")) if lines else "")
                   + caption + _data(chart, data) + _table(rows, list(rows[0])))
    return out


def _memory(trace: Trace) -> tuple[str, bool]:
    from ..analyses.memory_timeline import memory_timeline

    mt = memory_timeline(trace).model_dump(mode="json")
    out = []
    for d in mt["devices"]:
        chart = f"memory_timeline_{d['device_id']}"
        data = {"series": d["series"], "peak_allocated_bytes": d["peak_allocated_bytes"], "peak_ts_ns": d["peak_ts_ns"],
                "never_freed_bytes": d["never_freed_bytes"], "live_at_peak_by_site": d["live_at_peak_by_site"]}
        facts = [{"peak_allocated_bytes": d["peak_allocated_bytes"], "peak_ts_ns": d["peak_ts_ns"],
                  "pct_of_device_memory": d["pct_of_device_memory"], "allocations": d["allocations"], "frees": d["frees"],
                  "never_freed_allocations": d["never_freed_allocations"], "never_freed_bytes": d["never_freed_bytes"]}]
        series = [(p["ts_ns"], p["allocated_bytes"]) for p in d["series"]]
        out.append(_el("h3", f"GPU {d['device_id']}: {_shown(d['device_name'] or '')}, allocated bytes")
                   + (_step_lines(chart, [("allocated", "#4c78a8", False, series)],
                                  (d["peak_ts_ns"], d["peak_allocated_bytes"], "allocated")) if series else "")
                   + _data(chart, data) + _table(facts, list(facts[0]))
                   + _table(d["live_at_peak_by_site"], list(d["live_at_peak_by_site"][0]) if d["live_at_peak_by_site"] else []))
    out += _os_memory(mt["os_memory"])
    return "".join(out), any(d["series"] for d in mt["devices"]) or any(o["series"] for o in mt["os_memory"])


SECTIONS: dict[str, tuple[str, Callable[[Trace], tuple[str, bool]]]] = {
    "diagnosis": ("Diagnosis", _diagnosis),
    "gpu_timeline": ("GPU timeline per device", _timeline),
    "top_kernels": ("Top kernels", _top_kernels),
    "gap_histogram": ("GPU idle gaps", _gaps),
    "iterations": ("Iteration times", _iterations),
    "roofline": ("Roofline", _roofline),
    "memory_timeline": ("Memory timeline", _memory),
}

STYLE = """body{font:14px system-ui,sans-serif;margin:24px;max-width:1000px;color:#222}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
td:first-child,th:first-child{text-align:left}.lbl{font:12px monospace}.val{font:11px sans-serif;fill:#444}
.note{color:#8a6d3b;background:#fcf8e3;padding:6px}h2{border-bottom:1px solid #ddd;margin-top:32px}"""


def write_html(trace: Trace, out: str | Path) -> HtmlReportWritten:
    t0 = time.perf_counter()
    path = Path(out).expanduser()
    if path.suffix.lower() not in (".html", ".htm"):
        raise ProfileError(f"the report is HTML: name the file *.html (got {shown_path(path)}).")
    if not path.parent.is_dir():
        raise ProfileError(f"folder {shown_path(path.parent)} does not exist; create it or name a file in an existing folder.")
    if path.exists() and path.resolve() == trace.path.resolve():
        raise ProfileError("the output file is the profile itself; choose another name.")
    body, written = [], []
    for key, (title, build) in SECTIONS.items():
        try:
            content, chart = build(trace)
            note = None
        except ProfileError as exc:
            content, chart, note = f"<p class=note>{_shown(exc)}</p>", False, str(exc)
        body.append(_el("section", _el("h2", html.escape(title)) + content, id=key))
        written.append(SectionWritten(section=key, chart=chart, note=note))
    head = (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>gpuscope report: {_shown(trace.path.name)}</title>"
            f"<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<style>{STYLE}</style></head><body><h1>gpuscope report</h1><p>{_shown(trace.path)} "
            f"({_shown(trace.format_name)})</p>")
    text = head + "".join(body) + "</body></html>\n"
    with atomic_output(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return HtmlReportWritten(trace=str(trace.path), path=str(path.resolve()), bytes=path.stat().st_size,
                             build_s=round(time.perf_counter() - t0, 3), sections=written)


DATA_RE = re.compile(r'<script type="application/json" id="data-([\w]+)">(.*?)</script>', re.S)


def embedded_data(text: str) -> dict[str, Any]:
    """The chart data blocks of a written report, by chart id (for tests and for readers who want the numbers)."""
    return {m.group(1): json.loads(m.group(2)) for m in DATA_RE.finditer(text)}
