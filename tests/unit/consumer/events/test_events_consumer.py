"""JSON events through the whole consumer wired to fakes (tests/unit/wired.py): enriched results in each partition's
order, bad events dead-lettered with their reasons, tombstones forwarded, commits past all of them."""

from __future__ import annotations

from pathlib import Path

import orjson

from consumer.signature import ModelSignature
from tests.unit.fakes import FakeClock
from tests.unit.wired import Wired, in_offset_order, per_destination, source_of

MAPPING = """
inputs:
  input: [pixels]
outputs:
  label: digit
  probabilities: null
"""


async def test_events_are_answered_enriched_and_tombstones_forwarded(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(MAPPING)
    h = Wired(tmp_path, digits_signature, clock, request_format="json", input_mapping=mapping)
    await h.start(partitions=(0,))
    pixels = [[float(i == k) for i in range(64)] for k in range(10)]
    events = [orjson.dumps({"id": f"e{k}", "pixels": pixels[k % 10]}) for k in range(6)]
    events[2] = orjson.dumps({"id": "e2", "pixels": pixels[2][:10]})  # 10 values for a [batch, 64] input
    events[4] = orjson.dumps({"id": "e4", "pixels": pixels[4], "digit": 7})  # the result would overwrite it
    h.send(0, [*events, None])  # type: ignore[list-item]  # a tombstone last
    await h.until(lambda: h.committed(0) == 7)
    assert all(in_offset_order(answers) for answers in per_destination(h.handed_over()).values())
    results = sorted(h.results(), key=source_of)
    assert [source_of(w)[1] for w in results] == [0, 1, 3, 5, 6]  # the tombstone's answer included
    bodies = [orjson.loads(w.value) for w in results[:4] if w.value is not None]
    assert bodies == [{"id": f"e{k}", "pixels": pixels[k], "digit": k} for k in (0, 1, 3, 5)]  # the fake's argmax
    assert results[4].value is None
    assert results[4].key == b"p0-6"
    assert h.reasons() == {(0, 2): "wrong_type", (0, 4): "field_clash"}
    registry = h.metrics.registry
    assert registry.get_sample_value("streaminfer_records_total", {"outcome": "tombstone"}) == 1
    assert registry.get_sample_value("streaminfer_records_total", {"outcome": "result"}) == 4
    assert registry.get_sample_value("streaminfer_records_total", {"outcome": "dead_letter"}) == 2
    await h.stop()
