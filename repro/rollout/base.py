"""The rollout-engine interface the RL loop talks to; the embedded CPU engine (``repro.rollout.embedded``) and
vLLM (``repro.rollout.vllm_engine``) implement it, and declare what they can do in
``repro.recipes.backends.ROLLOUTS``.

A weight sync reaches an engine through ``repro.sync.handoff.receive``: bucket by bucket through
``begin_sync`` / ``apply_bucket`` / ``finish_sync`` (``repro.sync.apply``), or -- where the engine's workers
receive themselves -- through ``receive_from_groups`` or ``receive_transfer``. Between the first bucket and a
successful finish the ``gate`` refuses ``generate``.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from repro.recipes.backends import RolloutCapabilities
from repro.rollout.types import RolloutResult, SamplingParams
from repro.rollout.vllm_transfer import TransferAddress
from repro.sync.apply import SyncStats, SyncTarget
from repro.sync.group import SyncAddress


class RolloutEngine(SyncTarget, Protocol):
    capabilities: ClassVar[RolloutCapabilities]
    weight_version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        """Sample ``params.n`` responses per prompt (token ids, BOS included); refused while the gate is closed."""

    def receive_from_groups(self, addresses: list[SyncAddress], version: int) -> SyncStats:
        """Where ``capabilities.workers_join_groups``: every worker joins the senders' sync groups and applies the
        buckets itself, behind the gate."""

    def receive_transfer(self, address: TransferAddress, version: int) -> SyncStats:
        """Where ``capabilities.transfer_engine``: one sync through the serving library's weight-transfer engine,
        behind the gate."""
