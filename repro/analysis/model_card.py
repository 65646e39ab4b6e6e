"""The README.md model card of an exported policy: what was trained (the recipe's key settings), which step, and
the comparison's headline numbers beside AMD's, from the log up to the exported step.

The headline rows are ``compare_to_amd``'s: reward accuracy by phase, held-out avg@k at the start and the end, the
train-rollout KL (k1, and k3 beside it) and the effective sample size at the last logged step. Throughput and
single-step extremes are left to the full report (``repro compare``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from repro.analysis import summary
from repro.analysis.compare import compare_to_amd
from repro.analysis.formats import fmt
from repro.analysis.frame import THROUGHPUT, RunFrames
from repro.analysis.report import CPU_CAVEAT, value_cell
from repro.recipes.schema import Recipe


@dataclass(frozen=True)
class ExportFacts:
    """What the card says about the export itself."""

    run_dir: str
    checkpoint: str
    step: int
    trainer_backend: str
    trainer_dtype: str
    layout: str               # "deepseek" (the release's names) or "hf" (transformers')
    dtype: str                # the export's floating dtype ("bfloat16" or "float32")
    tensors: int
    bytes: int
    by_dtype: dict[str, int]  # stored dtype -> tensors
    files: list[str]          # everything in the folder besides README.md
    deepseek_v4: bool = True  # the release's FP32 rule and MTP layer apply


def headline(frames: RunFrames) -> pd.DataFrame:
    """``compare_to_amd``'s rows without throughput and single-step extremes."""
    table = compare_to_amd(frames)
    keep = (table["key"] != THROUGHPUT) & ~table["metric"].str.contains("single step")
    return table[keep].reset_index(drop=True)


def recipe_settings(recipe: Recipe) -> list[tuple[str, str]]:
    """The settings a reader of the card needs to know what produced these weights, as (setting, value)."""
    a, r, c, o = recipe.algorithm, recipe.rollout, recipe.rollout_correction, recipe.optim
    actor = recipe.actor
    return [
        ("recipe", f"`{recipe.name}` ({recipe.description})" if recipe.description else f"`{recipe.name}`"),
        ("engine / trainer", f"{recipe.engine} / {actor.backend}, {actor.dtype} compute with fp32 AdamW masters, "
                             f"TP{actor.tensor_parallel} PP{actor.pipeline_parallel} EP{actor.expert_parallel}"),
        ("start model", f"`{recipe.model.name}` (`{recipe.model.path}`), {recipe.model.num_parameters:,} parameters"),
        ("steps, seed", f"{recipe.steps}, {recipe.seed}"),
        ("batch", f"{a.prompts_per_step} prompts x {a.responses_per_prompt} responses, "
                  f"{a.updates_per_step} update(s) per step"),
        ("data", f"train `{recipe.data.train.kind}`, held-out `{recipe.data.eval.kind}` "
                 f"(avg@{recipe.eval.samples_per_problem} at T={recipe.eval.temperature}, top-p {recipe.eval.top_p})"),
        ("loss", f"GRPO, advantages {'/ group std (' + a.adv_std + ')' if a.norm_adv_by_std else 'centred only'}, "
                 f"clip {a.clip_ratio_low}/{a.clip_ratio_high}, {a.loss_agg_mode}, KL coef {a.kl_coef}, "
                 f"entropy coef {a.entropy_coef}"),
        ("optimizer", f"AdamW lr {o.lr:g} ({o.schedule}, {o.warmup_steps} warm-up), betas {tuple(o.betas)}, "
                      f"eps {o.eps:g}, weight decay {o.weight_decay}, grad clip {o.grad_clip}"),
        ("rollout", f"{r.backend}, {r.weight_format} weights, T={r.temperature}, top-p {r.top_p}, "
                    f"{r.logprobs_mode} log-probs, {recipe.lengths.max_response} response tokens at most"),
        ("rollout correction", f"{c.mode} TIS, cap {c.threshold}"),
        ("routing replay (R3)", "on" if recipe.routing_replay.enabled else "off"),
    ]


def _headline_table(frames: RunFrames) -> list[str]:
    lines = ["| metric | AMD (DeepSeek-V4-Flash, 75 steps) | this run | note |", "|---|---|---|---|"]
    for row in headline(frames).itertuples(index=False):
        lines.append(f"| {row.metric} | {fmt(row.amd, row.quantity)} | {value_cell(row)} | {row.note} |")
    return lines


def model_card(recipe: Recipe, frames: RunFrames, facts: ExportFacts) -> str:
    """README.md of the exported folder."""
    hw = summary.hardware(frames)
    tiny = hw is not None and hw.gpus == 0
    names = ("the release's own tensor names and config keys (deepseek-ai/DeepSeek-V4-Flash's layout)"
             if facts.layout == "deepseek" else "transformers' in-memory tensor names and config.json")
    dtypes = ", ".join(f"{count} {dtype}" for dtype, count in facts.by_dtype.items())
    parts = [
        f"# {recipe.name}: the GRPO policy at step {facts.step}", "",
        *(["> " + CPU_CAVEAT.format(who="This model comes from"), ""] if tiny else []),
        f"Exported by `repro export` from checkpoint `{facts.checkpoint}` of run `{facts.run_dir}`: step "
        f"{facts.step} of the recipe's {recipe.steps}, the {facts.trainer_backend} trainer's fp32 master weights "
        f"({facts.trainer_dtype} trainer) written as {facts.dtype}.", "",
        "## Weights", "",
        f"- Layout: {names}.",
        f"- {facts.tensors} tensors, {facts.bytes:,} bytes ({dtypes}). Floating tensors are {facts.dtype}"
        + (" except those the release keeps in FP32 (hyper-connection parameters, attention sinks, compressor "
           "position biases, the router's selection bias); integer tensors (the hash router's token-to-expert "
           "table) as trained." if facts.deepseek_v4 else "; integer tensors as trained."),
        *(["- No MTP layer: the trainer does not train it (transformers' DeepseekV4ForCausalLM has none and vLLM "
           "skips it), so `num_nextn_predict_layers` is 0."] if facts.deepseek_v4 else []),
        f"- Files: {', '.join(f'`{f}`' for f in facts.files)}.", "",
        "Load it with `AutoModelForCausalLM.from_pretrained(folder)` (transformers >= 5.24)"
        + (", or serve it with vLLM, which reads the release layout." if facts.layout == "deepseek" else "."), "",
        "## Recipe", "",
        "| setting | value |", "|---|---|",
        *[f"| {name} | {value} |" for name, value in recipe_settings(recipe)], "",
        f"## Headline numbers up to step {facts.step}, beside AMD's", "",
        *_headline_table(frames), "",
        "Phase means are over the steps logged up to the exported one; KL and ESS are at the last logged step "
        "(AMD's at step 75). The full comparison, with noise bands and where the numbers are not AMD's quantity: "
        f"`repro compare {facts.run_dir}`.", "",
    ]
    return "\n".join(parts)
