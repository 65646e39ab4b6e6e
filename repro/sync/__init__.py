"""Weight sync, trainer -> rollout (see ``repro.sync.stream`` for the wire format).

    stream.py    buckets: packing, the JSON header, the checksum, the checked stream of arrivals
    group.py     the collective groups a sync runs over on Ray (one per sending trainer rank)
    apply.py     an engine's side: the gate, applying a stream bucket by bucket, the sync's stats
    handoff.py   what travels from trainer to rollout, and ``Wire``: the seam each rollout engine's wire fills
    bucket_wire.py  repro's own wire: the bucket stream over one group per sending rank (any engine)
    errors.py    ``SyncError`` and ``BucketError``
"""
