"""Rollout engines behind one interface (repro/rollout/base.py): embedded CPU engine, vLLM."""
