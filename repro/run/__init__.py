"""The driver: a run directory opened (or resumed), the RL loop over its steps, checkpoints and the metrics log;
``launch``: `repro launch` of this engine on a Ray cluster and its dry run (LumenRL's is ``repro.lumenrl.launch``)."""
