"""What ``repro launch --dry-run`` prints for ``engine: verl``: the placement verl will make, the overrides written
from the recipe beside verl's published DeepSeek-V4-Flash script's, the departures, whether verl's own code composed
and validated them here, the environment and the command. Writes nothing (paths are where the run would put them).
"""

from __future__ import annotations

from pathlib import Path

from repro.recipes.schema import Recipe
from repro.verl import compose, launch, overrides as ov, published
from repro.verl.mapping import departures


def layout_lines(recipe: Recipe) -> list[str]:
    r = recipe
    nodes = ov.verl_nodes(r)
    gpus = nodes * r.cluster.gpus_per_node
    model_parallel = r.actor.tensor_parallel * r.actor.pipeline_parallel
    return [f"placement (verl's synchronous trainer, rollout colocated): {nodes} node(s) x {r.cluster.gpus_per_node} "
            f"GPUs = {gpus} GPUs, each holding one trainer rank and a share of a vLLM replica",
            f"  trainer: TP{r.actor.tensor_parallel} PP{r.actor.pipeline_parallel} EP{r.actor.expert_parallel} "
            f"ETP{r.actor.expert_tensor_parallel}, DP {gpus // max(model_parallel, 1)}",
            f"  rollout: {gpus // r.rollout.tensor_parallel} vLLM replica(s) of TP{r.rollout.tensor_parallel}, "
            f"gpu_memory_utilization {r.rollout.gpu_memory_utilization} while the trainer's state is on the host",
            f"  cluster nodes not used by verl: {max(r.cluster.num_nodes - nodes, 0)}"]


def beside_published(written: list[str]) -> list[str]:
    """Each key ours or the published script sets: ours, the script's, and whether they differ."""
    ours = {published.bare_key(o): o.split("=", 1)[1] for o in written if "=" in o}
    theirs = {published.bare_key(k): v for k, v in published.PUBLISHED.items()}
    keys = list(ours) + [k for k in theirs if k not in ours]
    width = min(max(len(k) for k in keys), 78)
    lines = [f"{'key':<{width}}  {'written (this recipe)':<28} verl's {published.SCRIPT}"]
    for key in keys:
        mine, script = ours.get(key, "-"), theirs.get(key, "-")
        mark = "" if mine == script else "   <- only ours" if script == "-" else (
            "   <- only the script's" if mine == "-" else "   <- differs")
        lines.append(f"{key:<{width}}  {mine[:28]:<28} {script[:40]}{mark}")
    return lines


def describe_launch(recipe: Recipe, run_dir: Path) -> str:
    from repro.verl.run import checkpoint_root, environment, run_files

    files = run_files(recipe, run_dir, None, 1)
    env = environment(recipe, files)
    written = ov.verl_overrides(recipe, files, env)
    lines = [f"engine: verl 0.9.1 -- python {launch.interpreter(recipe)}"
             + (f", image {recipe.verl.image}" if recipe.verl.image else ""), ""]
    lines += layout_lines(recipe) + [""]
    lines += [f"overrides written from the recipe, beside verl's published script (commit {published.COMMIT[:9]}):"]
    lines += beside_published(written) + [""]
    lines += [f"departure: {note}" for note in departures(recipe)]
    if compose.verl_available():
        try:
            compose.check_config(written)
            fields = compose.megatron_optimizer_fields()
            lines.append("composed by verl's Hydra config and validated by verl's validate_config and the run-time "
                         "checks here" + ("" if fields is not None else " (override_optimizer_config keys not checked:"
                                          " megatron-core not importable here)"))
        except compose.VerlConfigError as err:
            lines.append(f"verl REFUSES this config: {err}")
    else:
        lines.append("not composed here: verl is not importable (the launch composes and validates it first)")
    lines += ["", f"checkpoints: {checkpoint_root(recipe, Path(run_dir))} (resume: the newest complete "
              "global_step_N, by resume_path)", "", "environment (driver; the same reach the workers through "
              "+ray_kwargs.ray_init.runtime_env.env_vars):"]
    lines += [f"  {k}={v}" for k, v in launch.driver_env(recipe, env).items()]
    lines += ["", "command:", "  " + " ".join(launch.verl_command(recipe, ["<the overrides above>"]))]
    lines += [f"missing here: {p}" for p in launch.install_problems(recipe)]
    return "\n".join(lines)
