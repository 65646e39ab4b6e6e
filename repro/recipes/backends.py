"""The backends a recipe can name, one table per side: ``actor.backend`` -> ``TRAINERS``, ``rollout.backend`` ->
``ROLLOUTS``, ``engine`` -> ``ENGINES``. Each entry is what the backend can do and the function that builds it
(trainers, rollouts) or the seam that runs it (engines: ``repro.engine_seam``); every other module asks these tables
rather than comparing backend names. An engine is one row here and one package.

The builder is named as ``"module:function"`` and imported when a worker builds it (``build``): recipe
validation reads this table and must not import torch, megatron-core or vLLM to do so.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from repro.errors import RecipeError

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe


@dataclass(frozen=True)
class Library:
    """An optional library a backend needs on the cluster (pins: repro/readiness/pins.py)."""

    distribution: str             # as pip and ``cluster.versions`` name it
    module: str                   # as Python imports it
    what: str                     # what it is, for messages


MEGATRON_CORE = Library("megatron-core", "megatron.core", "megatron-core, the Megatron trainer backend's library")
VLLM = Library("vllm", "vllm", "vLLM, the rollout engine's library")
# megatron-core 0.16.1's OptimizerConfig.__post_init__ asks Transformer Engine's version on the precision-aware path
# (``is_te_min_version("2.1.0")``, before its CPU-offload early return) and fails with a TypeError without TE
TRANSFORMER_ENGINE = Library("transformer-engine", "transformer_engine",
                             "Transformer Engine, which megatron-core's precision-aware optimizer (CPU offload or "
                             "moments below fp32 with the distributed optimizer) asks for")


@dataclass(frozen=True)
class TrainerCapabilities:
    """What a trainer backend can do, declared once."""

    builder: str                  # "module:function" (recipe, model_dir) -> the trainer of one process
    scores_in_update: bool        # can take pi_old from its update's own first forward (``scored_train_step``)
    sends_per_pipeline_stage: bool  # each pipeline stage's first rank sends its layers (else one sender)
    one_worker: bool              # one process only (no model or data parallelism)
    moments: Literal["fp32", "distributed"]  # fp32 moments only, or any dtype through a distributed optimizer
    fp32_gradients: bool          # gradients held in fp32 whatever the compute dtype
    hf_state: bool                # its saved state is also a Hugging Face folder (config.json), which export reads
    own_adamw: bool               # always steps repro's fp32-master AdamW (torch's), never megatron's optimizer
    needs_model_provider: bool    # actor.model_provider builds its model
    library: Library | None       # the optional library it needs, None: repro's own


@dataclass(frozen=True)
class RolloutCapabilities:
    """What a rollout backend can do, declared once."""

    builder: str                  # "module:function" (recipe, model_dir) -> the engine
    receivers_per_tensor_rank: bool  # every tensor-parallel worker receives the sync (else the one engine)
    wire: str                     # "module:function" (recipe, model_dir) -> its weight wire (repro.sync.handoff.Wire)
    workers_join_groups: bool     # its workers join repro's bucket-stream groups themselves (``receive_from_groups``)
    checkpoint_names: bool        # reloads checkpoint-format tensors (a trainer exports those names to it)
    library: Library | None


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine (who runs the RL loop) does, declared once; ``seam`` and ``problems`` are imported when used."""

    seam: str                     # "module:attribute" of its repro.engine_seam.EngineSeam (run, launch, resume, ...)
    own_loop: bool                # repro's loop: its sinks write rollouts/ and W&B, its checkpoints are repro's
    streams_log: bool             # the run's rows are streamed from the engine's own log (key origins, step time)
    rollout_logprobs: Literal["raw"] | None  # which log-probs its rollout reports when the recipe cannot say
    streamed_optimizer: bool      # its trainer streams the optimizer state (LumenRL's DSV4 optimizer)
    problems: str | None          # "module:function" (recipe) -> what of a recipe it cannot run, field by field
    source_kind: str | None = None  # the run-source kind (repro.analysis.sources) its own log files read as
    colocates: bool = False       # runs the rollout on the trainer's GPUs itself: the recipe's node accounting is moot
    about_run_dir: str | None = None  # "module:function" (run_dir) -> what the analysis reads beside metrics.jsonl
    caveats: str | None = None    # "module:function" (frames) -> its sentences for the comparison with AMD's numbers


TRAINERS: dict[str, TrainerCapabilities] = {
    "embedded": TrainerCapabilities(
        "repro.train.embedded:build_trainer", scores_in_update=True, sends_per_pipeline_stage=False,
        one_worker=True, moments="fp32", fp32_gradients=False, hf_state=True, own_adamw=True,
        needs_model_provider=False, library=None),
    "megatron": TrainerCapabilities(
        "repro.train.megatron.trainer:build_trainer", scores_in_update=False, sends_per_pipeline_stage=True,
        one_worker=False, moments="distributed", fp32_gradients=True, hf_state=False, own_adamw=False,
        needs_model_provider=True, library=MEGATRON_CORE),
}

ROLLOUTS: dict[str, RolloutCapabilities] = {
    "embedded": RolloutCapabilities("repro.rollout.embedded:build_engine", receivers_per_tensor_rank=False,
                                    wire="repro.sync.bucket_wire:bucket_wire", workers_join_groups=False,
                                    checkpoint_names=False, library=None),
    "vllm": RolloutCapabilities("repro.rollout.vllm_engine:build_engine", receivers_per_tensor_rank=True,
                                wire="repro.rollout.vllm_transfer:vllm_wire", workers_join_groups=True,
                                checkpoint_names=True, library=VLLM),
}


ENGINES: dict[str, EngineCapabilities] = {
    "repro": EngineCapabilities("repro.run.engine:SEAM", own_loop=True, streams_log=False, rollout_logprobs=None,
                                streamed_optimizer=False, problems=None),
    "lumenrl": EngineCapabilities("repro.lumenrl.seam:SEAM", own_loop=False, streams_log=True,
                                  rollout_logprobs="raw", streamed_optimizer=True,
                                  problems="repro.recipes.lumenrl_checks:lumenrl_problems", source_kind="lumenrl",
                                  about_run_dir="repro.analysis.lumenrl_origins:streamed_about"),
    "verl": EngineCapabilities("repro.verl.seam:SEAM", own_loop=False, streams_log=True, rollout_logprobs=None,
                               streamed_optimizer=False, problems="repro.verl.checks:verl_problems", colocates=True,
                               about_run_dir="repro.verl.analysis:about_run_dir",
                               caveats="repro.verl.analysis:caveats"),
}


def trainer_of(recipe: "Recipe") -> TrainerCapabilities:
    return _entry(TRAINERS, recipe.actor.backend, "actor.backend")


def trainer_named(name: str, where: str) -> TrainerCapabilities:
    """A trainer backend by the name a saved state records (``where`` names the file, for the error)."""
    return _entry(TRAINERS, name, where)


def engine_of(recipe: "Recipe") -> EngineCapabilities:
    return _entry(ENGINES, recipe.engine, "engine")


def engine_reading(source_kind: str) -> EngineCapabilities | None:
    """The engine whose own log files read as run sources of ``source_kind`` (None: no engine's)."""
    return next((e for e in ENGINES.values() if e.source_kind == source_kind), None)


def engine_problems(recipe: "Recipe") -> list[str]:
    """What of ``recipe`` its engine cannot run, one ``field: why`` line each (empty: it can)."""
    problems = engine_of(recipe).problems
    return function_named(problems)(recipe) if problems is not None else []


def function_named(spec: str) -> Any:
    """The function a table entry names as "module:function", imported now."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def rollout_of(recipe: "Recipe") -> RolloutCapabilities:
    return _entry(ROLLOUTS, recipe.rollout.backend, "rollout.backend")


def _entry(table: dict, name: str, field: str):
    try:
        return table[name]
    except KeyError:
        raise RecipeError(f"{field}: {name!r} is not one of {sorted(table)}") from None


def precision_aware_optimizer(distributed: bool, offload: bool, fp32_moments: bool) -> bool:
    """Whether megatron's optimizer takes its precision-aware path: CPU offload (``HybridDeviceOptimizer``) or moments
    below fp32, which megatron allows only with the distributed optimizer."""
    return distributed and (offload or not fp32_moments)


def needs_transformer_engine(recipe: "Recipe") -> bool:
    """Megatron's own optimizer (a GPU trainer) on the precision-aware path, which megatron-core 0.16.1 cannot
    configure without Transformer Engine (``TRANSFORMER_ENGINE``); the CPU lane steps the project's AdamW."""
    actor = recipe.actor
    return (trainer_of(recipe).library is MEGATRON_CORE and recipe.cluster.gpus_per_node > 0
            and precision_aware_optimizer(actor.num_workers > 1, actor.optimizer_cpu_offload,
                                          actor.optimizer_moment_dtype == "fp32"))


def libraries(recipe: "Recipe") -> list[Library]:
    """The optional libraries the recipe's trainer and rollout backends need (none for the embedded ones)."""
    found = [lib for lib in (trainer_of(recipe).library, rollout_of(recipe).library) if lib is not None]
    return found + [TRANSFORMER_ENGINE] if needs_transformer_engine(recipe) else found


def sync_senders(recipe: "Recipe") -> int:
    """Trainer ranks that send a weight sync: the first rank of each pipeline stage where the trainer sends per
    stage (Megatron), else one."""
    return recipe.actor.pipeline_parallel if trainer_of(recipe).sends_per_pipeline_stage else 1


def sync_receivers(recipe: "Recipe") -> int:
    """Processes that receive a weight sync: every tensor-parallel worker of the rollout (vLLM), or the one
    engine."""
    return recipe.rollout.tensor_parallel if rollout_of(recipe).receivers_per_tensor_rank else 1


def build(builder: str, recipe: "Recipe", model_dir: Any) -> Any:
    """Import a table entry's builder and call it: the trainer or engine of this worker process."""
    module, _, function = builder.partition(":")
    return getattr(importlib.import_module(module), function)(recipe, model_dir)
