"""`repro check` and the estimates it shares with the launch dry run: is this machine (or Ray cluster) ready for
a recipe?

``checks`` judges (pure functions over gathered facts), ``facts`` gathers them, ``types`` holds the facts and the
verdicts, ``versions`` compares installed software with ``pins``, ``report`` prints and saves the results, and
``memory_budget`` estimates each trainer rank's memory and a checkpoint's bytes (also read by ``repro launch
--dry-run`` and the run directory's disk check). Built on ``repro.cluster``; nothing here is imported by it.
"""
