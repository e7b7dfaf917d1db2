"""The regression gate's engine (baseline save / check) on the gate scenarios written as Nsight, rocpd and Kineto files.

Expected figures come from the scenarios (fixtures/scenarios_regression.py: the step walls and kernel durations the
generator wrote), computed here in plain Python; p-values from scipy on those expected lists."""

from __future__ import annotations

import json
import statistics

import pytest
from scipy.stats import mannwhitneyu

from conftest import FORMATS
from test_iterations import warmup_truth
from gpuscope import __version__
from gpuscope.fixtures import scenarios_regression as R
from gpuscope.fixtures.truth import expressed, merge, time_shift
from gpuscope.tools.analyses import regression as G
from gpuscope.tools.model.errors import ProfileError

GATE = R.SCENARIOS


@pytest.fixture(scope="module")
def opened(open_profile):
    return lambda name, fmt: open_profile(name, fmt, scenarios=GATE)


def truth(name: str, fmt: str) -> dict:
    """Steps, warm-up, per-step figures and device totals of a gate scenario, from the scenario itself."""
    s = expressed(GATE[name](), fmt)
    steps = sorted((m for m in s.markers if m.name.startswith("ProfilerStep#")), key=lambda m: m.start_ns)
    walls = [m.end_ns - m.start_ns for m in steps]
    warm = warmup_truth(walls)
    per_kernel: dict[str, list[int]] = {}
    busy = []
    for i, m in enumerate(steps):
        inside = [k for k in s.kernels if m.start_ns <= k.start_ns < m.end_ns]
        for k in inside:
            per_kernel.setdefault(k.short_name, [0] * len(steps))[i] += k.end_ns - k.start_ns
        clipped = [(max(k.start_ns, m.start_ns), min(k.end_ns, m.end_ns)) for k in s.kernels
                   if k.start_ns < m.end_ns and k.end_ns > m.start_ns]
        busy.append(sum(e - b for b, e in merge(clipped)))
    groups = {}
    for k in s.kernels:
        c, t = groups.get(k.short_name, (0, 0))
        groups[k.short_name] = (c + 1, t + k.end_ns - k.start_ns)
    dev_busy = sum(e - b for b, e in merge([(k.start_ns, k.end_ns) for k in s.kernels]))
    dev_total = max(k.end_ns for k in s.kernels) - min(k.start_ns for k in s.kernels)
    steady = [i for i in range(len(steps)) if i not in warm]
    return {"s": s, "steps": steps, "walls": walls, "warm": warm, "steady": steady, "per_kernel": per_kernel,
            "busy": busy, "idle": [w - b for w, b in zip(walls, busy)], "groups": groups, "dev_busy": dev_busy,
            "dev_total": dev_total}


# ------------------------------------------------------------------------------------------ baseline


@pytest.mark.parametrize("fmt", FORMATS)
def test_baseline_records_the_generators_figures(opened, fmt):
    t = truth("gate_base", fmt)
    b = G.save_baseline(opened("gate_base", fmt))
    assert b.schema_name == "gpuscope-baseline" and b.schema_version == G.SCHEMA_VERSION and b.gpuscope_version == __version__
    assert b.profile.format == fmt and b.profile.size_bytes > 0 and len(b.profile.content_key) == 32
    it = b.iterations
    assert it.how == "ProfilerStep" and it.pattern == "ProfilerStep#<N>" and it.pid == R.PID and it.marker is None
    shift = time_shift(t["s"], fmt)
    assert [(st.name, st.start_ns, st.wall_ns) for st in it.steps] == [
        (m.name, m.start_ns + shift, m.end_ns - m.start_ns) for m in t["steps"]]
    assert [st.wall_ns for st in it.steps] == [w * 1_000 for w in R.BASE_WALLS_US]
    assert [st.warmup for st in it.steps] == [i in t["warm"] for i in range(13)] and t["warm"] == [0]
    assert [st.gpu_busy_ns for st in it.steps] == t["busy"]
    assert [st.gpu_idle_ns for st in it.steps] == t["idle"]
    # step 1: gemm 300 µs + reduce 50 µs + elementwise 20 µs, back to back on one stream; wall 1,000 µs
    assert (it.steps[1].gpu_busy_ns, it.steps[1].gpu_idle_ns) == (370_000, 630_000)
    groups = {g.short_name: g for g in b.kernel_groups}
    assert {n: (g.count, g.total_ns) for n, g in groups.items()} == t["groups"]
    assert {n: g.per_step_ns for n, g in groups.items()} == t["per_kernel"]
    assert groups["gemm_kernel"].per_step_ns == [g * 1_000 for g in R.BASE_GEMM_US]
    assert groups["gemm_kernel"].total_ns == 4_010_000 and groups["reduce_kernel"].total_ns == 13 * 50_000
    assert [(d.device_id, d.busy_ns, d.total_ns, d.idle_ns) for d in b.devices] == [
        (0, t["dev_busy"], t["dev_total"], t["dev_total"] - t["dev_busy"])]


def test_baseline_round_trips_through_json(opened, tmp_path):
    b = G.save_baseline(opened("gate_base", "nsys"))
    path = tmp_path / "b.json"
    path.write_text(json.dumps(b.model_dump(mode="json")))
    assert G.load_baseline(path) == b
    data = b.model_dump(mode="json")
    data["kernel_groups"][0]["per_step_ns"].pop()  # a hand-edited file: one step short
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="damaged \\(kernel per_step_ns do not match its 13 steps\\)"):
        G.load_baseline(path)


def test_baseline_refuses_more_per_step_figures_than_it_holds(opened, monkeypatch):
    # 13 steps x (3 kernel groups + the step itself): 52 figures. A budget one short refuses, with what to do, instead of
    # writing a file the loader would refuse (or, at 250,000 steps, computing for minutes).
    groups = len(truth("gate_base", "nsys")["groups"])
    monkeypatch.setattr(G, "MAX_STEP_FIGURES", 13 * (groups + 1) - 1)
    with pytest.raises(ProfileError, match=f"too many per-step figures to record or compare: 13 steps of 'ProfilerStep#<N>' x "
                                           f"{groups} kernel groups .*Pass marker="):
        G.save_baseline(opened("gate_base", "nsys"))
    monkeypatch.setattr(G, "MAX_STEP_FIGURES", 13 * (groups + 1))
    assert len(G.save_baseline(opened("gate_base", "nsys")).iterations.steps) == 13


def test_baseline_without_steps_keeps_totals(opened):
    b = G.save_baseline(opened("gate_no_steps", "nsys"))
    assert b.iterations is None and "annotation ranges" in b.iterations_absent
    assert {g.short_name: (g.count, g.total_ns, g.per_step_ns) for g in b.kernel_groups} == {
        n: (c, tot, None) for n, (c, tot) in truth("gate_base", "nsys")["groups"].items()}
    # a marker the caller asked for must be there: no silent baseline without steps
    with pytest.raises(ProfileError, match="no baseline written: .*no annotation ranges"):
        G.save_baseline(opened("gate_no_steps", "nsys"), marker="step_<N>")
    with pytest.raises(ProfileError, match="no baseline written: no annotation range matches marker='step_<N>'"):
        G.save_baseline(opened("gate_base", "nsys"), marker="step_<N>")


# ------------------------------------------------------------------------------------------ check


def _check(opened, base: str, cand: str, fmt: str, *specs: str, **kw) -> G.CheckResult:
    return G.check_regression(opened(cand, fmt), G.save_baseline(opened(base, fmt)), list(specs), **kw)


def _steady(t: dict, key: str, name: str | None = None) -> list[int]:
    values = t["per_kernel"][name] if key == "kernel" else t[key]
    return [values[i] for i in t["steady"]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_identical_profile_passes(opened, fmt):
    r = _check(opened, "gate_base", "gate_base", fmt, "step_time:+5%", "kernel:gemm*:+10%", "gpu_busy:+5%", "gpu_idle:+5%")
    assert (r.verdict, r.exit_code) == ("pass", 0)
    assert [(m.metric, m.baseline_ns, m.candidate_ns, m.change_pct, m.verdict) for m in r.metrics] == [
        ("step_time", 1_000_000, 1_000_000, 0.0, "pass"), ("kernel", 300_000, 300_000, 0.0, "pass"),
        ("gpu_busy", 370_000, 370_000, 0.0, "pass"), ("gpu_idle", 630_000, 630_000, 0.0, "pass")]
    assert all(m.baseline_n == m.candidate_n == 12 and m.samples == "per_step" and m.p_value > 0.05 for m in r.metrics)
    assert r.metrics[1].matched_groups == ["gemm_kernel"]
    assert "same content key" in " ".join(r.notes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_step_ten_percent_slower_fails(opened, fmt):
    base, slow = truth("gate_base", fmt), truth("gate_slower", fmt)
    r = _check(opened, "gate_base", "gate_slower", fmt, "step_time:+5%", "kernel:gemm*:+10%")
    assert (r.verdict, r.exit_code) == ("regression", 1)
    st, gemm = r.metrics
    b, c = _steady(base, "walls"), _steady(slow, "walls")
    assert c == [w * 11 // 10 for w in b]
    assert (st.baseline_ns, st.candidate_ns) == (statistics.median(b), statistics.median(c)) == (1_000_000, 1_100_000)
    assert st.change_pct == 10.0 and st.verdict == "regression" and "step_time" in st.spec
    assert st.p_value == float(f"{mannwhitneyu(c, b, alternative='greater').pvalue:.4g}") and st.p_value < 0.001
    assert gemm.verdict == "pass" and gemm.change_pct == 0.0
    md = r.markdown
    assert "FAIL: regression (1 of 2 metrics)" in md and "Mann-Whitney" in md
    assert "| step_time (median/step) | 1,000,000 ns (1.000 ms) | 1,100,000 ns (1.100 ms) | +10.00 % | +5 % |" in md
    assert "**REGRESSION**" in md.split("step_time (median/step)")[1].split("\n")[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_one_outlier_step_passes(opened, fmt):
    base, out = truth("gate_base", fmt), truth("gate_outlier", fmt)
    r = _check(opened, "gate_base", "gate_outlier", fmt, "step_time:+5%")
    (st,) = r.metrics
    c = _steady(out, "walls")
    assert c == [w * 3 if i == R.OUTLIER_STEP else w for i, w in zip(base["steady"], _steady(base, "walls"))]
    assert (st.baseline_ns, st.candidate_ns) == (1_000_000, statistics.median(c)) == (1_000_000, 1_005_000)
    assert st.change_pct == 0.5 and st.p_value == float(f"{mannwhitneyu(c, _steady(base, 'walls'), alternative='greater').pvalue:.4g}")
    assert (st.verdict, r.exit_code) == ("pass", 0)
    # the mean would have moved 16.7 %: a mean-based gate fails this build
    assert statistics.fmean(c) / statistics.fmean(_steady(base, "walls")) > 1.15


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_glob_regression(opened, fmt):
    base, slow = truth("gate_base", fmt), truth("gate_gemm_slower", fmt)
    r = _check(opened, "gate_base", "gate_gemm_slower", fmt, "step_time:+5%", "kernel:gemm*:+10%", "kernel:*reduce*:+10%")
    st, gemm, red = r.metrics
    b, c = _steady(base, "kernel", "gemm_kernel"), _steady(slow, "kernel", "gemm_kernel")
    assert c == [g * 6 // 5 for g in b]
    assert (gemm.baseline_ns, gemm.candidate_ns, gemm.change_pct) == (300_000, 360_000, 20.0)
    assert gemm.verdict == "regression" and gemm.matched_groups == ["gemm_kernel"] and gemm.p_value < 0.001
    assert st.verdict == "pass" and red.verdict == "pass" and red.matched_groups == ["reduce_kernel"]
    assert (r.verdict, r.exit_code) == ("regression", 1)


def test_too_few_steps_fall_back_to_the_median_rule(opened):
    base = G.save_baseline(opened("gate_base", "nsys"))
    base.iterations.steps = base.iterations.steps[:4]  # warm-up + 3 steady steps
    r = G.check_regression(opened("gate_slower", "nsys"), base, ["step_time:+5%"])
    (st,) = r.metrics
    assert st.baseline_n == 3 and st.candidate_n == 12 and st.p_value is None
    assert "too few steady steps" in st.test and f">= {G.MIN_STEPS}" in st.test
    assert (st.baseline_ns, st.candidate_ns, st.verdict) == (1_000_000, 1_100_000, "regression")


def test_no_steps_on_either_side_compares_totals(opened):
    t = truth("gate_base", "nsys")
    r = _check(opened, "gate_no_steps", "gate_no_steps", "nsys", "kernel:gemm*:+10%", "gpu_busy:+5%", "step_time:+5%")
    gemm, busy, st = r.metrics
    assert gemm.samples == "profile_total" and (gemm.baseline_ns, gemm.candidate_ns) == (4_010_000, 4_010_000)
    assert gemm.baseline_ns == t["groups"]["gemm_kernel"][1] and gemm.p_value is None and "no noise test" in gemm.test
    assert busy.samples == "profile_total" and busy.baseline_ns == t["dev_busy"] and busy.verdict == "pass"
    assert st.verdict == "cannot_compare" and "baseline has none" in st.reason
    assert (r.verdict, r.exit_code) == ("cannot_compare", 2)
    assert any("record steps" in n and "--marker" in n for n in r.notes)


def test_candidate_without_steps_cannot_be_compared(opened):
    r = _check(opened, "gate_base", "gate_no_steps", "nsys", "step_time:+5%", "kernel:gemm*:+10%")
    assert [m.verdict for m in r.metrics] == ["cannot_compare", "cannot_compare"] and r.exit_code == 2
    assert "candidate has none" in r.metrics[0].reason
    assert any(n.startswith("the candidate has no iterations") and "prof.step()" in n for n in r.notes)


def test_regression_outranks_cannot_compare(opened):
    r = _check(opened, "gate_base", "gate_slower", "nsys", "step_time:+5%", "kernel:nosuch*:+5%")
    assert [m.verdict for m in r.metrics] == ["regression", "cannot_compare"] and r.exit_code == 1
    assert "no kernel short name matches 'nosuch*'" in r.metrics[1].reason and "gemm_kernel" in r.metrics[1].reason


def test_new_kernel_in_the_candidate_is_a_regression(opened):
    base = G.save_baseline(opened("gate_base", "nsys"))
    base.kernel_groups = [g for g in base.kernel_groups if g.short_name != "reduce_kernel"]
    (red,) = G.check_regression(opened("gate_base", "nsys"), base, ["kernel:reduce*:+50%"]).metrics
    assert (red.baseline_ns, red.candidate_ns, red.change_pct, red.verdict) == (0, 50_000, None, "regression")


def test_version_mismatch_needs_permission(opened):
    base = G.save_baseline(opened("gate_base", "nsys"))
    base.gpuscope_version = "0.0.1"
    with pytest.raises(ProfileError, match="gpuscope 0.0.1.*Re-save the baseline.*--allow-version-mismatch"):
        G.check_regression(opened("gate_base", "nsys"), base, ["step_time:+5%"])
    r = G.check_regression(opened("gate_base", "nsys"), base, ["step_time:+5%"], allow_version_mismatch=True)
    assert r.exit_code == 0 and any("0.0.1" in n for n in r.notes)


def test_untrusted_kernel_names_are_escaped_in_the_markdown(opened):
    base = G.save_baseline(opened("gate_base", "nsys"))
    evil = "evil\x1b[2J\n| fake | row |\u202e`"
    base.kernel_groups.append(base.kernel_groups[0].model_copy(update={"short_name": evil}))
    r = G.check_regression(opened("gate_base", "nsys"), base, ["kernel:evil*:+5%"])
    assert r.metrics[0].matched_groups == [evil]  # structured results keep the raw text
    assert "\x1b" not in r.markdown and "\u202e" not in r.markdown and "\n| fake" not in r.markdown
    assert "evil\\u001b[2J\\u000a\\| fake \\| row \\|\\u202e'" in r.markdown


# ------------------------------------------------------------------------------------------ files and grammar


@pytest.mark.parametrize("content,words", [
    ("garbage", "is not JSON"), ("[1, 2]", "is not a gpuscope baseline"), ('{"schema_name": "x"}', "not a gpuscope baseline"),
    ('{"schema_name": "gpuscope-baseline", "schema_version": 99}', "schema_version 99; this gpuscope"),
    ('{"schema_name": "gpuscope-baseline", "schema_version": 1}', "is damaged"),
])
def test_unusable_baselines_say_what_to_do(tmp_path, content, words):
    path = tmp_path / "b.json"
    path.write_text(content)
    with pytest.raises(ProfileError, match="Re-create it with `gpuscope baseline save PROFILE -o FILE`") as exc:
        G.load_baseline(path)
    assert words in str(exc.value)
    with pytest.raises(ProfileError, match="baseline: No such file"):
        G.load_baseline(tmp_path / "missing.json")


def test_a_profile_or_a_pipe_given_as_the_baseline_is_refused_without_a_class_name(tmp_path):
    """The corpus passes every argument a profile path: a SQLite file is not UTF-8; a FIFO must not block."""
    import os
    import re

    sqlite = tmp_path / "trace.sqlite"
    sqlite.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 8)
    with pytest.raises(ProfileError) as exc:
        G.load_baseline(sqlite)
    assert "not a gpuscope baseline" in str(exc.value) and "Re-create" in str(exc.value)
    assert not re.search(r"\b[A-Z][A-Za-z0-9]*(Error|Exception)\b", str(exc.value))
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match="named pipe"):
        G.load_baseline(fifo)


@pytest.mark.parametrize("spec,parsed", [
    ("step_time:+5%", ("step_time", None, 5.0)), ("gpu_idle:12.5%", ("gpu_idle", None, 12.5)),
    ("kernel:gemm*:+10%", ("kernel", "gemm*", 10.0)), ("kernel:at::native::*:+3%", ("kernel", "at::native::*", 3.0)),
])
def test_fail_on_grammar(spec, parsed):
    th = G.parse_fail_on(spec)
    assert (th.metric, th.pattern, th.max_rise_pct) == parsed


@pytest.mark.parametrize("spec,words", [
    ("step_time", "expected METRIC[:PATTERN]:+N%"), ("latency:+5%", "expected METRIC"), ("step_time:+5", "expected METRIC"),
    ("step_time:-5%", "a fall never fails"), ("kernel:+5%", "kernel needs a pattern"), ("step_time:x*:+5%", "only kernel"),
])
def test_fail_on_grammar_errors(spec, words):
    with pytest.raises(ProfileError, match="--fail-on") as exc:
        G.parse_fail_on(spec)
    assert words in str(exc.value)


def test_the_baselines_marker_is_reused_by_check(opened):
    base = G.save_baseline(opened("gate_base", "nsys"), marker="ProfilerStep#*")
    assert (base.iterations.how, base.iterations.marker, len(base.iterations.steps)) == ("caller", "ProfilerStep#*", 13)
    r = G.check_regression(opened("gate_slower", "nsys"), base, ["step_time:+5%"])
    assert r.exit_code == 1 and (r.metrics[0].baseline_ns, r.metrics[0].candidate_ns) == (1_000_000, 1_100_000)
    # the candidate's own marker overrides it: a name that is not there leaves nothing to compare
    r = G.check_regression(opened("gate_slower", "nsys"), base, ["step_time:+5%"], marker="train_step_<N>")
    assert r.exit_code == 2 and any("no annotation range matches marker='train_step_<N>'" in n for n in r.notes)
