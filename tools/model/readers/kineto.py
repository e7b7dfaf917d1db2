"""PyTorch profiler (Kineto) Chrome-trace JSON → trace model.

DuckDB parses the events: the reader finds the `traceEvents` array in the file (the few top-level
keys around it are parsed with the stdlib), copies just the array bytes into private temporary
files (decompressing .json.gz on the way), cut between events into parts that read_json parses
one thread each, into one table in file order, converting times and ids in the same scan.
Everything else - category aliases, args fields, linking, device/process resolution - is DuckDB
SQL over that table. Files that do not fit that path (odd layout, values DuckDB will not convert,
invalid JSON) go through json.loads instead, which also produces the error messages for broken
files; both paths feed the same SQL.

Besides the model tables this creates the view `native.events` (over the table native.event_store):
one row per traceEvents entry, idx = position in the file, args as JSON text - for sql_query users
who need something the model does not carry.

`preview` answers the first top_kernels of a large trace while its store builds (model/trace.py): the
same staging, read_json call and SQL, into memory, keeping only what the kernels derive from.
"""

from __future__ import annotations

import atexit
import codecs
import gc
import gzip
import json
import math
import os
import re
import shutil
import tempfile
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from itertools import repeat
from json.decoder import scanstring
from json.encoder import c_make_encoder, encode_basestring
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from ..detect import GZIP_MAGIC, detect, gzip_isize
from ..errors import NoPreview, ProfileError, shown_path
from ..limits import max_decompressed_bytes, memory_limit_bytes, memory_limit_now, scratch_dir, setting
from ..names import create_short_names
from ..quote import quote_literal
from ..quality import check_model, count_sql, record_query
from ..store import content_key

# Pre-2022 category names (and the 2022 gpu_user_Annotation typo) → current ActivityType names.
CAT_ALIASES = {
    "Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset", "gpu_user_Annotation": "gpu_user_annotation",
}
# Kineto of PyTorch 1.8-1.9 wrote every record_function range as 'Operator', prof.step()'s
# ProfilerStep#N included; later traces give those 'user_annotation'. Only the step ranges have a
# name fixed by PyTorch, so only they become annotations (other user ranges stay cpu_ops, as in
# TensorBoard's profiler plugin).
STEP_PREFIX = "ProfilerStep#"
FLOW_CATS = ("ac2g", "async", "async_gpu", "async_cpu_to_gpu")  # launch flows, 2022 name first
GPU_OP_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
GPU_CATS = GPU_OP_CATS + ("gpu_user_annotation",)
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
CPU_CATS = ("cpu_op", "python_function", "user_annotation", "cpu_instant_event") + RUNTIME_CATS
COPY_KINDS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA")
# cpu_op args lifted into their own cpu_ops columns; the rest stays in cpu_ops.args.
CPU_OP_LIFTED = ("External id", "Sequence number", "Input Dims", "Input type", "Input Strides", "Concrete Inputs")
OLD_DIMS = "Input dims"  # PyTorch 1.8's spelling of Input Dims

# One reusable C encoder: json.dumps builds a new one per call, which doubles the cost per event.
_encode = c_make_encoder(None, None, encode_basestring, None, ": ", ", ", False, False, True)

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_HEAD_BYTES = 1 << 20      # first read for the keys before traceEvents (grown up to _HEAD_MAX)
_HEAD_MAX = 64 << 20
_TAIL_BYTES = 4 << 20      # the keys after traceEvents must fit in this much of the file's end
_CHUNK = 8 << 20           # gzip streaming block
# No profiler writes args nested more than a few levels (Input Dims: a list of lists). Far deeper
# values crash DuckDB's recursive JSON functions (json_merge_patch on 300k nested objects) and
# exhaust json.loads' recursion limit (~1000), so both readers refuse past this depth.
MAX_NESTING = 256


def _json(value) -> str | None:
    return None if value is None else "".join(_encode(value, 0))


class _Fallback(Exception):
    """The fast path does not apply to this file; parse it with json.loads instead."""


def load(con, path: Path, progress, detected) -> None:
    try:
        try:
            top = _load_duckdb(con, path, detected, progress)
            progress(0.7, "building the trace model")
            _build(con, top)
            return
        except duckdb.OutOfMemoryException:  # json.loads needs several times more: say what ran out
            raise ProfileError(_out_of_memory(path, "building the trace model from its events")) from None
        except (_Fallback, duckdb.Error, ValueError, RecursionError):
            _reset(con)  # anything unexpected: the json.loads path decides (and words any error)
        top = _load_python(con, path, detected, progress)
        progress(0.7, "building the trace model")
        _build(con, top)
    finally:
        _drop_temp(con)


_FILLED = ("trace_meta", "devices", "processes", "threads", "kernels", "memops", "api_calls", "markers", "cpu_ops",
           "memory_events", "data_issues")


def _drop_temp(con) -> None:
    con.execute("DROP VIEW IF EXISTS kin_ev")
    for table in ("kin_gpu", "kin_rt", "kin_meta", "kin_names", "kin_pids", "kin_piddev", "kin_link", "kin_evid", "kin_mem"):
        con.execute(f"DROP TABLE IF EXISTS {table}")


def _reset(con) -> None:
    """Undo a fast-path attempt before the json.loads path runs."""
    _drop_temp(con)
    con.execute("DROP VIEW IF EXISTS native.events")
    con.execute("DROP TABLE IF EXISTS native.event_store")
    for table in _FILLED:
        con.execute(f"DELETE FROM {table}")


# --------------------------------------------------------------------------- the first answer while the store builds

PREVIEW_MIN_BYTES = 64 << 20  # smaller traces build their store in about a second: no preview
# Raw category names (current and legacy) of the events whose name and args the preview reads: GPU ops and annotations
# (kin_gpu, kin_piddev), runtime calls (kin_rt: launch links, the launch check, graph launches) and cuda_sync records
# (the calls' event ids). Of every other complete event it reads ph, cat, pid, tid, ts and dur only.
PREVIEW_CATS = GPU_CATS + RUNTIME_CATS + ("cuda_sync",) + tuple(k for k, v in CAT_ALIASES.items() if v in GPU_CATS + RUNTIME_CATS)


def preview(con, path: Path, names: bool = True, streams: bool = True) -> None:
    """Fill the model tables top_kernels reads with the rows the full reader and check_model give them: kernels,
    devices, api_calls (what decides the launch check and graph replays), the kernels' data_issues and trace_meta's
    capture span. The same staging, read_json call and SQL as load(), without writing a store: native.event_store
    is held in memory with the name and args only of the events the kernels are derived from (PREVIEW_CATS), and
    of the model only what kernels need is built. The store's build repeats this work and the rest in the background.

    Raises NoPreview where load() would not take this path (a layout, values or entries only json.loads reads, an
    error it reports) and for a trace without kernels. The parts staged here (a .json.gz decompressed) are kept for
    the store's build that follows in this process (_Handoff), which parses them without staging again. `names` and `streams` (what the one question reads) change nothing here: the names and streams come with
    the kernel events the preview parses anyway."""
    try:
        top = _load_duckdb(con, path, detect(path), lambda *_: None, preview=True)
        cat = _cat_sql()
        _links(con, cat)
        _kernels(con)
        if not con.execute("SELECT count(*) FROM kernels").fetchone()[0]:
            raise NoPreview("no kernels")
        _api_calls(con, event_ids=False)
        _issues(con, cat, ("kernels",))
        _devices(con, top)
        span, _ = _capture(con)
        con.executemany("INSERT INTO trace_meta VALUES (?, ?)", [("format", "kineto"), *span])
        check_model(con)
    except (_Fallback, ProfileError, duckdb.Error, ValueError, RecursionError, OSError) as exc:
        raise NoPreview(f"{type(exc).__name__}: {exc}") from None
    finally:
        _drop_temp(con)


# --------------------------------------------------------------------------- event table

def _int_sql(x: str) -> str:
    """A JSON scalar (as text or DOUBLE) → BIGINT like the reader always did: numbers and numeric
    text count (fractions truncated), anything else is NULL."""
    return f"TRY_CAST(trunc(TRY_CAST({x} AS DOUBLE)) AS BIGINT)"


# |ts| and |dur| above this many µs (2^62 ns, the year 2116 as epoch time) are not times: ts + dur of two
# values below it still fits a BIGINT, so no end time can overflow.
US_LIMIT = 4.6e15


def _ns_sql(x: str) -> str:
    """µs (DOUBLE) → integer ns as round(us*1000), done on the integer and fractional parts
    separately so absolute integer µs (~1.7e15) stay exact and 3-decimal relative µs round to the
    written ns (half to even, like numpy.rint)."""
    return (f"CASE WHEN isfinite({x}) AND abs({x}) < {US_LIMIT} "
            f"THEN floor({x})::BIGINT * 1000 + round_even(({x} - floor({x})) * 1000, 0)::BIGINT END")


def _json_time_sql(x: str) -> str:
    """A ts/dur value read_json gave as JSON text → DOUBLE µs: NULL when absent or null, a number or numeric
    text as its value, anything else (true/false, a list, an object, 'abc') +inf, i.e. present but not a
    finite number. Read as DOUBLE, read_json would turn `true` into 1.0 and keep the event. (JSON, not
    VARCHAR: read_json writes a number as text about 10 % slower; a string's text is that of the JSON
    string with its quotes and escapes, which ->> '$' takes off.)"""
    text = f"CASE WHEN starts_with({x}, '\"') THEN {x} ->> '$' ELSE {x}::VARCHAR END"
    # A number (nearly every value) casts at once; a string's quotes and anything else fail that cast and go the long way.
    return f"coalesce(TRY_CAST({x}::VARCHAR AS DOUBLE), CASE WHEN {x} IS NULL THEN NULL ELSE coalesce(TRY_CAST({text} AS DOUBLE), 'inf'::DOUBLE) END)"


def _time_issue_sql() -> str:
    """Why a complete (ph X) event has no usable ts/dur, or NULL. The source relation writes NULL for
    an absent value and a non-finite DOUBLE for one that is present but not a number."""
    checks = []
    for x in ("ts", "dur"):
        checks += [f"WHEN {x} IS NULL THEN '{x} is missing'",
                   f"WHEN NOT isfinite({x}) THEN '{x} is not a finite number (NaN, Infinity or text)'",
                   f"WHEN abs({x}) >= {US_LIMIT} THEN '{x} is out of range (beyond ±4.6e15 us)'"]
    return f"CASE WHEN ph = 'X' THEN CASE {' '.join(checks)} END END"


def _create_store(con, source: str, params: list | None = None) -> None:
    """native.event_store from a relation with ph, cat, name, pid, tid (text or numbers), ts, dur
    (DOUBLE µs: NULL when absent, non-finite when not a number) and args (JSON text); rows in file
    order, so rowid is the event's index."""
    con.execute("CREATE SCHEMA IF NOT EXISTS native")
    con.execute(
        f"""CREATE TABLE native.event_store AS
            SELECT ph, cat, name, {_int_sql('pid')} AS pid, {_int_sql('tid')} AS tid,
                   {_ns_sql('ts')} AS ts_ns, {_ns_sql('dur')} AS dur_ns,
                   CASE WHEN starts_with(args, '{{') AND args <> '{{}}' THEN args END AS args,
                   {_time_issue_sql()} AS time_issue
            FROM {source}""",
        params,
    )


def _staging_folder() -> str:
    """A new private (0700) folder for a trace's staged parts, removed once they are parsed. It is in the process's
    scratch folder in the cache, so that parts left by a killed process (an MCP host stops its server with SIGTERM,
    which exits without cleaning up) go when the next process opens a store; 235 MB a time for the 245 MB bench
    trace piled up in /tmp before. A cache that cannot be written stages in the system's temp folder instead."""
    try:
        return tempfile.mkdtemp(prefix="kineto-", dir=scratch_dir())
    except (ProfileError, OSError):
        pass
    try:
        return tempfile.mkdtemp(prefix="gpuscope-kineto-")
    except OSError:
        raise _Fallback from None


def _load_duckdb(con, path: Path, detected, progress, preview: bool = False) -> dict:
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    kept = _staged.take(path) if not preview else None
    if kept is not None:
        tmp, files, top = kept
    else:
        tmp = _staging_folder()
    done = False
    try:
        if kept is None:
            progress(0.05, "locating traceEvents")
            try:
                files, top = _stage(path, detected, Path(tmp), int(threads))
            except ProfileError as exc:
                if preview:
                    _staged.keep(path, exc)  # the build would only unpack it again to say the same
                raise
        progress(0.3, "parsing events (DuckDB read_json)")
        try:
            try:
                _read_events(con, files, preview)
            except duckdb.Error as exc:
                if len(files) == 1 or isinstance(exc, duckdb.OutOfMemoryException):
                    raise
                # A cut between two parts that fell inside a string (no profiler writes '}, {' in a name, but text
                # may hold it) leaves a part that is not JSON: read the array whole, as one part.
                con.execute("DROP TABLE IF EXISTS native.event_store")
                files, top = _stage(path, detected, Path(tmp), 1)
                _read_events(con, files, preview)
        except (duckdb.OutOfMemoryException, MemoryError):
            # Not a reason to try json.loads, which needs several times more.
            raise ProfileError(_out_of_memory(path, "DuckDB's JSON reader")) from None
        done = True
    except MemoryError:
        raise ProfileError(_out_of_memory(path, "the staging step")) from None
    finally:
        if preview and done:
            _staged.keep(path, (tmp, files, top))  # for the store's build, which reads the same parts
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    n, blank = con.execute(
        """SELECT count(*), count(*) FILTER (WHERE ph IS NULL AND cat IS NULL AND name IS NULL AND pid IS NULL AND tid IS NULL
                                              AND ts_ns IS NULL AND dur_ns IS NULL AND args IS NULL AND time_issue IS NULL)
           FROM native.event_store"""
    ).fetchone()
    if not n:  # said here: json.loads would only say the same after reading it all again
        raise ProfileError(_empty_trace(path))
    if blank:
        # read_json turns a `null` entry into an all-NULL row, like `{}`: let json.loads tell them apart.
        raise _Fallback
    _check_nesting(con, path)
    return top


class _Handoff:
    """What staging the one trace a preview last read gave, kept for the store's build that follows it in this
    process: its parts, which the build parses again without decompressing a .json.gz a second time (or copying a
    plain trace's parts again), or the error that refused the file (a corrupt .json.gz, or one that decompresses past
    the cap), which the build raises without unpacking it again. Keyed by path and content identity, so a file
    rewritten in between is staged anew. At most one trace is kept; trace.py drops it once that build is over,
    whoever built the store, and what is left at exit goes then."""

    def __init__(self):
        self._lock = threading.Lock()
        # path, content key, then (folder, parts, top-level keys) or the ProfileError
        self._kept: tuple[str, str, tuple[str, list[Path], dict] | ProfileError] | None = None
        atexit.register(self.drop)

    def keep(self, path: Path, staged: tuple[str, list[Path], dict] | ProfileError) -> None:
        try:
            key = content_key(path)
        except OSError:
            key = None
        with self._lock:
            old, self._kept = self._kept, ((str(path), key, staged) if key is not None else None)
        for gone in (old, None if key is not None else (None, None, staged)):
            if gone is not None and isinstance(gone[2], tuple):
                shutil.rmtree(gone[2][0], ignore_errors=True)

    def take(self, path: Path) -> tuple[str, list[Path], dict] | None:
        """The staged parts kept for `path` (now the caller's to remove), None, or the kept error raised."""
        with self._lock:
            kept, self._kept = self._kept, None
        if kept is None:
            return None
        try:
            same = kept[0] == str(path) and kept[1] == content_key(path)
        except OSError:
            same = False
        staged = kept[2]
        if same and isinstance(staged, ProfileError):
            raise staged
        if same and all(p.exists() for p in staged[1]):
            return staged
        if isinstance(staged, tuple):
            shutil.rmtree(staged[0], ignore_errors=True)
        return None

    def drop(self, path: Path | None = None) -> None:
        """Let go of what is kept (for `path` only, when given)."""
        with self._lock:
            kept = self._kept
            if kept is None or (path is not None and kept[0] != str(path)):
                return
            self._kept = None
        if isinstance(kept[2], tuple):
            shutil.rmtree(kept[2][0], ignore_errors=True)


_staged = _Handoff()


def drop_staged(path: Path) -> None:
    """Called by trace.py when the store's build that followed a preview of `path` is over."""
    _staged.drop(path)


def _read_events(con, files: list[Path], preview: bool = False) -> None:
    """native.event_store from the staged parts of the traceEvents array, one thread per part: DuckDB parses
    one JSON array with one thread, and a second thread on the same array only adds hand-offs (up to 2x
    slower on a busy machine). The parts are read in their order, so rowid is still the index in the file."""
    events = """read_json(?, format = 'array',
                          columns = {'ph': 'VARCHAR', 'cat': 'VARCHAR', 'name': 'VARCHAR', 'pid': 'VARCHAR',
                                     'tid': 'VARCHAR', 'ts': 'JSON', 'dur': 'JSON', 'args': 'JSON'})"""
    if preview:
        # What preview() reads: complete and metadata events, the tid, name and args of metadata events and of
        # PREVIEW_CATS only, and every entry the blank-entry and nesting checks of _load_duckdb look at (entries
        # without ph, args that may nest too deep), so those decide as they do for load().
        # (list_contains, not IN: DuckDB evaluates a long IN list as a join, one for each place it is written.)
        detail = f"(ph IS DISTINCT FROM 'X' OR list_contains([{', '.join(map(quote_literal, PREVIEW_CATS))}], cat))"
        events = f"""(SELECT ph, cat, CASE WHEN {detail} THEN name END AS name, pid, CASE WHEN {detail} THEN tid END AS tid,
                             ts, dur, CASE WHEN {detail} OR {_deep_sql('args')} THEN args END AS args
                      FROM {events} WHERE ph IS NULL OR ph IN ('X', 'M') OR {_deep_sql('args')})"""
    with setting(con, "threads", len(files)):
        _create_store(
            con,
            f"""(SELECT ph, cat, name, pid, tid, {_json_time_sql('ts')} AS ts, {_json_time_sql('dur')} AS dur,
                       args::VARCHAR AS args
                FROM {events})""",
            [[str(f) for f in files]],
        )


def _check_nesting(con, path: Path) -> None:
    """Refuse a trace whose args nest deeper than MAX_NESTING before any JSON function walks them.
    Only args with more than MAX_NESTING opening brackets can be that deep: SQL picks those (none in
    real traces), numpy measures their depth outside strings. Such args are longer than MAX_NESTING
    bytes, a test that costs nothing next to counting the brackets of every args text."""
    cur = con.execute(f"SELECT rowid, args FROM native.event_store WHERE {_deep_sql('args')}")
    while rows := cur.fetchmany(256):
        for idx, args in rows:
            depth = _depth(args)
            if depth > MAX_NESTING:
                raise ProfileError(_too_deep(path, f"the args of traceEvents entry {idx} nest {depth} levels deep"))


def _deep_sql(x: str) -> str:
    """True for args text that may nest deeper than MAX_NESTING (_check_nesting measures those)."""
    # '[' and '{' are one byte each: counting bytes (strlen, replace) counts them without decoding UTF-8 (length, translate)
    return (f"CASE WHEN strlen({x}) > {MAX_NESTING} "
            f"THEN strlen({x}) - strlen(replace(replace({x}, '[', ''), '{{', '')) > {MAX_NESTING} ELSE false END")


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _depth(text: str) -> int:
    b = np.frombuffer(_STRING.sub(b'""', text.encode("utf-8", "surrogatepass")), np.uint8)
    step = (b == ord("[")).astype(np.int32) + (b == ord("{")) - (b == ord("]")) - (b == ord("}"))
    return int(np.cumsum(step).max(initial=0))


def _too_deep(path: Path, what: str) -> str:
    return (f"{shown_path(path)}: {what}, deeper than the {MAX_NESTING} levels gpuscope reads (PyTorch writes a few). "
            "The file is damaged or was not written by the PyTorch profiler; export the trace again with "
            "prof.export_chrome_trace(...).")


def _out_of_memory(path: Path, where: str) -> str:
    return (f"gpuscope ran out of memory reading {shown_path(path)} ({where}); nothing was loaded and the server keeps "
            f"running. Close other profiles or programs and open it again, or set {memory_limit_now()}, the memory one "
            "profile may use, to what this machine can spare so that files too large for it are refused up front.")


def _stage(path: Path, detected, tmp: Path, threads: int) -> tuple[list[Path], dict]:
    """Copy the bytes of the traceEvents array into files in tmp, cut into up to `threads` parts (each a JSON
    array of whole events, PART_BYTES at least) that DuckDB parses in parallel; return them in file order and the
    other top-level keys. Raises _Fallback when the layout is not the expected one or the temporary files cannot
    be written (disk full, ...)."""
    for old in tmp.iterdir():  # a second staging (one part) replaces the first
        old.unlink()
    with _open(path) as fh:
        try:
            if _is_gzip(fh, detected):
                size = _gzip_size(fh)
                return _stage_gzip(_gzip_reader(path, fh), tmp, threads, size)
            return _stage_plain(fh, tmp, threads)
        except OSError:
            raise _Fallback from None


def _open(path: Path):
    try:
        return open(path, "rb")
    except OSError as exc:
        raise ProfileError(f"Cannot read {shown_path(path)}: {exc.strerror}. Check the path and its permissions.") from None


def _is_gzip(fh, detected) -> bool:
    compressed = detected.compressed or fh.read(2) == GZIP_MAGIC
    fh.seek(0)
    return compressed


def _gzip_reader(path: Path, fh):
    """read(n) over the decompressed bytes of every gzip member in turn (concatenated members are
    one stream), with a running count: past max_decompressed_bytes() it stops with a ProfileError.
    A few MB of gzip can expand a thousandfold, and both readers hold or stage what comes out."""
    gz = gzip.GzipFile(fileobj=fh, mode="rb")
    cap = max_decompressed_bytes()
    total = 0

    def read(n: int) -> bytes:
        nonlocal total
        try:
            block = gz.read(n)
        except (OSError, EOFError, zlib.error) as exc:
            raise ProfileError(
                f"{shown_path(path)} is a corrupt or truncated gzip file ({exc}). Copy or download the trace again "
                f"(`gzip -t {shown_path(path.name)}` confirms the damage)."
            ) from None
        total += len(block)
        if total > cap:
            raise ProfileError(
                f"{shown_path(path)} decompresses to more than {cap / 1e9:.3g} GB, the most gpuscope unpacks "
                f"(GPUSCOPE_MAX_DECOMPRESSED_GB, {_setting('GPUSCOPE_MAX_DECOMPRESSED_GB', 'half of the machine memory')}). "
                "A small .json.gz that expands this much is damaged or a decompression bomb. If it is a genuine trace "
                "and the machine has that much free disk (staging) and memory, set GPUSCOPE_MAX_DECOMPRESSED_GB to a "
                "larger number of GB in the gpuscope server's environment (e.g. the env of its MCP entry) and open "
                "it again."
            )
        return block

    return read


def _setting(name: str, default: str) -> str:
    value = os.environ.get(name)
    return f"set to {value!r}" if value else f"default {default}"


def _read_head(read) -> tuple[bytes, dict, int, bool]:
    """Read until the keys before traceEvents parse; return (bytes read, top keys, byte offset of
    the array's '[', whether the document is the bare array)."""
    buf = b""
    size = _HEAD_BYTES
    while True:
        more = read(size - len(buf)) if len(buf) < size else b""
        buf += more
        complete = len(buf) < size  # the whole stream is in buf
        try:
            return (buf, *_head(codecs.getincrementaldecoder("utf-8")().decode(buf, final=complete)))
        except (ValueError, StopIteration, IndexError):
            pass
        if complete or size >= _HEAD_MAX:
            raise _Fallback
        size *= 4


def _head(text: str) -> tuple[dict, int, bool]:
    """Parse `{"key": value, ..., "traceEvents": ` (or a bare `[`); return the keys, the UTF-8 byte
    offset of the array's '[' and whether the document is the bare array."""
    i = _WS.match(text, 1 if text.startswith("\ufeff") else 0).end()
    top: dict = {}
    if text.startswith("[", i):
        return top, len(text[:i].encode()), True
    if not text.startswith("{", i):
        raise _Fallback
    i = _WS.match(text, i + 1).end()
    while text.startswith('"', i):
        key, i = scanstring(text, i + 1)
        i = _WS.match(text, i).end()
        if not text.startswith(":", i):
            raise ValueError("no colon")
        i = _WS.match(text, i + 1).end()
        if key == "traceEvents":
            if text.startswith("[", i):
                return top, len(text[:i].encode()), False
            raise _Fallback  # not a list: json.loads words the error
        top[key], i = _DECODER.raw_decode(text, i)
        i = _WS.match(text, i).end()
        if not text.startswith(",", i):
            break
        i = _WS.match(text, i + 1).end()
    if i >= len(text):
        raise ValueError("need more")
    raise _Fallback  # no traceEvents, or not JSON


_CAND = re.compile(r"\](?=[ \t\n\r]*[,}])")


def _tail(window: bytes, window_start: int, events_start: int, array_doc: bool) -> tuple[int, dict]:
    """Find the traceEvents array's closing ']' in the last bytes of the document; return its
    absolute offset and the top-level keys after it. Candidates are ']' that close a list of
    objects (or an empty one) and are followed by `, "key": value ... }` up to the end; the leftmost
    candidate after the array's start is the array's end. (Were the keys after the array longer
    than the window, the cut would land inside them; read_json then rejects the trailing text and
    the file goes through json.loads.)"""
    if array_doc:
        end = len(window.rstrip(b" \t\n\r")) - 1
        if end < 0 or window[end:end + 1] != b"]":
            raise _Fallback
        return window_start + end, {}
    text = window.decode("utf-8", "surrogateescape")
    first = 0  # first character after the array's '['
    if events_start >= window_start:
        first = len(window[:events_start - window_start + 1].decode("utf-8", "surrogateescape"))
    for m in _CAND.finditer(text, first):
        p = j = m.start()
        while j > first and text[j - 1] in " \t\n\r":
            j -= 1
        if j > first and text[j - 1] not in "}[":
            continue
        if _after(text, p + 1) is not None:
            break
    else:
        raise _Fallback
    end = window_start + len(text[:p].encode("utf-8", "surrogateescape"))
    try:
        keys = _after(window[end - window_start + 1:].decode("utf-8"), 0)  # strictly UTF-8 this time
    except UnicodeDecodeError:
        keys = None
    if keys is None or "traceEvents" in keys:
        raise _Fallback  # duplicate key: json.loads keeps the last one
    return end, keys


def _after(text: str, i: int) -> dict | None:
    """Parse `, "key": value ... }` from text[i:] to its end; None if it is not exactly that."""
    keys: dict = {}
    try:
        i = _WS.match(text, i).end()
        while text.startswith(",", i):
            i = _WS.match(text, i + 1).end()
            if not text.startswith('"', i):
                return None
            key, i = scanstring(text, i + 1)
            i = _WS.match(text, i).end()
            if not text.startswith(":", i):
                return None
            keys[key], i = _DECODER.raw_decode(text, _WS.match(text, i + 1).end())
            i = _WS.match(text, i).end()
    except (ValueError, StopIteration, IndexError):
        return None
    if not text.startswith("}", i) or _WS.match(text, i + 1).end() != len(text):
        return None
    return keys


def _stage_plain(fh, tmp: Path, threads: int) -> tuple[list[Path], dict]:
    size = os.fstat(fh.fileno()).st_size
    head, top, start, array_doc = _read_head(fh.read)
    window_start = max(start + 1, size - _TAIL_BYTES)
    fh.seek(window_start)
    end, keys = _tail(fh.read(size - window_start), window_start, start, array_doc)
    top.update(keys)
    if array_doc and _parts(end + 1 - start, threads) == 1:
        out = tmp / "events.json"
        os.symlink(Path(fh.name).resolve(), out)  # read_json takes the file as it is
        return [out], top
    return _write_parts(fh.fileno(), _split(fh.fileno(), start, end, threads), tmp), top


def _stage_gzip(read, tmp: Path, threads: int, size_hint: int) -> tuple[list[Path], dict]:
    """Decompress the traceEvents array straight into its parts (see _split): each is cut at the first boundary
    between two events after its equal share of `size_hint`, the decompressed size the gzip trailer states (only the
    parts' balance depends on it). One thread writes each block while this one decompresses the next: both leave the
    GIL, and staging runs on one core otherwise (the 245 MB bench trace: 0.11 s to decompress, 0.1-0.5 s to write).
    Staging the whole array first and copying the parts out of it wrote every byte after the first part twice."""
    head, top, start, array_doc = _read_head(read)
    n = _parts(max(size_hint - start, 0), threads)
    targets = [start + (size_hint - start) * k // n for k in range(n - 1, 0, -1)]  # popped from the end: ascending
    starts = [start]  # the stream offset of each part's first byte: the array's '[', then an event's '{'
    files = [tmp / "events-000.json"]
    recent, recent_len, recent_start = [head], len(head), 0  # the last >= _TAIL_BYTES bytes read
    with ThreadPoolExecutor(1, thread_name_prefix="gpuscope-stage") as pool:
        out = [os.open(files[0], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)]
        pending: list = []

        def put(*chunks) -> None:
            pending.append(pool.submit(_write_all, out[-1], *chunks))
            while len(pending) > 2:  # bounds what waits in memory
                pending.pop(0).result()

        try:
            block, pos = memoryview(head)[start:], start  # pos: the stream offset of block[0]
            while True:
                while targets and targets[-1] < pos + len(block):
                    m = _BOUNDARY.search(block, max(targets[-1] - pos, 0))
                    if m is None:
                        break  # looked for again from the next block's start
                    targets.pop()
                    put(block[:m.start() + 1], b"]")
                    block, pos = block[m.end() - 1:], pos + m.end() - 1
                    starts.append(pos)
                    files.append(tmp / f"events-{len(files):03d}.json")
                    out.append(os.open(files[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                    put(b"[")
                put(block)
                pos += len(block)
                block = read(_CHUNK)
                if not block:
                    break
                recent.append(block)
                recent_len += len(block)
                while recent_len - len(recent[0]) >= _TAIL_BYTES:
                    recent_start += len(recent[0])
                    recent_len -= len(recent.pop(0))
                block = memoryview(block)
            for done in pending:
                done.result()
        finally:
            for done in pending:
                done.cancel()
            pool.shutdown(wait=True)
            for fd in out:
                os.close(fd)
    end, keys = _tail(b"".join(recent), recent_start, start, array_doc)
    top.update(keys)
    # The part holding the array's ']' ends there: a cut after it (in the keys that follow, where a trailer overstated
    # the size) leaves parts that hold no events, removed here.
    last = max(i for i, s in enumerate(starts) if s <= end)
    os.truncate(files[last], (1 if last else 0) + end + 1 - starts[last])
    for gone in files[last + 1:]:
        gone.unlink()
    return files[:last + 1], top


def _write_all(fd: int, *chunks) -> None:
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]


def _gzip_size(fh) -> int:
    """What a .json.gz decompresses to as its trailer says (detect.gzip_isize: modulo 4 GiB). Below the compressed size
    it has wrapped (no trace compresses that badly): 4 GiB more is then the nearest guess."""
    isize = gzip_isize(fh)
    return isize if isize >= os.fstat(fh.fileno()).st_size else isize + (1 << 32)


# Each part of the array at least this large: below it a second thread costs more than it gains. At most PART_MAX
# parts: each parsing thread holds its own buffers (peak RSS of the 245 MB bench trace: 434 MB in 2 parts, 676 MB in 8).
PART_BYTES = 8 << 20
PART_MAX = 4
_BOUNDARY = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")  # between two events of the array
_CUT_WINDOW = 1 << 20  # where a cut is looked for after each part's share of the array


def _parts(size: int, threads: int) -> int:
    return max(1, min(threads, PART_MAX, size // PART_BYTES))


def _split(src: int, lo: int, hi: int, threads: int) -> list[tuple[int, int]]:
    """The byte ranges [a, b) of the parts of the array at bytes [lo, hi] of file descriptor `src` ('[' at lo, ']'
    at hi): each but the last ends after an event's closing '}' (its file then gets a ']'), each but the first
    starts at the next event's '{' (its file gets a '['). A cut is taken at the first '}, {' after each equal share;
    one that lands inside a string leaves a part that is not JSON (the part before it ends inside the string),
    which read_json refuses: _load_duckdb then reads the array whole."""
    n = _parts(hi + 1 - lo, threads)
    bounds = [lo]
    for k in range(1, n):
        at = max(lo + (hi + 1 - lo) * k // n, bounds[-1])
        m = _BOUNDARY.search(os.pread(src, _CUT_WINDOW, at))
        if m and at + m.end() - 1 < hi:
            bounds += [at + m.start() + 1, at + m.end() - 1]
    bounds.append(hi + 1)
    return list(zip(bounds[::2], bounds[1::2]))


def _write_parts(src: int, ranges: list[tuple[int, int]], tmp: Path, first: int = 0) -> list[Path]:
    """Part files for ranges[first:] (see _split), copied from `src` side by side: the copy is the one step before
    the parse that runs on one core, and copy_file_range (or pread) leaves the GIL (the 245 MB bench trace: 0.13 s
    of CPU, half of it off the critical path on 2 cores)."""

    def write(i: int) -> Path:
        a, b = ranges[i]
        out = tmp / f"events-{i:03d}.json"
        with open(out, "wb", buffering=0) as dst:
            if i:
                dst.write(b"[")
            _copy_range(src, dst, a, b - a)
            if i < len(ranges) - 1:
                dst.write(b"]")
        return out

    if len(ranges) - first < 2:
        return [write(i) for i in range(first, len(ranges))]
    with ThreadPoolExecutor(len(ranges) - first, thread_name_prefix="gpuscope-stage") as pool:
        return list(pool.map(write, range(first, len(ranges))))


def _copy_range(src: int, dst, offset: int, todo: int) -> None:
    """Append bytes [offset, offset + todo) of `src` to the unbuffered file `dst`, in the kernel where it can."""
    try:
        while todo:  # the array never passes through Python
            n = os.copy_file_range(src, dst.fileno(), todo, offset)
            if n <= 0:
                raise OSError("copy_file_range copied nothing")
            todo -= n
            offset += n
    except (OSError, AttributeError):
        while todo:
            block = os.pread(src, min(todo, _CHUNK), offset)
            if not block:
                raise _Fallback
            dst.write(block)
            todo -= len(block)
            offset += len(block)


# --------------------------------------------------------------------------- json.loads path

def _load_python(con, path: Path, detected, progress) -> dict:
    try:
        top = _load_frame(con, path, detected, progress)
    except MemoryError:
        raise ProfileError(_out_of_memory(path, "the fallback JSON parser")) from None
    except RecursionError:  # values just under json.loads' limit can still exhaust the encoder's
        raise ProfileError(_too_deep(path, "it nests arrays or objects about a thousand levels deep")) from None
    _check_nesting(con, path)
    return top


def _load_frame(con, path: Path, detected, progress) -> dict:
    # Millions of small dicts trigger repeated full collections during json.loads and the
    # comprehensions (~2x slower); none of them form cycles, so collection can wait.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        doc = _parse(path, detected, progress)
        top = {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}
        events = doc if isinstance(doc, list) else doc["traceEvents"]
        bad = next((i for i, e in enumerate(events) if type(e) is not dict), None)
        if bad is not None:
            raise ProfileError(
                f"{shown_path(path)}: traceEvents has entries of an unexpected shape (entry {bad} is "
                f"{''.join(_encode(events[bad], 0))[:40]!r}, not an object); it does not look like a PyTorch profiler trace. "
                "Pass the file written by prof.export_chrome_trace(...) or torch.profiler.tensorboard_trace_handler."
            )
        progress(0.45, "extracting event fields")

        def field(key: str, rows: list = events) -> list:
            return list(map(dict.get, rows, repeat(key)))

        frame = pd.DataFrame({
            **{k: np.array([v if v is None or type(v) is str else _value_text(v) for v in field(k)], dtype=object)
               for k in ("ph", "cat", "name")},
            "pid": _floats(field("pid"), text=True),
            "tid": _floats(field("tid"), text=True),
            "ts": _times(field("ts")),
            "dur": _times(field("dur")),
            "args": np.array([_json(a) if type(a) is dict else None for a in field("args")], dtype=object),
        })
        del doc, events
    finally:
        if gc_was_enabled:
            gc.enable()
    con.register("kin_src_df", frame)
    try:
        _create_store(con, "(SELECT ph::VARCHAR AS ph, cat::VARCHAR AS cat, name::VARCHAR AS name, pid::DOUBLE AS pid, "
                           "tid::DOUBLE AS tid, ts::DOUBLE AS ts, dur::DOUBLE AS dur, args::VARCHAR AS args FROM kin_src_df)")
    finally:
        con.unregister("kin_src_df")
    return top


def _value_text(v) -> str:
    """Text of a non-string JSON value where a string is expected, as read_json writes it."""
    if type(v) is bool:
        return "true" if v else "false"
    if type(v) is int or type(v) is float:
        return repr(v)
    return _json(v)


# Memory of the json.loads path, measured as peak RSS growth over the whole of _load_python
# (json.loads, the field lists, the DataFrame and its copy into DuckDB; Python 3.11, 2025-11):
#   real events (the MI300X resnet trace repeated to 196 MB, 734k events)  6.0 x the JSON text
#   small synthetic events (40 MB each: bare kernels, lists, floats, short strings, emoji names)  8.6 - 13.2 x
#   arrays of tiny objects (40 MB of `{}` / `{"a":1}`)  43 - 70 x
#   re-measured on real traces from shared/data/pytorch repeated to 22-30 MB (nv_a100_ddp_cnn, nv_h100_qwen,
#   amd_mi300x_resnet): 6.6 x, 8.5 x, 6.8 x; the estimate below was 1.54 x, 1.22 x, 1.48 x of those peaks
# The cost follows the number of values and containers more than the bytes, so the estimate counts
# them: 6 B per byte (+3 when non-ASCII text widens Python strings) + 80 B per ',' (about one per
# value), or 400 B per '{' / '[' when larger. It was 1.15 - 1.9 x the measured peak on every file above.
_PER_BYTE, _PER_NON_ASCII_BYTE, _PER_VALUE, _PER_CONTAINER = 6, 3, 80, 400


def _fallback_bytes(size: int, values: int, containers: int, ascii_only: bool) -> int:
    per_byte = _PER_BYTE + (0 if ascii_only else _PER_NON_ASCII_BYTE)
    return max(per_byte * size + _PER_VALUE * values, _PER_CONTAINER * containers)


def _read_text(path: Path, detected) -> bytearray:
    """The whole JSON text for json.loads, decompressed in a stream under the same cap as the fast
    path, refused as soon as parsing what has been read would take more than GPUSCOPE_MEMORY_LIMIT."""
    budget = memory_limit_bytes()
    with _open(path) as fh:
        compressed = _is_gzip(fh, detected)
        read = _gzip_reader(path, fh) if compressed else fh.read
        if not compressed:
            size = os.fstat(fh.fileno()).st_size
            if _fallback_bytes(size, 0, 0, True) > budget:
                _refuse_fallback(path, fh, size, _fallback_bytes(size, 0, 0, True), budget)
        text = bytearray()
        values = containers = 0
        ascii_only = True
        while block := read(_CHUNK):
            text += block
            values += block.count(b",")
            containers += block.count(b"{") + block.count(b"[")
            ascii_only = ascii_only and block.isascii()
            need = _fallback_bytes(len(text), values, containers, ascii_only)
            if need > budget:
                _refuse_fallback(path, None if compressed else fh, len(text), need, budget)
    return text


def _refuse_fallback(path: Path, fh, size: int, need: int, budget: int):
    if fh is not None:  # a plain file that does not even end like JSON is simply cut off
        fh.seek(max(0, os.fstat(fh.fileno()).st_size - 64))
        if fh.read().rstrip()[-1:] not in (b"}", b"]"):
            raise ProfileError(_truncated(path, "it ends in the middle of a value"))
    raise ProfileError(
        f"{shown_path(path)} can only be read by gpuscope's fallback JSON parser (the fast reader cannot take its "
        f"layout or values), which would need about {need / 1e9:.1f} GB of memory for {'its' if fh else 'the first'} "
        f"{size / 1e6:.0f} MB of JSON text, more than the {budget / 1e9:.1f} GB one profile may use (GPUSCOPE_MEMORY_LIMIT, "
        f"{_setting('GPUSCOPE_MEMORY_LIMIT', 'an eighth of the machine memory, at most 800 MB')}). Export the trace again "
        "with prof.export_chrome_trace(...) (a trace as PyTorch writes it takes the fast reader), or, if the machine has "
        "the memory, set GPUSCOPE_MEMORY_LIMIT higher (e.g. GPUSCOPE_MEMORY_LIMIT=16GB) in the gpuscope server's "
        "environment."
    )


def _truncated(path: Path, detail: str) -> str:
    return (f"{shown_path(path)} is not valid JSON ({detail}); the trace is probably truncated (the profiled process "
            "ended or the disk filled while it was written). Export it again with prof.export_chrome_trace(...) or "
            "torch.profiler.tensorboard_trace_handler.")


def _parse(path: Path, detected, progress) -> dict | list:
    progress(0.05, "reading file")
    raw = _read_text(path, detected)
    progress(0.15, f"parsing {len(raw) / 1e6:.0f} MB of JSON")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ProfileError(_truncated(path, f"{exc.msg} at line {exc.lineno}, column {exc.colno}")) from None
    except RecursionError:
        raise ProfileError(_too_deep(path, "it nests arrays or objects about a thousand levels deep")) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProfileError(f"{shown_path(path)} cannot be decoded as JSON text ({exc}). Export the trace again.") from None
    del raw
    events = doc if isinstance(doc, list) else doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise ProfileError(
            f"{path} is JSON but has no 'traceEvents' list, so it is not a PyTorch profiler trace. Pass the file "
            "written by prof.export_chrome_trace(...) or torch.profiler.tensorboard_trace_handler (*.pt.trace.json[.gz])."
        )
    if not events:
        raise ProfileError(_empty_trace(path))
    return doc


def _empty_trace(path: Path) -> str:
    return (f"{shown_path(path)} has an empty traceEvents list: the profiler recorded nothing. Make sure the profiler "
            "schedule reaches an active step (prof.step() is called every iteration) before the trace is exported.")


def _text(v):
    return v if v is None or type(v) is str else str(v)


def _floats(values: list, text: bool = False) -> np.ndarray:
    if not text:
        try:
            out = np.array(values, dtype=np.float64)
            if out.ndim == 1:  # values that are all lists of one length make a 2-D array
                return out
        except (ValueError, TypeError, OverflowError):
            pass
    # pid/tid are text in some events ('Spans', ROCm '123'): numeric text counts, the rest is NULL.
    return np.array([_number(v) for v in values], dtype=np.float64)


def _times(values: list) -> np.ndarray:
    """ts/dur values as float64: absent (or null) → NaN, which DuckDB reads as NULL; present but not a
    number ('abc', NaN, true, a list) → +inf, so the store tells 'missing' from 'not a finite number' as the
    read_json path does. Only the NaN positions are looked at again."""
    out = _floats(values)
    # numpy takes true/false as 1.0/0.0; a boolean is no time
    flags = [i for i, v in enumerate(values) if v is True or v is False]
    if flags:
        out[flags] = np.inf
    nan = np.flatnonzero(np.isnan(out))
    if nan.size:
        present = np.fromiter((values[i] is not None for i in nan), dtype=bool, count=nan.size)
        out[nan[present]] = np.inf
    return out


def _number(v) -> float | None:
    """A number, or numeric text, as a float (an integer beyond float range becomes ±inf, which the
    store takes as out of range); anything else None."""
    if type(v) is float:
        return v
    if type(v) is int or type(v) is str:
        try:
            return float(v)
        except OverflowError:
            return (math.inf if v > 0 else -math.inf) if type(v) is int else None
        except ValueError:
            return None
    return None


# --------------------------------------------------------------------------- model

def _name_sql(x: str) -> str:
    """An args value (JSON) that names something → text: a non-empty string, or an integer as text; else NULL."""
    return (f"CASE WHEN json_type({x}) = 'VARCHAR' THEN nullif({x} ->> '$', '') "
            f"WHEN json_type({x}) IN ('BIGINT', 'UBIGINT') THEN {x}::VARCHAR END")


def _args_struct(*keys: str, kind: str = "VARCHAR") -> str:
    """json_transform structure reading the given args keys (text of numbers, strings unquoted)."""
    return quote_literal(json.dumps({k: kind for k in keys}))


# JSON text in json.dumps' layout (', ' and ': ' outside strings), as the cpu_ops input columns always had.
# Every match runs from outside a string to the next separator or the end, so it never starts
# inside a string; the space the end gets is trimmed (minified JSON never ends in a space).
_SPACED = r"""((?:"(?:[^"\\]|\\.)*"|[^",:])*)([,:]|$)"""


def _spaced(x: str) -> str:
    """The regex only where it matters (it costs as much as the rest of the cpu_ops insert): text
    without separators is already in that layout, and in text without quotes every separator is
    outside a string."""
    v = f"{x}::VARCHAR"
    return (f"CASE WHEN NOT (contains({v}, ',') OR contains({v}, ':')) THEN {v} "
            f"""WHEN NOT contains({v}, '"') THEN replace(replace({v}, ',', ', '), ':', ': ') """
            f"ELSE rtrim(regexp_replace({v}, '{_SPACED}', '\\1\\2 ', 'g'), ' ') END")


def _cat_sql() -> str:
    """The current category name of a native.event_store row (cat, name)."""
    aliases = " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in CAT_ALIASES.items())
    return (f"CASE WHEN cat = 'Operator' AND starts_with(name, '{STEP_PREFIX}') THEN 'user_annotation' "
            f"ELSE CASE cat {aliases} ELSE cat END END")


def _build(con, top: dict) -> None:
    cat = _cat_sql()
    con.execute("COMMENT ON TABLE native.event_store IS 'storage behind native.events (rowid = idx); query native.events'")
    con.execute("CREATE VIEW native.events AS SELECT rowid AS idx, ph, cat, name, pid, tid, ts_ns, dur_ns, args, time_issue "
                "FROM native.event_store")
    con.execute(
        "COMMENT ON VIEW native.events IS 'Kineto traceEvents, one row per entry (ORDER BY idx for file order); "
        "ts_ns/dur_ns = round(us*1000); pid/tid NULL where the trace writes text; args as JSON text; "
        "time_issue says why a complete (ph X) event has no usable ts/dur (it is then in no model table)'"
    )
    _links(con, cat)
    _kernels(con)
    gpu_from = """FROM kin_gpu g LEFT JOIN kin_link l USING (idx) LEFT JOIN kin_piddev p ON p.pid = g.pid"""
    kinds = ", ".join(f"'{k}'" for k in COPY_KINDS)
    with _link_join(con):
        con.execute(
            f"""INSERT INTO memops
                SELECT coalesce(g.device, p.dev, g.pid), g.stream, g.ts, g.ts + g.dur, g.dur,
                       CASE g.cat WHEN 'gpu_memset' THEN 'set' ELSE 'copy' END,
                       CASE WHEN g.cat = 'gpu_memset' THEN 'memset'
                            WHEN regexp_extract(g.name, '^Memcpy\\s+(\\w+)', 1) IN ({kinds}) THEN regexp_extract(g.name, '^Memcpy\\s+(\\w+)', 1)
                            ELSE 'Unknown' END,
                       g.bytes,
                       nullif(regexp_extract(g.name, '\\((.+?)\\s*->', 1), ''),
                       nullif(coalesce(nullif(regexp_extract(g.name, '->\\s*(.+?)\\s*\\)', 1), ''), regexp_extract(g.name, '^Memset\\s*\\((.+?)\\)', 1)), ''),
                       g.src_dev, g.dst_dev, g.corr, coalesce(l.pid, {ONE_CPU}), l.tid, l.pid IS NOT NULL
                {gpu_from}
                WHERE g.cat IN ('gpu_memcpy', 'gpu_memset') AND coalesce(g.device, p.dev, g.pid) IS NOT NULL ORDER BY g.idx"""
        )
    _api_calls(con)
    con.execute(
        """INSERT INTO markers
           SELECT pid, tid, ts, ts + dur, dur, name, '', 'annotation', 'pytorch', NULL, NULL
           FROM kin_ev WHERE cat = 'user_annotation' AND pid IS NOT NULL AND name IS NOT NULL
           UNION ALL
           SELECT NULL, NULL, ts, ts + dur, dur, name, '', 'gpu_annotation', 'pytorch', p.dev, e.tid
           FROM kin_ev e JOIN kin_piddev p USING (pid) WHERE e.cat = 'gpu_user_annotation' AND name IS NOT NULL"""
    )
    lift = _args_struct(*CPU_OP_LIFTED, kind="JSON")
    patch = quote_literal(json.dumps(dict.fromkeys(CPU_OP_LIFTED + (OLD_DIMS,))))
    dims = f"""coalesce(l."Input Dims", json_extract(args, {quote_literal('$.' + json.dumps(OLD_DIMS))}))"""
    # A scan, filter and projection of native.event_store keep its order (preserve_insertion_order, as every table
    # here relies on), so the rows go in in file order without sorting every cpu_op row again.
    con.execute(
        f"""INSERT INTO cpu_ops
            SELECT pid, tid, ts, ts + dur, dur, name, cat, TRY_CAST(l."External id"::VARCHAR AS BIGINT),
                   TRY_CAST(l."Sequence number"::VARCHAR AS BIGINT), {_spaced(dims)}, {_spaced('l."Input type"')},
                   {_spaced('l."Input Strides"')}, {_spaced('l."Concrete Inputs"')},
                   CASE WHEN cat = 'cpu_op' AND args IS NOT NULL THEN nullif(json_merge_patch(args, {patch})::VARCHAR, '{{}}') ELSE args END
            FROM (SELECT *, CASE WHEN cat = 'cpu_op' THEN json_transform(args, {lift}) END AS l
                  FROM kin_ev WHERE cat IN ('cpu_op', 'python_function') AND pid IS NOT NULL AND name IS NOT NULL)"""
    )
    _issues(con, cat)
    _memory(con)
    dist = top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else {}
    rank = _int_or_none(dist.get("rank"))
    n_cpu = con.execute("SELECT count(*) FROM kin_pids").fetchone()[0]
    con.execute(
        """INSERT INTO processes
           SELECT p.pid, n.value, ?, NULL FROM kin_pids p
           LEFT JOIN (SELECT pid, arg_max(value, idx) AS value FROM kin_meta WHERE kind = 'process_name' GROUP BY pid) n USING (pid)""",
        [rank if n_cpu == 1 else None],
    )
    con.execute(
        """INSERT INTO threads
           SELECT t.pid, t.tid, coalesce(nullif(regexp_extract(n.value, '^thread\\s+\\d+\\s+\\((.*)\\)$', 1), ''), n.value)
           FROM (SELECT DISTINCT pid, tid FROM kin_ev WHERE tid IS NOT NULL AND pid IN (SELECT pid FROM kin_pids)
                 UNION SELECT pid, tid FROM kin_meta WHERE kind = 'thread_name' AND tid IS NOT NULL AND pid IN (SELECT pid FROM kin_pids)) t
           LEFT JOIN (SELECT pid, tid, arg_max(value, idx) AS value FROM kin_meta WHERE kind = 'thread_name' GROUP BY pid, tid) n
                  ON n.pid = t.pid AND n.tid = t.tid"""
    )
    _devices(con, top)
    _meta(con, top, dist, rank, n_cpu)



def _links(con, cat: str) -> None:
    """The temporary tables both the reader and preview() derive the GPU rows from: kin_ev (complete events with usable
    times, categories aliased), kin_gpu (GPU ops with their args), kin_rt (runtime calls), kin_meta (metadata events),
    kin_pids (CPU processes), kin_piddev (device of each GPU pid), kin_link (each GPU op's launching call) and
    kin_names (kernel base names)."""
    con.execute(
        f"""CREATE TEMP VIEW kin_ev AS SELECT rowid AS idx, ph, {cat} AS cat, name, pid, tid,
                  ts_ns AS ts, greatest(dur_ns, 0) AS dur, dur_ns < 0 AS neg_dur, args
           FROM native.event_store WHERE ph = 'X' AND time_issue IS NULL"""
    )
    i = _int_sql
    gpu_args = _args_struct("device", "inDevice", "stream", "correlation", "graph id", "registers per thread", "shared memory",
                            "bytes", "fromDevice", "toDevice")[:-2] + (', "grid": "VARCHAR[]", "block": "VARCHAR[]", '
                                                                       '"Process Group Name": "JSON", "Collective name": "JSON"}\'')
    # Its rows need no order (every reader of it orders by idx or aggregates), and without one DuckDB fills it with less
    # work: 0.19-0.20 s against 0.27-0.28 s in the store's build of the 250k-kernel bench trace (the preview's took
    # 0.17-0.18 s either way).
    with setting(con, "preserve_insertion_order", False):
        con.execute(
            f"""CREATE TEMP TABLE kin_gpu AS
                SELECT idx,
                       -- Peer copies carry fromDevice/inDevice/toDevice instead of device; the engine is inDevice.
                       CASE WHEN a.device IS NOT NULL THEN {i('a.device')} ELSE {i('a.inDevice')} END AS device,
                       {i('a.stream')} AS stream, {i('a.correlation')} AS corr, {i('a."graph id"')} AS graph_id,
                       {', '.join(f"CASE WHEN len(a.{g}) = 3 THEN {i(f'a.{g}[{k + 1}]')} END AS {g}_{c}"
                                  for g in ('grid', 'block') for k, c in enumerate('xyz'))},
                       {i('a."registers per thread"')} AS regs, {i('a."shared memory"')} AS shmem, {i('a.bytes')} AS bytes,
                       {i('a.fromDevice')} AS src_dev, {i('a.toDevice')} AS dst_dev,
                       -- PyTorch's args of an NCCL kernel: its process group (the communicator) and operation
                       {_name_sql('a."Process Group Name"')} AS pg, {_name_sql('a."Collective name"')} AS coll,
                       cat, name, pid, tid, ts, dur
                FROM (SELECT *, json_transform(args, {gpu_args}) AS a FROM kin_ev WHERE cat IN {GPU_OP_CATS})"""
        )
    # Runtime events of 2021 traces spell it 'external id', and write 0 when no CPU op launched the call
    # (struct keys are case-insensitive in DuckDB, so that spelling is read by path).
    # (CASE, not coalesce: DuckDB computed the path lookup for every row.)
    legacy_ext = """json_extract_string(args, '$."external id"')"""
    ext = i('a."External id"')
    con.execute(
        f"""CREATE TEMP TABLE kin_rt AS
            SELECT idx, {i('a.correlation')} AS corr, CASE WHEN {ext} IS NOT NULL THEN {ext} ELSE nullif({i(legacy_ext)}, 0) END AS ext,
                   cat, name, pid, tid, ts, dur
            FROM (SELECT *, json_transform(args, {_args_struct('correlation', 'External id')}) AS a
                  FROM kin_ev WHERE cat IN {RUNTIME_CATS} AND pid IS NOT NULL)"""
    )
    con.execute(
        f"""CREATE TEMP TABLE kin_meta AS
            SELECT name AS kind, pid, tid, CASE WHEN a.name IS NOT NULL THEN a.name ELSE a.labels END AS value, idx
            FROM (SELECT rowid AS idx, name, pid, tid, json_transform(args, {_args_struct('name', 'labels')}) AS a
                  FROM native.event_store WHERE ph = 'M' AND pid IS NOT NULL)"""
    )
    # CPU processes: pids with host-side events or a 'CPU' label, never a pid that carries GPU work
    # or a 'GPU n' label (Kineto also writes python frames of helper threads under GPU pid 0).
    con.execute(
        f"""CREATE TEMP TABLE kin_pids AS
            SELECT pid FROM (
                SELECT pid, bool_or(cat IN {CPU_CATS}) AS cpu, bool_or(cat IN {GPU_CATS}) AS gpu
                FROM kin_ev WHERE pid IS NOT NULL GROUP BY pid
                UNION ALL SELECT pid, value = 'CPU', value LIKE 'GPU%' FROM kin_meta WHERE kind = 'process_labels')
            GROUP BY pid HAVING bool_or(cpu) AND NOT bool_or(gpu)"""
    )
    # Device of each GPU pid: what its GPU ops say in args.device (ROCm pids are HSA agent ids),
    # else the 'GPU n' label, else the pid itself.
    con.execute(
        """CREATE TEMP TABLE kin_piddev AS
           SELECT pid, coalesce(d.dev, l.dev, pid)::INTEGER AS dev FROM (
               SELECT DISTINCT pid FROM kin_ev WHERE cat IN ('kernel','gpu_memcpy','gpu_memset','gpu_user_annotation'))
           -- the most frequent device, a tie going to the one seen first in the file (mode() breaks ties by input order)
           LEFT JOIN (SELECT pid, arg_max(device, (n, -first)) AS dev
                      FROM (SELECT pid, device, count(*) AS n, min(idx) AS first FROM kin_gpu WHERE device IS NOT NULL GROUP BY ALL)
                      GROUP BY pid) d USING (pid)
           LEFT JOIN (SELECT pid, max(TRY_CAST(regexp_extract(value, '^GPU\\s*(\\d+)$', 1) AS INTEGER)) AS dev
                      FROM kin_meta WHERE kind = 'process_labels' GROUP BY pid) l USING (pid)"""
    )
    # Launch link by args.correlation. Correlation ids are unique per process, so the only
    # ambiguity is a file with several processes: take the latest call that started before the op.
    # A graph launch matches every op of its replay (1 → N).
    con.execute(
        """CREATE TEMP TABLE kin_link AS
           SELECT g.idx, r.pid, r.tid FROM kin_gpu g JOIN kin_rt r ON r.corr = g.corr
           QUALIFY row_number() OVER (PARTITION BY g.idx ORDER BY (r.ts <= g.ts) DESC, r.ts DESC) = 1"""
    )
    create_short_names(con, "kin_names", "SELECT name FROM kin_gpu WHERE cat = 'kernel'")


@contextmanager
def _link_join(con):
    """For the inserts of GPU ops that join kin_gpu to kin_link on idx: DuckDB estimates the kernel (or copy) rows of
    kin_gpu at a fifth of the table and so builds the hash table on them, every column, rather than on kin_link (three
    narrow columns, one row per linked op). Building on the right side of the LEFT JOIN, as written, takes a third off
    the kernels insert (0.24 -> 0.16 s CPU for the 250k kernels of the bench trace)."""
    with setting(con, "disabled_optimizers", "build_side_probe_side"):
        yield


# The launching process of GPU work without a linked call: the trace's CPU process when there is exactly one.
ONE_CPU = "(SELECT CASE WHEN count(*) = 1 THEN min(pid) END FROM kin_pids)"


def _kernels(con) -> None:
    """kernels from kin_gpu: the device is args.device, else the device of the GPU pid, else the pid itself."""
    with _link_join(con):
        con.execute(
            f"""INSERT INTO kernels
                SELECT coalesce(g.device, p.dev, g.pid), g.stream, g.ts, g.ts + g.dur, g.dur, g.name, coalesce(n.short, g.name),
                       g.grid_x, g.grid_y, g.grid_z, g.block_x, g.block_y, g.block_z, g.regs, g.shmem, NULL, g.corr, g.graph_id,
                       coalesce(l.pid, {ONE_CPU}), l.tid, l.pid IS NOT NULL, false, g.pg, g.coll
                FROM kin_gpu g LEFT JOIN kin_link l USING (idx) LEFT JOIN kin_piddev p ON p.pid = g.pid
                LEFT JOIN kin_names n ON n.name = g.name
                WHERE g.cat = 'kernel' AND g.name IS NOT NULL AND coalesce(g.device, p.dev, g.pid) IS NOT NULL ORDER BY g.idx"""
        )


def _api_calls(con, event_ids: bool = True) -> None:
    """api_calls from kin_rt, with the event ids Kineto's cuda_sync records give (NULL without `event_ids`: the
    preview's one question reads none)."""
    if not event_ids:
        con.execute(f"""INSERT INTO api_calls SELECT {_API_CALL_COLUMNS}, NULL FROM kin_rt WHERE name IS NOT NULL ORDER BY idx""")
        return
    i = _int_sql
    # Event ids. Kineto names no CUDA event handle on the calls, but its 'cuda_sync' records (GPU track, args.correlation
    # = the waiting call's) name the correlation id of the cudaEventRecord that recorded the awaited event. That id
    # serves as the event id of both calls, so a wait pairs with exactly its record (critical_path).
    con.execute(
        f"""CREATE TEMP TABLE kin_evid AS
            SELECT r.idx, s.rec AS event_id
            FROM (SELECT ts, {i('a.correlation')} AS corr, {i('a.wait_on_cuda_event_record_corr_id')} AS rec
                  FROM (SELECT ts, json_transform(args, {_args_struct('correlation', 'wait_on_cuda_event_record_corr_id')}) AS a
                        FROM kin_ev WHERE cat = 'cuda_sync')) s
            JOIN kin_rt r ON r.corr = s.corr
            WHERE s.rec >= 0
            QUALIFY row_number() OVER (PARTITION BY s.corr, s.ts ORDER BY abs(r.ts - s.ts), r.idx) = 1"""
    )
    con.execute(
        """INSERT INTO kin_evid
           SELECT r.idx, r.corr FROM kin_rt r
           WHERE r.name LIKE '%EventRecord%' AND r.corr IN (SELECT event_id FROM kin_evid)"""
    )
    con.execute(
        f"""INSERT INTO api_calls
            SELECT {_API_CALL_COLUMNS}, e.event_id
            FROM kin_rt LEFT JOIN (SELECT idx, min(event_id) AS event_id FROM kin_evid GROUP BY idx) e USING (idx)
            WHERE name IS NOT NULL ORDER BY idx"""
    )


# api_calls' columns but the event id, from kin_rt
_API_CALL_COLUMNS = """pid, tid, ts, ts + dur, dur, CASE WHEN contains(name, '_v') THEN regexp_replace(name, '_v\\d+$', '') ELSE name END,
                  CASE WHEN name LIKE 'hip%' THEN 'hip' WHEN name LIKE 'hsa%' THEN 'hsa' ELSE cat END, corr, ext"""


# c10::DeviceType of a '[memory]' event: 0 is host memory, every other type (1 CUDA, 6 HIP, 12 XPU, ...) a device's.
HOST_DEVICE_TYPE = 0


def _exact_int_sql(x: str) -> str:
    """An args value (text of a JSON scalar) → BIGINT, exact for integers beyond 2^53 (addresses), else as _int_sql."""
    return f"coalesce(TRY_CAST({x} AS BIGINT), {_int_sql(x)})"


def _memory(con) -> None:
    """memory_events from PyTorch's '[memory]' instant events (profile_memory=True): args Bytes (signed), Addr,
    Total Allocated, Total Reserved, Device Type, Device Id. The site is the innermost cpu_op running on the
    event's thread at its time (the allocation happens inside the op that asked for the tensor)."""
    keys = _args_struct("Bytes", "Addr", "Total Allocated", "Total Reserved", "Device Type", "Device Id")
    x = _exact_int_sql
    con.execute(
        f"""CREATE TEMP TABLE kin_mem AS
            SELECT idx, pid, tid, ts_ns AS ts, {x('a."Bytes"')} AS bytes, {x('a."Addr"')} AS addr,
                   {x('a."Total Allocated"')} AS total_alloc, {x('a."Total Reserved"')} AS total_res,
                   {x('a."Device Type"')} AS dtype, {x('a."Device Id"')} AS dev
            FROM (SELECT rowid AS idx, pid, tid, ts_ns, json_transform(args, {keys}) AS a
                  FROM native.event_store WHERE ph IN ('i', 'I') AND name = '[memory]')"""
    )

    def host(a: str) -> str:
        return f"({a}dtype = {HOST_DEVICE_TYPE} OR ({a}dtype IS NULL AND coalesce({a}dev, -1) < 0))"

    checks = [("ts IS NULL", "skipped", "ts is missing or not a finite number"),
              ("pid IS NULL", "skipped", "pid is not a number"),
              ("bytes IS NULL", "skipped", "args.Bytes is missing or not an integer"),
              (f"NOT {host('')} AND (dev IS NULL OR dev < 0)", "skipped",
               "device memory event without a device: args.Device Id is missing, negative or not an integer")]
    record_query(con, count_sql("memory_events", "kin_mem", checks))
    con.execute(
        f"""INSERT INTO memory_events
            WITH site AS (
                SELECT m.idx, o.name FROM kin_mem m JOIN cpu_ops o
                  ON o.pid = m.pid AND o.tid = m.tid AND o.start_ns <= m.ts AND m.ts < o.end_ns
                WHERE o.category = 'cpu_op' AND m.ts IS NOT NULL
                QUALIFY row_number() OVER (PARTITION BY m.idx ORDER BY o.start_ns DESC, o.end_ns, o.name) = 1)
            SELECT CASE WHEN {host('m.')} THEN NULL ELSE m.dev END::INTEGER, CASE WHEN {host('m.')} THEN 'Host' ELSE 'Device' END,
                   m.pid, m.tid, m.ts, m.bytes, m.addr, m.total_alloc, m.total_res,
                   CASE WHEN m.bytes < 0 THEN 'free' ELSE 'alloc' END, s.name, NULL
            FROM kin_mem m LEFT JOIN site s USING (idx)
            WHERE m.ts IS NOT NULL AND m.pid IS NOT NULL AND m.bytes IS NOT NULL AND ({host('m.')} OR m.dev >= 0)
            ORDER BY m.idx"""
    )


def _sql_list(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(quote_literal(v) for v in values) + ")"


def _table_of(cat: str) -> str:
    """The model table an event of (aliased) category `cat` belongs in, or NULL for none."""
    return (f"CASE WHEN {cat} = 'kernel' THEN 'kernels' WHEN {cat} IN ('gpu_memcpy', 'gpu_memset') THEN 'memops' "
            f"WHEN {cat} IN {RUNTIME_CATS} THEN 'api_calls' WHEN {cat} IN ('user_annotation', 'gpu_user_annotation') "
            f"THEN 'markers' WHEN {cat} IN ('cpu_op', 'python_function') THEN 'cpu_ops' END")


def _issues(con, cat: str, tables: tuple[str, ...] = _FILLED) -> None:
    """data_issues of the model tables `tables`: every event of their categories that the inserts above left out or
    changed, each counted once with the first reason that applies. The conditions mirror the
    inserts' WHERE clauses: kept + skipped = the category's complete events."""
    gpu_ops = "('kernel', 'gpu_memcpy', 'gpu_memset')"
    record_query(con, f"""
        SELECT tbl, 'skipped', count(*), time_issue
        FROM (SELECT {_table_of(cat)} AS tbl, time_issue
              FROM native.event_store WHERE ph = 'X' AND time_issue IS NOT NULL)
        WHERE tbl IN {_sql_list(tables)} GROUP BY ALL
        UNION ALL
        SELECT tbl, CASE WHEN reason IS NULL THEN 'repaired' ELSE 'skipped' END, count(*),
               coalesce(reason, 'dur is negative: set to 0')
        FROM (SELECT {_table_of('e.cat')} AS tbl, e.neg_dur,
                     CASE WHEN e.pid IS NULL AND e.cat NOT IN {gpu_ops} THEN 'pid is not a number'
                          WHEN e.pid IS NULL AND g.device IS NULL AND e.cat IN {gpu_ops}
                               THEN 'no device: args.device is missing or not a number, and pid is not a number'
                          WHEN e.name IS NULL AND e.cat NOT IN ('gpu_memcpy', 'gpu_memset') THEN 'name is missing'
                     END AS reason
              -- only the rows a reason or a negative dur can apply to meet the join
              FROM (SELECT * FROM kin_ev WHERE {_table_of('cat')} IN {_sql_list(tables)} AND (pid IS NULL OR name IS NULL OR neg_dur)) e
              LEFT JOIN kin_gpu g USING (idx))
        WHERE reason IS NOT NULL OR neg_dur GROUP BY ALL
        ORDER BY 1, 2, 4""")


def _devices(con, top: dict) -> None:
    listed = top.get("deviceProperties")
    props = [p for p in (listed if isinstance(listed, list) else []) if isinstance(p, dict) and _int_or_none(p.get("id")) is not None]
    build = ("AMD" if any(k in top for k in ("hip_runtime_version", "roctracer_version", "hip_driver_version")) else
             "NVIDIA" if any(k in top for k in ("cuda_runtime_version", "cuda_driver_version", "cupti_version")) else None)
    rows = {int(p["id"]): _device_row(int(p["id"]), p, build) for p in props}
    seen = [d for (d,) in con.execute(
        "SELECT DISTINCT device_id FROM (SELECT device_id FROM kernels UNION ALL SELECT device_id FROM memops "
        "UNION ALL SELECT device_id FROM markers WHERE device_id IS NOT NULL) ORDER BY 1").fetchall()]
    missing = [d for d in seen if d not in rows]
    warnings = []
    if missing and props:
        listed = ", ".join(str(i) for i in sorted(rows))
        kinds = {(r[1], r[4], r[5], r[8]) for r in rows.values()}
        if len(kinds) == 1:
            # ROCm Kineto writes the HSA agent id (2, 3, ...) where deviceProperties uses ordinals;
            # when every listed GPU is the same model the properties still hold for the unlisted id.
            for d in missing:
                rows[d] = (d,) + next(iter(rows.values()))[1:]
            warnings.append(
                f"GPU events use device id(s) {', '.join(map(str, missing))} that deviceProperties does not list (ids {listed}); "
                f"ROCm traces write the HSA agent id there. All listed devices are '{props[0].get('name')}', so those properties are used."
            )
        else:
            warnings.append(
                f"GPU events use device id(s) {', '.join(map(str, missing))} that deviceProperties does not list (ids {listed}); "
                "their names and sizes are unknown."
            )
    if missing and not props:
        warnings.append("The trace has no deviceProperties: GPU names, SM counts and memory sizes are unknown (sub-sampled or very old trace).")
    for d in missing:
        rows.setdefault(d, (d,) + (None,) * 10)
    if rows:
        con.executemany("INSERT INTO devices VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [rows[k] for k in sorted(rows)])
    if warnings:
        con.executemany("INSERT INTO trace_meta VALUES ('warning', ?)", [[w] for w in warnings])


def _device_row(dev: int, p: dict, build: str | None) -> tuple:
    name = _text(p.get("name"))
    low = (name or "").lower()
    # ROCm builds add maxSharedMemoryPerMultiProcessor; CUDA builds the Optin/PerMultiprocessor keys.
    if any(k in low for k in ("amd", "radeon", "instinct")) or "maxSharedMemoryPerMultiProcessor" in p:
        vendor = "AMD"
    elif any(k in low for k in ("nvidia", "tesla", "geforce", "quadro")) or "sharedMemPerBlockOptin" in p or "regsPerMultiprocessor" in p:
        vendor = "NVIDIA"
    else:
        vendor = build
    major, minor = _int_or_none(p.get("computeMajor")), _int_or_none(p.get("computeMinor"))
    cc = f"{major}.{minor}" if major is not None and minor is not None else None
    return (dev, name, vendor, True, _int_or_none(p.get("numSms")), _int_or_none(p.get("totalGlobalMem")), None, None, cc,
            _int_or_none(p.get("warpSize")), None)


def _int_or_none(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _capture(con) -> tuple[list[tuple[str, str]], bool]:
    """trace_meta's capture span rows, and whether the times are fractional absolute µs (approximate)."""
    lo, hi, frac, big = con.execute(
        "SELECT min(ts), max(ts + dur), bool_or(ts % 1000 <> 0 OR dur % 1000 <> 0), max(abs(ts)) >= 8796093022208000 FROM kin_ev"
    ).fetchone()
    if lo is None:
        return [("absent", "capture span: the trace has no timed (ph X) events")], False
    return [("capture_start_ns", str(lo)), ("capture_end_ns", str(hi)),
            ("capture_span_source", "first start to last end of all complete (ph X) events, including the profiler's own span event")], \
        bool(frac and big)


def _meta(con, top: dict, dist: dict, rank, n_cpu: int) -> None:
    rows: list[tuple[str, str]] = [("format", "kineto"), ("format_version", _text(top.get("schemaVersion")) or "")]
    cuda, hip = _int_or_none(top.get("cuda_runtime_version")), _int_or_none(top.get("hip_runtime_version"))
    if hip is not None:
        rows.append(("product_version", f"HIP runtime {hip // 10_000_000}.{hip // 100_000 % 100}.{hip % 100_000}"))
    elif cuda is not None:
        rows.append(("product_version", f"CUDA runtime {cuda // 1000}.{cuda % 1000 // 10}"))
    else:
        rows.append(("product_version", ""))
    for key in ("cuda_runtime_version", "cuda_driver_version", "cupti_version", "hip_runtime_version", "hip_driver_version",
                "roctracer_version", "trace_id", "displayTimeUnit"):
        if top.get(key) is not None:
            rows.append((key if key != "displayTimeUnit" else "display_time_unit", _text(top[key])))
    base = _int_or_none(top.get("baseTimeNanoseconds"))
    span, frac_big = _capture(con)
    if base is not None:
        rows.append(("base_time_ns", str(base)))
        rows.append(("timestamp_format", "microseconds relative to baseTimeNanoseconds (absolute epoch ns = base_time_ns + ts)"))
    else:
        rows.append(("timestamp_format", "absolute epoch microseconds"))
    rows += span
    if base is None and frac_big:
        rows.append(("warning", "Timestamps are fractional absolute microseconds (2024-era Kineto before baseTimeNanoseconds): "
                                "float parsing keeps only ~0.25 us resolution, so sub-microsecond times are approximate."))
    if dist:
        for key, meta_key in (("rank", "rank"), ("world_size", "world_size"), ("backend", "distributed_backend")):
            if dist.get(key) is not None:
                rows.append((meta_key, _text(dist[key])))
        if rank is not None and n_cpu > 1:
            rows.append(("warning", f"distributedInfo gives rank {rank} but the trace has {n_cpu} CPU processes; process ranks are left unset."))
    (n_gpu, n_unlinked, n_kern, n_mem, n_rt, n_mark, n_cpu_ops, n_flows, n_memory) = con.execute(
        f"""SELECT (SELECT count(*) FROM kernels) + (SELECT count(*) FROM memops),
                  (SELECT count(*) FILTER (WHERE NOT launched) FROM kernels) + (SELECT count(*) FILTER (WHERE NOT launched) FROM memops),
                  (SELECT count(*) FROM kernels), (SELECT count(*) FROM memops), (SELECT count(*) FROM api_calls),
                  (SELECT count(*) FROM markers), (SELECT count(*) FROM cpu_ops),
                  (SELECT count(*) FROM native.event_store WHERE ph IN ('s', 'f', 't') AND cat IN {FLOW_CATS}),
                  (SELECT count(*) FROM memory_events)"""
    ).fetchone()
    if n_unlinked:
        rows.append(("warning", f"{n_unlinked} of {n_gpu} GPU operations (kernels, copies, sets) have no launching runtime call in the trace "
                                "(launched before profiling started, or the call was not captured); they count as GPU work but have no host thread."))
    if n_gpu and not n_flows:
        rows.append(("warning", "The trace has no flow (ac2g) events; GPU work was linked to runtime calls by args.correlation alone."))
    for count, what in ((n_kern, "kernels: no kernel events"), (n_mem, "memops: no gpu_memcpy/gpu_memset events"),
                        (n_rt, "api_calls: no cuda_runtime/cuda_driver events"), (n_mark, "markers: no user annotations"),
                        (n_cpu_ops, "cpu_ops: no cpu_op/python_function events"),
                        (n_memory, "memory_events: no '[memory]' instant events (profile with "
                                   "torch.profiler.profile(..., profile_memory=True))")):
        if not count:
            rows.append(("absent", what))
    rows.append(("absent", "device clocks and memory bandwidth: Kineto deviceProperties has no clock or bandwidth fields"))
    rows.append(("absent", "dynamic shared memory: Kineto reports one shared-memory total per kernel (kept in static_shared_bytes)"))
    con.executemany("INSERT INTO trace_meta VALUES (?, ?)", rows)
