"""Kafka I/O: the clients, the requests source, record-batch unpacking, security settings, broker reachability and
the results partitioner."""
