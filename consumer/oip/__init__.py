"""The Open Inference Protocol (KServe V2) on Kafka records: bytes <-> tensors.

- :mod:`consumer.oip.wire`: record headers (correlation ID, binary data extension length), byte layouts;
- :mod:`consumer.oip.decode`: request value -> validated :class:`~consumer.oip.decode.DecodedRequest`, one record
  or a whole fetched chunk at once;
- :mod:`consumer.oip.validate`: the value checks a decoded tensor must pass (datatype, range, exactness);
- :mod:`consumer.oip.encode`: model outputs -> response values, one record or a whole micro-batch at once;
- :mod:`consumer.oip.client`: the request encoder and response decoder used by producer_tools and tests.
"""
