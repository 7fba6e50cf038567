"""Column helpers every layer shares."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def distinct(values: npt.ArrayLike) -> np.ndarray:
    """The sorted distinct values, as ``np.unique(values)`` gives them (NaNs as one).

    ``np.unique`` imports ``numpy.ma`` on its first plain call (8 ms of every command's start), and its
    hash table is slower than a sort on the columns a trace has (5 M device ids: 92 against 31 ms).
    """
    v = np.sort(np.ravel(values))
    if v.size < 2:
        return v
    keep = np.empty(v.size, dtype=bool)
    keep[0] = True
    np.not_equal(v[1:], v[:-1], out=keep[1:])
    if v.dtype.kind in "fc" and np.isnan(v[-1]):
        keep[1:] &= ~(np.isnan(v[1:]) & np.isnan(v[:-1]))
    return v[keep]
