"""`repro export`'s work: a run's checkpoint -> a safetensors folder a user ships, written as one atomic rename.

    result = export_run("runs/tiny-cpu", "exports/tiny-cpu-step75", layout="deepseek", dtype="bf16")

The folder holds the weights (``repro.model.streamed_export``: streamed slab by slab, sharded by size, with
``model.safetensors.index.json`` when there are several shards), ``config.json`` in the layout's keys, the
tokenizer files and ``generation_config.json`` of the run's model folder, and ``README.md``
(``repro.analysis.model_card``). It is built in a hidden temp folder beside the output and renamed onto it last,
so an export that fails or is killed leaves nothing under the output name; an output that exists is refused.

What is exported: the checkpoints of repro's own loop (``checkpoints/step_NNNNNN/trainer``) written by the
embedded trainer. Two kinds are refused, each naming why:

  Megatron trainer state  today's format (``repro.train.megatron.dist_state``: ``trainer_state.json`` of backend
                          "megatron" and megatron-core's ``dist/``) holds every tensor as a shard of its global
                          tensor, but under megatron's own parameter keys (fused QKV, gated fc1, local expert
                          numbers); mapping those to the release's names is a DeepSeek-V4 model provider's
                          ``export_names``, met only in the live model (``repro.train.megatron.stream_weights``),
                          and the CPU lane's Megatron model is a tiny GPT-MoE, which has no release layout.
                          The older format (one ``rank-NNNNN`` folder of local shards per rank) also lacks each
                          tensor's partition dim, the stages' layer numbers and the EP expert offsets.
  LumenRL runs            (``engine: lumenrl``) LumenRL writes its own Megatron checkpoints; they are not read here.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from repro.analysis.frame import RECIPE_FILE, checked_rows, frames_from_rows, read_jsonl_numbered, read_recipe
from repro.analysis.model_card import ExportFacts, model_card
from repro.errors import CheckpointError
from repro.model.streamed_export import plan_weights, write_weights
from repro.model.tiny_release import config_json, staged_folder
from repro.recipes import resolve_path
from repro.recipes.backends import engine_of, trainer_named
from repro.run.checkpoints import (COMPLETE_MARKER, STATE_FILE, Checkpoint, check_complete, list_checkpoints,
                                   usable_checkpoint)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja")
GENERATION_CONFIG = "generation_config.json"
TRAINER_FILES = ("trainer_state.json", "config.json", "model.safetensors")


@dataclass(frozen=True)
class ExportResult:
    folder: Path
    step: int
    layout: str
    tensors: int
    bytes: int
    files: list[str]


def find_checkpoint(run_dir: Path, step: int | None, say: Callable[[str], None] = print) -> Checkpoint:
    """Checkpoint ``step`` of ``run_dir`` (None: the newest that verifies, each newer one that does not said in one
    line); refuses a missing one, or one whose files do not match its marker's digests, naming the file."""
    root = run_dir / "checkpoints"
    if step is None:
        newest, notes = usable_checkpoint(root)
        if newest is None:
            raise CheckpointError(f"{root}: no complete checkpoint that verifies (a folder step_NNNNNN with "
                                  f"{COMPLETE_MARKER} and {STATE_FILE}, every file matching its digest)"
                                  + "".join(f"; not used: {note}" for note in notes))
        for note in notes:
            say(f"not exported: {note}")
        return newest
    folder = root / f"step_{step:06d}"
    if folder.is_dir():
        missing = [f for f in (COMPLETE_MARKER, STATE_FILE) if not (folder / f).exists()]
        if missing:
            raise CheckpointError(f"{folder} is incomplete (no {' or '.join(missing)}): its write never finished")
        why = check_complete(folder)
        if why:
            raise CheckpointError(f"{folder} is not exported: {why}")
        return Checkpoint(step, folder)
    have = [c.step for c in list_checkpoints(root)]
    raise CheckpointError(f"{folder} does not exist (complete checkpoints of this run: steps {have or 'none'})")


def trainer_meta(trainer_dir: Path) -> dict:
    """``trainer_state.json`` of an embedded trainer's state, after checking the files the export reads."""
    ranks = sorted(p.name for p in trainer_dir.glob("rank-*")) if trainer_dir.is_dir() else []
    state = trainer_dir / "trainer_state.json"
    try:
        meta = json.loads(state.read_text()) if state.is_file() else {}
    except ValueError as err:
        raise CheckpointError(f"{state}: not valid JSON ({err})") from None
    backend = meta.get("backend", "embedded")
    if ranks or not trainer_named(backend, f"{state}: backend").hf_state:
        kind = (f"the old per-rank format, {len(ranks)} rank folder(s) of local shards" if ranks else
                "megatron-core dist_checkpointing under megatron's parameter keys")
        raise CheckpointError(
            f"{trainer_dir}: Megatron trainer state ({kind}); repro export reads the embedded trainer's checkpoints "
            "only. Mapping megatron's keys to the release's names needs the live model's DeepSeek-V4 provider, and "
            "the tiny Megatron model has no release layout: see repro/run/export.py")
    missing = [name for name in TRAINER_FILES if not (trainer_dir / name).is_file()]
    if missing:
        raise CheckpointError(f"{trainer_dir}: incomplete trainer state, no {', '.join(missing)}")
    if meta.get("dtype") not in DTYPES:
        raise CheckpointError(f"{state}: trainer dtype {meta.get('dtype')!r}, expected one of {sorted(DTYPES)}")
    return meta


def model_folder(recipe, model_dir: str | Path | None) -> Path:
    """The run's model folder (``model.path``, or ``model_dir`` over it), which must hold the tokenizer."""
    folder = Path(model_dir) if model_dir is not None else resolve_path(recipe.model.path)
    where = "--model-dir" if model_dir is not None else f"the recipe's model.path ({recipe.model.path})"
    if not folder.is_dir():
        raise CheckpointError(f"{folder} ({where}) does not exist: the tokenizer is copied from the run's model folder")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{folder} ({where}) holds no tokenizer file ({', '.join(TOKENIZER_FILES[:2])}, ...)")
    return folder


def _metrics_frames(run_dir: Path, checkpoint: Checkpoint, recipe):
    """The log up to the exported step: the copy the checkpoint holds, else the run's own cut at the step."""
    own = checkpoint.path / "metrics.jsonl"
    path = own if own.is_file() else run_dir / "metrics.jsonl"
    rows = [row for row in checked_rows(read_jsonl_numbered(path), path, own=True)[0] if row["step"] <= checkpoint.step]
    return frames_from_rows(rows, path, recipe, label=run_dir.name)


def export_run(run_dir: str | Path, out: str | Path, *, step: int | None = None, layout: str = "deepseek",
               dtype: str = "bf16", max_shard_bytes: int | None = 5 * 10**9,
               model_dir: str | Path | None = None, say: Callable[[str], None] = print) -> ExportResult:
    """Export checkpoint ``step`` (None: the newest that verifies) of ``run_dir`` to the new folder ``out`` (see the
    module doc); ``say`` gets one line per newer checkpoint passed over."""
    from transformers import AutoConfig

    run_dir, out = Path(run_dir), Path(out)
    if dtype not in DTYPES:
        raise CheckpointError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if out.exists():
        raise CheckpointError(f"{out} already exists; choose a new output folder (an export never overwrites)")
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: run directory not found")
    recipe, _ = read_recipe(run_dir / RECIPE_FILE)
    if not engine_of(recipe).own_loop:
        raise CheckpointError(f"{run_dir}: a LumenRL run (engine: lumenrl) keeps LumenRL's own Megatron "
                              "checkpoints, which repro export does not read")
    checkpoint = find_checkpoint(run_dir, step, say)
    meta = trainer_meta(checkpoint.trainer_dir)
    source_model = model_folder(recipe, model_dir)
    config = AutoConfig.from_pretrained(checkpoint.trainer_dir, local_files_only=True)
    v4 = config.model_type == "deepseek_v4"
    planned = plan_weights(checkpoint.trainer_dir, layout, DTYPES[dtype], v4=v4, needs_master=meta["dtype"] != "fp32")
    frames = _metrics_frames(run_dir, checkpoint, recipe)
    with staged_folder(out, replace=False) as tmp:
        written = write_weights(planned, tmp, max_shard_bytes)
        (tmp / "config.json").write_text(json.dumps(config_json(config, layout, DTYPES[dtype], 0), indent=2) + "\n")
        for name in (*TOKENIZER_FILES, GENERATION_CONFIG):
            if (source_model / name).is_file():
                shutil.copyfile(source_model / name, tmp / name)
        files = sorted(p.name for p in tmp.iterdir())
        facts = ExportFacts(str(run_dir), str(checkpoint.path), checkpoint.step, meta.get("backend", "embedded"),
                            meta["dtype"], layout, str(DTYPES[dtype]).removeprefix("torch."), written.tensors,
                            written.bytes, written.by_dtype, files, deepseek_v4=v4)
        (tmp / "README.md").write_text(model_card(recipe, frames, facts))
    return ExportResult(out.resolve(), checkpoint.step, layout, written.tensors, written.bytes, files + ["README.md"])
