"""The recipe schema: one typed tree, a help line on every field, defaults equal to AMD's published run.

Every field's default is the value of the run being reproduced (AMD, DeepSeek-V4-Flash on 24 MI308X,
2026-08-17..21; LumenRL `examples/GRPO/configs/grpo_dsv4_flash_vllm_longrun.yaml`), so a recipe file only
states where it departs. Validation is strict: an unknown key, a wrong type (``"8"`` for an int, ``1e-6``
that YAML reads as a string) or a layout that does not multiply out is an error naming the field.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from repro.owned import single_component
from repro.recipes.consistency import check_consistency
from repro.recipes.schema.cluster import ClusterConfig, ClusterVersions, ModelConfig
from repro.recipes.schema.run import (DSV4_ON_MEGATRON_BRIDGE, CheckpointConfig, LumenRLSettings, TrackingConfig,
                                      VerlSettings, WandbTracking, WeightSyncConfig)
from repro.recipes.schema.section import EngineName, Section
from repro.recipes.schema.training import (ActorConfig, AlgorithmConfig, DataConfig, DatasetConfig, EvalConfig,
                                           LengthConfig, OptimConfig, RewardConfig, RolloutConfig,
                                           RolloutCorrectionConfig, RoutingReplayConfig)

__all__ = ["ActorConfig", "AlgorithmConfig", "CheckpointConfig", "ClusterConfig", "ClusterVersions", "DataConfig",
           "DatasetConfig", "DSV4_ON_MEGATRON_BRIDGE", "EvalConfig", "LengthConfig", "LumenRLSettings", "ModelConfig",
           "OptimConfig", "Recipe", "RewardConfig", "RolloutConfig", "RolloutCorrectionConfig", "RoutingReplayConfig",
           "Section", "TrackingConfig", "VerlSettings", "WandbTracking", "WeightSyncConfig"]


class Recipe(Section):
    name: str = Field(description="Recipe name, also the default run directory name.")
    description: str = Field("", description="One line on what this recipe reproduces.")
    engine: EngineName = Field(
        "repro", description="Who runs the RL loop: repro's own loop (embedded on CPU; Megatron-core + vLLM on a "
        "cluster), AMD's LumenRL from the checkout at lumenrl.path, or verl 0.9.1 (verl:), with the config written "
        "from this recipe.")
    seed: int = Field(10086, description="Seed for data order, sampling and initialisation.")
    steps: int = Field(75, ge=1, description="Optimizer steps of the run.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Where the run is placed.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="The trainer group.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="The optimizer.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="The rollout group.")
    lengths: LengthConfig = Field(default_factory=LengthConfig, description="Sequence length limits.")
    data: DataConfig = Field(default_factory=DataConfig, description="Training and evaluation data.")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="GRPO / PPO loss settings.")
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig, description="Truncated importance sampling.")
    routing_replay: RoutingReplayConfig = Field(
        default_factory=RoutingReplayConfig, description="Rollout routing replay (R3).")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="The reward rule.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoints and resume.")
    weight_sync: WeightSyncConfig = Field(
        default_factory=WeightSyncConfig, description="Trainer-to-rollout weight sync.")
    lumenrl: LumenRLSettings = Field(
        default_factory=LumenRLSettings, description="AMD's LumenRL as the engine (engine: lumenrl): checkout, site "
        "settings.")
    verl: VerlSettings = Field(
        default_factory=VerlSettings, description="verl as the engine (engine: verl): install, shared folders, site "
        "settings.")
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig, description="W&B, TensorBoard and the rollouts on disk: records of the run, "
        "not settings of it.")

    @property
    def trajectories_per_step(self) -> int:
        return self.algorithm.prompts_per_step * self.algorithm.responses_per_prompt

    @property
    def data_parallel(self) -> int:
        return self.actor.num_workers // (self.actor.tensor_parallel * self.actor.pipeline_parallel)

    @field_validator("name")
    @classmethod
    def _one_folder_name(cls, name: str) -> str:
        """The name is the default run folder's (runs/<name>): one folder name, never a path out of runs/."""
        why = single_component(name)
        if why:
            raise ValueError(f"{name!r}: the run folder's default name (runs/<name>): {why}")
        return name

    @model_validator(mode="after")
    def _consistent(self) -> "Recipe":
        check_consistency(self)
        return self
