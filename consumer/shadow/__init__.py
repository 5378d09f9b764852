"""Shadow scoring: a candidate model scored on live traffic beside the serving one, changing nothing it serves.

The room's parts, in the order a micro-batch meets them::

    candidate   shadow_model_path -> a loaded, checked candidate (hash against shadow_validation_record, inputs
                against the serving model's)                                      (:mod:`consumer.shadow.candidate`)
    scorer      each micro-batch that ran, offered after its answers were handed to the publisher -> a bounded
                queue -> the candidate in its own thread -> the comparison; a full queue sheds whole batches
                                                                                   (:mod:`consumer.shadow.scorer`)
    compare     serving vs candidate outputs, row by row: label / top-1 agreement, max absolute difference
                                                                                   (:mod:`consumer.shadow.compare`)
    metrics     ``streaminfer_shadow_*`` on the service's registry                 (:mod:`consumer.shadow.metrics`)
    answers     shadow_results_topic: the candidate's answers through a producer of their own, at-least-once,
                never in a transaction, never committing                           (:mod:`consumer.shadow.answers`)

What the delivery modes hand over (:class:`consumer.inference.Scored`) holds the requests and the serving model's
outputs, never the pipeline's input buffers: the candidate assembles its own feeds, so a buffer the serving
path reuses is never read late.
"""
