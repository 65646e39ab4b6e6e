"""repro's own engine (``engine: repro``): recipe, run directory, groups, progress sink. ``repro.engines`` runs a
recipe through here or through ``repro.lumenrl.run``; ``repro run``, ``repro smoke``, ``repro launch`` and the
notebooks 02/03 all go through ``repro.engines.run_recipe``.

It checks what can fail before any worker starts (the run directory, the data and model paths, a run that is
already finished), starts the two groups -- in this process, or as Ray actors placed by the recipe's plan --
times their start-up as the run's warm-up (so it is not booked to the first evaluation), opens or resumes the
run, trains, writes the parquet copy of the log, and always releases what it started. The run directory is locked
for the call; a failure names its step (``repro.run.restarts``), and a worker's death may restart both groups.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Literal

from repro.cluster.placement import create_placement_groups, format_placement_table, placement_table, plan_placement
from repro.cluster.runtime import end_recorded_processes, ensure_ray, record_local_processes, shutdown_ray
from repro.groups.protocol import RolloutGroup, TrainerGroup
from repro.groups.workers import RolloutWorker, TrainerWorker
from repro.recipes.schema import Recipe
from repro.run.checkpoints import latest_checkpoint, usable_checkpoint
from repro.run.folder import check_run_folder, clear_for_fresh
from repro.run.loop import train
from repro.run.plan import RunOutcome, RunPlan, terminate_as_exit
from repro.run.planning import plan_run
from repro.run.restarts import Restarts, StepFailed, at_step
from repro.run.run_dir import check_inputs, open_run, resume_recipe_changes, run_dir_lock
from repro.run.state import Progress, no_progress
from repro.train.threads import use_worker_threads


def plan_repro_run(recipe: Recipe, run_dir: str | Path, resume: bool | Literal["auto"] = False,
                   fresh: bool | str = False) -> RunPlan:
    """``repro.run.planning.plan_run`` on repro's own checkpoints: the newest that verifies by content."""
    return plan_run(run_dir, recipe.steps, lambda: usable_checkpoint(Path(run_dir) / "checkpoints"), resume, fresh)


def run_repro(recipe: Recipe, plan: RunPlan, *, in_process: bool = False, progress: Progress = no_progress,
              say: Callable[[str], None] = print) -> RunOutcome:
    """Run (or resume) ``recipe`` as ``plan`` says; ``progress(step, row)`` is called after every step.

    The run directory is locked for the call. When a worker dies and ``checkpoint.max_restarts`` allows, both
    groups are ended and started again and the run resumes from the newest complete checkpoint
    (``repro.run.restarts``); otherwise the failure is raised as ``RunStopped`` naming the step, the worker or
    file, and the checkpoint to resume from."""
    started = time.perf_counter()
    run_dir = plan.run_dir
    say(plan.describe())
    if plan.finished:
        return RunOutcome(run_dir, plan.checkpoint.step, plan.checkpoint.step, 0.0, time.perf_counter() - started,
                          already_finished=True)
    # before the lock file is made in a folder that is not a run's, and before fresh removes anything
    check_run_folder(run_dir, plan.resume or bool(plan.fresh))
    if plan.resume:
        resume_recipe_changes(recipe, run_dir)  # a refused resume leaves the folder as it was, lock file included
    with run_dir_lock(run_dir), ExitStack() as stack:
        if plan.fresh:
            clear_for_fresh(run_dir, plan.fresh, say)  # says what it removes, then removes it
        model_dir = check_inputs(recipe, run_dir, plan.resume, fresh=bool(plan.fresh))
        stack.enter_context(terminate_as_exit())
        warmup = time.perf_counter()
        session = None if in_process else stack.enter_context(ray_session(recipe, run_dir))
        stack.enter_context(terminate_as_exit())  # ray.init put its own SIGTERM handler (exit code 15) over ours
        restarts, resume = Restarts(recipe.checkpoint.max_restarts), plan.resume
        while True:
            attempt = Attempt(recipe, model_dir, run_dir, session, restarts)
            try:
                warmup_s = attempt.run(resume, warmup, progress, say)
                break
            except StepFailed as failure:
                say(restarts.allow(failure, attempt.workers, resume_hint(run_dir)))
                resume, warmup = True, time.perf_counter()
    start_step = plan.checkpoint.step if plan.checkpoint is not None else 0
    return RunOutcome(run_dir, start_step, recipe.steps, warmup_s, time.perf_counter() - started)


@dataclass
class Attempt:
    """One start of both groups and the run on them, until the last step or a failure (``StepFailed``)."""

    recipe: Recipe
    model_dir: Path
    run_dir: Path
    session: "RaySession | None"   # None: the groups run in this process
    restarts: "Restarts"
    workers: dict[str, dict] = field(default_factory=dict)  # name -> process, once started (on Ray)

    def run(self, resume: bool, warmup: float, progress: Progress, say: Callable[[str], None]) -> float:
        """Start, resume if asked, train to the end, write the parquet log; returns the warm-up seconds."""
        newest = latest_checkpoint(self.run_dir / "checkpoints") if resume else None
        with ExitStack() as stack:
            with at_step(newest.step if newest else 0):  # failing to start or resume: at the step it resumes from
                if self.session is None:
                    trainer, rollout = in_process_groups(self.recipe, self.model_dir)
                else:
                    trainer, rollout = stack.enter_context(self.session.groups(self.model_dir))
                trainer.ready()
                rollout.ready()
                if self.session is not None:
                    self.workers = self.session.record(trainer, rollout)
                warmup_s = time.perf_counter() - warmup
                say(f"groups started in {warmup_s:.1f} s ({'in this process' if self.session is None else 'on Ray'})")
                run = open_run(self.recipe, self.run_dir, trainer, rollout, resume=resume)
                # the tracking sinks end with the attempt, marked failed when it raised (W&B's run state)
                stack.push(lambda kind, err, tb: run.metrics.close(exit_code=0 if kind is None else 1))
                self.restarts.log_pending(run.metrics, run.start_step)
            run.progress, run.warmup_s = progress, warmup_s
            train(run)
            run.metrics.write_parquet()
        return warmup_s


def in_process_groups(recipe: Recipe, model_dir: Path) -> tuple[TrainerGroup, RolloutGroup]:
    """Trainer and rollout as plain objects in this process (tests, debugging, a notebook kernel), computing with
    the thread settings a Ray worker gets (torch's default, every core, is slower here and rounds differently)."""
    if recipe.cluster.gpus_per_node == 0:
        use_worker_threads(recipe.cluster.cpu_threads_per_worker)
    return TrainerWorker(recipe, model_dir), RolloutWorker(recipe, model_dir)


@dataclass
class RaySession:
    """Ray for one call of ``run_planned``: the groups are started (and ended) once per attempt inside it."""

    recipe: Recipe
    run_dir: Path
    ray_record: Path           # logs/ray_processes.json: the local instance's processes, ended by the next run
    started_local: bool        # this call started a local instance (it stops it at the end)
    attempts: list[list[dict]] = field(default_factory=list)

    @contextmanager
    def groups(self, model_dir: Path) -> Iterator[tuple[TrainerGroup, RolloutGroup]]:
        """Both groups placed and started; on exit their actors are ended and the placement released."""
        from repro.groups.ray_actors import stop_actors  # ray (seconds to import): runs on Ray only
        from repro.groups.ray_groups import start_groups

        placement = create_placement_groups(plan_placement(self.recipe))
        try:
            (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
            (self.run_dir / "logs" / "placement.txt").write_text(
                format_placement_table(placement_table(placement)) + "\n")
            trainer, rollout = start_groups(placement, self.recipe, model_dir)
            try:
                yield trainer, rollout
            finally:
                stop_actors([*trainer.ranks, rollout.actor])
        finally:
            placement.remove()

    def record(self, trainer, rollout) -> dict[str, dict]:
        """Write every worker's process (id, start time, host, log file) of this attempt beside the earlier
        attempts' to logs/workers.json, and re-record the local instance's processes (its workers now among
        them) for the clean-up after a killed driver. Returns the workers by name."""
        import json

        processes = trainer.processes() + rollout.processes()
        self.attempts.append(processes)
        path = self.run_dir / "logs" / "workers.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"driver": os.getpid(), "attempts": self.attempts}, indent=1))
        tmp.replace(path)
        if self.started_local:
            record_local_processes(self.ray_record)
        return {p["name"]: p for p in processes}


@contextmanager
def ray_session(recipe: Recipe, run_dir: Path) -> Iterator[RaySession]:
    """Ray started or joined as the recipe says; a local instance this call started is stopped on exit (and
    what a killed earlier run in ``run_dir`` left of its own is ended first, by recorded process id)."""
    import ray

    from repro.groups.ray_groups import check_group_sizes  # ray (seconds to import): runs on Ray only

    check_group_sizes(recipe)
    record = run_dir / "logs" / "ray_processes.json"
    ended = end_recorded_processes(record)
    if ended:
        print(f"ended {len(ended)} Ray process(es) a killed run in {run_dir} left behind: {', '.join(ended)}")
    connected = ray.is_initialized()
    info = ensure_ray(recipe)
    started_local = info.started_local and not connected
    if started_local:
        record_local_processes(record)
    try:
        yield RaySession(recipe, run_dir, record, started_local)
    finally:
        if started_local:
            shutdown_ray()
            record.unlink(missing_ok=True)


def resume_hint(run_dir: Path) -> str:
    newest, skipped = usable_checkpoint(run_dir / "checkpoints")
    passed = "".join(f"; not used: {note}" for note in skipped if "did not finish" not in note)
    if newest is None:
        return f"no checkpoint that verifies was written yet: rerun from the start{passed}"
    return f"the last good checkpoint is step {newest.step} ({newest.path}): rerun with --resume{passed}"
