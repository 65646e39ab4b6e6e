"""The config verl 0.9.1 composes from a recipe's overrides, against the one it composes from its published
DeepSeek-V4-Flash script (run_deepseek_v4_flash_megatron.sh, without the key 0.9.1 dropped): every key whose
composed value differs, as a Markdown table. Needs verl: `.venv-verl/bin/python benchmarks/verl_config_diff.py
[RECIPE [--set FIELD=VALUE ...]]` (default: h100-8x8-dsv4-flash-verl). docs/verl.md shows its output."""

import argparse
import tempfile
from pathlib import Path

from repro.recipes import load_recipe
from repro.verl import compose, overrides as ov, published
from repro.verl.run import environment, run_files

# where the two can only differ: paths and names of this machine or of the script's author
LOCAL = ("data.train_files", "data.val_files", "trainer.default_local_dir", "actor_rollout_ref.model.path",
         "reward.custom_reward_function.path", "trainer.project_name", "trainer.experiment_name",
         "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("recipe", nargs="?", default="h100-8x8-dsv4-flash-verl")
    parser.add_argument("--set", dest="sets", action="append", default=[])
    args = parser.parse_args()
    recipe = load_recipe(args.recipe, args.sets)
    files = run_files(recipe, Path(tempfile.mkdtemp()), None, 1)
    ours = compose.flat(compose.check_config(ov.verl_overrides(recipe, files, environment(recipe, files))))
    theirs = compose.flat(compose.compose_config(published.published_overrides(compose_on_0_9_1=True)))
    keys = [k for k in list(ours) + [k for k in theirs if k not in ours]
            if ours.get(k, "(absent)") != theirs.get(k, "(absent)") and k not in LOCAL]
    print(f"| key | {recipe.name} | verl's published script |\n|---|---|---|")
    for key in keys:
        print(f"| `{key}` | `{ours.get(key, '(absent)')}` | `{theirs.get(key, '(absent)')}` |")
    print(f"\n{len(keys)} keys differ of {len(set(ours) | set(theirs))}; paths and names left out: {', '.join(LOCAL)}")


if __name__ == "__main__":
    main()
