"""harness.bench.profile: py-spy's raw stacks into own-time, total-time and per-file shares."""

from __future__ import annotations

from harness.bench.profile import parse, table

RAW = """\
<module> (consumer/__main__.py:10);run (consumer/app.py:50);decode_chunk (consumer/oip/chunk.py:120) 6
<module> (consumer/__main__.py:10);run (consumer/app.py:50);send_batch (aiokafka/producer/producer.py:400) 3
<module> (consumer/__main__.py:10);run (consumer/app.py:50) 1
not a stack line
"""


def test_own_time_is_the_innermost_frame_and_total_time_counts_each_function_once_per_stack() -> None:
    own, inclusive, files, total = parse(RAW)
    assert total == 10
    assert own["decode_chunk (consumer/oip/chunk.py)"] == 6
    assert own["run (consumer/app.py)"] == 1
    assert inclusive["run (consumer/app.py)"] == 10
    assert files["aiokafka/producer/producer.py"] == 3
    lines = table("Own", own, total, 2)
    assert lines[4] == "| 60.0 % | `decode_chunk (consumer/oip/chunk.py)` |"
    assert len(lines) == 7  # title, blank, header, rule, 2 rows, blank
