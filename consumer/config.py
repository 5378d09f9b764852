"""Settings: one frozen object, read from CLI flags and ``STREAMINFER_*`` environment variables at start-up.

Precedence: CLI flag > environment variable > ``.env``-free default. Every name carries its unit
(``_ms``, ``_s``, ``_bytes``, ``_rows``). A bad value fails start-up with a message naming the setting
(:func:`load_settings` raises :class:`~consumer.errors.ConfigError`). Pattern after quix-streams
``ApplicationConfig`` and MLServer ``settings.py`` (``env_prefix``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, CliApp, CliSettingsSource, SettingsConfigDict

from consumer.errors import ConfigError

ENV_PREFIX = "STREAMINFER_"
#: Upper bound of max_batch_size and max_record_rows, rows: a batch must fit in memory next to its copies.
MAX_ROWS_LIMIT = 65_536
#: Kafka's legal topic names (``org.apache.kafka.common.internals.Topic``): at most 249 of [a-zA-Z0-9._-].
_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_HOST_PORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


class Settings(BaseSettings):
    """Everything the consumer can be told. Field docs are the CLI help and docs/settings.md (``make docs``)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        extra="forbid",
        cli_kebab_case=True,
        cli_prog_name="streaminfer-consumer",
        cli_implicit_flags=True,
        cli_hide_none_type=True,
        cli_show_env_vars=True,
        validate_default=True,
    )

    # Kafka
    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers, host:port[,host:port].")
    group_id: str = Field("streaminfer", min_length=1, description="Consumer group id.")
    group_instance_id: str | None = Field(
        None,
        description="Static group membership id (KIP-345): a member killed and restarted with the same id within "
        "session_timeout_ms gets its partitions back without a rebalance. Unique per replica: the overlays use the "
        "pod's name, which a container restarted in place keeps.",
    )
    partition_assignor: Literal["roundrobin", "sticky"] = Field(
        "roundrobin",
        description="How the group leader spreads partitions. sticky: a rebalance moves only what balance needs, so a "
        "member keeps more of its partitions (and, exactly_once, their producers). Every member must use the same "
        "one: aiokafka offers the group a single assignor, so switching a running group needs all members replaced "
        "at once (a Deployment's Recreate), not a rolling update.",
    )
    leave_group_on_shutdown: bool = Field(
        True,
        description="A static member (group_instance_id) leaves the group on a graceful shutdown (SIGTERM), so its "
        "partitions move at once, not after session_timeout_ms (as Kafka 4.1's CloseOptions LEAVE_GROUP, KIP-1092). "
        "False: KIP-345's behaviour, it stays a member until its session times out (for a StatefulSet whose pods "
        "come back with their names). Dynamic members always leave.",
    )
    allow_auto_create_topics: bool = Field(
        False,
        description="Start even when the requests, results or dead-letter topic does not exist (the broker creates "
        "them on first use where auto.create.topics.enable is on); false: a missing one stops start-up (exit 2, "
        "naming it), so a typo is neither served nor written to silently.",
    )
    requests_topic: str = Field("requests", min_length=1, description="Topic of inference requests.")
    results_topic: str = Field("results", min_length=1, description="Topic the responses are written to.")
    dead_letter_topic: str = Field("requests.dlq", min_length=1, description="Dead-letter topic for poison records.")
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a group with no committed offset starts."
    )
    client_id: str = Field("streaminfer", min_length=1, description="Kafka client id prefix.")
    session_timeout_ms: int = Field(45_000, ge=1_000, description="Group session timeout, ms.")
    heartbeat_interval_ms: int = Field(3_000, ge=100, description="Group heartbeat interval, ms.")
    max_poll_interval_ms: int = Field(
        300_000, ge=1_000, description="Longest gap between fetches before the member is evicted, ms."
    )
    fetch_max_records: int = Field(500, ge=1, description="Most records taken from the fetcher at once, records.")
    fetch_timeout_ms: int = Field(100, ge=1, description="Longest wait for records in one fetch call, ms.")
    producer_linger_ms: int = Field(
        0,
        ge=0,
        description="Producer linger before sending a produce request, ms. Answers reach the producer as whole "
        "batches (one per results partition), so a linger only delays them.",
    )
    producer_max_request_bytes: int = Field(1_048_576, ge=1024, description="Largest produce request, bytes.")
    producer_batch_bytes: int = Field(
        65_536,
        ge=1024,
        description="Answers appended to one producer batch per results partition until it holds this much, bytes "
        "(a larger answer travels alone).",
    )
    producer_request_timeout_ms: int = Field(
        30_000, ge=1_000, description="Producer wait for metadata or an acknowledgement before a write is retried, ms."
    )
    retry_backoff_ms: int = Field(
        100,
        ge=1,
        description="First pause before a transient failure (a write, an out-of-memory batch) is retried, ms.",
    )
    retry_backoff_max_ms: int = Field(
        5_000, ge=1, description="Longest pause between retries; the pause doubles from retry_backoff_ms up to it, ms."
    )
    inference_retries: int = Field(
        3,
        ge=0,
        le=20,
        description="Retries of a micro-batch whose inference failed transiently (GPU or host out of memory), with "
        "backoff, before it is bisected and a record failing alone is dead-lettered; other failures are not retried.",
    )
    revoke_timeout_ms: int = Field(
        5_000, ge=0, description="On a rebalance, time to finish and commit work of revoked partitions, ms."
    )
    delivery: Literal["at_least_once", "exactly_once"] = Field(
        "at_least_once",
        description="at_least_once: commit after acknowledged answers. exactly_once: answers and offsets in one "
        "Kafka transaction per partition and fetch (read results with isolation.level=read_committed).",
    )
    transactional_id_prefix: str = Field(
        "streaminfer",
        min_length=1,
        description="exactly_once: transactional.id = <prefix>-<group_id>-<topic>-<partition>, one producer per "
        "assigned partition, so the partition's next owner fences a zombie.",
    )
    transaction_timeout_ms: int = Field(
        60_000,
        ge=1_000,
        le=900_000,  # the broker's default transaction.max.timeout.ms
        description="exactly_once: the broker aborts a transaction left open this long, ms.",
    )
    commit_interval_ms: int = Field(
        200,
        ge=0,
        description="at_least_once: least time between two offset commits. exactly_once: the transaction window "
        "(answers become visible to read_committed readers when it commits), ms.",
    )
    # Kafka security (TLS, SASL). Secrets are SecretStr: never printed, never logged.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security protocol."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="SASL mechanism for SASL_PLAINTEXT / SASL_SSL."
    )
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(None, description="SASL password (prefer sasl_password_file).")
    sasl_password_file: Path | None = Field(None, description="File holding the SASL password (a mounted Secret).")
    ssl_cafile: Path | None = Field(
        None, description="PEM file of CA certificates that sign the brokers' certificates."
    )
    ssl_certfile: Path | None = Field(None, description="PEM client certificate for mutual TLS.")
    ssl_keyfile: Path | None = Field(None, description="PEM private key of ssl_certfile.")
    ssl_key_password: SecretStr | None = Field(None, description="Password of ssl_keyfile, if encrypted.")
    ssl_check_hostname: bool = Field(True, description="Check the broker certificate's host name.")
    # Model and execution
    model_path: Path = Field(description="ONNX model file (required).")
    model_name: str | None = Field(
        None, description="Name in responses; default: ONNX metadata 'model_name' or the file stem."
    )
    model_version: str | None = Field(
        None, description="Version in responses; default: ONNX metadata 'model_version' or '1'."
    )
    execution_provider: Literal["auto", "cuda", "cpu"] = Field(
        "auto", description="ONNX Runtime execution provider: auto = CUDA when available, else CPU."
    )
    require_gpu: bool = Field(False, description="Fail start-up unless the CUDA execution provider is active.")
    intra_op_threads: int = Field(
        0, ge=0, description="ORT intra-op threads; 0 = ORT's default (one per physical core; measured best)."
    )
    inter_op_threads: int = Field(
        0, ge=0, description="ORT inter-op threads (parallel execution mode only); 0 = ORT's."
    )
    intra_op_spinning: bool = Field(
        False,
        description="Let ORT's thread pools spin-wait for work after each run (ORT's own default) instead of sleeping. "
        "Off: a model whose batch computes in microseconds leaves the cores to the Kafka client (measured on the "
        "2-core bench, breast-cancer JSON events: 0.47 -> 0.66 of the client-only ceiling).",
    )
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = Field(
        "all", description="ORT graph optimisation level (all: layout and fusions; measured best on CPU)."
    )
    tensorrt: bool = Field(
        False,
        description="Opt in to the TensorRT execution provider (before CUDA): explicit profile shapes, engine cache.",
    )
    trt_engine_cache_dir: Path = Field(
        Path(".cache/trt"), description="TensorRT engine cache folder, relative to the working directory or absolute."
    )
    fp16: bool = Field(
        False, description="GPU only: run a float16 copy of the model (inputs and outputs stay float32)."
    )
    warmup_runs: int = Field(
        3, ge=0, description="Warm-up runs per batch size (and length bucket on a GPU) before joining, runs."
    )
    warmup_request: Path | None = Field(
        None,
        description="An OIP request (JSON file) whose rows probe and warm the model up instead of zeros, for a model "
        "that zeros are not valid input for (e.g. a OneHotEncoder with handle_unknown='error').",
    )
    validation_record: Path | None = Field(
        None,
        description="The model's validation record (JSON, streaminfer-model record): start-up refuses a model_path "
        "whose sha256 differs (exit 2, both hashes named) and logs its summary; records with a value outside an "
        "input's recorded range are counted (streaminfer_input_out_of_range_total{input}) and still served.",
    )
    shadow_model_path: Path | None = Field(
        None,
        description="A candidate ONNX model scored in the shadow of the serving one, on the same micro-batches, in "
        "its own thread, after the answers are handed to the publisher: it never changes what is served or "
        "committed (docs/models.md, Shadow scoring). Start-up fails (exit 2) when it cannot take the serving "
        "model's inputs.",
    )
    shadow_validation_record: Path | None = Field(
        None,
        description="The candidate's validation record: start-up refuses a shadow_model_path whose sha256 differs "
        "(exit 2, both hashes named).",
    )
    shadow_results_topic: str | None = Field(
        None,
        description="Where the candidate's answers go (same key and correlation ID, its own model_version), through "
        "a producer of its own: at-least-once and outside exactly_once's transactions; None: compared only.",
    )
    shadow_max_pending: int = Field(
        16,
        ge=1,
        description="Micro-batches waiting for the candidate, at most (those waiting together run as one); one more "
        "is shed whole "
        "(streaminfer_shadow_shed_batches_total) rather than slow the consumer, batches.",
    )
    shadow_max_busy_share: float = Field(
        0.5,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Share of the time the candidate's thread may spend scoring: after a run of t seconds of its "
        "CPU it rests "
        "t * (1 / share - 1) seconds while offered micro-batches wait (or are shed beyond shadow_max_pending), so a "
        "slow candidate takes at most this share of a core; 1: no rest.",
    )
    tokenizer_path: Path | None = Field(
        None, description="tokenizer.json of a sequence model: text requests (BYTES input) are tokenized with it."
    )
    text_input_name: str = Field("text", min_length=1, description="Request input that carries text (BYTES [rows]).")
    image_input_name: str = Field(
        "image",
        min_length=1,
        description="Image models: request input that carries images (BYTES [rows] JPEG/PNG or UINT8 [rows, H, W, 3]).",
    )
    image_preprocessing: str | None = Field(
        None,
        description="Image models: the preprocessing declaration (JSON object: input, layout, size, resize, mean, "
        "std, interpolation; docs/models.md, Images), overriding the model metadata's 'streaminfer.image'.",
    )
    image_max_pixels: int = Field(
        40_000_000, ge=1, description="Largest accepted image, width x height (above: too_large), pixels."
    )
    image_threads: int = Field(
        0, ge=0, description="Image decode threads; 0 = the CPUs given to the process (affinity, cgroup quota)."
    )
    max_in_flight_images: int = Field(
        256,
        ge=1,
        description="Image models: images fetched but not yet answered before partitions are paused (each holds "
        "its preprocessed tensor, e.g. 588 KiB at float32 3 x 224 x 224), images.",
    )
    # Events: domain events already on a topic (JSON, Avro through a schema registry) instead of OIP requests
    request_format: Literal["oip", "json", "avro"] = Field(
        "oip",
        description="oip: Open Inference Protocol requests (JSON, binary extension, protobuf). json: one JSON object "
        "per record, a domain event (a schema registry's JSON Schema framing is accepted). avro: Avro in the schema "
        "registry's wire format (magic byte 0, schema ID), the writer schema fetched by ID (docs/events.md).",
    )
    result_format: Literal["oip", "enrich"] | None = Field(
        None,
        description="oip: an OIP inference response per record. enrich: the request event plus the model's outputs "
        "as fields (JSON in, JSON out; Avro in, Avro out under the results topic's subject). Unset: enrich for json "
        "and avro requests, oip for oip.",
    )
    input_mapping: Path | None = Field(
        None,
        description="json/avro: YAML file saying which event fields feed which model input, with defaults, lookup "
        "tables and output field names (docs/events.md). Unset: every model input of shape [batch] or [batch, 1] is "
        "fed by the event field of its name.",
    )
    schema_registry_url: str | None = Field(
        None,
        description="avro: the schema registry's Confluent-compatible API (e.g. http://registry:8081, or Apicurio's "
        "http://host:8080/apis/ccompat/v7). Subjects follow TopicNameStrategy (<topic>-value).",
    )
    schema_registry_username: str | None = Field(None, description="Schema registry basic-auth user name.")
    schema_registry_password: SecretStr | None = Field(
        None, description="Schema registry basic-auth password (prefer schema_registry_password_file)."
    )
    schema_registry_password_file: Path | None = Field(
        None, description="File holding the schema registry password (a mounted Secret)."
    )
    schema_registry_ca_file: Path | None = Field(
        None, description="PEM file of CA certificates that sign the schema registry's certificate (https)."
    )
    schema_registry_timeout_ms: int = Field(
        5_000, ge=100, description="Longest wait for one schema registry request before it counts as unanswered, ms."
    )
    register_result_schema: bool = Field(
        True,
        description="avro + enrich: register the result schema under <results_topic>-value when it is absent "
        "(idempotent); false: only look it up (the operator registers it ahead; a missing one stops start-up or "
        "dead-letters result_schema_refused).",
    )
    unknown_schema_retries: int = Field(
        3,
        ge=0,
        le=20,
        description="avro: times a schema ID the registry does not know is asked for again, with backoff, before "
        "its records are dead-lettered unknown_schema_id (a registry follower may lag).",
    )
    # Batching and limits
    max_batch_size: int = Field(64, ge=1, le=MAX_ROWS_LIMIT, description="Flush a micro-batch at this many rows, rows.")
    max_batch_delay_ms: float = Field(
        5.0, ge=0, allow_inf_nan=False, description="Flush when the oldest pending record waited this long, ms."
    )
    flush_when_caught_up: bool = Field(
        True,
        description="at_least_once: flush pending micro-batches at once when a fetch reached the high watermark of "
        "its partitions (no record is waiting on the broker for the delay to catch); false: always wait for "
        "max_batch_delay_ms or max_batch_size.",
    )
    max_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Sequence models: flush a micro-batch at this many padded tokens (rows x length bucket), tokens; "
        "unset: 2048 on CPU (larger batches run slower per token there), 8192 on a GPU.",
    )
    max_record_tokens: int = Field(
        8192,
        ge=1,
        description="Sequence models: largest accepted rows x length of one request (above: too_large), tokens.",
    )
    max_in_flight_rows: int = Field(
        4096,
        ge=1,
        description="Rows fetched but not yet answered (1 per dead letter) before partitions are paused, rows.",
    )
    max_record_bytes: int = Field(1_048_576, ge=1, description="Largest accepted request value, bytes.")
    max_batch_unpacked_bytes: int = Field(
        67_108_864,
        ge=1024,
        le=2_147_483_647,
        description="A compressed record batch that unpacks to more is never unpacked: its offset range is "
        "dead-lettered too_large, bytes.",
    )
    max_in_flight_bytes: int = Field(
        536_870_912,
        ge=1024,
        description="Record keys, values and headers fetched but not yet answered; fetches are sized to stay below "
        "it, bytes.",
    )
    max_record_rows: int = Field(
        1024, ge=1, le=MAX_ROWS_LIMIT, description="Largest accepted shape[0] of one request, rows."
    )
    # Operations
    http_port: int = Field(9400, ge=0, le=65535, description="Port of /metrics, /healthz, /readyz; 0 = disabled.")
    http_host: str = Field("0.0.0.0", description="Address the HTTP endpoints bind to.")  # noqa: S104 (a pod's port)
    stall_timeout_s: float = Field(
        120.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "/healthz fails when nothing was fetched or committed for this long while lag > 0, or while the "
            "cluster has not answered for this long (lag unknown), s."
        ),
    )
    shutdown_grace_s: float = Field(
        25.0, gt=0, allow_inf_nan=False, description="Budget to drain, publish and commit on SIGTERM, s."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    log_json: bool = Field(False, description="Log one JSON object per line.")

    @property
    def enrich(self) -> bool:
        """Whether results are enriched events (``result_format``; by default enrich for json and avro requests)."""
        if self.result_format is not None:
            return self.result_format == "enrich"
        return self.request_format != "oip"

    @field_validator("requests_topic", "results_topic", "dead_letter_topic")
    @classmethod
    def _topic_name(cls, value: str) -> str:
        if not _TOPIC.match(value) or value in (".", ".."):
            raise ValueError(f"{value!r} is not a legal Kafka topic name (1-249 of a-z A-Z 0-9 . _ -)")
        return value

    @field_validator("group_id", "group_instance_id", "transactional_id_prefix", "client_id")
    @classmethod
    def _no_blanks(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or value != value.strip()):
            raise ValueError(f"{value!r} must be non-empty without leading or trailing whitespace")
        return value

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_ports(cls, value: str) -> str:
        servers = [v.strip() for v in value.split(",")]
        for server in servers:
            match = _HOST_PORT.match(server)
            if match is None or not 0 < int(match.group(2)) < 65536:
                raise ValueError(f"{server!r} is not host:port (e.g. 127.0.0.1:9092)")
        return ",".join(servers)

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be below session_timeout_ms")
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ValueError("retry_backoff_max_ms must be at least retry_backoff_ms")
        if self.max_in_flight_bytes < self.max_record_bytes:
            raise ValueError("max_in_flight_bytes must be at least max_record_bytes (one largest record must fit)")
        if self.max_batch_unpacked_bytes < self.max_record_bytes:
            raise ValueError(
                "max_batch_unpacked_bytes must be at least max_record_bytes (a batch holding one largest record "
                "must unpack)"
            )
        if len({self.requests_topic, self.results_topic, self.dead_letter_topic}) != 3:
            raise ValueError("requests_topic, results_topic and dead_letter_topic must differ")
        if not self.model_path.is_file():
            raise ValueError(f"model_path {str(self.model_path)!r} is not a file")
        if self.tokenizer_path is not None and not self.tokenizer_path.is_file():
            raise ValueError(f"tokenizer_path {str(self.tokenizer_path)!r} is not a file")
        if self.image_preprocessing is not None:
            try:
                declared = json.loads(self.image_preprocessing)
            except ValueError as exc:
                raise ValueError(f"image_preprocessing is not JSON: {exc}") from None
            if not isinstance(declared, dict):
                raise ValueError("image_preprocessing must be a JSON object")
        if self.validation_record is not None and not self.validation_record.is_file():
            raise ValueError(f"validation_record {str(self.validation_record)!r} is not a file")
        if self.shadow_model_path is not None and not self.shadow_model_path.is_file():
            raise ValueError(f"shadow_model_path {str(self.shadow_model_path)!r} is not a file")
        if self.shadow_model_path is None and (self.shadow_validation_record or self.shadow_results_topic):
            raise ValueError("shadow_validation_record and shadow_results_topic need shadow_model_path")
        if self.shadow_validation_record is not None and not self.shadow_validation_record.is_file():
            raise ValueError(f"shadow_validation_record {str(self.shadow_validation_record)!r} is not a file")
        if self.shadow_results_topic in {self.requests_topic, self.results_topic, self.dead_letter_topic}:
            raise ValueError(
                "shadow_results_topic must differ from requests_topic, results_topic and dead_letter_topic"
            )
        if self.warmup_request is not None and not self.warmup_request.is_file():
            raise ValueError(f"warmup_request {str(self.warmup_request)!r} is not a file")
        if self.request_format == "avro" and not self.schema_registry_url:
            raise ValueError("request_format=avro needs schema_registry_url")
        if self.result_format == "enrich" and self.request_format == "oip":
            raise ValueError("result_format=enrich needs request_format json or avro (an OIP request is no event)")
        if self.input_mapping is not None:
            if self.request_format == "oip":
                raise ValueError("input_mapping is for request_format json or avro")
            if not self.input_mapping.is_file():
                raise ValueError(f"input_mapping {str(self.input_mapping)!r} is not a file")
        if self.schema_registry_password_file is not None and not self.schema_registry_password_file.is_file():
            raise ValueError(f"schema_registry_password_file {str(self.schema_registry_password_file)!r} is not a file")
        if self.schema_registry_ca_file is not None and not self.schema_registry_ca_file.is_file():
            raise ValueError(f"schema_registry_ca_file {str(self.schema_registry_ca_file)!r} is not a file")
        has_password = self.schema_registry_password is not None or self.schema_registry_password_file is not None
        if has_password != (self.schema_registry_username is not None):
            raise ValueError("schema_registry_username and a schema registry password go together")
        if (self.tensorrt or self.fp16) and self.execution_provider == "cpu":
            raise ValueError("tensorrt and fp16 need a GPU; they cannot be used with execution_provider=cpu")
        used = []  # files are checked only where the protocol uses them (a mounted Secret may be absent otherwise)
        if self.security_protocol.endswith("SSL"):
            used += ["ssl_cafile", "ssl_certfile", "ssl_keyfile"]
        if self.security_protocol.startswith("SASL"):
            used.append("sasl_password_file")
        for name in used:
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {str(path)!r} is not a file")
        if self.security_protocol.startswith("SASL"):
            if not self.sasl_username:
                raise ValueError(f"security_protocol={self.security_protocol} needs sasl_username")
            if self.sasl_password is None and self.sasl_password_file is None:
                raise ValueError("SASL needs sasl_password or sasl_password_file")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together")
        return self


#: ``STREAMINFER_*`` variables that are not settings and are not mistakes: the tools' cache folder, and the
#: service links Kubernetes injects for a Service named ``streaminfer-...`` (``STREAMINFER_METRICS_SERVICE_HOST``,
#: ``STREAMINFER_METRICS_PORT_9000_TCP_ADDR``, ...).
NOT_SETTINGS = re.compile(
    ENV_PREFIX
    + r"(CACHE|([A-Z0-9_]+_)?(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?))"
)


#: The end of ``--help``: where settings come from and what the exit codes mean (``consumer.__main__``).
HELP_EPILOG = f"""\
Every flag is also an environment variable, {ENV_PREFIX}<FLAG> in upper case with underscores
(--max-batch-size -> {ENV_PREFIX}MAX_BATCH_SIZE); a flag wins over the environment. An unknown
{ENV_PREFIX}* variable stops start-up. docs/settings.md lists them all with their defaults.

Exit codes: 0 clean stop (SIGTERM, SIGINT); 1 a background task failed (restart it); 2 bad settings;
3 the model cannot be served; 4 the Kafka cluster cannot be reached or refuses us at start-up.
"""


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One message per ``STREAMINFER_*`` variable that names no setting (a typo in a ConfigMap would otherwise
    start the consumer silently with the default), with the closest real variable when there is one."""
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    problems = []
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or NOT_SETTINGS.fullmatch(upper):
            continue
        close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else f" (settings: {ENV_PREFIX}<NAME>, see docs/settings.md)"
        problems.append(f"environment variable {variable} is not a setting{hint}")
    return problems


def did_you_mean(message: str, flags: Sequence[str]) -> str:
    """`` (did you mean --flag?)`` for the first ``--word`` of argparse's error ``message`` that is no flag of
    ``flags`` but close to one (difflib, ratio >= 0.8); "" otherwise. The user tools' parsers use it too."""
    words = (word.split("=")[0] for word in message.replace(",", " ").split() if word.startswith("--"))
    bad = next((word for word in words if word not in flags), None)
    close = difflib.get_close_matches(bad, flags, n=1, cutoff=0.8) if bad else []
    return f" (did you mean {close[0]}?)" if close else ""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line, with the closest real flag, as a :class:`ConfigError`."""

    def error(self, message: str) -> NoReturn:
        flags = [f"--{name.replace('_', '-')}" for name in Settings.model_fields]
        raise ConfigError(f"{message}{did_you_mean(message, flags)}; --help lists every flag")


def load_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Read settings from ``argv`` flags (kebab-case, e.g. ``--max-batch-size 32``) and the environment.

    Args:
        argv: the command line's flags (without the program name).
        environ: the process environment (``consumer.__main__`` passes ``os.environ``, the only module that reads
            it): checked for ``STREAMINFER_*`` variables that name no setting. pydantic-settings reads the
            ``STREAMINFER_*`` values themselves.

    Raises:
        ConfigError: a value is invalid, a flag is unknown (abbreviations too: no prefix matching), or a
            ``STREAMINFER_*`` variable names no setting; the message names every bad setting, flag or variable.
        SystemExit: ``--help`` (argparse's own handling).
    """
    problems = unknown_variables(environ)
    if problems:
        raise ConfigError("; ".join(problems))
    parser = _Parser(
        prog="streaminfer-consumer",
        description="Serve an ONNX model over Kafka: requests topic in, results and dead letters out.",
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --max-batch-siz is a typo, not --max-batch-size
    )
    source: CliSettingsSource[Settings] = CliSettingsSource(
        Settings, root_parser=parser, parse_args_method=argparse.ArgumentParser.parse_args
    )
    try:
        return CliApp.run(Settings, cli_args=list(argv), cli_settings_source=source)
    except ValidationError as exc:
        raise ConfigError("invalid settings: " + "; ".join(_problem(err) for err in exc.errors())) from None


def _problem(err: Mapping[str, Any]) -> str:
    """One validation error, naming the setting as flag and variable: ``max_batch_size (--max-batch-size,
    STREAMINFER_MAX_BATCH_SIZE): Input should be ...``. A cross-field check names its setting first in its message."""
    message = str(err["msg"]).removeprefix("Value error, ")
    loc = err["loc"]
    name = str(loc[0]) if loc else message.split(" ", 1)[0]
    if name not in Settings.model_fields:
        return f"settings: {message}"
    where = f"{name} (--{name.replace('_', '-')}, {ENV_PREFIX}{name.upper()})"
    return f"{where}: {message}"
