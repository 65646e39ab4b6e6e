"""The worker of each group, a plain Python object: in this process it is the group itself (it implements
``repro.groups.protocol``), on Ray each actor holds one (``repro.groups.ray_groups``).

A worker builds its backend from the resolved recipe (a dict when it crossed a process boundary) and the model
folder, so weights load where they are used and never travel through the driver, and it owns its side of the
weight sync: the trainer worker cuts its weights into buckets, the rollout worker checks and applies them.
"""

from __future__ import annotations

from pathlib import Path

from repro.recipes.schema import Recipe
from repro.rollout.types import RolloutResult, SamplingParams
from repro.sync import Bucket, SyncStats, apply_buckets, make_buckets
from repro.train.base import LogprobResult
from repro.train.batch import TrainBatch


def _recipe(recipe: Recipe | dict) -> Recipe:
    return recipe if isinstance(recipe, Recipe) else Recipe.model_validate(recipe)


class TrainerWorker:
    """One trainer process: the embedded trainer, or one rank of a Megatron world (its rendezvous environment set
    by ``repro.groups.ray_groups``; the model from ``actor.model_provider``, so ``model_dir`` is unused there)."""

    def __init__(self, recipe: Recipe | dict, model_dir: str | Path):
        recipe = _recipe(recipe)
        if recipe.actor.backend == "megatron":  # needs megatron-core (`make test-megatron` builds .venv-megatron)
            from repro.train.megatron.parallel import init_distributed_from_env
            from repro.train.megatron.trainer import MegatronTrainer

            if recipe.actor.num_workers > 1:
                init_distributed_from_env()
            self.trainer = MegatronTrainer.from_recipe(recipe)
        else:
            from repro.train.embedded import EmbeddedTrainer

            self.trainer = EmbeddedTrainer.from_recipe(recipe, model_dir)
        self.bucket_bytes = recipe.weight_sync.bucket_mb * 1024 * 1024

    def ready(self) -> None:
        """Construction is the warm-up; by the time this runs it is done."""

    def logprobs(self, batch: TrainBatch, replay_routing: bool) -> LogprobResult:
        return self.trainer.logprobs(batch, replay_routing=replay_routing)

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        return self.trainer.train_step(batch)

    def scored_train_step(self, batch: TrainBatch) -> tuple[LogprobResult, dict[str, float]]:
        return self.trainer.scored_train_step(batch)

    def send_weights(self, version: int) -> list[Bucket]:
        """The whole model in buckets (a Megatron trainer: on rank 0; its other ranks return [])."""
        weights = list(self.trainer.named_weights())
        return make_buckets(weights, self.bucket_bytes, version) if weights else []

    def save(self, directory: str | Path) -> Path:
        return Path(self.trainer.save(directory))

    def load(self, directory: str | Path) -> None:
        self.trainer.load(directory)


class RolloutWorker:
    """The rollout engine a recipe names: the embedded CPU engine, or vLLM."""

    def __init__(self, recipe: Recipe | dict, model_dir: str | Path):
        recipe = _recipe(recipe)
        if recipe.rollout.backend == "vllm":  # needs vllm installed (`make test-vllm` builds .venv-vllm)
            from transformers import AutoTokenizer

            from repro.rollout.vllm_engine import VLLMEngine

            eos_id = AutoTokenizer.from_pretrained(model_dir).eos_token_id
            self.engine = VLLMEngine.from_recipe(recipe, model_dir, eos_id=eos_id)
            return
        from repro.model.hf_folder import load_checkpoint
        from repro.rollout.embedded import EmbeddedEngine
        from repro.rollout.fp8_view import weight_view_for

        model, tokenizer = load_checkpoint(model_dir)
        r = recipe.rollout
        self.weight_view = weight_view_for(r.weight_format, r.fp8_format, r.fp8_block, r.fp8_scale)
        self.engine = EmbeddedEngine(
            model,
            eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id,
            max_context=recipe.lengths.max_context,
            weight_view=self.weight_view,
            record_routing=recipe.routing_replay.enabled,
        )

    def ready(self) -> None:
        """Construction is the warm-up; by the time this runs it is done."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        return self.engine.generate(prompts, params)

    def receive_weights(self, sent: list[Bucket], version: int) -> SyncStats:
        return apply_buckets(self.engine, sent, version)

    def weight_version(self) -> int:
        return self.engine.weight_version
