"""A resume runs the recipe the run started with: its ``recipe.yaml`` is the run's record, read, never rewritten
silently.

``--resume`` with a recipe or ``--set`` that differs from the record in a field that changes training is refused,
listing each difference (``field: run's value -> given value``). A few fields may change on resume (RESUMABLE,
each with why): they decide where the run stops, what it records or how long it waits, never what a step
computes -- a resumed run recomputes the very same floats whichever of them changed (tests/test_loop_resume.py:
a resume matches the uninterrupted run bit for bit, whatever step it resumed from). Such a change is written into
recipe.yaml and recorded as a ``resume`` row of metrics.jsonl naming each field with its old and new value.

A record that cannot be read (not YAML, not a recipe) is refused naming the file and line.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from repro.errors import RecipeError
from repro.recipes import apply_override, format_errors, read_yaml, validate_recipe
from repro.recipes.earlier import EARLIER_CONVENTIONS, fill_earlier_conventions
from repro.recipes.schema import Recipe

RECIPE_FILE = "recipe.yaml"
RESUME = "resume"  # the metrics row kind of a resume that changed a RESUMABLE field

# dotted field (or section) -> why changing it on resume leaves every step's computation as it was
RESUMABLE: dict[str, str] = {
    "steps": "where the run stops: extending a run (or ending it earlier) changes no step taken or to come",
    "description": "a sentence about the recipe",
    "tracking": "records of the run (W&B, TensorBoard, rollouts on disk), not settings of it",
    "checkpoint.every_steps": "when state is saved: a resume from any step recomputes the same floats",
    "checkpoint.keep_last": "how many saved states are kept",
    "checkpoint.max_restarts": "what the driver does when a worker dies, not what a step computes",
    "weight_sync.timeout_s": "how long a sync may take before it is called failed",
    "cluster.ray_address": "where the Ray head is found; the placement the recipe asks for is unchanged",
    "cluster.versions": "what `repro check` compares the cluster with",
    "actor.bf16_gemm": "how a CPU computes the BF16 GEMMs; the trainer's checkpoint records the path it took and "
                       "refuses the other, so a change here can only name the path the run already took",
}


def may_change(dotted: str) -> bool:
    return any(dotted == field or dotted.startswith(field + ".") for field in RESUMABLE)


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _line_of(text: str, loc: tuple) -> int | None:
    """The line (1-based) of the key at ``loc`` in the YAML ``text`` (its deepest key present)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
        if match is None:
            break
        line, node = match[0].start_mark.line + 1, match[1]
    return line


def read_run_recipe(path: Path) -> dict:
    """The record as a mapping, the convention keys it predates filled (repro.recipes.earlier) and validated;
    refused with ``file:line`` when it is not YAML or not a recipe."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not text (a run's recipe.yaml is UTF-8 YAML)") from None
    try:
        data = read_yaml(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise RecipeError(f"{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}:1: not a recipe (a mapping of sections), got {type(data).__name__}")
    fill_earlier_conventions(data)
    try:
        Recipe.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        line = _line_of(text, first["loc"])
        problem = format_errors(err)[0].strip()
        raise RecipeError(f"{path}:{line or 1}: not a recipe this repro reads: {problem}") from None
    return data


def load_run_recipe(path: Path, overrides: list[str] | tuple[str, ...] = (), steps: int | None = None) -> Recipe:
    """The run's own recipe (``--resume`` without ``--recipe``), with the overrides a resume may bring."""
    data = read_run_recipe(Path(path))
    applied = {apply_override(data, o): o for o in [*overrides, *([f"steps={steps}"] if steps is not None else [])]}
    return validate_recipe(data, source=str(path), overrides=applied)


def _show(value) -> str:
    return "null" if value is None else repr(value)


def resume_changes(stored_path: Path, given: Recipe, hint: str | None = None) -> dict[str, list]:
    """{field: [run's value, given value]} for the RESUMABLE fields ``given`` changes; raises RecipeError listing
    every other difference (``hint``: what to do instead). An absent record (a run stopped before writing it) has
    nothing to differ from."""
    if not stored_path.is_file():
        return {}
    stored = _flat(Recipe.model_validate(read_run_recipe(stored_path)).model_dump(mode="json"))
    now = _flat(given.model_dump(mode="json"))
    differ = {k: [stored.get(k), now.get(k)] for k in sorted(set(stored) | set(now)) if stored.get(k) != now.get(k)}
    blocked = {k: v for k, v in differ.items() if not may_change(k)}
    if blocked:
        listed = "; ".join(f"{k}: {_show(a)} -> {_show(b)}" for k, (a, b) in blocked.items())
        hint = hint or (f"resume with the run's own recipe (repro run --resume --run-dir {stored_path.parent}, no "
                        "--recipe), or start a new --run-dir")
        raise RecipeError(f"--resume runs the recipe the run started with, as {stored_path} records it; these "
                          f"fields differ and would change training: {listed}. {hint[0].upper()}{hint[1:]}")
    return {k: v for k, v in differ.items()}


def check_conventions_kept(recipe: Recipe, stored_path: Path) -> None:
    """A run written before a convention became a recipe field ran the earlier convention; resuming it under
    today's default would change the algorithm halfway. Refuse, naming the ``--set`` that keeps the run as it was."""
    if not stored_path.is_file():
        return
    try:
        raw = read_yaml(stored_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return  # read_run_recipe refuses it, naming the line
    if not isinstance(raw, dict):
        return
    current = recipe.model_dump()
    changed = []
    for dotted in fill_earlier_conventions(raw):
        value = current
        for part in dotted.split("."):
            value = value[part]
        if value != EARLIER_CONVENTIONS[dotted]:
            earlier = EARLIER_CONVENTIONS[dotted]
            changed.append(f"--set {dotted}={'null' if earlier is None else earlier}")
    if changed:
        raise RecipeError(
            f"run dir {stored_path.parent} was started before these conventions were recipe fields and ran the "
            f"earlier ones; resume it as it ran with {' '.join(changed)} (or start a new run dir for AMD's)")


def recipe_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / RECIPE_FILE
