"""Bounded unpacking of fetched record batches: a compression bomb becomes a dead letter, not an out-of-memory.

The broker checks a produced batch's *compressed* size against ``max.message.bytes``; a batch of a few kilobytes of
zstd can hold gigabytes of zeros. aiokafka unpacks a compressed batch whole, inside ``getmany``, before any check of
ours could see a record, so :func:`install` puts two narrow hooks into the client:

1. **Capped codecs.** The record modules look their codec functions up by name at call time (``gzip_decode``,
   ``snappy_decode``, ``lz4_decode``, ``zstd_decode`` in ``aiokafka.record.default_records``, its compiled twin
   ``aiokafka.record._crecords.default_records`` and the two ``legacy_records``). They are replaced by decoders that
   never write more than ``max_batch_bytes``: zlib's ``max_length`` for gzip, ``cramjam``'s ``decompress_into`` a
   buffer of that size for lz4 and zstd (it fails instead of growing), and the length every raw snappy block
   declares, read before the block is unpacked. Past the cap they raise :class:`BatchTooLarge`.
2. **Stand-ins.** ``aiokafka.consumer.fetcher.MemoryRecords`` is wrapped so that every batch the fetcher iterates
   turns a :class:`BatchTooLarge` into one record standing for the whole batch (at the batch's last offset, so the
   client moves past it), a batch its codec cannot unpack at all (a corrupt payload the broker accepted, e.g.
   gzip or lz4 with trailing garbage) into the same kind of stand-in, and a record whose key, value and headers
   exceed ``max_record_bytes`` into one without its value (and without its key and headers where those alone are
   too large). Every stand-in's value is a :class:`Dropped` (an empty ``bytes`` carrying the offsets and sizes
   seen); the intake dead-letters it ``too_large`` (``undecodable_record`` for a corrupt batch) and the dead letter
   never carries the bomb.

Memory: one partially read batch per assigned partition (at most ``max_batch_bytes`` each, unpacked) plus the records
fetched and not yet answered (``max_in_flight_bytes``). Checked against aiokafka 0.12 to 0.14 (the versions
``pyproject.toml`` allows): :func:`install` raises :class:`~consumer.errors.ConfigError` if a hook point is missing,
and tests/unit/test_unpack.py runs real batches built by the client's own builders through both record
implementations.
"""

from __future__ import annotations

import importlib
import itertools
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from consumer.errors import ConfigError

#: The codec names the record modules call, and the modules that call them.
CODEC_NAMES = ("gzip_decode", "snappy_decode", "lz4_decode", "zstd_decode")
RECORD_MODULES = (
    "aiokafka.record.default_records",
    "aiokafka.record._crecords.default_records",
    "aiokafka.record.legacy_records",
    "aiokafka.record._crecords.legacy_records",
)
#: The start of a snappy stream in xerial's framing (what Kafka's Java client writes): 8 magic bytes, then two
#: int32 versions; blocks follow as (int32 length, raw snappy bytes).
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER_BYTES = 16
#: First output buffer for lz4 and zstd, bytes: most batches fit; a larger one is tried again at the cap.
FIRST_GUESS_RATIO = 32
FIRST_GUESS_MIN_BYTES = 1 << 20


class BatchTooLarge(Exception):
    """A compressed record batch unpacks to more than the cap.

    Attributes:
        compressed_bytes: the batch's compressed payload, bytes.
        cap: the cap it passed, bytes (it unpacks to more).
    """

    def __init__(self, compressed_bytes: int, cap: int) -> None:
        super().__init__(f"{compressed_bytes} compressed bytes unpack to more than {cap} bytes")
        self.compressed_bytes = compressed_bytes
        self.cap = cap


class BatchCorrupt(Exception):
    """A compressed record batch its codec cannot unpack (a corrupt payload the broker accepted).

    Attributes:
        compressed_bytes: the batch's compressed payload, bytes.
        error: the codec's error, as text.
    """

    def __init__(self, compressed_bytes: int, error: str) -> None:
        super().__init__(error)
        self.compressed_bytes = compressed_bytes
        self.error = error


#: Bytes the last capped decode produced (the event loop unpacks one batch at a time; read right after it).
LAST_UNPACKED = [0]


def _reporting(decode: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """``decode`` with every error but :class:`BatchTooLarge` raised as :class:`BatchCorrupt`."""

    def guarded(payload: Any) -> bytes:
        try:
            out = decode(payload)
            LAST_UNPACKED[0] = len(out)
            return out
        except BatchTooLarge:
            raise
        except Exception as exc:  # zlib.error, cramjam.DecompressionError, ValueError, struct.error, ...
            raise BatchCorrupt(len(payload), f"{type(exc).__name__}: {exc}") from exc

    return guarded


class Dropped(bytes):
    """The (empty) value of a stand-in record: what was dropped and why.

    Attributes:
        first_offset, last_offset: the source offsets it stands for (equal for one record).
        compressed_bytes: a whole batch: its compressed payload, bytes; None for one record.
        unpacked_bytes: a whole batch: the cap it passed (it unpacks to more), bytes; one record: its key, value and
            headers, bytes.
        limit_name, limit: the setting it broke and its value, bytes.
        error: a whole batch the client cannot unpack at all (a corrupt payload): why; None otherwise.
    """

    first_offset: int
    last_offset: int
    compressed_bytes: int | None
    unpacked_bytes: int
    limit_name: str
    limit: int
    error: str | None = None

    @classmethod
    def make(
        cls,
        first_offset: int,
        last_offset: int,
        compressed_bytes: int | None,
        unpacked_bytes: int,
        limit_name: str,
        limit: int,
        error: str | None = None,
    ) -> Dropped:
        """A stand-in value (see the attributes)."""
        out = cls(b"")
        out.first_offset, out.last_offset = first_offset, last_offset
        out.compressed_bytes, out.unpacked_bytes = compressed_bytes, unpacked_bytes
        out.limit_name, out.limit, out.error = limit_name, limit, error
        return out

    def describe(self) -> str:
        """The dead letter's message."""
        if self.error is not None:
            return (
                f"record batch of offsets {self.first_offset}-{self.last_offset} ({self.compressed_bytes} bytes "
                f"compressed) cannot be unpacked: {self.error}"
            )
        if self.compressed_bytes is not None:
            return (
                f"record batch of offsets {self.first_offset}-{self.last_offset} ({self.compressed_bytes} bytes "
                f"compressed) unpacks to more than {self.limit_name}={self.limit} bytes; not unpacked"
            )
        return (
            f"record of {self.unpacked_bytes} bytes (key, value and headers) exceeds {self.limit_name}={self.limit}; "
            "not kept"
        )


class _StandIn:
    """A record the fetcher wraps as usual (it reads these attributes only)."""

    __slots__ = ("headers", "key", "offset", "timestamp", "timestamp_type", "value")
    checksum = None

    def __init__(self, offset: int, timestamp: int, timestamp_type: int, key: Any, value: Dropped, headers: Any):
        self.offset, self.timestamp, self.timestamp_type = offset, timestamp, timestamp_type
        self.key, self.value, self.headers = key, value, headers


# -- capped decoders
def capped_gzip(cap: int) -> Callable[[Any], bytes]:
    """A ``gzip_decode`` that raises :class:`BatchTooLarge` past ``cap`` output bytes (every gzip member)."""

    def decode(payload: Any) -> bytes:
        data = bytes(payload)
        out: list[bytes] = []
        total = 0
        while data:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            chunk = inflater.decompress(data, cap + 1 - total)
            total += len(chunk)
            out.append(chunk)
            if total > cap or inflater.unconsumed_tail:
                raise BatchTooLarge(len(payload), cap)
            if not inflater.eof:
                raise zlib.error("truncated gzip stream")
            data = inflater.unused_data.lstrip(b"\0")  # zero padding after a member is allowed (as gzip reads it)
        return b"".join(out)

    return decode


def capped_into(decompress_into: Callable[[Any, Any], int], cap: int) -> Callable[[Any], bytes]:
    """A decoder over ``cramjam.<codec>.decompress_into`` (lz4 frames, zstd) that never writes past ``cap`` bytes:
    it unpacks into a buffer of a first guess, then of ``cap`` + 1 bytes, and raises :class:`BatchTooLarge` when even
    that one fills (any other ``cramjam.DecompressionError`` means a corrupt payload and is raised as it is)."""
    import cramjam

    def decode(payload: Any) -> bytes:
        size = len(payload)
        guess = max(FIRST_GUESS_MIN_BYTES, size * FIRST_GUESS_RATIO)
        for room in (guess, cap + 1) if guess <= cap else (cap + 1,):
            try:
                buffer = np.empty(room, np.uint8)  # pages are only touched as output is written
            except MemoryError:
                raise BatchTooLarge(size, cap) from None
            try:
                written = decompress_into(payload, buffer)
            except cramjam.DecompressionError as exc:
                if "whole buffer" not in str(exc):  # cramjam's message when the output does not fit
                    raise
                continue
            if written <= cap:
                return buffer[:written].tobytes()
        raise BatchTooLarge(size, cap)

    return decode


def capped_snappy(cap: int) -> Callable[[Any], bytes]:
    """A ``snappy_decode`` (xerial framing or one raw block) that reads every raw block's declared length before
    unpacking it and raises :class:`BatchTooLarge` once they add up past ``cap``."""
    import cramjam

    raw_len, raw = cramjam.snappy.decompress_raw_len, cramjam.snappy.decompress_raw

    def decode(payload: Any) -> bytes:
        data = memoryview(bytes(payload))
        if bytes(data[:8]) == XERIAL_MAGIC and len(data) >= XERIAL_HEADER_BYTES:
            blocks = []
            cursor = XERIAL_HEADER_BYTES
            while cursor < len(data):
                (length,) = struct.unpack_from("!i", data, cursor)
                cursor += 4
                if length < 0 or cursor + length > len(data):
                    raise ValueError(f"corrupt xerial snappy block length {length} at byte {cursor - 4}")
                blocks.append(data[cursor : cursor + length])
                cursor += length
        else:
            blocks = [data]
        total = 0
        for block in blocks:
            total += raw_len(block)
            if total > cap:
                raise BatchTooLarge(len(data), cap)
        return b"".join(bytes(raw(block)) for block in blocks)

    return decode


def capped_codecs(cap: int) -> dict[str, Callable[[Any], bytes]]:
    """Every codec name of :data:`CODEC_NAMES` -> its capped decoder (``cap``: output bytes)."""
    import cramjam

    return {
        "gzip_decode": _reporting(capped_gzip(cap)),
        "snappy_decode": _reporting(capped_snappy(cap)),
        "lz4_decode": _reporting(capped_into(cramjam.lz4.decompress_into, cap)),
        "zstd_decode": _reporting(capped_into(cramjam.zstd.decompress_into, cap)),
    }


# -- stand-ins
#: A sentinel no batch ever yields.
_NO_RECORD = object()


class GuardedBatch:
    """One record batch as the fetcher iterates it, with stand-ins (see the module docstring).

    Args:
        batch: the client's batch (either record implementation).
        max_record_bytes: a record whose key, value and headers add up to more becomes a stand-in without its
            value, bytes (its key and headers stay where they alone fit: the correlation ID is in them).
        wire_bytes: the batch's size in the fetch, bytes: an uncompressed batch no larger than
            ``max_record_bytes`` (a compressed one that unpacked to no more) holds no record to check.
    """

    def __init__(self, batch: Any, max_record_bytes: int, wire_bytes: int) -> None:
        self._batch = batch
        self._max_record_bytes = max_record_bytes
        self._wire_bytes = wire_bytes
        self._records: Iterator[Any] | None = None
        # What the fetcher reads of every batch, read once here (not through __getattr__, a Python call each)
        self.validate_crc = batch.validate_crc
        self.next_offset = batch.next_offset
        self.is_control_batch = batch.is_control_batch
        self.producer_id = batch.producer_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __iter__(self) -> Iterator[Any]:
        if self._records is None:
            self._records = self._open()
        return self._records

    def __next__(self) -> Any:  # aiokafka's _contains_abort_marker calls next() on a control batch
        if self._records is None:
            self._records = self._open()
        return next(self._records)

    def _open(self) -> Iterator[Any]:
        """The batch's records with their stand-ins. Where no record can need one (the batch, unpacked, is no larger
        than ``max_record_bytes``) that is the client's own compiled iterator behind the first record, so the
        fetcher's loop costs nothing here per record."""
        batch = self._batch
        try:
            records = iter(batch)  # a compressed batch is unpacked here (compiled) or at its first record (Python);
            record = next(records)  # the compiled batch may be iterated once: next() on it from here on
        except StopIteration:
            return iter(())
        except (BatchTooLarge, BatchCorrupt) as exc:
            return iter((self._whole(exc),))
        unpacked = LAST_UNPACKED[0] if batch.compression_type else self._wire_bytes
        if unpacked <= self._max_record_bytes:  # no record can be larger than its batch: nothing to check per record
            # chain() would call iter() on the compiled batch again (it refuses a second iteration): its __next__
            # until StopIteration instead (the sentinel is never a record)
            return itertools.chain((record,), iter(records.__next__, _NO_RECORD))
        return self._checked(record, records)

    def _checked(self, record: Any, records: Iterator[Any]) -> Iterator[Any]:
        """``record`` and the rest of ``records``, each one too large as a stand-in without its value."""
        limit = self._max_record_bytes
        while True:
            value, key, headers = record.value, record.key, record.headers
            size = (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
            for name, header in headers or ():
                size += len(name) + (len(header) if header is not None else 0)
            if size > limit:
                dropped = Dropped.make(record.offset, record.offset, None, size, "max_record_bytes", limit)
                kept = size - (len(value) if value is not None else 0) <= limit  # key and headers alone fit
                yield _StandIn(
                    record.offset,
                    record.timestamp,
                    record.timestamp_type,
                    key if kept else None,
                    dropped,
                    headers if kept else [],
                )
            else:
                yield record
            try:
                record = next(records)
            except StopIteration:
                return

    def _whole(self, exc: BatchTooLarge | BatchCorrupt) -> _StandIn:
        """The stand-in for a batch that was not unpacked, at its last offset."""
        batch = self._batch
        last = batch.next_offset - 1
        first = getattr(batch, "base_offset", last)
        if isinstance(exc, BatchTooLarge):
            value = Dropped.make(first, last, exc.compressed_bytes, exc.cap, "max_batch_unpacked_bytes", exc.cap)
        else:
            value = Dropped.make(first, last, exc.compressed_bytes, 0, "", 0, error=exc.error)
        return _StandIn(last, getattr(batch, "max_timestamp", -1), getattr(batch, "timestamp_type", 0), None, value, [])


class GuardedRecords:
    """Wraps the client's ``MemoryRecords`` (one partition's fetched bytes): its batches are :class:`GuardedBatch`."""

    max_record_bytes = 1_048_576
    memory_records: Any = None

    has_next: Callable[[], bool]

    def __init__(self, data: Any) -> None:
        self._records = type(self).memory_records(data)
        self._data = memoryview(data)
        self._pos = 0
        self.has_next = self._records.has_next  # the client's own (the fetcher calls it once per batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._records, name)

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        if batch is None:
            return None
        # Every batch (and v0/v1 message set) starts with offset int64, length int32: its size is length + 12.
        (length,) = struct.unpack_from(">i", self._data, self._pos + 8)
        self._pos += length + 12
        return GuardedBatch(batch, self.max_record_bytes, length + 12)


def install(max_batch_bytes: int, max_record_bytes: int) -> None:
    """Bound the client's unpacking in this process (see the module docstring); calling it again re-sets the caps.

    Args:
        max_batch_bytes: a compressed batch unpacks to at most this, bytes (else one stand-in for the batch).
        max_record_bytes: a record's value above this becomes a stand-in without it, bytes.

    Raises:
        ConfigError: the installed aiokafka lacks a hook point (a version this module was not checked against).
    """
    codecs = capped_codecs(max_batch_bytes)
    found = 0
    for name in RECORD_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # the compiled records are optional (AIOKAFKA_NO_EXTENSIONS, no wheel)
            continue
        for codec in CODEC_NAMES:
            if hasattr(module, codec):
                setattr(module, codec, codecs[codec])
                found += 1
    fetcher = importlib.import_module("aiokafka.consumer.fetcher")
    current = getattr(fetcher, "MemoryRecords", None)
    if found < 4 or current is None:
        raise ConfigError(
            "this aiokafka version cannot be bounded (no codec names or fetcher.MemoryRecords to hook); "
            "install aiokafka>=0.12,<0.15"
        )
    if not (isinstance(current, type) and issubclass(current, GuardedRecords)):
        GuardedRecords.memory_records = current
        fetcher.MemoryRecords = GuardedRecords  # type: ignore[attr-defined]
    GuardedRecords.max_record_bytes = max_record_bytes
