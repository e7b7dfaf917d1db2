"""The malformed-profile corpus (gpuscope.fixtures.malformed) through every per-profile MCP tool.

Each corpus file goes through every tool the server lists that takes a profile path, in-process over
an MCP client session, each call bounded by CALL_LIMIT_S (a hang fails the entry instead of
freezing CI). Every call must end in an answer or an isError result that says what to do, never a
traceback, an "internal error" or a raw exception class name; the file and its folder must be
unchanged afterwards; then the entry's own expectation holds (the figure it must answer, or the
words its refusal must hold). The bombs also run in a subprocess that checks peak memory.

GPUSCOPE_MAX_DECOMPRESSED_GB is SMALL_CAP_GB here so that the bombs are refused after 50 MB instead
of after half of the machine's memory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client

from gpuscope.fixtures.malformed import CORPUS, write_corpus
from gpuscope.fixtures.samples import ACTION_WORDS
from gpuscope.server.app import server

# A hang fails the entry after this long; a call on these small files takes well under a second
# (the limit leaves room for a machine shared with other test runs).
CALL_LIMIT_S = 10.0
SMALL_CAP_GB = "0.05"
BY_NAME = {e.name: e for e in CORPUS}
# Tool argument that names the profile -> how the file is passed. compare_traces gets it twice;
# rank_summary once, since it refuses a profile given twice before reading it.
PROFILE_ARGS = {"trace": lambda p: p, "path": lambda p: p, "traces": lambda p: [p], "baseline": lambda p: p,
                "candidate": lambda p: p}
# Required arguments other than the profile; call_stack requires one of kernel / op, neither in the schema.
OTHER_ARGS = {"op": "aten::mm", "kernel": "k", "sql": "SELECT count(*) FROM kernels", "table": "kernels"}
ONE_OF = {"call_stack": {"kernel": "k"}}
ISSUES_SQL = "SELECT coalesce(sum(rows), 0) FROM data_issues"
# A raw exception class name (ValueError, OutOfMemoryException, ...). Linear in the text: the outputs
# hold names of up to 64k characters, which a nested quantifier would backtrack over for minutes.
CLASS_NAME = re.compile(r"\b[A-Z][A-Za-z0-9]*(?:Error|Exception|Exit|Interrupt)\b")
# A refusal says what to do: the shared action words, or an imperative about the call's arguments.
ACTIONABLE = ACTION_WORDS + ("supply", "give ", "set ", "raise", "remove", "close", "annotate", "record", "open ",
                             "capture")


def test_corpus_is_large_and_varied():
    kinds = {e.expect for e in CORPUS}
    assert len(CORPUS) >= 100 and kinds == {"answers", "clear_error", "either"}
    assert sum(e.bomb for e in CORPUS) >= 5
    for e in CORPUS:
        assert e.expect == "answers" or e.words, f"{e.name}: a refusal needs the words it must hold"


class _Session:
    """One MCP client session on a daemon thread's event loop. call() waits at most `limit` seconds:
    a call stuck in a worker thread (a FIFO opened for reading blocks for ever) is abandoned, and
    the daemon thread keeps it from holding up the end of the test run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.queue: asyncio.Queue | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),), daemon=True).start()
        if not self.ready.wait(60):
            raise RuntimeError(f"the MCP session did not start: {self.error!r}")

    async def _serve(self) -> None:
        try:
            self.queue = asyncio.Queue()
            async with Client(server) as client:
                self.client = client
                self.tools = await server.list_tools()
                self.ready.set()
                async with anyio.create_task_group() as tg:
                    while (item := await self.queue.get()) is not None:
                        tg.start_soon(self._one, *item)
                    tg.cancel_scope.cancel()
        except BaseException as exc:  # surfaced by __init__ / call
            self.error = exc
            self.ready.set()

    async def _one(self, tool: str, args: dict, fut: concurrent.futures.Future) -> None:
        try:
            fut.set_result(await self.client.call_tool(tool, args))
        except Exception as exc:
            fut.set_exception(exc)

    def call(self, tool: str, args: dict, limit: float):
        done, hung = self.call_all([(tool, args)], limit)
        if hung:
            raise concurrent.futures.TimeoutError(tool)
        return done[tool]

    def call_all(self, calls: list[tuple[str, dict]], limit: float) -> tuple[dict, list[str]]:
        """Run the calls concurrently; return {tool: result} and the tools with no answer after `limit` s."""
        futs = {}
        for tool, args in calls:
            futs[tool] = concurrent.futures.Future()
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (tool, args, futs[tool]))
        concurrent.futures.wait(futs.values(), timeout=limit)
        hung = [t for t, f in futs.items() if not f.done()]
        return {t: f.result() for t, f in futs.items() if f.done()}, hung

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, None)


@pytest.fixture(scope="module")
def session():
    s = _Session()
    yield s
    s.close()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUSCOPE_MAX_DECOMPRESSED_GB", SMALL_CAP_GB)
        root = tmp_path_factory.mktemp("malformed")
        yield root, write_corpus(root)


def _calls(tools, path: str) -> list[tuple[str, dict]]:
    out = []
    for tool in tools:
        props = tool.input_schema.get("properties", {})
        args = {k: make(path) for k, make in PROFILE_ARGS.items() if k in props}
        if not args:
            continue  # get_guide, remote_context: no profile
        required = tool.input_schema.get("required", [])
        args.update({k: v for k, v in OTHER_ARGS.items() if k in required})
        args.update(ONE_OF.get(tool.name, {}))
        out.append((tool.name, args))
    return out


def _snapshot(folder: Path) -> dict:
    """Names, types and content hashes of what the entry's folder holds (links and FIFOs not followed)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        if stat.S_ISREG(st.st_mode):
            try:
                out[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
            except PermissionError:
                out[p.name] = (st.st_size, st.st_mtime_ns)
        else:
            out[p.name] = stat.S_IFMT(st.st_mode)
    return out


def _release_fifo(path: str) -> None:
    """Open the write end once per blocked reader so that a call stuck opening a FIFO returns."""
    try:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            return
    except (OSError, ValueError):
        return
    for _ in range(64):
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader left
                return
            raise
        time.sleep(0.01)


def _text(res) -> str:
    return "\n".join(getattr(c, "text", "") for c in res.content)


def _first_cell(res):
    rows = (res.structured_content or {}).get("rows") or [[None]]
    return rows[0][0]


@pytest.mark.parametrize("name", [e.name for e in CORPUS])
def test_corpus_entry(name, corpus, session):
    entry = BY_NAME[name]
    if entry.non_root and hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.skip("permissions are not enforced for root")
    root, paths = corpus
    path, folder = paths[name], root / name
    before = _snapshot(folder)
    problems: list[str] = []
    results: dict[str, object] = {}
    calls = sorted(_calls(session.tools, path), key=lambda c: c[0] != "trace_info")
    try:
        # trace_info alone first, so the profile is opened once; then every other tool at once.
        for batch in (calls[:1], calls[1:]):
            done, hung = session.call_all(batch, CALL_LIMIT_S)
            problems += [f"{tool}: no answer within {CALL_LIMIT_S:.0f} s (hang)" for tool in hung]
            results.update(done)
            if hung:
                break
    finally:
        _release_fifo(path)
    for tool, res in results.items():
        text = _text(res)
        low = text.lower()
        bad = next((w for w in ("traceback", "internal error") if w in low), None) or CLASS_NAME.search(text)
        if bad:
            problems.append(f"{tool}: {bad if isinstance(bad, str) else bad.group(0)!r} in {text[:600]!r}")
        if res.is_error:
            if not any(w in low for w in ACTIONABLE):
                problems.append(f"{tool}: refusal does not say what to do: {text[:400]!r}")
            if len(text) > 5000:
                problems.append(f"{tool}: refusal of {len(text)} characters")
    if _snapshot(folder) != before:
        problems.append(f"the folder changed: {before} -> {_snapshot(folder)}")
    problems += _expectation(entry, path, results, session)
    assert not problems, f"{name} ({entry.what}):\n  " + "\n  ".join(_grouped(problems))


def _grouped(problems: list[str]) -> list[str]:
    """One line per distinct problem, naming every tool that had it (the tools share one open)."""
    groups: dict[str, list[str]] = {}
    for p in problems:
        tool, _, rest = p.partition(": ")
        rest = re.sub(r"Error executing tool \w+: ", "", rest)
        rest = re.sub(r"(internal error in )[^(]+\(", r"\1<tool> (", rest)
        groups.setdefault(rest, []).append(tool)
    return [f"{', '.join(tools)}: {rest}" for rest, tools in groups.items()]


def _expectation(entry, path: str, results: dict, session) -> list[str]:
    """The entry's own expectation. A profile counts as opened when sql_query answers; an opened
    profile must give the kernel count the fixture kept (and count its bad rows), an unopened one
    must be refused by every tool in words that name the damage."""
    if "trace_info" not in results or "sql_query" not in results:
        return []  # a hang was reported already
    info, sql = results["trace_info"], results["sql_query"]
    opened = not sql.is_error
    if entry.expect == "answers" and (info.is_error or not opened):
        return [f"expected an answer, trace_info says: {_text(info)[:500]!r}; sql_query says: {_text(sql)[:300]!r}"]
    if entry.expect != "clear_error" and opened:
        out = []
        if entry.kernels is not None and _first_cell(sql) != entry.kernels:
            out.append(f"kernels: expected {entry.kernels}, got {_first_cell(sql)!r}")
        if entry.issues:
            res = session.call("sql_query", {"trace": path, "sql": ISSUES_SQL}, CALL_LIMIT_S)
            got = _text(res)[:300] if res.is_error else _first_cell(res)
            if res.is_error or got < entry.issues:
                out.append(f"data_issues: expected at least {entry.issues} skipped or repaired rows counted, got {got!r}")
        return out
    out = [f"expected a refusal, {t} answered" for t, r in results.items() if not r.is_error and t != "list_traces"]
    for tool, res in results.items():
        if tool == "list_traces" or not res.is_error:  # list_traces lists folders; its refusal need not name the damage
            continue
        text = _text(res)
        for group in entry.words:
            options = group if isinstance(group, tuple) else (group,)
            if not any(w.lower() in text.lower() for w in options):
                out.append(f"{tool}: refusal lacks any of {options}: {text[:500]!r}")
                break
    return out


# -- peak memory on the bombs, in a fresh process ----------------------------------------------------
# Ceiling on peak RSS growth while one bomb is opened, above the RSS of the process after its imports:
# GPUSCOPE_MEMORY_LIMIT (what the json.loads fallback may take) + 256 MB for staging buffers (the
# head read of at most 64 MB and its decoded copies, the 4 MB tail window, 8 MB blocks) and DuckDB's
# parse of at most the decompression cap.
BOMB_MEMORY_LIMIT = 256 * 10**6
BOMB_CEILING = BOMB_MEMORY_LIMIT + 256 * 10**6

_MEASURE = r"""
import json, sys
from gpuscope.fixtures.malformed import peak_rss_bytes, reset_peak_rss
from gpuscope.tools.model.errors import ProfileError
from gpuscope.tools.model.trace import load_trace
out = {}
for name, path in json.loads(sys.argv[1]).items():
    if not reset_peak_rss():
        sys.exit("cannot reset VmHWM")
    rss = int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmRSS:'))) * 1024
    try:
        trace = load_trace(path)
        outcome = ["answers", trace.count("kernels")]
        trace.close()
    except ProfileError as exc:
        outcome = ["refused", str(exc)]
    out[name] = {"outcome": outcome, "grew": peak_rss_bytes() - rss}
print(json.dumps(out))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to measure peak RSS")
def test_bombs_peak_memory(corpus):
    bombs = {e.name: corpus[1][e.name] for e in CORPUS if e.bomb}
    env = {**os.environ, "GPUSCOPE_MAX_DECOMPRESSED_GB": SMALL_CAP_GB, "GPUSCOPE_MEMORY_LIMIT": str(BOMB_MEMORY_LIMIT)}
    run = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(bombs)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    measured = json.loads(run.stdout)
    for name, m in measured.items():
        e = BY_NAME[name]
        assert m["grew"] < BOMB_CEILING, f"{name}: peak RSS grew {m['grew'] / 1e6:.0f} MB"
        kind, detail = m["outcome"]
        if e.expect == "answers":
            assert (kind, detail) == ("answers", e.kernels), (name, m)
        else:
            assert kind == "refused" and any(w in detail for w in e.words[0]), (name, m)
