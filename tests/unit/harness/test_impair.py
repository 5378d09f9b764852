"""The user-space link impairment (harness/impair.py): loss, delay with jitter, order kept, counts. No TUN
device: the forwarder's decisions are driven with an injected clock and seeded random source."""

from __future__ import annotations

import random

import pytest

from harness.impair import IDLE_WAIT_S, Impairment, main

A, B = 10, 11  # stand-in descriptors: only compared, never read


def impairment(delay_ms: float = 50, jitter_ms: float = 10, loss: float = 0.0, seed: int = 1) -> Impairment:
    return Impairment((A, B), delay_ms, jitter_ms, loss, random.Random(seed), clock=lambda: 0.0)


def test_packets_wait_their_delay_and_keep_their_order() -> None:
    imp = impairment(delay_ms=50, jitter_ms=10)
    for i in range(200):
        imp.take(A, f"a{i}".encode(), now=i * 0.001)  # one packet a millisecond, jitter 20 ms wide: overlaps
    imp.take(B, b"b0", now=0.0)
    assert imp.due(0.039) == []  # nothing before delay - jitter
    out = imp.due(1.0)
    assert [p for target, p in out if target == B] == [f"a{i}".encode() for i in range(200)]  # A -> B, in order
    assert [p for target, p in out if target == A] == [b"b0"]
    assert imp.counts.passed == {"a_to_b": 200, "b_to_a": 1}
    assert imp.counts.lost == 0


def test_the_delay_stays_within_the_jitter() -> None:
    imp = impairment(delay_ms=50, jitter_ms=10)
    for i in range(500):
        imp.take(A, b"p", now=i * 1.0)  # a second apart: no packet waits for the one before it
    dues = [due - i * 1.0 for i, (due, _) in enumerate(imp.queues[A])]
    assert min(dues) >= 0.040 - 1e-9
    assert max(dues) <= 0.060 + 1e-9
    assert max(dues) - min(dues) > 0.015  # the jitter is used, not a fixed delay


def test_loss_drops_about_the_share_asked_for_each_way() -> None:
    imp = impairment(delay_ms=0, jitter_ms=0, loss=0.01, seed=7)
    for _ in range(20_000):
        imp.take(A, b"p", now=0.0)
        imp.take(B, b"q", now=0.0)
    imp.due(0.0)
    for way in ("a_to_b", "b_to_a"):
        assert 120 <= imp.counts.dropped[way] <= 280  # 1 % of 20,000 = 200; binomial sd 14
        assert imp.counts.dropped[way] + imp.counts.passed[way] == 20_000
    assert imp.counts.total == 40_000


def test_no_loss_and_no_delay_passes_everything_at_once() -> None:
    imp = impairment(delay_ms=0, jitter_ms=0, loss=0.0)
    imp.take(A, b"x", now=5.0)
    assert imp.wait_s(5.0) == 0.0
    assert imp.due(5.0) == [(B, b"x")]
    assert imp.wait_s(5.0) == IDLE_WAIT_S  # nothing queued: wake up to look for a stop


def test_the_wait_is_until_the_next_packet_is_due() -> None:
    imp = impairment(delay_ms=100, jitter_ms=0)
    imp.take(B, b"x", now=0.0)
    assert imp.wait_s(0.05) == pytest.approx(0.05)
    assert imp.wait_s(0.0) == pytest.approx(min(0.1, IDLE_WAIT_S))


@pytest.mark.parametrize("flags", [["--loss", "1.5"], ["--delay-ms", "-1"], ["--jitter-ms", "-2"]])
def test_bad_flags_are_refused(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--fds", "3,4", *flags])
    assert exc.value.code == 2
    assert "--loss must be in [0, 1]" in capsys.readouterr().err
