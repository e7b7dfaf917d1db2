"""Element sizes and dtype names (dtypes.py)."""
from __future__ import annotations

import pytest

from gpuscope.tools.perf_models import bytes_per_element, dtype_from_concrete


@pytest.mark.parametrize("s,b", [
    ("float", 4), ("double", 8), ("half", 2), ("BFloat16", 2), ("c10::Half", 2), ("c10::BFloat16", 2),
    ("c10::Float8_e4m3fn", 1), ("c10::Float8_e4m3fnuz", 1), ("c10::Float8_e5m2", 1), ("c10::Float8_e5m2fnuz", 1),
    ("c10::Float8_e8m0fnu", 1), ("signed char", 1), ("unsigned char", 1), ("short int", 2), ("short", 2),
    ("int", 4), ("long int", 8), ("bool", 1), ("c10::complex<float>", 8), ("c10::complex<double>", 16),
    ("c10::complex<c10::Half>", 4),
])
def test_bytes_per_element_known(s, b):
    assert bytes_per_element(s) == b


@pytest.mark.parametrize("s", ["Scalar", "ScalarList", "TensorList", "", None, "c10::SomethingNew", 3])
def test_bytes_per_element_unknown_is_none_not_nan(s):
    assert bytes_per_element(s) is None


def test_dtype_from_concrete_scalar_type_enum():
    assert dtype_from_concrete("15") == "c10::BFloat16"
    assert dtype_from_concrete("6") == "float"
    assert dtype_from_concrete("24") == "c10::Float8_e4m3fn"
    assert dtype_from_concrete("") is None
