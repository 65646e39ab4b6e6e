"""A recipe's schedule in words (what notebooks and commands say about a run, written from the recipe it runs, so the
text cannot drift from the fields): when the held-out set is evaluated and when checkpoints are written."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repro.recipes.schema import Recipe


def eval_schedule(recipe: "Recipe") -> str:
    """When the loop evaluates (``repro.run.loop`` and ``repro.run.steps.evaluates_after``), in words."""
    e = recipe.eval
    when = (["at step 0"] if e.at_start else []) + (["after step 1"] if e.after_first_update else [])
    when += [f"every {e.every_steps} steps" if e.every_steps > 1 else "after every step", "after the last"]
    return f"held-out avg@{e.samples_per_problem} {', '.join(when[:-1])} and {when[-1]}"


def checkpoint_schedule(recipe: "Recipe") -> str:
    c = recipe.checkpoint
    return f"a checkpoint every {c.every_steps} steps and after the last, the newest {c.keep_last} kept"


def schedule(recipe: "Recipe") -> str:
    """The recipe's evaluation and checkpoint schedule, one sentence."""
    return f"{recipe.name}: {recipe.steps} steps; {eval_schedule(recipe)}; {checkpoint_schedule(recipe)}"
