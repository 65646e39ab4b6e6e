"""The tiny Qwen3-MoE of the Megatron lane (`repro build-tiny --arch qwen3-moe`): tiny-math tokenizer, a vocabulary
TP 2 and 4 divide, routing recorded by the embedded rollout engine."""

from __future__ import annotations

import torch

from repro.cli import main
from repro.model.hf_folder import load_checkpoint
from repro.rollout.embedded import EmbeddedEngine
from repro.rollout.types import SamplingParams


def test_build_tiny_qwen3_moe_writes_a_loadable_math_model_whose_rollout_records_routing(tmp_path, one_thread):
    assert main(["build-tiny", "--arch", "qwen3-moe", "--out", str(tmp_path / "q3"), "--seed", "1"]) in (0, None)
    model, tokenizer = load_checkpoint(tmp_path / "q3")
    assert model.config.model_type == "qwen3_moe" and model.config.vocab_size == 32
    prompt = tokenizer("12+34=")["input_ids"]
    assert len(prompt) == 7 and prompt[0] == tokenizer.bos_token_id and max(prompt) < 25
    assert tokenizer.decode(prompt, skip_special_tokens=True) == "12+34="
    engine = EmbeddedEngine(model, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, max_context=32)
    result = engine.generate([prompt, prompt], SamplingParams(n=2, max_new_tokens=5, temperature=1.0, seed=0))
    assert len(result.trajectories) == 4
    for traj in result.trajectories:
        fed = len(traj.prompt_ids) + len(traj.response_ids) - 1
        assert sorted(traj.routing) == [0, 1]
        assert all(t.shape == (fed, 2) and 0 <= int(t.min()) and int(t.max()) < 8 for t in traj.routing.values())
