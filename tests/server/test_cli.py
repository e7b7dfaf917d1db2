"""`gpuscope` command line: readable text, `--json` equal to the analyses, clean failures (exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import duckdb
import pytest

from conftest import run_main
from gpuscope.tools import analyses as A
from gpuscope.tools.model.cache import open_trace


from gpuscope.fixtures import samples as H
GPUSCOPE = H.VENV_BIN / "gpuscope"


def _expected(profile: Path, command: str, **kw) -> dict:
    if command == "list-traces":
        return A.list_traces(str(profile), **kw).model_dump(mode="json")
    fn = {"trace-info": A.trace_info, "top-kernels": A.top_kernels, "gap-histogram": A.gap_histogram,
          "sql": A.sql_query, "list-tables": A.list_tables, "describe-table": A.describe_table}[command]
    return fn(open_trace(profile), **kw).model_dump(mode="json")


# (argv after the profile, title of the text output, facts the text must show, analysis kwargs for --json)
COMMANDS = [
    ("trace-info", [], "## Trace info", ["nsys", "kernels"], {}),
    ("top-kernels", ["--limit", "3"], "## Top kernels", ["gemm_kernel", f"{H.DEVICE0_GEMM_TOTAL_NS:,}"], {"limit": 3}),
    ("gap-histogram", [], "## GPU idle gaps", ["<10us", "1-10ms"], {}),
    ("sql", ["SELECT count(*) FROM kernels"], "## Query result", [str(H.TOTAL_KERNELS)],
     {"sql": "SELECT count(*) FROM kernels"}),
    ("list-tables", [], "## Tables", ["kernels", "native"], {}),
    ("describe-table", ["kernels"], "## Table", ["start_ns", "short_name"], {"table": "kernels"}),
]


@pytest.fixture(scope="module")
def nsys_profile(profiles) -> Path:
    return profiles["nsys"]


@pytest.mark.parametrize("command,extra,title,facts,kwargs", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_text_and_json(capsys, nsys_profile, command, extra, title, facts, kwargs):
    code, out, err = run_main(capsys, command, str(nsys_profile), *extra)
    assert code == 0, err
    assert out.startswith(title), out[:200]
    for fact in facts:
        assert fact in out, f"{fact!r} missing from `gpuscope {command}` output:\n{out}"
    assert not out.lstrip().startswith("{")  # text mode is not JSON

    code, out, err = run_main(capsys, command, str(nsys_profile), *extra, "--json")
    assert code == 0, err
    got = json.loads(out)
    want = _expected(nsys_profile, command, **kwargs)
    assert got == want


def test_sql_json_numbers(capsys, nsys_profile):
    code, out, _ = run_main(capsys, "sql", str(nsys_profile), "SELECT count(*) AS n FROM kernels", "--json")
    assert code == 0
    assert json.loads(out)["rows"] == [[H.TOTAL_KERNELS]]


def test_top_kernels_options(capsys, nsys_profile):
    code, out, _ = run_main(capsys, "top-kernels", str(nsys_profile), "--device", "0", "--sort-by", "count",
                            "--group-by", "name", "--json")
    assert code == 0
    got = json.loads(out)
    assert got == _expected(nsys_profile, "top-kernels", device=0, sort_by="count", group_by="name")
    assert {k["device_id"] for k in got["kernels"]} == {0}


def test_list_traces(capsys, profiles):
    folder = profiles["nsys"].parent
    code, out, err = run_main(capsys, "list-traces", str(folder))
    assert code == 0, err
    assert out.startswith("## Profiles")
    for p in profiles.values():
        assert p.name in out
    code, out, _ = run_main(capsys, "list-traces", str(folder), "--json")
    assert code == 0
    got = json.loads(out)
    assert got == _expected(folder, "list-traces")
    assert {Path(t["path"]).name for t in got["traces"]} >= {p.name for p in profiles.values()}


@pytest.mark.parametrize("case", ["missing", "directory", "text", "truncated_sqlite", "corrupt_json_gz",
                                  "truncated_json", "empty"])
def test_bad_files_exit_2(capsys, bad_inputs, case):
    path, words = bad_inputs[case]
    code, out, err = run_main(capsys, "trace-info", str(path))
    assert code == 2
    assert out == ""
    assert err.startswith("gpuscope: ")
    H.assert_message(err, words)


def test_bad_requests_exit_2(capsys, nsys_profile):
    code, _, err = run_main(capsys, "describe-table", str(nsys_profile), "nope")
    assert code == 2 and "unknown table" in err
    code, _, err = run_main(capsys, "sql", str(nsys_profile), "DELETE FROM kernels")
    assert code == 2 and "SELECT" in err
    code, _, err = run_main(capsys, "top-kernels", str(nsys_profile), "--device", "42")
    assert code == 2 and "device 42" in err
    code, out, err = run_main(capsys, "roofline", str(nsys_profile), "--device", "0", "--kernel-flops", "[1]")
    assert code == 2 and out == "" and "must be JSON objects" in err
    # /proc takes no new files, even for root: the write fails and the CLI says where, without a traceback.
    code, out, err = run_main(capsys, "report", str(nsys_profile), "--xlsx", "/proc/gpuscope-test.xlsx")
    assert code == 2 and out == "" and err.startswith("gpuscope: ") and "/proc" in err and "Traceback" not in err


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(GPUSCOPE), *argv], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not GPUSCOPE.exists(), reason="gpuscope console script not installed in .venv")
def test_console_script(nsys_profile, tmp_path):
    res = _run("top-kernels", str(nsys_profile), "--limit", "3")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("## Top kernels") and "gemm_kernel" in res.stdout
    res = _run("trace-info", str(nsys_profile), "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["counts"]["kernels"] == H.TOTAL_KERNELS and info["format"] == "nsys"

    missing = tmp_path / "nope.sqlite"
    res = _run("trace-info", str(missing))
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.startswith("gpuscope: No such file") and str(missing) in res.stderr
    assert "Traceback" not in res.stderr

    res = _run("--version")
    assert res.returncode == 0 and res.stdout.startswith("gpuscope ")


def test_roofline_plot_without_matplotlib_fails_clearly(capsys, tmp_path, write_profile):
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib installed: the chart is written (tests/analyses/test_roofline.py)")
    from gpuscope.fixtures.scenarios_diagnose import SCENARIOS as SD

    trace = write_profile("compute_bound", "kineto", scenarios=SD)
    code, _, err = run_main(capsys, "roofline", str(trace), "--plot", str(tmp_path / "r.png"))
    assert code == 2 and "no chart written" in err and "pip install" in err and "Traceback" not in err
    assert not (tmp_path / "r.png").exists()


@pytest.mark.parametrize("error", [MemoryError(), duckdb.OutOfMemoryException(
    "Out of Memory Error: could not allocate block\n\nPossible solutions:\n* Reducing the number of threads (SET threads=X)")])
def test_out_of_memory_is_a_clear_error(capsys, monkeypatch, nsys_profile, error):
    from gpuscope.server import cli

    def exhausted(*args, **kwargs):
        raise error

    monkeypatch.setitem(cli.COMMANDS, "top-kernels", (exhausted, *cli.COMMANDS["top-kernels"][1:]))
    code, out, err = run_main(capsys, "top-kernels", str(nsys_profile))
    assert code == 2 and out == ""
    H.assert_message(err, ["out of memory", "window", "GPUSCOPE_MEMORY_LIMIT"])
    assert "Traceback" not in err and "SET " not in err and " MiB) in the server's environment" in err
