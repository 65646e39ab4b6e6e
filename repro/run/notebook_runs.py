"""What the run notebooks (02, 03) call: the RL run with a progress hook, the log's train rows, a live plot.

Kept apart from ``repro.notebooks`` (executing and chaining notebooks) so each file holds one job.
"""

from __future__ import annotations

import io
import math
import time
from pathlib import Path
from typing import Callable, Iterable



def run_recipe(recipe: str, run_dir: str | Path, steps: int | None = None, overrides: Iterable[str] = (), *,
               in_process: bool = False, resume: bool | str = "auto", fresh: bool = False,
               progress: Callable[[int, dict], None] | None = None) -> Path:
    """The RL run as ``repro run`` does it (open the run, groups on Ray or in this process, train, write the
    parquet copy), with ``progress(step, row)`` called after every step (a live plot, a bar).

    resume: True/False, or "auto" (resume when the run dir already holds a log, as ``make repro`` does).
    fresh: delete the run dir first (the smoke run is a throwaway check).
    """
    import shutil

    from repro.run.loop import train
    from repro.recipes import load_recipe
    from repro.run.run_dir import local_groups, open_run

    run_dir = Path(run_dir)
    overrides = list(overrides) + ([f"steps={steps}"] if steps else [])
    resolved = load_recipe(recipe, overrides)
    if fresh and run_dir.exists():
        shutil.rmtree(run_dir)
    if resume == "auto":
        resume = (run_dir / "metrics.jsonl").exists()
    cluster = None
    if in_process:
        groups = local_groups
    else:
        from repro.groups.ray_groups import RayGroups

        cluster = RayGroups(resolved, run_dir)
        groups = cluster.make_groups
    try:
        run = open_run(resolved, run_dir, resume=bool(resume), groups=groups)
        if progress is not None:
            run.progress = progress
        train(run)
        run.metrics.write_parquet()
    finally:
        if cluster is not None:
            cluster.shutdown()
    return run_dir


def train_rows(run_dir: str | Path):
    """The run's training rows as a frame indexed by step (what the log holds, every key)."""
    from repro.analysis import load_run

    return load_run(run_dir).train


class LivePlot:
    """Reward accuracy and train-rollout KL redrawn while the run trains: a ``Run.progress`` callback.

    In JupyterLab the figure is one display that is replaced in place; under papermill the same
    ``update_display`` messages rewrite the stored output, so the executed notebook ends with the last
    frame. Outside IPython it only collects rows. Redraws are throttled to one per ``min_interval_s``
    (the last step always redraws).
    """

    def __init__(self, total_steps: int, min_interval_s: float = 1.0, rows: Iterable[tuple[int, dict]] = ()):
        self.total_steps = total_steps
        self.min_interval_s = min_interval_s
        self.steps: list[int] = []
        self.accuracy: list[float] = []
        self.kl: list[float] = []
        self.redraws = 0
        self._last_draw = -math.inf
        self._handle = None
        for step, row in rows:
            self._add(step, row)
        try:
            from IPython import get_ipython
            from IPython.display import display

            if get_ipython() is not None:
                self._handle = display(self._image(), display_id=True)
        except ImportError:
            pass

    def _add(self, step: int, row: dict) -> None:
        from repro.analysis.frame import ACCURACY, KL

        self.steps.append(int(step))
        self.accuracy.append(float(row.get(ACCURACY, math.nan)))
        self.kl.append(float(row.get(KL, math.nan)))

    def figure(self):
        from matplotlib.ticker import PercentFormatter

        from repro.plots import AMD_COLOUR, RUN_COLOUR, _new_figure, styled
        from repro.reference import amd_value

        with styled():
            fig, (ax_acc, ax_kl) = _new_figure(ncols=2)
            fig.set_size_inches(9.0, 3.2)
            ax_acc.plot(self.steps, self.accuracy, ".-", color=RUN_COLOUR, label="this run")
            for phase in (1, 2, 3):
                first = 25 * phase - 24
                ax_acc.plot([first, first + 24], [amd_value(f"reward_acc_phase{phase}")] * 2, "--", color=AMD_COLOUR,
                            label="AMD 25-step means" if phase == 1 else None)
            ax_acc.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
            ax_acc.set(xlim=(0, max(self.total_steps, 1) + 1), ylim=(0, 1), xlabel="step", ylabel="reward accuracy",
                       title=f"step {self.steps[-1] if self.steps else 0} / {self.total_steps}")
            ax_acc.legend(loc="lower right")
            ax_kl.plot(self.steps, self.kl, ".-", color=RUN_COLOUR)
            ax_kl.set(xlim=(0, max(self.total_steps, 1) + 1), xlabel="step", ylabel="KL(rollout ‖ trainer)",
                      title=f"train-rollout KL (AMD at step 75: {amd_value('kl_train_rollout_step75')})")
            fig.tight_layout()
        return fig

    def _image(self):
        from IPython.display import Image

        from repro.plots import styled

        buffer = io.BytesIO()
        with styled():
            self.figure().savefig(buffer, format="png", dpi=80, bbox_inches="tight")
        return Image(data=buffer.getvalue(), format="png")

    def __call__(self, step: int, row: dict) -> None:
        self._add(step, row)
        now = time.monotonic()
        if self._handle is None or (now - self._last_draw < self.min_interval_s and step < self.total_steps):
            return
        self._handle.update(self._image())
        self._last_draw = now
        self.redraws += 1
