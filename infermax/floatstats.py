"""Sums, means and percentiles of plain float lists that equal numpy's bit for bit, without importing numpy.

Why: importing numpy is about a fifth of a tiny ``infermax simulate`` process, and the summary is
the only numpy a fixed-workload run of an Algorithm 1 scheduler needs. The summary's values must
stay exactly what they were when it was computed with numpy, so these follow numpy's own order of
operations (``tests/test_floatstats.py`` compares them with numpy on random lists, with ``==``):

- ``float64_sum``: numpy's pairwise summation of a contiguous float64 array (``np.add.reduce``): blocks of at
  most 128 values summed with 8 interleaved accumulators, combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), the
  tail added in order; longer runs split in two halves (the first a multiple of 8 long) summed recursively.
  Its rounding error grows with log n, not n, which is why ``math.fsum`` or ``sum`` (different values) are
  not used.
- ``mean``: that sum divided by the count (``ndarray.mean``).
- ``percentiles``: ``np.percentile``'s default ``linear`` method: index ``(n − 1)·q/100`` into the sorted
  values, interpolated as ``a + (b − a)·g`` below ``g = 0.5`` and ``b − (b − a)·(1 − g)`` from there on.
"""

from __future__ import annotations

import math
from typing import Sequence

_BLOCK = 128  # numpy's PW_BLOCKSIZE


def _pairwise(values: Sequence[float], start: int, n: int) -> float:
    if n < 8:
        total = -0.0
        for i in range(start, start + n):
            total += values[i]
        return total
    if n <= _BLOCK:
        r = list(values[start:start + 8])
        stop = start + n - n % 8
        for i in range(start + 8, stop, 8):
            r[0] += values[i]
            r[1] += values[i + 1]
            r[2] += values[i + 2]
            r[3] += values[i + 3]
            r[4] += values[i + 4]
            r[5] += values[i + 5]
            r[6] += values[i + 6]
            r[7] += values[i + 7]
        total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for i in range(stop, start + n):
            total += values[i]
        return total
    half = n // 2
    half -= half % 8
    return _pairwise(values, start, half) + _pairwise(values, start + half, n - half)


def float64_sum(values: Sequence[float]) -> float:
    """``float(np.asarray(values, dtype=float).sum())`` (``values`` are floats)."""
    return 0.0 + _pairwise(values, 0, len(values))


def mean(values: Sequence[float]) -> float:
    """``float(np.asarray(values, dtype=float).mean())`` for a non-empty list of floats."""
    return float64_sum(values) / len(values)


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """``np.percentile(values, qs)`` (method ``linear``) for a non-empty list of floats without NaN."""
    ordered = sorted(values)
    last = len(ordered) - 1
    out = []
    for q in qs:
        virtual = last * (q / 100)
        if virtual >= last:
            lo = hi = last
            gamma = virtual + 1  # numpy's index -1 for both ends; the value is the largest either way
        else:
            lo = math.floor(virtual)
            hi, gamma = lo + 1, virtual - lo
        a, b = ordered[lo], ordered[hi]
        diff = b - a
        out.append(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)
    return out
