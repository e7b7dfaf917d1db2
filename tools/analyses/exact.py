"""Exact statistics of integer series (ns) held in numpy arrays: the figures Python's statistics module gives for the
same values as a list (fmean, median, stdev: the sample standard deviation, correctly rounded as in Python 3.11+),
without a Python object per value. statistics.stdev turns every value into a fraction: 0.23 s of an iterations call
over 250,000 steps, the median and the mean as much again."""

from __future__ import annotations

import math

import numpy as np

_INT64_MAX = 2**63 - 1


def total(values: np.ndarray) -> int:
    """The exact sum of an integer array, whatever its size (int64 where it cannot overflow, Python ints otherwise)."""
    v = np.asarray(values, dtype=np.int64)
    if not v.size:
        return 0
    if v.size * max(-int(v.min()), int(v.max())) <= _INT64_MAX:  # Python ints: np.abs(INT64_MIN) stays negative
        return int(v.sum())
    return int(v.astype(object).sum())


def fmean(values: np.ndarray) -> float:
    """statistics.fmean of the values: their exact sum, rounded once to a float, over their count (every ns value
    below 2^53 is a float exactly, as fsum takes it)."""
    return float(total(values)) / len(values)


def median(values: np.ndarray) -> int | float:
    """statistics.median: the middle value, or the exact mean of the two middle values (an int, or a float rounded
    once)."""
    v = np.asarray(values, dtype=np.int64)
    n = v.size
    if not n:
        raise ValueError("no median of an empty series")
    mid = n // 2
    if n % 2:
        return int(np.partition(v, mid)[mid])
    lo_hi = np.partition(v, [mid - 1, mid])
    return (int(lo_hi[mid - 1]) + int(lo_hi[mid])) / 2


def stdev(values: np.ndarray) -> float:
    """statistics.stdev (sample, n - 1): the square root of the exact variance, correctly rounded to a float."""
    v = np.asarray(values, dtype=np.int64)
    n = v.size
    if n < 2:
        raise ValueError("stdev needs at least two values")
    s = total(v)
    # the squares as Python ints: a step of 3 s squared in ns passes the int64 range
    q = int(np.square(v.astype(object)).sum())
    return sqrt_of_fraction(n * q - s * s, n * (n - 1))


def sqrt_of_fraction(num: int, den: int) -> float:
    """sqrt(num / den) for integers num >= 0 and den > 0, correctly rounded to a float: an integer square root with
    more bits than a float holds and a sticky last bit for an inexact remainder (round to odd), then one rounding by
    the int-to-float conversion."""
    if num == 0:
        return 0.0
    bits = 2 * 53 + 3  # the root gets at least 55 bits; the sticky bit then decides ties exactly
    shift = (num.bit_length() - den.bit_length() - bits) // 2
    if shift >= 0:
        n, d = num, den << (2 * shift)
    else:
        n, d = num << (-2 * shift), den
    root = math.isqrt(n // d)
    root |= root * root * d != n  # inexact: round to odd
    return math.ldexp(float(root), shift)


def pcts(part: np.ndarray, whole: np.ndarray, digits: int = 2) -> np.ndarray:
    """common.pct of each (part, whole) pair, whole nonzero: 100.0 * part / whole in float64, rounded to `digits`
    decimals as Python's round does (the float nearest to the exactly rounded decimal). rint(100 x * 10^digits) /
    10^digits is that float except where the scaled value lies next to a tie, which its own rounding error may
    cross: those few are rounded by Python."""
    values = 100.0 * np.asarray(part).astype(np.float64) / np.asarray(whole).astype(np.float64)
    scale = 10.0**digits
    scaled = values * scale
    out = np.rint(scaled) / scale
    tie = np.abs(scaled - np.floor(scaled) - 0.5) < 1e-6
    if tie.any():
        out[tie] = [round(x, digits) for x in values[tie].tolist()]
    return out
