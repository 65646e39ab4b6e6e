"""Weight sync, trainer -> rollout (see ``repro.sync.stream`` for the wire format).

    stream.py    buckets: packing, the JSON header, the checksum, the checked stream of arrivals
    group.py     the collective groups a sync runs over on Ray (one per sending trainer rank)
    apply.py     an engine's side: the gate, applying a stream bucket by bucket, the sync's stats
    handoff.py   what travels from trainer to rollout (``WeightSource``) and the one place it is received
    errors.py    ``SyncError`` and ``BucketError``
"""
