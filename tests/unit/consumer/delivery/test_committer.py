"""The committer (consumer/delivery/committer.py) in a consumer wired to fakes: commits never pass the first
unacknowledged answer."""

from __future__ import annotations

from pathlib import Path

from consumer.signature import ModelSignature
from tests.unit.fakes import FakeClock
from tests.unit.wired import Wired, digits_value, source_of


async def test_commit_never_passes_the_first_unacknowledged_answer(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    h = Wired(tmp_path, digits_signature, clock)
    h.cluster.policy = "hold"
    await h.start(partitions=(0,))
    h.send(0, [digits_value() for _ in range(10)])
    await h.until(lambda: sum(len(b) for _, _, b in h.cluster.held) == 10)
    holds_3 = lambda batch: any(source_of(w) == (0, 3) for w in batch)  # noqa: E731
    assert h.cluster.settle(where=lambda batch: not holds_3(batch)) > 0
    unacknowledged = sorted(source_of(w)[1] for _, _, batch in h.cluster.held for w in batch)
    assert 3 in unacknowledged
    assert unacknowledged[-1] < 9  # answers after the held batch are acknowledged
    await h.quiet()
    # the commit stops exactly at the first answer still unacknowledged (None: not even offset 0 is)
    assert h.committed(0) == (unacknowledged[0] or None)
    assert h.app.lag == 10 - h.committed(0)
    h.cluster.settle()
    await h.until(lambda: h.committed(0) == 10)
    await h.until(lambda: h.app.lag == 0)
    await h.stop()
