"""The driver: a run directory opened (or resumed), the RL loop over its steps, checkpoints and the metrics log."""
