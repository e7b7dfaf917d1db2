"""Installed names are namespaced: from the checkout, a bare `import server` / `import tools` is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["server", "tools"])
def test_bare_top_level_packages_are_refused(name):
    res = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and f"import gpuscope.{name}, not {name}" in res.stderr
    ok = subprocess.run([sys.executable, "-c", f"import gpuscope.{name}"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
