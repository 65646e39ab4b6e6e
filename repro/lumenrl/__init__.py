"""AMD's LumenRL as the engine of a run (``engine: lumenrl`` in the recipe): the code AMD ran, from our notebooks.

repro writes LumenRL's config from the recipe, starts ``python -m lumenrl.trainer.main`` on the Ray head as
LumenRL's ``examples/GRPO/run_grpo_dsv4.sh`` does, streams its console log into the run directory's
``metrics.jsonl`` while it trains (so notebook 03's live plot and the analysis notebooks read it as they read our
own runs), maps its checkpoints onto our resume, and stops it cleanly. It stands beside
``repro/run`` (our own loop, the other value of ``engine``); ``repro.engines`` chooses between the two, and neither
``repro/run`` nor ``repro/recipes`` imports anything from here. What a recipe must satisfy to run on LumenRL is
checked when the recipe is loaded, with its other cross-field checks (``repro.recipes.lumenrl_checks``).

Modules: ``config`` (recipe -> LumenRL config), ``launch`` (command, environment, its process group), ``stream``
(console log -> metrics.jsonl rows), ``checkpoints`` (its ``global_step_N/`` folders as our resume points),
``run`` (plan and run, what ``repro.engines`` calls).

Run directory of a LumenRL run: ``recipe.yaml``, ``metrics.jsonl`` (+ parquet), ``logs/lumenrl.log`` (its console
output, every attempt appended), ``lumenrl/config.yaml`` (the written config), ``lumenrl/command.sh`` (environment
and command, to rerun it by hand), ``checkpoints/global_step_N/`` (LumenRL's own, unless lumenrl.checkpoint_dir).
"""
