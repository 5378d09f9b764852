"""The vectorised partitioner picks the partition aiokafka's own DefaultPartitioner picks, key for key."""

from __future__ import annotations

import random

from aiokafka.partitioner import DefaultPartitioner, murmur2

from consumer.kafka.partitioner import murmur2_many, partitions_for_keys


def test_murmur2_of_every_length_equals_aiokafkas() -> None:
    rng = random.Random(1)
    keys = [bytes(rng.randrange(256) for _ in range(n)) for n in range(0, 41) for _ in range(25)]
    assert [int(h) for h in murmur2_many(keys)] == [murmur2(k) for k in keys]


def test_partitions_equal_the_default_partitioners() -> None:
    rng = random.Random(2)
    keys = [f"key-{rng.randrange(10**9)}".encode() for _ in range(2000)] + [b"", b"\xff" * 7]
    for partitions in ([0], [0, 1, 2], list(range(12)), [3, 5, 8]):
        want = [DefaultPartitioner()(k, partitions, partitions) for k in keys]
        assert partitions_for_keys(keys, partitions) == want


def test_records_without_a_key_go_to_some_partition() -> None:
    chosen = partitions_for_keys([None, b"a", None], [4, 7])
    assert chosen[1] == DefaultPartitioner()(b"a", [4, 7], [4, 7])
    assert {chosen[0], chosen[2]} <= {4, 7}


def test_keys_of_one_length_take_the_ungrouped_path_and_agree() -> None:
    rng = random.Random(3)
    for length in range(0, 41):
        keys = [bytes(rng.randrange(256) for _ in range(length)) for _ in range(50)]
        assert [int(h) for h in murmur2_many(keys)] == [murmur2(k) for k in keys]
        for partitions in ([0], [3, 5, 8], list(range(7))):
            want = [DefaultPartitioner()(k, partitions, partitions) for k in keys]
            assert partitions_for_keys(keys, partitions) == want
    assert partitions_for_keys([], [0, 1]) == []
