"""``actor.model_provider`` for AMD's trainer image: this rank's DeepSeek-V4 GPTModel, built by LumenRL's own
``megatron_lumen_dsv4`` engine, without LumenRL's DDP and optimizer (repro's trainer owns the update).

Set ``actor.model_provider: repro.train.megatron.lumenrl_dsv4:provider`` and ``model.path`` to the BF16 HF folder.
What it needs from the image (LumenRL ``examples/GRPO/Dockerfile.dsv4``, target ``trainer``): ``lumenrl``
(``/workspace/Lumen-RL``, branch ``dev/dsv4-grpo``) and ``lumen`` (``/workspace/Lumen``: ``lumen.models.dsv4.megatron
.spec.get_dsv4_spec``) importable; ROCm/Megatron-LM ``rocm_dev`` patched by
``examples/GRPO/dsv4/patch_rocm_megatron_dsv4
.py`` (``experimental_attention_variant="dsv4"`` and the ``dsv4_*`` TransformerConfig fields); aiter, TileLang and
flash-attention for the kernels; a ROCm GPU per rank (the engine calls ``model.cuda()``). Every rank reads the whole
HF checkpoint (LumenRL's ``load_hf_safetensors``), so stage it in ``/dev/shm`` as AMD did.

How it is built (facts from LumenRL's ``megatron_lumen_dsv4_engine.py``): ``MegatronLumenDSV4Engine(model_config,
engine_config, optimizer_config, model_name)``; ``initialize()`` keeps an existing model-parallel state, builds the
``MLATransformerConfig`` from the HF ``config.json`` and the engine config, loads and shards the weights, casts to
BF16 except parameters marked ``_keep_fp32`` (hyper-connections, attention sink, compressor position bias), freezes
``mlp.router.{weight,expert_bias,tid2eid}``, and returns before DDP and the optimizer when
``LUMENRL_FORWARD_ONLY_INIT=1``. The model is ``engine.module``; ``dsv4_megatron_to_hf`` names weights for vLLM.

Not run here (no ROCm GPU, no LumenRL in this environment): ``tests/test_lumenrl_provider.py`` checks our side with
a stand-in engine. To verify on the cluster first: the R3 hook (LumenRL replays routes through its own
``RouterReplay``, repro's trainer arms megatron's), and gradient reduction of LumenRL's duplicated linears, which
it marks tensor-parallel although every TP rank holds them whole (exported once here, see ``_duplicated``); and
that ``dsv4_megatron_to_hf`` maps a part of the state -- the weight stream hands it one export unit at a time
(``repro.train.megatron.stream_weights.export_unit``: one layer's experts of one projection, one layer's other
tensors, a top-level tensor) rather than a whole stage; LumenRL's source was not at hand to check this.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable

import torch

from repro.train.base import TrainerError

ENGINE_MODULE = "lumenrl.engine.training.megatron_lumen_dsv4_engine"
BRIDGE_MODULE = "lumenrl.engine.training.dsv4_megatron_bridge"
FORWARD_ONLY = "LUMENRL_FORWARD_ONLY_INIT"


def pipeline_stage_layers(num_layers: int, stages: int) -> tuple[int, int] | None:
    """(first, last) stage sizes LumenRL's engine takes, the middle stages sharing the rest evenly: 43 layers over
    PP4 -> (11, 10), i.e. 11 + 11 + 11 + 10 as in AMD's config. None at PP 1."""
    if stages == 1:
        return None
    first = math.ceil(num_layers / stages)
    last = num_layers - first * (stages - 1)
    if last < 1:
        raise TrainerError(f"actor.pipeline_parallel: {num_layers} layers cannot fill {stages} stages")
    return first, last


def engine_config(recipe, num_layers: int) -> dict[str, Any]:
    """The ``megatron_cfg`` keys LumenRL's engine reads, from the recipe (values of AMD's longrun config)."""
    actor = recipe.actor
    full = actor.recompute == "full"
    config = {
        "tensor_model_parallel_size": actor.tensor_parallel,
        "pipeline_model_parallel_size": actor.pipeline_parallel,
        "expert_model_parallel_size": actor.expert_parallel,
        "expert_tensor_parallel_size": actor.expert_tensor_parallel,
        "num_experts": recipe.model.num_routed_experts,
        "sequence_parallel": actor.sequence_parallel and actor.tensor_parallel > 1,
        "recompute_granularity": "full" if full else None,
        "recompute_method": "uniform" if full else None,
        "recompute_num_layers": 1 if full else None,
        "moe_grouped_gemm": True,
        "moe_token_dispatcher_type": "alltoall",
        "attention_softmax_in_fp32": True,
        "attention_backend": "flash",
        "use_packed_sequences": True,
        "log_probs_chunk_size": 1024,
        "moe_enable_routing_replay": recipe.routing_replay.enabled,
        "seed": recipe.seed,
    }
    first, last = actor.num_layers_in_first_pipeline_stage, actor.num_layers_in_last_pipeline_stage
    if first is None and last is None:
        stages = pipeline_stage_layers(num_layers, actor.pipeline_parallel)
    else:  # the recipe's split, checked against the checkpoint's own layer count by megatron's rule
        from repro.recipes.consistency import pipeline_stage_layers as split

        try:
            split(num_layers, actor.pipeline_parallel, first, last)
        except ValueError as err:
            raise TrainerError(f"{err} (the checkpoint's config.json has num_hidden_layers={num_layers})") from None
        stages = (first, last)
    if stages:
        config["num_layers_in_first_pipeline_stage"], config["num_layers_in_last_pipeline_stage"] = stages
    return config


def _import(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise TrainerError(
            f"actor.model_provider=repro.train.megatron.lumenrl_dsv4:provider needs {module} ({err}); it runs inside "
            "AMD's trainer image (LumenRL examples/GRPO/Dockerfile.dsv4: /workspace/Lumen-RL and /workspace/Lumen on "
            "PYTHONPATH, ROCm Megatron-LM patched for DSV4); docs/megatron-dsv4.md") from err


def _duplicated(model: torch.nn.Module) -> dict[str, int]:
    """Full names (and the dim repro's gather concatenates) of weights LumenRL marks tensor-parallel although every
    TP rank holds them whole (``_lumen_weight_partition_dim = None``), collected from every rank."""
    import torch.distributed as dist

    from repro.train.megatron.parallel import full_names

    names = full_names(model)
    local = {names[n]: int(getattr(p, "partition_dim", 0)) for n, p in model.named_parameters()
             if getattr(p, "tensor_model_parallel", False)
             and hasattr(p, "_lumen_weight_partition_dim") and p._lumen_weight_partition_dim is None}
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return local
    every: list[dict[str, int]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, local)
    return {name: dim for part in every for name, dim in part.items()}


def hf_export(engine, duplicated: dict[str, int], tp: int) -> Callable[[dict], dict]:
    """Gathered full Megatron weights -> the HF checkpoint names vLLM loads, by LumenRL's own converter."""
    bridge = _import(BRIDGE_MODULE)

    def export(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # a whole weight gathered from TP ranks that each hold it whole is TP copies side by side: keep one
        whole = {name: (t.chunk(tp, dim=duplicated[name])[0] if name in duplicated and tp > 1 else t)
                 for name, t in weights.items()}
        pairs = bridge.dsv4_megatron_to_hf(whole, engine._dims, pp_rank=0, pp_size=1, layers_per_pp_rank=None,
                                           use_grouped_mlp=True)
        return {bridge._denormalize_redhat_key(name): tensor for name, tensor in pairs}

    return export


def provider(recipe):
    """This rank's DeepSeek-V4 stage/shard from LumenRL's engine, and the export naming synced weights for vLLM.
    Model parallelism must already be initialised (``MegatronTrainer.from_recipe`` does it). Returns ``(model,
    export_names)``."""
    from repro.recipes import resolve_path

    model_dir = Path(resolve_path(recipe.model.path))
    config_path = model_dir / "config.json"
    try:
        num_layers = int(json.loads(config_path.read_text())["num_hidden_layers"])
    except (OSError, ValueError, KeyError) as err:
        raise TrainerError(f"{config_path}: cannot read num_hidden_layers ({err})") from err
    engines = _import(ENGINE_MODULE)
    engine = engines.MegatronLumenDSV4Engine(model_config={}, engine_config=engine_config(recipe, num_layers),
                                             optimizer_config={}, model_name=str(model_dir))
    previous = os.environ.get(FORWARD_ONLY)
    os.environ[FORWARD_ONLY] = "1"  # the model only: repro's trainer owns DDP, the optimizer and the schedule
    try:
        engine.initialize()
    finally:
        if previous is None:
            os.environ.pop(FORWARD_ONLY, None)
        else:
            os.environ[FORWARD_ONLY] = previous
    model = engine.module
    return model, hf_export(engine, _duplicated(model), recipe.actor.tensor_parallel)
