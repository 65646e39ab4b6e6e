"""Progress sinks: what a run calls after every step with ``(step, row)`` (``Run.progress``).

``progress_bar`` is the command line's tqdm bar; ``LivePlot`` is notebook 03's figure, redrawn in place.
"""

from __future__ import annotations

import io
import math
import time
from typing import Iterable

from repro import metric_keys as K
from repro.reference import amd_value


def progress_bar(total_steps: int):
    """A tqdm bar over the run's steps: reward accuracy, the two KL estimates, ESS and rollout tokens/s."""
    from tqdm.auto import tqdm  # a widget in JupyterLab, text in a terminal or a papermill log

    bar = None

    def update(step: int, row: dict) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total_steps, initial=step - 1, unit="step", dynamic_ncols=True)
        bar.set_postfix({
            "acc": f"{row.get(K.ACCURACY, math.nan):.3f}",
            "kl_k1": f"{row.get(K.KL, math.nan):+.2e}",  # unbiased sample estimate: can be negative
            "kl_k3": f"{row.get(K.K3_KL, math.nan):.2e}",  # never negative
            "ess": f"{row.get(K.ESS, math.nan):.1%}",
            "tok/s": f"{row.get(K.THROUGHPUT, math.nan):.0f}",
        })
        bar.update(step - bar.n)

    def close() -> None:
        if bar is not None:
            bar.close()

    update.close = close
    return update


def fan_out(*sinks):
    """One progress sink that calls each of ``sinks`` in turn (a live plot and a bar)."""

    def update(step: int, row: dict) -> None:
        for sink in sinks:
            sink(step, row)

    return update


class LivePlot:
    """Reward accuracy and train-rollout KL redrawn while the run trains: a ``Run.progress`` callback.

    In JupyterLab the figure is one display that is replaced in place; under papermill the same
    ``update_display`` messages rewrite the stored output, so the executed notebook ends with the last
    frame. Outside IPython it only collects rows. Redraws are throttled to one per ``min_interval_s``
    (the last step always redraws).
    """

    # A redraw takes ~0.2 s of the kernel, and the loop waits for it: once a step (1.7 s on 2 cores) it cost the
    # 75-step run ~15 s; once per 5 s, ~5 s.
    def __init__(self, total_steps: int, min_interval_s: float = 5.0, rows: Iterable[tuple[int, dict]] = ()):
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
        self.steps.append(int(step))
        self.accuracy.append(float(row.get(K.ACCURACY, math.nan)))
        self.kl.append(float(row.get(K.KL, math.nan)))

    def figure(self):
        from matplotlib.ticker import PercentFormatter

        # matplotlib: the notebook's figure only
        from repro.analysis.plots import AMD_COLOUR, RUN_COLOUR, new_figure, styled

        with styled():
            fig, (ax_acc, ax_kl) = new_figure(ncols=2)
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

        from repro.analysis.plots import styled  # matplotlib: the notebook's figure only

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
