"""A STAND-IN for ``python -m verl.trainer.main_ppo``, NOT verl's trainer: it reads the overrides repro writes, as
verl would, and for each step logs through verl's own ``Tracking`` (backends console and file, so verl's own
FileLogger opens ``$VERL_FILE_LOGGER_PATH`` with "wb" and verl's LocalLogger prints ``step:N - k:v``), saves
checkpoints in verl's layout and order (``global_step_N/actor/``, ``data.pt``, then the tracker), and resumes from
``trainer.resume_from_path`` as verl's ``resume_mode=resume_path`` does. It trains nothing: the metrics are formulas
of the step. What it does not cover: verl's Ray workers, its real metrics, Hydra's composition (tests/verl/
test_compose.py composes the same overrides with verl's config).

Faults, from the environment (reaching the program only through ``+ray_kwargs.ray_init.runtime_env.env_vars``, as
verl's workers would get them): STANDIN_CRASH_SAVING_AT=N dies while writing checkpoint N (``actor/`` written, no
``data.pt``, tracker not updated), once: the crash leaves ``crashed`` beside the checkpoints.
"""

import os
import sys
from pathlib import Path

from verl.utils.tracking import Tracking

ENV = "+ray_kwargs.ray_init.runtime_env.env_vars."


def main(argv: list[str]) -> int:
    settings = dict(arg.split("=", 1) for arg in argv if "=" in arg)
    for key, value in settings.items():  # what verl's workers would see through the runtime env
        if key.startswith(ENV):
            os.environ[key[len(ENV):]] = value.strip("'")
    steps, save_freq = int(settings["trainer.total_training_steps"]), int(settings["trainer.save_freq"])
    test_freq = int(settings["trainer.test_freq"])
    root = Path(settings["trainer.default_local_dir"].strip("'"))
    start = 0
    if settings["trainer.resume_mode"] == "resume_path":
        start = int(settings["trainer.resume_from_path"].strip("'").rsplit("global_step_", 1)[1])
    elif settings["trainer.resume_mode"] != "disable":
        print(f"stand-in: resume_mode {settings['trainer.resume_mode']} is not what repro writes", file=sys.stderr)
        return 2
    crash_at = int(os.environ.get("STANDIN_CRASH_SAVING_AT", "0"))
    logger = Tracking(project_name=settings["trainer.project_name"], experiment_name="standin",
                      default_backend=["console", "file"])
    for step in range(start + 1, steps + 1):
        data = {"training/global_step": step, "actor/pg_loss": -0.01 * step, "critic/score/mean": -1 + 0.1 * step,
                "response_length/mean": 100.0 + step, "timing_s/gen": 2.0, "timing_s/step": 3.0 + step / 10,
                "rollout_corr/kl": 0.001 * step, "actor/grad_norm": float("nan") if step == 2 else 0.5}
        if step % save_freq == 0 or step == steps:
            folder = root / f"global_step_{step}"
            (folder / "actor").mkdir(parents=True, exist_ok=True)
            if step == crash_at and not (root / "crashed").exists():
                (root / "crashed").write_text("")
                logger.finish()
                os._exit(3)
            (folder / "data.pt").write_bytes(b"dataloader state")
            (root / "latest_checkpointed_iteration.txt").write_text(str(step))
        if test_freq > 0 and (step % test_freq == 0 or step == steps):
            data.update({"val-core/math_dapo/acc/mean@8": 0.25 + 0.01 * step, "timing_s/testing": 5.0})
        logger.log(data=data, step=step)
    logger.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
