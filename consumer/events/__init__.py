"""Domain events as requests: JSON objects or Avro records (schema registry wire format) already on a topic, their
fields mapped onto the model's inputs, answered with the event enriched by the model's outputs.

- :mod:`consumer.events.mapping`: which fields feed which input (``input_mapping`` or by name), checked against the
  model at start-up; the columns of a chunk's events -> one tensor per input.
- :mod:`consumer.events.avro`: the registry's wire format, writer schemas (logical types left raw), result schemas.
- :mod:`consumer.events.registry`: the schema registry client (confluent-kafka's async client), the schema cache,
  waiting out a registry that does not answer.
- :mod:`consumer.events.decode`: a fetched chunk of event values -> decoded requests or dead-letter errors.

A second protocol beside :mod:`consumer.oip`, feeding the same :class:`~consumer.work.Work`; its answers (events
enriched with the outputs, JSON or Avro) are shaped in the answers room (:mod:`consumer.answers.enrich`).
"""
