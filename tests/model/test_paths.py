"""Only regular files are opened: FIFOs, devices, sockets, folders, symlink loops, NUL bytes and absurd paths
get a clear error before anything reads them, and echoed paths are capped."""

from __future__ import annotations

import os
import socket
import time

import pytest

from gpuscope.fixtures import samples as H
from gpuscope.tools.analyses.list_traces import list_traces
from gpuscope.tools.model.cache import open_trace
from gpuscope.tools.model.detect import regular_file
from gpuscope.tools.model.errors import SHOWN_PATH_CHARS, ProfileError
from gpuscope.tools.model.trace import load_trace


def _error(path) -> str:
    t0 = time.monotonic()
    for opener in (regular_file, open_trace, load_trace):
        with pytest.raises(ProfileError) as info:
            opener(path)
    assert time.monotonic() - t0 < 5
    return str(info.value)


def test_fifo(tmp_path):
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    assert "named pipe" in _error(fifo)


def test_socket(tmp_path):
    path = tmp_path / "s.sqlite"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    try:
        assert "socket" in _error(path)
    finally:
        s.close()


def test_character_device():
    assert "character device" in _error("/dev/null")


def test_folder(tmp_path):
    (tmp_path / "x.sqlite").mkdir()
    assert "folder" in _error(tmp_path / "x.sqlite")


def test_symlink_loop(tmp_path):
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    os.symlink(b, a)
    os.symlink(a, b)
    assert "loops" in _error(a)


def test_dangling_symlink(tmp_path):
    link = tmp_path / "gone.sqlite"
    os.symlink(tmp_path / "missing.sqlite", link)
    assert "does not exist" in _error(link)


def test_symlink_to_a_profile_opens(tmp_path):
    real = H.write_profiles(tmp_path / "p")["nsys"]
    link = tmp_path / "link.sqlite"
    os.symlink(real, link)
    trace = load_trace(link)
    assert trace.path == real and trace.count("kernels") == H.TOTAL_KERNELS
    trace.close()


def test_nul_and_long_paths(tmp_path):
    assert "NUL" in _error(f"{tmp_path}/a\x00b.sqlite")
    long = str(tmp_path) + "/" + "x" * 200_000
    msg = _error(long)
    assert "200" in msg and len(msg) < SHOWN_PATH_CHARS + 400
    msg = _error(str(tmp_path) + "/" + "y" * 1000 + ".sqlite")  # legal length, no such file: still capped
    assert len(msg) < SHOWN_PATH_CHARS + 400
    assert _error("   ").startswith("No profile path")


def test_list_traces_skips_special_files(tmp_path):
    H.write_profiles(tmp_path)
    os.mkfifo(tmp_path / "pipe.json")
    os.symlink(tmp_path / "loop.sqlite", tmp_path / "loop.sqlite")
    t0 = time.monotonic()
    res = list_traces(str(tmp_path))
    assert time.monotonic() - t0 < 10
    assert {os.path.basename(t.path) for t in res.traces} >= {"small.sqlite", "small_rocpd.db"}
    assert res.skipped >= 1


@pytest.mark.parametrize("text, words", [
    ("a" * 200_000, "characters long"),
    ("run/\x00rank0.json", "NUL"),
    ("~no_such_user_x9/trace.json", "no_such_user_x9"),
    ("/tmp/" + "n" * 300 + "/rank*.json", "too long"),   # a name over 255 bytes: the file system refuses it
    ("/tmp/" + "n" * 300, "too long"),
    ("", "No profile path"),
])
def test_a_job_names_paths_no_file_system_holds(text, words):
    """rank_summary and friends expand folders and globs before any file is opened: the same paths get the same
    clear error, with the path cut to its shown length."""
    from gpuscope.tools.model.job import expand

    with pytest.raises(ProfileError) as info:
        expand([text])
    message = str(info.value)
    assert words in message and len(message) < SHOWN_PATH_CHARS + 400


def test_unknown_user_home_is_not_called_a_symlink_loop():
    message = _error("~no_such_user_x9/trace.json")
    assert "no_such_user_x9" in message and "loop" not in message
