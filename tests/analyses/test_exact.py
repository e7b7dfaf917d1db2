"""exact.py gives, over numpy arrays, the figures the statistics module and common.pct give value by value."""

import statistics
import sys

import numpy as np
import pytest

from gpuscope.tools.analyses import exact
from gpuscope.tools.analyses.common import pct


@pytest.mark.parametrize("scale", [10, 10**6, 10**10, 2**52])
def test_series_figures_equal_the_statistics_module(scale):
    rng = np.random.default_rng(scale % 1000)
    for n in [1, 2, 3, 4, 7, 50, 1001]:
        for same in (False, True):
            v = rng.integers(0, scale, n)
            if same:
                v[:] = v[0]
            values = v.tolist()
            assert exact.total(v) == sum(values)
            assert exact.fmean(v) == statistics.fmean(values)
            med = exact.median(v)
            assert med == statistics.median(values) and type(med) is type(statistics.median(values))
            if n > 1 and sys.version_info >= (3, 11):  # before 3.11 stdev was not correctly rounded
                assert exact.stdev(v) == statistics.stdev(values)


def test_sums_and_squares_past_the_int64_range_stay_exact():
    v = np.full(4, 2**62, dtype=np.int64)
    v[1] = 2**62 - 1
    assert exact.total(v) == 4 * 2**62 - 1
    assert exact.stdev(v) == 0.5  # deviations 1/4, -3/4, 1/4, 1/4: variance (3/4) / 3
    low = np.array([np.iinfo(np.int64).min, -1], dtype=np.int64)
    assert exact.total(low) == -(2**63) - 1 and exact.fmean(low) == statistics.fmean(low.tolist())


def test_square_roots_of_fractions_are_correctly_rounded():
    from fractions import Fraction

    assert exact.sqrt_of_fraction(0, 5) == 0.0
    assert exact.sqrt_of_fraction(9, 4) == 1.5
    rng = np.random.default_rng(7)
    for _ in range(2000):
        num, den = int(rng.integers(1, 2**62)) * int(rng.integers(1, 2**40)), int(rng.integers(1, 2**50))
        r = exact.sqrt_of_fraction(num, den)
        # r is the nearest float: the true root lies within half an ulp of it
        half_ulp = Fraction(np.spacing(r)) / 2
        assert (Fraction(r) - half_ulp) ** 2 <= Fraction(num, den) <= (Fraction(r) + half_ulp) ** 2


def test_percentages_round_as_pct_does_also_at_ties():
    rng = np.random.default_rng(4)
    k = rng.integers(1, 10_000, 20_000)
    # part / whole = n / 100,000: 100 x that ends in 5 at the third decimal, a tie numpy's rounding breaks otherwise
    n = rng.integers(0, 10_000, k.size) * 10 + 5
    whole = np.concatenate([100_000 * k, rng.integers(1, 10**12, 20_000)])
    part = np.concatenate([n * k, rng.integers(0, 10**12, 20_000)])
    expected = [pct(p, w) for p, w in zip(part.tolist(), whole.tolist())]
    assert exact.pcts(part, whole).tolist() == expected
    assert exact.pcts(part, whole, digits=4).tolist() == [pct(p, w, 4) for p, w in zip(part.tolist(), whole.tolist())]
