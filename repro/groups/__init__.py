"""The two worker groups the loop talks to -- the trainer and the rollout -- in this process or as Ray actors."""
