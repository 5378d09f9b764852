"""The delivery modes: how answers are written and offsets committed (``settings.delivery``).

- :mod:`consumer.delivery.at_least_once`: pipelined stages, ordered retried writes, commits after acknowledgements;
- :mod:`consumer.delivery.exactly_once`: answers and offsets in one transaction per partition and window.

Both are composed of the same stages (:mod:`consumer.delivery.stages`).
"""
