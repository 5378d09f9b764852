"""A local Apache Kafka without Docker, for development, tests, the demo, the benchmark and the fault harness.

:class:`LocalBroker` runs one KRaft broker or a replicated cluster of three from Kafka's own jars (resolved by Maven,
run on the JDK), records it in a state folder, and can stop, kill and restart its nodes. ``scripts/kafka-local``
(and ``python -m harness.localkafka``) is its command line: :mod:`harness.localkafka.cli`.
"""

from harness.localkafka.broker import LocalBroker, Status
from harness.localkafka.java import BrokerSetupError
from harness.localkafka.nodes import Node

__all__ = ["BrokerSetupError", "LocalBroker", "Node", "Status"]
