"""A local Confluent-compatible Schema Registry without Docker, beside the local broker
(:mod:`harness.localkafka`).

:class:`LocalRegistry` runs Apicurio Registry (Apache-2.0; Maven Central's ``apicurio-registry-app`` archive,
checksummed and cached: :mod:`harness.registry.java`) on a JDK >= 21, bound to loopback, with its schemas kept in an
H2 file in the state folder; its :attr:`~LocalRegistry.url` is the Confluent-compatible API
(``/apis/ccompat/v7``) that confluent-kafka's ``SchemaRegistryClient`` and its Avro serializers take.
``scripts/registry-local`` (``python -m harness.registry``) is its command line: :mod:`harness.registry.cli`.
"""

from harness.registry.java import RegistrySetupError, app_home, find_registry_java
from harness.registry.registry import LocalRegistry, Status

__all__ = ["LocalRegistry", "RegistrySetupError", "Status", "app_home", "find_registry_java"]
