"""The Open Inference Protocol (KServe V2) on Kafka records: bytes <-> tensors.

- :mod:`consumer.oip.wire`: the binary data extension's header and byte layout;
- :mod:`consumer.oip.decode`: request value -> validated :class:`~consumer.oip.decode.DecodedRequest`, one record
  or a whole fetched chunk at once;
- :mod:`consumer.oip.validate`: the value checks a decoded tensor must pass (datatype, range, exactness);
- :mod:`consumer.oip.encode`: the OIP response formats, one record or a whole micro-batch at once (used by the
  answers room, :mod:`consumer.answers`);
- :mod:`consumer.oip.client`: the request encoder and response decoder used by producer_tools and tests.
"""
