"""Kafka's default partitioner for many keys at once: the partition ``send`` would pick for each key.

A keyed record goes to ``(murmur2(key) & 0x7fffffff) % partitions`` (``org.apache.kafka.common.utils.Utils.murmur2``,
as aiokafka's ``DefaultPartitioner`` implements it in pure Python, one key at a time); a record without a key to a
random partition. Here the hash runs over numpy ``uint32`` columns of all keys of one length together, so a chunk
of answers pays a few array operations instead of a Python loop per key. ``tests/unit/test_partitioner.py`` checks
it against aiokafka's own ``murmur2``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

_SEED = 0x9747B28C
_M = np.uint32(0x5BD1E995)


def murmur2_many(keys: Sequence[bytes]) -> np.ndarray:
    """Kafka's murmur2 of every key.

    Returns:
        ``uint32`` array, one hash per key, equal to aiokafka's ``murmur2(key)``.
    """
    out = np.empty(len(keys), dtype=np.uint32)
    lengths = set(map(len, keys))
    groups: list[tuple[int, slice | list[int]]]
    if len(lengths) == 1:  # the usual case (correlation IDs of one format): no per-key grouping
        groups = [(lengths.pop(), slice(None))]
    else:
        by_length: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            by_length.setdefault(len(key), []).append(i)
        groups = list(by_length.items())
    with np.errstate(over="ignore"):
        for length, index in groups:
            chosen = keys if type(index) is slice else [keys[i] for i in index]
            n = len(chosen)
            h = np.full(n, (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
            data = np.frombuffer(b"".join(chosen), dtype=np.uint8).reshape(n, length)
            words = length // 4
            if words:
                block = np.ascontiguousarray(data[:, : words * 4]).view("<u4").astype(np.uint32)
                for j in range(words):
                    k = block[:, j] * _M
                    k ^= k >> np.uint32(24)
                    k *= _M
                    h *= _M
                    h ^= k
            tail = length & ~3
            extra = length % 4
            if extra >= 3:
                h ^= data[:, tail + 2].astype(np.uint32) << np.uint32(16)
            if extra >= 2:
                h ^= data[:, tail + 1].astype(np.uint32) << np.uint32(8)
            if extra >= 1:
                h ^= data[:, tail].astype(np.uint32)
                h *= _M
            h ^= h >> np.uint32(13)
            h *= _M
            h ^= h >> np.uint32(15)
            out[index] = h
    return out


def partitions_for_keys(keys: Sequence[bytes | None], partitions: Sequence[int]) -> list[int]:
    """The partition of each key among ``partitions`` (sorted ids): murmur2 for a key, random for None."""
    if not partitions:
        raise ValueError("a topic has at least one partition")
    if None not in keys:  # every key set (the usual case): one array index, no per-key loop
        hashes = murmur2_many(keys)  # type: ignore[arg-type]  # keys holds no None
        indices = (hashes & np.uint32(0x7FFFFFFF)) % np.uint32(len(partitions))
        return np.asarray(partitions)[indices].tolist()  # type: ignore[no-any-return]
    keyed = [i for i, key in enumerate(keys) if key is not None]
    chosen = [0] * len(keys)
    if keyed:
        hashes = murmur2_many([keys[i] for i in keyed])  # type: ignore[misc]  # keyed holds no None
        indices = ((hashes & np.uint32(0x7FFFFFFF)) % np.uint32(len(partitions))).tolist()
        for i, index in zip(keyed, indices, strict=True):
            chosen[i] = partitions[index]
    if len(keyed) < len(keys):
        for i, key in enumerate(keys):
            if key is None:
                chosen[i] = random.choice(partitions)  # noqa: S311 (spreading load, not security)
    return chosen
