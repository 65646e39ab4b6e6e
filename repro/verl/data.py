"""The recipe's datasets as verl's parquet files: one row per problem with ``prompt`` (the chat messages, our
template applied), ``data_source``, ``reward_model`` {``style``: rule, ``ground_truth``} and ``extra_info`` {index,
uid}, the layout verl's ``RLHFDataset`` reads and its reward manager hands to ``compute_score``.

Problems are read by repro's own loaders (``repro.data.recipe_datasets``), so ``data.*.kind``, ``template``,
``on_malformed`` and ``dedupe`` mean what they mean on our loop. The held-out set is always deduplicated by problem
(AIME 2024: 30 rows): verl samples ``val_kwargs.n`` responses per row, so a repeated row would count its problem
twice in avg@k. Files are written to a temp name and renamed, so a half-written file never looks complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from repro.data.recipe_datasets import load_dataset, prompt_messages
from repro.data.records import MathProblem

if TYPE_CHECKING:
    from repro.recipes.schema import DatasetConfig, Recipe


def rows(problems: list[MathProblem], template_name: str, answer_format: bool = False) -> list[dict]:
    """verl's rows: the chat messages as repro renders them (``prompt_messages``: the recipe's template, LumenRL's
    answer-format line on evaluation when ``eval.answer_format``); verl's own chat template turns them into text."""
    return [{"data_source": p.data_source, "prompt": prompt_messages(p, template_name, answer_format),
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": p.ground_truth},
             "extra_info": {"index": i, "uid": p.uid}} for i, p in enumerate(problems)]


def write_parquet(table_rows: list[dict], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(table_rows), tmp)
    tmp.replace(path)
    return path


def _problems(config: "DatasetConfig", data_dir: Path, seed: int, dedupe: bool) -> list[MathProblem]:
    return load_dataset(config.model_copy(update={"dedupe": dedupe}), data_dir, seed=seed)


def write_datasets(recipe: "Recipe", data_dir: Path) -> tuple[Path, Path, int, int]:
    """train.parquet and val.parquet in ``data_dir``; returns (train, val, train rows, val rows)."""
    data_dir = Path(data_dir)
    train = _problems(recipe.data.train, data_dir / "source", recipe.seed, recipe.data.train.dedupe)
    held_out = _problems(recipe.data.eval, data_dir / "source", recipe.seed, True)
    train_path = write_parquet(rows(train, recipe.data.train.template), data_dir / "train.parquet")
    val_path = write_parquet(rows(held_out, recipe.data.eval.template, recipe.eval.answer_format),
                             data_dir / "val.parquet")
    return train_path, val_path, len(train), len(held_out)
