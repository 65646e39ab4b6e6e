"""The Ray layer the groups stand on: start or join Ray (``runtime``), place the trainer and rollout groups
(``placement``). It imports nothing of the package above ``repro.errors``; the checks of ``repro check``
(``repro.readiness``) and the launch (``repro.run.launch``) are built on it, never the other way round.

``placement.plan_placement`` is pure (no Ray import), so a dry run can print the plan without a cluster;
``runtime`` and ``placement.create_placement_groups`` need Ray (the actors live in ``repro.groups``).
"""

from repro.errors import ReproError


class ClusterError(ReproError):
    """Ray could not be started or joined, a group could not be placed, or a worker died."""
