"""What runs inside each Ray actor: a trainer worker and a rollout worker, plain Python objects.

Keeping them free of Ray means tests can drive the same objects in-process; ``repro.cluster`` only places
them and forwards calls (to every rank of a Megatron trainer at once). Each is built from the resolved recipe (a dict, so it crosses process boundaries)
and the model folder.
"""

from __future__ import annotations

from pathlib import Path

from repro.recipes.schema import Recipe
from repro.rollout.types import RolloutResult, SamplingParams
from repro.sync import Bucket, SyncStats, apply_buckets, make_buckets


def _recipe(recipe: Recipe | dict) -> Recipe:
    return recipe if isinstance(recipe, Recipe) else Recipe.model_validate(recipe)


class TrainerWorker:
    """One trainer process: the embedded trainer, or one rank of a Megatron world (its rendezvous environment
    set by ``repro.groups.ray_ranks``; the model from ``actor.model_provider``, so ``model_dir`` is unused there)."""

    def __init__(self, recipe: Recipe | dict, model_dir: str | Path):
        recipe = _recipe(recipe)
        if recipe.actor.backend == "megatron":  # needs megatron-core (`make test-megatron` builds .venv-megatron)
            from repro.train.megatron.trainer import MegatronTrainer
            from repro.train.megatron.parallel import init_distributed_from_env

            if recipe.actor.num_workers > 1:
                init_distributed_from_env()
            self.trainer = MegatronTrainer.from_recipe(recipe)
        else:
            from repro.train.embedded import EmbeddedTrainer

            self.trainer = EmbeddedTrainer.from_recipe(recipe, model_dir)
        self.bucket_bytes = recipe.weight_sync.bucket_mb * 1024 * 1024

    def logprobs(self, batch, replay_routing: bool = True):
        return self.trainer.logprobs(batch, replay_routing=replay_routing)

    def train_step(self, batch) -> dict[str, float]:
        return self.trainer.train_step(batch)

    def weight_buckets(self, version: int) -> list[Bucket]:
        """The whole model in buckets (a Megatron trainer: on rank 0; its other ranks return [])."""
        weights = list(self.trainer.named_weights())
        return make_buckets(weights, self.bucket_bytes, version) if weights else []

    def save(self, directory: str) -> str:
        return str(self.trainer.save(directory))

    def load(self, directory: str) -> None:
        self.trainer.load(directory)


class RolloutWorker:
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

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutResult:
        return self.engine.generate(prompts, params)

    def apply_buckets(self, buckets: list[Bucket], version: int) -> SyncStats:
        return apply_buckets(self.engine, buckets, version)

    def weight_version(self) -> int:
        return self.engine.weight_version
