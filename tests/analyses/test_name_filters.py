"""name_contains / kernel filters take the user's text literally: '_' and '%' are characters, not LIKE wildcards."""

from __future__ import annotations

import pytest

from gpuscope.tools import analyses as A
from gpuscope.tools.model.errors import ProfileError


def test_underscore_and_percent_are_literal(open_profile):
    t = open_profile("concurrent_streams", "nsys")
    names = {r[0] for r in t.sql("SELECT DISTINCT short_name FROM kernels")}
    # 'g_mm' would match 'gemm_kernel' if '_' were a wildcard; no kernel name contains it literally.
    assert "gemm_kernel" in names and not any("g_mm" in n for n in names)
    with pytest.raises(ProfileError, match="no kernel matches"):
        A.top_kernels(t, name_contains="g_mm")
    with pytest.raises(ProfileError):
        A.call_stack(t, kernel="g_mm")
    with pytest.raises(ProfileError, match="no kernel matches"):
        A.top_kernels(t, name_contains="%")
    got = {k.name for k in A.top_kernels(t, name_contains="M_K", limit=50).kernels}  # case-insensitive, literal '_'
    assert got == {n for n in names if "m_k" in n.lower()} and "gemm_kernel" in got
