"""verl as the engine of a run (``engine: verl``, verl 0.9.1, ``python -m verl.trainer.main_ppo``): the RL framework
most practitioners run, on NVIDIA and on ROCm, driven from our recipes and read by our notebooks.

repro writes verl's Hydra overrides from the recipe (``overrides``: every recipe field mapped, refused or a stated
departure, ``mapping.MAPPING``), composes them with verl's own ``ppo_trainer`` config and checks the result with
verl's own ``validate_config`` plus what verl only catches at run time (``compose``), writes the data in verl's
parquet layout (``data``) and the reward as our DAPO rule (``reward_fn``), starts verl in a process group of its own
(``launch``), streams verl's JSONL file logger into ``metrics.jsonl`` while it trains (``stream``), and resumes from
the newest complete ``global_step_N`` with an explicit ``resume_from_path`` (``checkpoints``). ``run`` plans and
runs; ``seam`` is what ``repro.engines`` calls. Importing this package imports nothing of verl: only ``compose``
does, and only when verl is installed (its own venv here: ``make test-verl``).

Run directory of a verl run: ``recipe.yaml``, ``metrics.jsonl`` (+ parquet), ``logs/verl.log`` (console, every
attempt appended), ``verl/overrides.txt`` and ``verl/config.yaml`` (the composed config, when verl is importable
here), ``verl/command.sh``, ``verl/metrics.attempt-N.jsonl`` (verl's file logger, one per attempt: verl truncates
its file at every start), ``verl/data/{train,val}.parquet``, ``checkpoints/global_step_N/`` (verl's own).
"""
