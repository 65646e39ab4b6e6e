"""Studies: experiments that run models to measure something, beside the analysis of logs (``repro.analysis``
only reads, compares and draws).

    mismatch_sources.py      the trainer/rollout mismatch by numeric source and by response position (notebook 15)
    mismatch_attribution.py  that mismatch attributed to routing, the indexer and the numerics, by position
    mismatch_faults.py       injected faults (stale experts, an FP8 scale off, ...) and the mismatch each makes
    ablations.py             R3 / TIS / cap ablations: runs of the tiny recipe, read back as tables (notebook 14)
"""
