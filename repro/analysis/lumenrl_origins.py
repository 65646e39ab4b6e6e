"""What the analysis reads of a run directory that LumenRL's log was streamed into (``engine: lumenrl``): which of our
keys came from which of LumenRL's. ``repro.lumenrl.stream`` writes that record while it streams; it lives here, below
both the stream and ``repro.analysis.frame``, so the reader and the writer share its name without importing each
other.
"""

from __future__ import annotations

import json
from pathlib import Path

ORIGINS_FILE = "origins.json"  # beside the config: our key -> LumenRL's, for the analysis' notes


def streamed_about(run_dir: Path) -> dict:
    """What the analysis should know of a run directory LumenRL's log was streamed into: which of our keys came from
    which of LumenRL's, and that its step time includes validation (LumenRL times validation inside the step)."""
    path = Path(run_dir) / "lumenrl" / ORIGINS_FILE
    origins = json.loads(path.read_text()) if path.is_file() else {}
    return {"origins": origins, "step_time_includes_eval": "timing_s/step" not in origins,
            "notes": ["Streamed from LumenRL's console log (engine: lumenrl), keys renamed as for a LumenRL log"]}
