"""The Ray layer: start or join Ray, place the trainer and rollout groups, hold backends in actors.

``placement.plan_placement`` is pure (no Ray import), so a dry run can print the plan without a cluster;
``runtime``, ``placement.create_placement_groups`` and ``actors`` need Ray.
"""

from repro.errors import ReproError


class ClusterError(ReproError):
    """Ray could not be started or joined, a group could not be placed, or a worker died."""
