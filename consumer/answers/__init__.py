"""The answers room: everything that turns model outputs into the record that goes out, for both protocols.

- :mod:`consumer.answers.outputs`: a micro-batch's outputs -> each record's result or dead-letter error (cut per
  request, unpadded, non-finite outputs found, OIP responses encoded for the batch);
- :mod:`consumer.answers.enrich`: events with enriched results: the event plus the outputs, JSON or Avro;
- :mod:`consumer.answers.records`: the result and dead-letter records, their values and headers;
- :mod:`consumer.answers.headers`: the correlation ID's header and rule (read at intake, written on every answer);
- :mod:`consumer.answers.ladder`: the too-large ladder (sent alone, then shrunk).

Inference hands the room outputs; the delivery modes' writer (:mod:`consumer.delivery.writer`) takes the records it
builds. The response formats themselves are OIP's own (:mod:`consumer.oip.encode`, :mod:`consumer.oip.proto`); the
room never imports delivery, inference or the Kafka clients (import-linter contracts in pyproject.toml).
"""
