"""consumer.shadow.scorer and .candidate under the fake clock, without threads: the shedding bound, the counted
agreement and differences, failures, the input check; and the delivery mode offering after the hand-over."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from consumer.errors import ConfigError
from consumer.inference import Scored
from consumer.shadow.candidate import check_inputs
from consumer.shadow.scorer import ShadowScorer, block_runs, rest_seconds
from consumer.signature import ModelSignature, TensorSpec
from consumer.work import DecodedRequest
from tests.unit.fakes import FakeClock, FakeSession, fake_runner
from tests.unit.wired import Wired, digits_value


def part(rows: list[int], seed: int = 0) -> Scored:
    """A micro-batch of requests of ``rows`` rows each, with the serving (fake) model's outputs."""
    rng = np.random.default_rng(seed)
    requests = [DecodedRequest(None, {"input": rng.random((n, 64), dtype=np.float32)}, n, None) for n in rows]
    x = np.concatenate([r.inputs["input"] for r in requests])
    outputs = dict(zip(("label", "probabilities"), FakeSession().run(None, {"input": x}), strict=True))
    return Scored([], requests, outputs, 0)


class SlowSession(FakeSession):
    """The fake model, taking ``seconds`` of the fake clock per run; ``flip``: answers another label."""

    def __init__(self, clock: FakeClock, seconds: float, flip: bool = False) -> None:
        super().__init__()
        self.clock, self.seconds, self.flip = clock, seconds, flip

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.clock.now += self.seconds
        label, probabilities = super().run(output_names, input_feed)
        if self.flip:
            probabilities = probabilities[:, ::-1].copy()
            label = probabilities.argmax(axis=1).astype(np.int64)
        return [label, probabilities]


def scorer(digits_signature: ModelSignature, session: FakeSession, clock: FakeClock, pending: int) -> ShadowScorer:
    return ShadowScorer(
        fake_runner(digits_signature, session), digits_signature, CollectorRegistry(), max_pending=pending, clock=clock
    )


def sample(s: ShadowScorer, name: str, labels: dict[str, str] | None = None) -> float:
    return s.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def test_sheds_whole_batches_beyond_max_pending(digits_signature: ModelSignature, clock: FakeClock) -> None:
    session = SlowSession(clock, 0.004)
    s = scorer(digits_signature, session, clock, pending=2)
    s.offer([part([1, 2]), part([3])])
    s.offer([part([4]), part([2, 2, 1])])
    assert s.pending == 2
    assert sample(s, "streaminfer_shadow_shed_batches_total") == 2
    assert sample(s, "streaminfer_shadow_shed_rows_total") == 4 + 5
    assert sample(s, "streaminfer_shadow_pending_batches") == 2
    assert session.batches == []  # offering runs nothing
    assert s.run_pending() == 2
    assert session.batches == [6]  # queued together, run together
    assert s.pending == 0
    assert sample(s, "streaminfer_shadow_rows_total") == 6
    assert sample(s, "streaminfer_shadow_agreed_rows_total", {"output": "label"}) == 6
    s.offer([part([5])])  # room again
    assert s.run_pending() == 1
    assert session.batches == [6, 5]
    assert sample(s, "streaminfer_shadow_shed_batches_total") == 2
    assert sample(s, "streaminfer_shadow_seconds_count") == 2
    assert sample(s, "streaminfer_shadow_seconds_sum") == pytest.approx(0.008)


def test_the_same_model_agrees_on_every_row(digits_signature: ModelSignature, clock: FakeClock) -> None:
    s = scorer(digits_signature, FakeSession(), clock, pending=4)
    s.offer([part([3, 4], seed=1), part([1], seed=2)])
    s.run_pending()
    assert sample(s, "streaminfer_shadow_rows_total") == 8
    for output in ("label", "probabilities"):
        assert sample(s, "streaminfer_shadow_agreed_rows_total", {"output": output}) == 8
    below = sample(s, "streaminfer_shadow_max_abs_diff_bucket", {"output": "probabilities", "le": "1e-07"})
    assert below == 8


def test_a_different_candidate_is_counted_as_disagreeing(digits_signature: ModelSignature, clock: FakeClock) -> None:
    s = scorer(digits_signature, SlowSession(clock, 0.0, flip=True), clock, pending=4)
    batch = part([6], seed=3)
    s.offer([batch])
    s.run_pending()
    served = batch.outputs["probabilities"]
    flipped = served[:, ::-1]
    expected_agree = int(np.count_nonzero(served.argmax(axis=1) == flipped.argmax(axis=1)))
    assert sample(s, "streaminfer_shadow_agreed_rows_total", {"output": "label"}) == expected_agree
    assert sample(s, "streaminfer_shadow_agreed_rows_total", {"output": "probabilities"}) == expected_agree
    total = float(np.abs(served - flipped).max(axis=1).sum())
    assert sample(s, "streaminfer_shadow_max_abs_diff_sum", {"output": "probabilities"}) == pytest.approx(total)
    assert sample(s, "streaminfer_shadow_max_abs_diff_count", {"output": "probabilities"}) == 6


def test_a_failing_candidate_is_counted_and_scoring_goes_on(digits_signature: ModelSignature, clock: FakeClock) -> None:
    session = FakeSession(fail_when=lambda feeds: bool(feeds["input"].shape[0] == 5))
    s = scorer(digits_signature, session, clock, pending=4)
    s.offer([part([2]), part([3])])  # one run of 5 rows: it fails
    assert s.run_pending() == 2
    assert sample(s, "streaminfer_shadow_failures_total") == 1
    assert sample(s, "streaminfer_shadow_rows_total") == 0
    assert s.pending == 0
    s.offer([part([3])])
    assert s.run_pending() == 1
    assert sample(s, "streaminfer_shadow_rows_total") == 3


def test_inputs_the_candidate_cannot_take_are_refused(digits_signature: ModelSignature) -> None:
    check_inputs(digits_signature, digits_signature)
    dynamic = dataclasses.replace(digits_signature, inputs=(TensorSpec("input", np.dtype(np.float32), (None, None)),))
    check_inputs(digits_signature, dynamic)
    for spec, words in (
        (TensorSpec("pixels", np.dtype(np.float32), (None, 64)), "not an input of the serving model"),
        (TensorSpec("input", np.dtype(np.float64), (None, 64)), "is FP64, the serving model's is FP32"),
        (TensorSpec("input", np.dtype(np.float32), (None, 32)), "has shape [None, 32]"),
        (TensorSpec("input", np.dtype(np.float32), (None, 8, 8)), "has shape [None, 8, 8]"),
    ):
        with pytest.raises(ConfigError, match="shadow_model_path") as info:
            check_inputs(digits_signature, dataclasses.replace(digits_signature, inputs=(spec,)))
        assert words in str(info.value)


Served = tuple[list[tuple[int, bytes | None, bytes | None]], list[int | None]]


async def serve(tmp_path: Path, signature: ModelSignature, clock: FakeClock, shadow: bool) -> tuple[Served, list[bool]]:
    """Two partitions of requests (one poison record each) answered: (every answer as (partition, key, value) in
    the order written, the committed offsets), and for each item of each offered batch whether it was answered."""
    options = {"shadow_model_path": tmp_path / "model.onnx"} if shadow else {}
    candidate = fake_runner(dataclasses.replace(signature, version="2"), SlowSession(clock, 0, flip=True))
    wired = Wired(tmp_path, signature, clock, candidate=candidate if shadow else None, **options)
    offered: list[bool] = []
    await wired.start()
    scorer_ = wired.app.stages.shadow if wired.app.stages is not None else None
    assert (scorer_ is not None) == shadow
    if scorer_ is not None:
        original = scorer_.offer

        def spy(scored: list[Scored]) -> None:
            offered.extend(w.answered for p in scored for w in p.batch)
            original(scored)

        scorer_.offer = spy  # type: ignore[method-assign]
    for p in (0, 1):
        wired.send(p, [digits_value(rows=1 + i % 3, marker=float(i)) for i in range(10)] + [b"not json"])
    await wired.until(lambda: len(wired.results()) + len(wired.dead_letters()) == 22)
    await wired.until_in_time(lambda: wired.committed(0) == 11 and wired.committed(1) == 11)
    await wired.stop()
    answers = [(w.partition, w.key, w.value) for w in wired.results() + wired.dead_letters()]
    return (answers, [wired.committed(0), wired.committed(1)]), offered


async def test_offered_after_the_hand_over_served_answers_unchanged(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    """The same requests with and without a shadow candidate (one that answers otherwise): the same answers, in
    the same order, the same commits; every batch is offered once its records are answered."""
    plain, offered_plain = await serve(tmp_path, digits_signature, clock, shadow=False)
    shadowed, offered = await serve(tmp_path, digits_signature, clock, shadow=True)
    assert offered_plain == []
    assert len(offered) == 20  # every request, poison records excepted
    assert all(offered)
    assert shadowed == plain


class FeedsSession(FakeSession):
    """The fake model, keeping every feed it was given (to see what the scorer assembled)."""

    def __init__(self) -> None:
        super().__init__()
        self.feeds: list[np.ndarray] = []

    def run(self, output_names: list[str] | None, input_feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.feeds.append(input_feed["input"])
        return super().run(output_names, input_feed)


def block_parts(block: np.ndarray, cuts: list[tuple[int, int]], *, runs: bool = True) -> list[Scored]:
    """Micro-batches of one-row requests of ``block`` (``[rows, 64]``), rows ``start:stop`` per cut, each
    knowing its block runs (as the serving path gives them) or not."""
    blocks = {"input": block}
    out = []
    for start, stop in cuts:
        requests = [DecodedRequest(None, None, 1, None, block=blocks, start=i) for i in range(start, stop)]
        answered = FakeSession().run(None, {"input": block[start:stop]})
        outputs = dict(zip(("label", "probabilities"), answered, strict=True))
        out.append(Scored([], requests, outputs, 0, [(blocks, start, stop)] if runs else None))
    return out


def test_block_runs_join_parts_that_continue_each_other() -> None:
    a, b = {"input": np.zeros((8, 64), np.float32)}, {"input": np.ones((8, 64), np.float32)}
    parts = [
        Scored([], [], {}, 0, [(a, 0, 3)]),
        Scored([], [], {}, 0, [(a, 3, 5), (b, 0, 2)]),
        Scored([], [], {}, 0, [(b, 2, 4)]),
        Scored([], [], {}, 0, [(b, 6, 8)]),  # a gap: rows 4 and 5 were a dead letter's
    ]
    assert block_runs(parts) == [(a, 0, 5), (b, 0, 4), (b, 6, 8)]
    assert block_runs([*parts, Scored([], [], {}, 0, None)]) is None  # a part without runs: the requests' path


def test_parts_of_one_block_are_scored_on_a_view_of_it(digits_signature: ModelSignature, clock: FakeClock) -> None:
    session = FeedsSession()
    s = scorer(digits_signature, session, clock, pending=8)
    block = np.random.default_rng(3).random((12, 64), dtype=np.float32)
    s.offer(block_parts(block, [(0, 4), (4, 9), (9, 12)]))
    assert s.run_pending() == 3
    assert session.batches == [12]
    assert np.shares_memory(session.feeds[0], block)  # no copy
    np.testing.assert_array_equal(session.feeds[0], block)
    assert sample(s, "streaminfer_shadow_agreed_rows_total", {"output": "label"}) == 12


def test_runs_of_several_blocks_are_concatenated_in_order(digits_signature: ModelSignature, clock: FakeClock) -> None:
    session = FeedsSession()
    s = scorer(digits_signature, session, clock, pending=8)
    rng = np.random.default_rng(4)
    first, second = rng.random((6, 64), dtype=np.float32), rng.random((6, 64), dtype=np.float32)
    parts = [*block_parts(first, [(0, 2), (3, 6)]), *block_parts(second, [(0, 5)])]  # row 2 of first: not served
    s.offer(parts)
    assert s.run_pending() == 3
    np.testing.assert_array_equal(session.feeds[0], np.concatenate([first[0:2], first[3:6], second[0:5]]))
    assert sample(s, "streaminfer_shadow_rows_total") == 10
    assert sample(s, "streaminfer_shadow_agreed_rows_total", {"output": "label"}) == 10


def test_parts_without_runs_are_assembled_from_their_requests_alike(
    digits_signature: ModelSignature, clock: FakeClock
) -> None:
    block = np.random.default_rng(5).random((9, 64), dtype=np.float32)
    fed = []
    for runs in (True, False):
        session = FeedsSession()
        s = scorer(digits_signature, session, clock, pending=8)
        s.offer(block_parts(block, [(0, 3), (5, 9)], runs=runs))
        s.run_pending()
        fed.append(session.feeds[0])
    np.testing.assert_array_equal(fed[0], fed[1])
    np.testing.assert_array_equal(fed[0], np.concatenate([block[0:3], block[5:9]]))


async def test_the_serving_path_offers_each_part_with_the_block_runs_of_its_requests(
    tmp_path: Path, digits_signature: ModelSignature, clock: FakeClock
) -> None:
    """What the scorer reads instead of the requests (Scored.runs) holds exactly their rows, in order."""
    candidate = fake_runner(dataclasses.replace(digits_signature, version="2"), FakeSession())
    wired = Wired(tmp_path, digits_signature, clock, candidate=candidate, shadow_model_path=tmp_path / "model.onnx")
    await wired.start()
    scorer_ = wired.app.stages.shadow if wired.app.stages is not None else None
    assert scorer_ is not None
    parts: list[Scored] = []
    original = scorer_.offer

    def spy(scored: list[Scored]) -> None:
        parts.extend(scored)
        original(scored)

    scorer_.offer = spy  # type: ignore[method-assign]
    wired.send(0, [digits_value(rows=1 + i % 3, marker=float(i)) for i in range(12)] + [b"not json"])
    await wired.until(lambda: len(wired.results()) + len(wired.dead_letters()) == 13)
    await wired.stop()
    assert sum(len(p.requests) for p in parts) == 12
    for p in parts:
        assert p.runs is not None
        from_runs = np.concatenate([block["input"][start:stop] for block, start, stop in p.runs])
        np.testing.assert_array_equal(from_runs, np.concatenate([r.inputs["input"] for r in p.requests]))


@pytest.mark.parametrize(
    ("busy", "share", "rest"), [(0.1, 1.0, 0.0), (0.1, 0.5, 0.1), (0.1, 0.25, 0.3), (0.02, 0.2, 0.08), (-1.0, 0.5, 0.0)]
)
def test_the_thread_rests_so_that_it_scores_at_most_its_share_of_the_time(
    busy: float, share: float, rest: float
) -> None:
    assert rest_seconds(busy, share) == pytest.approx(rest)
    if busy > 0:
        assert busy / (busy + rest_seconds(busy, share)) == pytest.approx(share)


def test_the_setting_reaches_the_scorer(tmp_path: Path, digits_signature: ModelSignature) -> None:
    from consumer.config import Settings
    from consumer.shadow.scorer import build_shadow

    for name in ("m.onnx", "c.onnx"):
        (tmp_path / name).write_bytes(b"")
    paths = {"model_path": tmp_path / "m.onnx", "shadow_model_path": tmp_path / "c.onnx"}
    settings = Settings(**paths, shadow_max_busy_share=0.3)
    runner = fake_runner(digits_signature)
    s = build_shadow(settings, runner, digits_signature, CollectorRegistry(), clients=None)  # type: ignore[arg-type]
    assert s._max_busy_share == 0.3
