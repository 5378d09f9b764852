"""Preallocated input buffers: a micro-batch's feeds are copied into them instead of allocated per batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


class BatchBuffers:
    """Preallocated input buffers that a micro-batch is copied into, one set per pipeline slot.

    Each input gets one flat buffer of ``capacity`` elements, grown (doubled) when a batch needs more; a batch of
    ``[rows, *dims]`` is the contiguous view of its first ``rows * prod(dims)`` elements, so nothing is allocated
    per batch once the buffers have grown to the largest batch. ONNX Runtime reads the views in place.

    Args:
        dtypes: input name -> numpy dtype.
        pad_values: input name -> the value padded positions get (sequence models); 0 when absent.
    """

    def __init__(self, dtypes: Mapping[str, np.dtype[Any]], pad_values: Mapping[str, int] | None = None) -> None:
        self._dtypes = dict(dtypes)
        self._pads = dict(pad_values or {})
        self._flat: dict[str, np.ndarray] = {}

    def _view(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        need = int(np.prod(shape))
        flat = self._flat.get(name)
        if flat is None or flat.size < need:
            grown = max(need, 2 * (flat.size if flat is not None else 0))
            flat = self._flat[name] = np.empty(grown, self._dtypes[name])
        return flat[:need].reshape(shape)

    def stack(self, requests: Sequence[Mapping[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], int]:
        """Copy requests' inputs (same non-batch shapes) one after another along axis 0.

        Returns:
            (feeds, rows): input name -> view ``[sum of rows, ...]``, and the total rows.
        """
        rows = sum(int(next(iter(r.values())).shape[0]) for r in requests)
        feeds: dict[str, np.ndarray] = {}
        for name in requests[0]:
            first = requests[0][name]
            out = self._view(name, (rows, *first.shape[1:]))
            start = 0
            for r in requests:
                n = r[name].shape[0]
                out[start : start + n] = r[name]
                start += n
            feeds[name] = out
        return feeds, rows

    def pad(self, requests: Sequence[Mapping[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], int, int]:
        """Copy ``[rows_i, L_i]`` requests into ``[sum rows, max L]``, padding each row's tail.

        Returns:
            (feeds, rows, length): input name -> view ``[rows, length]``, total rows, padded length in tokens.
        """
        rows = 0
        length = 0
        for r in requests:
            arr = next(iter(r.values()))
            rows += int(arr.shape[0])
            length = max(length, int(arr.shape[1]))
        feeds: dict[str, np.ndarray] = {}
        for name in requests[0]:
            out = self._view(name, (rows, length))
            out.fill(self._pads.get(name, 0))
            start = 0
            for r in requests:
                src = r[name]
                out[start : start + src.shape[0], : src.shape[1]] = src
                start += src.shape[0]
            feeds[name] = out
        return feeds, rows, length
