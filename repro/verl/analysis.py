"""What the analysis reads of a run verl ran (named in verl's row of ``repro.recipes.backends.ENGINES``, imported
only by the analysis, so reading a run never imports the engine's launch code): the key origins the stream recorded,
that verl's ``timing_s/step`` stops before validation (verl 0.9.1 ``trainer/ppo/v1/trainer_base.py``: the
``testing`` timer runs after the ``step`` timer closes), and verl's caveats for the comparison with AMD's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repro.analysis.frame import RunFrames

ORIGINS = Path("verl") / "origins.json"  # written by repro.verl.stream while it streams


def about_run_dir(run_dir: Path) -> dict:
    path = Path(run_dir) / ORIGINS
    origins = json.loads(path.read_text()) if path.is_file() else {}
    return {"origins": origins, "step_time_includes_eval": False,
            "notes": ["Streamed from verl's file logger (engine: verl), keys renamed as for a verl JSONL"]}


def caveats(frames: "RunFrames") -> list[str]:
    notes = ["verl (engine: verl) never evaluates after the first update: AMD's 'start' AIME figure (step 1) has "
             "no counterpart in this run; its first evaluation is before training (eval.at_start) or at "
             "eval.every_steps.",
             "verl's timing_s/step excludes its evaluation (timed apart as timing_s/testing), unlike LumenRL's "
             "DeepSeek-V4 trainer, which times validation inside the step."]
    if not any(c.startswith("rollout_corr/pos_") for c in frames.train.columns):
        notes.append("verl 0.9.1 logs no KL by response position (rollout_corr/pos_*); the position figures are "
                     "empty for this run.")
    return notes
