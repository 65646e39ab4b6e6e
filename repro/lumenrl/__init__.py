"""AMD's LumenRL as the engine of a run (``engine: lumenrl`` in the recipe): the code AMD ran, from our notebooks.

repro writes LumenRL's config from the recipe, starts ``python -m lumenrl.trainer.main`` on the Ray head as
LumenRL's ``examples/GRPO/run_grpo_dsv4.sh`` does, streams its console log into the run directory's
``metrics.jsonl`` while it trains (so notebook 03's live plot and the analysis notebooks read it as they read our
own runs), maps its checkpoints onto our resume, and stops it cleanly. Everything LumenRL-specific lives here,
beside ``repro/run`` (our own loop, the other value of ``engine``); ``repro.run.start`` dispatches to it.

Modules: ``config`` (recipe -> LumenRL config, and what a recipe must satisfy for it), ``launch`` (command,
environment, its process group), ``stream`` (console log -> metrics.jsonl rows), ``checkpoints`` (its
``global_step_N/`` folders as our resume points), ``run`` (plan and run, what ``repro.run.start`` calls).

Run directory of a LumenRL run: ``recipe.yaml``, ``metrics.jsonl`` (+ parquet), ``logs/lumenrl.log`` (its console
output, every attempt appended), ``lumenrl/config.yaml`` (the written config), ``lumenrl/command.sh`` (environment
and command, to rerun it by hand), ``checkpoints/global_step_N/`` (LumenRL's own, unless lumenrl.checkpoint_dir).
"""
