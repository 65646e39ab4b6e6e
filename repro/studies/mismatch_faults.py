"""What would produce AMD's numbers: the emulation pushed to its limits and injected reload faults (issue 31, item 4).

AMD reports a per-token k1 of 0.4706 and an ESS of 79.1 %. Its k1 compares vLLM's raw log-probs (log_softmax at
T = 1) with the trainer's log_softmax(z / 0.8) (docs/fidelity.md, "rollout log-probs"), so the temperature is part
of it. Each row of ``FAULTS`` makes the rollout engine serve the checkpoint one way, lets *that* engine sample a
batch of the recipe's training prompts (the faulted policy), and sets its raw log-probs against the BF16 trainer's
with R3, as the run does: per-token k1, k3, ESS (LumenRL's definitions), the share above the TIS cap, and the
faulted policy's reward accuracy on the batch.

The faults are of the kinds LumenRL's patches fix (paths and lines in LumenRL ``dev/dsv4-grpo`` at 2232f55, the
run's tree; unchanged at the branch head 93795b9):

* the FP8 scale doubled twice: vLLM's ``normalize_e4m3fn_to_e4m3fnuz`` reinterprets e4m3fn bytes as e4m3fnuz
  (half the value) and doubles the scale; applied again to a tensor that is already e4m3fnuz it doubles the scale
  once more, so the weight is served at twice its value -- ``lumenrl/engine/inference/vllm_fp8_utils.py:632-656``
  (``process_fp8_weight_block_strategy_rocm_safe``, "avoid a second (corrupting) conversion"). Emulated with
  ``repro.fp8.quant.e4m3fn_to_e4m3fnuz`` applied twice to the same bytes, on every FP8 weight or on one layer's
  routed experts;
* BF16 tensors served as FP8: the MoE router (``fp8_weight_quantizer.py:50-51``; why it matters,
  ``lumenrl/moe/router_precision.py:1-27``), the LM head (``fp8_weight_quantizer.py:45``,
  ``lumenrl/engine/training/fsdp_backend.py:228-244``), the compressors' and the indexer scorer's projections
  (``fp8_weight_quantizer.py:52-57``) -- each block-FP8 quantised like the linears;
* the hash-MoE table ``tid2eid`` lost in a reload (``vllm_fp8_utils.py:61-65`` and ``:300-336``,
  ``restore_checkpoint_static_tensors``): served as a freshly drawn table;
* the routed experts never synced (``lumenrl/engine/inference/vllm_moe_weight_sync.py:1-28``, "93% of the
  policy's parameters never reach the rollout engine"): served from an older checkpoint (``stale_dir``).

Everything here is an emulation on the ~2M-parameter tiny DeepSeek-V4 on CPU, not vLLM on MI308X.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from repro.algos import rollout_corr_metrics
from repro.studies.mismatch_sources import ALL_ON, checked_seeds, recipe_prompts
from repro.fp8.quant import dequantize_block, e4m3fn_to_e4m3fnuz, quantize_block
from repro.data.recipe_datasets import load_dataset
from repro.fp8.rules import decide
from repro.model.hf_folder import load_checkpoint
from repro.recipes import load_recipe, resolve_path
from repro.recipes.schema import Recipe
from repro.reward import score_response
from repro.rollout.embedded import EmbeddedEngine
from repro.rollout.fp8_view import FP8WeightView
from repro.rollout.numerics import RolloutNumerics
from repro.rollout.types import SamplingParams
from repro.train.batch import build_batch
from repro.train.embedded import EmbeddedTrainer
from repro.train.grpo_update import TrainerSettings

AMD = {"k1": 0.4706, "ess": 0.791}  # AMD's post: rollout_corr/kl and the ESS at the end of its run

ROUTER = r"(^|\.)mlp\.gate\.weight$"
HEAD = r"(^|\.)lm_head\.weight$"
COMPRESSOR = r"\.compressor\.(indexer\.)?(kv_proj|gate_proj)\.weight$|\.weights_proj\.weight$"


@dataclass(frozen=True)
class Fault:
    label: str
    numerics: RolloutNumerics = field(default_factory=lambda: replace(ALL_ON, hooked=[]))
    fmt: str = "e4m3fn"                 # the weights' FP8 encoding
    pow2_scale: bool = False            # UE8M0 (power-of-two) weight scales
    double_scale: str | None = None     # "all", or a layer's routed experts "experts:L": scale doubled twice
    fp8_also: str | None = None         # regex: tensors kept high precision by the rules, served as FP8 instead
    redraw_hash: bool = False           # tid2eid replaced by a freshly drawn table
    stale_experts: bool = False         # routed experts served from ``stale_dir``
    r3: bool = True
    logprobs_mode: str = "raw"          # AMD's convention
    source: str = ""                    # LumenRL path:line of the fix, or what the row is


FAULTS: tuple[Fault, ...] = (
    Fault("the run (all on, raw log-probs)", source="tiny-cpu-long as is"),
    Fault("processed log-probs", logprobs_mode="processed", source="the sampled distribution on both sides"),
    Fault("maxima: fnuz + UE8M0 scales + R3 off", fmt="e4m3fnuz",
          numerics=replace(ALL_ON, fp8_format="e4m3fnuz"), pow2_scale=True, r3=False,
          source="the emulation's coarsest settings"),
    Fault("scale doubled twice, every FP8 weight", double_scale="all",
          source="lumenrl/engine/inference/vllm_fp8_utils.py:632-656"),
    Fault("scale doubled twice, layer 3's experts", double_scale="experts:3",
          source="lumenrl/engine/inference/vllm_fp8_utils.py:632-656"),
    Fault("router served as FP8", fp8_also=ROUTER,
          source="lumenrl/engine/inference/fp8_weight_quantizer.py:50-51; lumenrl/moe/router_precision.py:1-27"),
    Fault("LM head served as FP8", fp8_also=HEAD,
          source="lumenrl/engine/inference/fp8_weight_quantizer.py:45; "
                 "lumenrl/engine/training/fsdp_backend.py:228-244"),
    Fault("compressor + indexer scorer served as FP8", fp8_also=COMPRESSOR,
          source="lumenrl/engine/inference/fp8_weight_quantizer.py:52-57"),
    Fault("hash table tid2eid lost in reload", redraw_hash=True,
          source="lumenrl/engine/inference/vllm_fp8_utils.py:61-65, 300-336"),
    Fault("routed experts never synced (stale)", stale_experts=True,
          source="lumenrl/engine/inference/vllm_moe_weight_sync.py:1-28"),
)


def doubled_twice(weight: torch.Tensor, fmt_block: int = 128) -> torch.Tensor:
    """``weight`` as served after the fn->fnuz conversion ran twice: block-FP8 (e4m3fn), converted, the converted
    bytes converted again (vLLM reads the already-fnuz tensor as int8 too), dequantised: 2x the one-pass value."""
    q, scale = quantize_block(weight.float(), "e4m3fn", block_size=fmt_block)
    once, scale, _ = e4m3fn_to_e4m3fnuz(q, scale)
    twice, scale, _ = e4m3fn_to_e4m3fnuz(once.view(torch.float8_e4m3fn), scale)
    return dequantize_block(twice, scale, block_size=fmt_block)


class FaultedView:
    """A weight view (``dict[name, tensor] -> dict``) serving block FP8 as ``FP8WeightView`` does, with one
    ``Fault`` injected; ``stale`` holds the module tensors served instead of the routed experts."""

    def __init__(self, fault: Fault, seed: int = 0, stale: dict[str, torch.Tensor] | None = None):
        self.fault, self.seed, self.stale = fault, seed, stale
        self.base = FP8WeightView(fault.fmt, 128, pow2_scale=fault.pow2_scale)
        self.also = re.compile(fault.fp8_also) if fault.fp8_also else None
        self.changed: list[str] = []  # names the fault touched, for tests and the table

    def _doubled(self, name: str, tensor: torch.Tensor) -> bool:
        mode = self.fault.double_scale
        if mode is None or not decide(name, tuple(tensor.shape), tensor.dtype).quantise:
            return False
        return mode == "all" or (mode.startswith("experts:") and f"layers.{mode.split(':')[1]}.mlp.experts." in name)

    def __call__(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        served, changed = self.base(weights), []
        for name, tensor in weights.items():
            if self._doubled(name, tensor):
                served[name] = doubled_twice(tensor)
            elif self.also is not None and self.also.search(name):
                q, scale = quantize_block(tensor.float(), self.fault.fmt, block_size=128)
                served[name] = dequantize_block(q, scale, block_size=128)
            elif self.fault.redraw_hash and name.endswith("tid2eid"):
                generator = torch.Generator().manual_seed(self.seed)
                experts = int(tensor.max()) + 1
                served[name] = torch.stack([torch.randperm(experts, generator=generator)[: tensor.shape[1]]
                                            for _ in range(tensor.shape[0])]).to(tensor.dtype)
            elif self.stale is not None and ".mlp.experts." in name:
                served[name] = self.base({name: self.stale[name]})[name]
            else:
                continue
            changed.append(name)
        if not changed:
            raise ValueError(f"fault {self.fault.label!r} touched no tensor of the model")
        self.changed = changed
        return served


def measure_fault(recipe: Recipe, folder: Path, fault: Fault, prompts: int, n: int, seed: int,
                  stale_dir: Path | None = None) -> dict:
    """One row of the table: the faulted engine samples ``prompts`` x ``n`` and is scored against the trainer."""
    model, tokenizer = load_checkpoint(folder)
    trainer = EmbeddedTrainer(folder, TrainerSettings(dtype=recipe.actor.dtype, max_tokens_per_micro_batch=16384,
                                                      temperature=recipe.rollout.temperature))
    stale = None
    if fault.stale_experts:
        if stale_dir is None:
            raise ValueError(f"fault {fault.label!r} needs stale_dir: the checkpoint the stale experts come from")
        stale = load_checkpoint(stale_dir)[0].state_dict()
    view = FaultedView(fault, seed, stale)
    faultless = not (fault.double_scale or fault.fp8_also or fault.redraw_hash or fault.stale_experts)
    engine = EmbeddedEngine(model, tokenizer.eos_token_id, tokenizer.pad_token_id, recipe.lengths.max_context,
                            view.base if faultless else view, numerics=replace(fault.numerics, hooked=[]),
                            logprobs_mode=fault.logprobs_mode)
    engine.update_weights(trainer.named_weights(), version=1)
    with_problems = recipe_problems(recipe, tokenizer, prompts, seed)
    params = SamplingParams(n=n, temperature=recipe.rollout.temperature, top_p=recipe.rollout.top_p,
                            max_new_tokens=recipe.lengths.max_response, seed=seed)
    result = engine.generate([ids for ids, _ in with_problems], params)
    batch = build_batch(result.trajectories, torch.zeros(len(result.trajectories)), tokenizer.pad_token_id,
                        with_routing=fault.r3)
    old = trainer.logprobs(batch, replay_routing=fault.r3).logprobs
    metrics = rollout_corr_metrics(old, batch.rollout_logprobs, batch.response_mask, "token",
                                   recipe.rollout_correction.threshold)
    rule = recipe.reward
    scores = [score_response(tokenizer.decode(t.response_ids, skip_special_tokens=True),
                             with_problems[t.prompt_index][1], rule.verifier, rule.boxed_fallback).acc
              for t in result.trajectories]
    return {"fault": fault.label, "seed": seed, "tokens": int(batch.response_mask.sum()),
            "k1": metrics["rollout_corr/kl"], "k3": metrics["rollout_corr/k3_kl"],
            "ess": metrics["rollout_corr/rollout_is_eff_sample_size"],
            "above_cap": metrics["rollout_corr/rollout_is_ratio_fraction_high"],
            "accuracy": sum(scores) / len(scores), "tensors_changed": len(view.changed), "source": fault.source}


def recipe_problems(recipe: Recipe, tokenizer, count: int, seed: int) -> list[tuple[list[int], str]]:
    """(prompt ids, ground truth) of the recipe's first ``count`` training problems in its seeded order."""
    with tempfile.TemporaryDirectory(prefix="repro-faults-") as data_dir:
        problems = load_dataset(recipe.data.train, data_dir, seed=seed)[:count]
    ids = recipe_prompts(recipe, tokenizer, count, seed)
    return [(p_ids, p.ground_truth) for p_ids, p in zip(ids, problems, strict=True)]


def measure_faults(recipe: str | Recipe, prompts: int, n: int, seeds: list[int], model_dir: str | Path | None = None,
                   stale_dir: str | Path | None = None, faults: tuple[Fault, ...] = FAULTS) -> list[dict]:
    """Every fault on every seed, on one torch thread (bit-for-bit repeatable). ``model_dir``: the checkpoint
    (default the recipe's model); ``stale_dir``: where the stale experts come from (default the recipe's model)."""
    recipe = load_recipe(recipe) if isinstance(recipe, str) else recipe
    folder = resolve_path(recipe.model.path) if not model_dir else Path(model_dir)
    stale = resolve_path(recipe.model.path) if not stale_dir else Path(stale_dir)
    seeds = checked_seeds(seeds)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [measure_fault(recipe, folder, fault, prompts, n, seed, stale) for fault in faults for seed in seeds]
    finally:
        torch.set_num_threads(threads)


def fault_frame(rows: list[dict]):
    """One row per fault, seeds averaged, with AMD's k1 / ESS beside it."""
    import pandas as pd

    frame = pd.DataFrame(rows).drop(columns="seed")
    table = frame.groupby(["fault", "source"], sort=False).mean(numeric_only=True).reset_index()
    table["k1 / AMD's"] = table["k1"] / AMD["k1"]
    return table
