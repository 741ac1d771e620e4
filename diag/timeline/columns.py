"""Arrow columns as the NumPy arrays and Python lists the timelines compute on: nulls made
explicit, one conversion per column; and the kernel classes as small integers."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from diag.knowledge import kernels

I64 = npt.NDArray[np.int64]


# Kernel classes by index: an activity's class is held as its index into CLASSES while the
# timeline is built (diag/knowledge/kernels.py KernelClass order: gemm, attention, comm, copy, memset, other).
CLASSES = tuple(str(k) for k in kernels.KernelClass)
_GEMM, _ATTENTION, _COMM, _COPY, _MEMSET, _OTHER = range(len(CLASSES))
_CLASS_NAMES = np.array(CLASSES, dtype=object)


def numpy_of(col: pa.Array | pa.ChunkedArray, dtype: Any) -> npt.NDArray[Any]:
    """A column without nulls as NumPy, by Arrow's own conversion: ~1 µs a small column, where
    np.asarray goes through the array protocol at ~9 µs, and each rank reads some forty (a rank of
    20 kernels is analyzed in ~5 ms: issue 16's 10,000 small files)."""
    return col.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _ints(col: pa.ChunkedArray) -> I64:
    """An integer column as int64, nulls as -1 (where they matter, `_valid` tells them apart)."""
    return numpy_of(col if col.null_count == 0 else col.fill_null(-1), np.int64)


def _valid(col: pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    return numpy_of(col.is_valid(), bool)


def _strings(col: pa.ChunkedArray) -> list[Any]:
    """A string column as a list: one str object per distinct value, not per row."""
    encoded = col.combine_chunks().dictionary_encode(null_encoding="encode")
    return np.array(encoded.dictionary.to_pylist(), dtype=object)[encoded.indices.to_numpy()].tolist()


def _take(col: pa.ChunkedArray, idx: I64) -> list[Any]:
    """col[i] for each index, None where the index is -1."""
    return col.take(pa.array(idx, mask=idx < 0)).to_pylist()
